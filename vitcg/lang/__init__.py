"""Spec files -> diagnostics or typed specs: discovery, the per-file pipeline, and the registry.

Pipeline per file: :mod:`.loader` (YAML with positions) -> :mod:`.checks` (schema, formulas, semantics,
bindings) -> :class:`.model.Spec`. Across files, names must be unique. The registry is sorted by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError
from .bindings import Bindings
from .checks import check, schema
from .loader import load_file, load_text
from .model import Spec
from .registry import Registry

__all__ = ["Bindings", "LoadResult", "Registry", "Spec", "discover", "load_registry", "load_specs", "schema", "spec_from_text"]

SPEC_SUFFIXES = (".yaml", ".yml")


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Spec files named by ``paths`` (files, or folders searched recursively), sorted, without repeats."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in SPEC_SUFFIXES and p.is_file()))
        elif path.is_file():
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
        return sorted({d.file for d in self.diagnostics})

    @property
    def unavailable(self) -> list[Spec]:
        """Valid specs that the installed transformers is too old to run (``Spec.unavailable`` says why)."""
        return [s for s in self.specs if s.unavailable]


def spec_from_text(text: str, file: str = "<text>", bindings: Bindings | None = None) -> Spec:
    """Validate one spec given as text. Raises SpecError with every diagnostic."""
    loaded, problems = load_text(text, file)
    spec = None
    if loaded is not None:
        spec, problems = check(loaded, bindings)
    if problems or spec is None:
        raise SpecError(problems)
    return spec


def load_specs(paths: Sequence[str | Path] = ("specs",), *, bindings: Bindings | None | bool = True,
               use_cache: bool = True) -> LoadResult:
    """Load and check every spec under ``paths``; never raises for a bad spec (UsageError for bad paths).

    ``bindings=True`` checks import paths and configs (cached); ``False`` skips those checks.
    """
    if bindings is True:
        bindings = Bindings(use_cache=use_cache)
    elif bindings is False:
        bindings = None
    result = LoadResult()
    owners: dict[str, tuple[str, int]] = {}
    for path in discover(paths):
        display = str(path)
        result.files.append(display)
        loaded, problems = load_file(path, display)
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


def load_registry(paths: Sequence[str | Path] = ("specs",), **kwargs) -> Registry:
    """Every spec under ``paths`` as a :class:`Registry`. Raises SpecError if any file is invalid."""
    result = load_specs(paths, **kwargs)
    if not result.ok:
        raise SpecError(result.diagnostics)
    if not result.specs:
        raise UsageError(f"no spec files under {', '.join(map(str, paths))}")
    return Registry(result.specs, ", ".join(f"{p}/" if Path(p).is_dir() else str(p) for p in paths))
