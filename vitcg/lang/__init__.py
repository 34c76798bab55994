"""Spec files -> diagnostics or typed specs: discovery, the per-file pipeline, and the front door.

Pipeline per file: :mod:`.loader` (YAML with positions) -> :mod:`.resolve` (the spec it ``extends``, its
``NAME.tests.yaml`` harness, its style base from ``styles/``) -> :mod:`.checks` (schema, formulas, semantics, bindings)
-> :class:`.model.Spec`. Within one folder, names must be unique; across folders, a later folder's
spec replaces an earlier one of the same name (:mod:`.folders` has the order: the packaged specs, then
``$VITCG_SPECS_DIR``, then the caller's folders). Every caller that reads spec files goes through one
:class:`.source.SpecSource` (folders loaded once; every entry, a selection, a lookup by model type, the
diagnostics), where a file that does not validate is an :class:`InvalidSpec` that blocks only its own spec
(DESIGN.md section 10). One spec given as text (a draft) is :func:`spec_from_text`; one file flattened for
``vitcg validate --resolved`` is :func:`resolve_file`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError
from .bindings import Bindings, bindings_for
from .checks import check, schema
from .folders import packaged_specs_dir, spec_folders
from .loader import LoadedYaml
from .model import Spec
from .resolve import Resolver, folder_finder, is_harness_file
from .source import SPEC_SUFFIXES, InvalidSpec, SpecSource

__all__ = ["Bindings", "InvalidSpec", "LoadResult", "Spec", "SpecSource", "discover", "packaged_specs_dir",
           "resolve_file", "resolver", "schema", "spec_folders", "spec_from_text"]

log = logging.getLogger(__name__)


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Spec files named by ``paths`` (files, or folders searched recursively, where ``NAME.tests.yaml`` and
    ``NAME.tests.yml`` harness files are not specs of their own), sorted, without repeats. Whatever is named like a
    spec file is found, a link whose target is gone or a FIFO included: loading it says what it is. Raises
    UsageError for a path that names nothing."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in SPEC_SUFFIXES and not is_harness_file(p)
                                and (p.is_symlink() or not p.is_dir())))
        elif os.path.lexists(path):
            found.append(path)
        else:
            raise UsageError(f"no such file or folder: {raw}")
    return list(dict.fromkeys(found))


@dataclass
class LoadResult:
    """What loading a set of spec files gave: the valid specs and every diagnostic."""

    files: list[str] = field(default_factory=list)
    specs: list[Spec] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    @property
    def invalid_files(self) -> list[str]:
        return sorted({d.spec_file for d in self.diagnostics})

    @property
    def unavailable(self) -> list[Spec]:
        """Valid specs that the installed transformers is too old to run (``Spec.unavailable`` says why)."""
        return [s for s in self.specs if s.unavailable]


def resolver(folders: Sequence[str | Path] | None = None) -> Resolver:
    """A :class:`Resolver` whose parents are found beside the spec, then in ``folders`` (default
    :func:`spec_folders`, where an entry of ``$VITCG_SPECS_DIR`` that is not a folder holds no parent: the
    callers that list the folders report it), and must pass the checks that need no transformers."""
    folders = spec_folders(skip_missing=True) if folders is None else folders
    return Resolver(folder_finder([Path(f) for f in folders]), _parent_problems)


def _parent_problems(loaded: LoadedYaml) -> list[Diagnostic]:
    return check(loaded, None)[1]


def resolve_file(path: str | Path, display: str | None = None) -> tuple[LoadedYaml | None, list[Diagnostic]]:
    """One spec file resolved (:mod:`.resolve`): what ``vitcg validate --resolved`` prints."""
    return resolver().resolve_file(Path(path), display)


def spec_from_text(text: str, file: str = "<text>", bindings: Bindings | None = None, at: str | Path | None = None) -> Spec:
    """Validate one spec given as text (it may extend a spec of :func:`spec_folders`; with ``at``, the path it is
    about to be written to, one beside that path first, as the file will). Raises SpecError with every
    diagnostic."""
    loaded, problems = resolver().resolve_text(text, file, Path(at) if at is not None else None)
    spec = None
    if loaded is not None:
        spec, problems = check(loaded, bindings)
    if problems or spec is None:
        raise SpecError(problems)
    return spec


def load_layer(paths: Sequence[str | Path], *, bindings: Bindings | None | bool = True,
               use_cache: bool = True) -> LoadResult:
    """Load and check every spec under ``paths`` as one layer of a :class:`SpecSource`: two specs of one name are
    an error naming both files. Never raises for a bad spec (UsageError for bad paths).

    ``bindings=True`` checks import paths and configs (cached); ``False`` skips those checks.
    """
    bindings = bindings_for(bindings, use_cache)
    result = LoadResult()
    owners: dict[str, tuple[str, int]] = {}
    resolving = resolver()
    for path in discover(paths):
        display = str(path)
        result.files.append(display)
        loaded, problems = resolving.resolve_file(path, display)
        spec = None
        if loaded is not None:
            spec, problems = check(loaded, bindings)
        result.diagnostics.extend(problems)
        if spec is None:
            continue
        if spec.name in owners:
            other, line = owners[spec.name]
            result.diagnostics.append(loaded.diagnostic(
                ("name",), f"spec name {spec.name!r} is already used by {other}:{line}",
                hint="each spec needs a unique name", code="duplicate"))
            continue
        owners[spec.name] = (display, loaded.position(("name",)).line)
        result.specs.append(spec)
    if bindings is not None:
        bindings.save()
    result.specs.sort(key=lambda s: s.name)
    return result
