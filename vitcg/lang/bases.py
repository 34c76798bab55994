"""The style bases: the language's defaults, as spec text a user can open.

``vitcg/lang/styles/`` holds one YAML file per attention style (``_packed.yaml``, ``_windowed.yaml``,
``_tiles.yaml``) and ``_spec.yaml`` under them all (the harness's ``budgets`` and ``max_model_len``). A base is
written like a spec fragment and may ``extends`` another base (``_windowed`` extends ``_packed``, which extends
``_spec``), merged by the one rule of :mod:`.resolve`. A spec that extends no other extends the base of its
``attention.style`` (``_spec`` where the style is none of them); a spec may also write ``extends: _packed``.

Their names start with ``_``, which no spec name may (``^[a-z][a-z0-9_]*$``), so a base never shadows a spec nor
the other way round; and they live outside the spec folders, so discovery, the registry, ``vitcg check --all``
and the spec count never meet them. They ship as package data (``pyproject.toml``) and are found where the
package is, through :mod:`importlib.resources` (:func:`.folders.packaged_folder`).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from . import catalogue as cat
from .loader import LoadedYaml, load_file

ROOT = "_spec"
"""The base under every other: what any spec gets (the harness's defaults)."""
NAMES = (ROOT, *(f"_{style}" for style in cat.STYLES))
"""Every base, by the name ``extends:`` gives it."""


def folder() -> Path:
    """Where the bases are: ``vitcg/lang/styles/`` of the installed package."""
    from .folders import packaged_folder
    return packaged_folder("lang/styles")


def is_base(name: Any) -> bool:
    return isinstance(name, str) and name in NAMES


def file(name: str) -> Path:
    """The file of base ``name`` (one of :data:`NAMES`)."""
    return folder() / f"{name}.yaml"


def style_of(name: str) -> str | None:
    """The attention style base ``name`` holds the defaults of (None for :data:`ROOT`)."""
    return name[1:] if name[1:] in cat.STYLES else None


def for_style(style: Any) -> str:
    """The base a spec of ``style`` that extends no other extends."""
    return f"_{style}" if isinstance(style, str) and style in cat.STYLES else ROOT


@functools.cache
def _resolved(name: str) -> LoadedYaml:
    """Base ``name`` merged over the base it extends. A packaged base that does not load is a broken install,
    never a user's mistake: RuntimeError."""
    path = file(name)
    loaded, problems = load_file(path, str(path))
    if loaded is None or problems or not isinstance(loaded.data, dict):
        raise RuntimeError(f"the packaged style base {path} does not load: "
                           + "; ".join(d.format() for d in problems))
    parent = loaded.data.get("extends")
    if parent is None:
        return loaded
    if not is_base(parent):
        raise RuntimeError(f"the packaged style base {path} extends {parent!r}, which is not a base")
    from .resolve import merge, without
    merged, problems = merge(_resolved(parent), without(loaded, "extends"))
    if problems:
        raise RuntimeError(f"the packaged style base {path} does not merge: "
                           + "; ".join(d.format() for d in problems))
    return merged


def data(name: str) -> dict[str, Any]:
    """What base ``name`` holds, merged over the bases it extends (a fresh copy)."""
    return copy.deepcopy(_resolved(name).data)


@functools.cache
def chain(name: str) -> tuple[tuple[str, str], ...]:
    """``(name, file)`` of base ``name`` and each base it extends, nearest first."""
    path = file(name)
    loaded, _ = load_file(path, str(path))
    parent = loaded.data.get("extends") if loaded is not None and isinstance(loaded.data, dict) else None
    return ((name, str(path)), *(chain(parent) if is_base(parent) else ()))


def style_defaults(style: str) -> dict[str, Any]:
    """What a spec of ``style`` gets from its base besides the harness: ``items``, ``budget``, ``buffers``."""
    found = data(f"_{style}")
    found.pop("tests", None)
    return found


def harness_defaults() -> dict[str, Any]:
    """What a spec's harness gets from :data:`ROOT`: ``budgets`` and ``max_model_len``."""
    return data(ROOT)["tests"]
