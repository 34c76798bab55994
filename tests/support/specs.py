"""The packaged spec files as tests read and copy them: a spec is ``NAME.yaml`` plus, for the shipped specs, its
harness ``NAME.tests.yaml`` beside it. A test that edits a spec's text works on :func:`spec_text`, the spec with its
harness written in as a ``tests:`` section (the other form the language accepts), so one string holds both.
:func:`packaged` is the packaged specs as one :class:`~vitcg.lang.SpecSource`, loaded once for the session."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from support import REPO

SPECS = REPO / "vitcg" / "specs"


@functools.cache
def packaged():
    """The packaged specs (``vitcg/specs/`` of the imported vitcg, bindings checked), loaded once for the session:
    loading all of them
    takes seconds, and a test that only reads specs needs no fresh source (tests/conftest.py loads it while
    collecting, before any test can patch what it reads). The suite never sees ``$VITCG_SPECS_DIR``
    (tests/conftest.py unsets it); a test that sets it, or edits spec files, loads its own."""
    import vitcg
    from vitcg.lang import SpecSource

    # the folder itself, not packaged_specs_dir(): a test may patch that to a folder of its own
    return SpecSource([Path(vitcg.__file__).parent / "specs"])


def spec_path(name: str) -> Path:
    return SPECS / f"{name}.yaml"


def harness_path(name: str) -> Path:
    return SPECS / f"{name}.tests.yaml"


def spec_text(name: str) -> str:
    """``NAME.yaml`` with ``NAME.tests.yaml`` appended as its ``tests:`` section."""
    text = spec_path(name).read_text()
    harness = harness_path(name)
    if not harness.is_file():
        return text
    body = "".join(f"  {line}" if line.strip() else line for line in harness.read_text().splitlines(keepends=True))
    return text.rstrip("\n") + "\n\ntests:\n" + body


def copy_spec(name: str, folder: Path, text: str | None = None) -> Path:
    """Copy spec ``name`` into ``folder`` (its harness too); ``text`` replaces the whole spec (harness included,
    as :func:`spec_text` gives it). Returns the copied spec's path."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.yaml"
    if text is not None:
        target.write_text(text)
        return target
    shutil.copy(spec_path(name), target)
    if harness_path(name).is_file():
        shutil.copy(harness_path(name), folder / f"{name}.tests.yaml")
    return target


def skip_unavailable(name: str) -> None:
    """Skip the calling test, saying why, where the installed transformers predates packaged spec ``name`` (its
    ``transformers:`` key): its classes may be missing, and validate and check report it as unavailable there."""
    spec = packaged().get(name)
    if spec.unavailable:
        pytest.skip(f"{name}: {spec.unavailable}")


def load_test_configs(out_dir: Path) -> dict[str, Any]:
    """``VIT_CUDAGRAPH_TEST_CONFIGS`` of the generated ``test_configs.py`` in ``out_dir``, keyed by spec name.

    Imports the file by path, so tests need no ``sys.path`` changes. Fails the test if it is missing.
    """
    path = out_dir / "test_configs.py"
    if not path.is_file():
        pytest.fail(f"no generated test configs at {path}; run `vitcg generate`")
    module_spec = importlib.util.spec_from_file_location("vitcg_registry_test_configs", path)
    module = importlib.util.module_from_spec(module_spec)
    # dataclasses look their module up in sys.modules while the class body is created.
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module.VIT_CUDAGRAPH_TEST_CONFIGS
