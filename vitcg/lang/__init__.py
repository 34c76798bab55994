"""Spec files -> diagnostics or typed specs: discovery, the per-file pipeline, and the registry.

Pipeline per file: :mod:`.loader` (YAML with positions) -> :mod:`.checks` (schema, formulas, semantics,
bindings) -> :class:`.model.Spec`. Across files, names must be unique. The registry is sorted by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError, suggest
from .bindings import Bindings
from .checks import check, schema
from .loader import load_file, load_text
from .model import Spec
from .registry import Registry

__all__ = ["Bindings", "InvalidSpec", "LoadResult", "Registry", "Spec", "discover", "load_registry", "load_specs",
           "schema", "select_specs", "spec_from_text"]

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


@dataclass(frozen=True)
class InvalidSpec:
    """A spec file that does not validate, selected by name or path: a command that works file by file
    reports it as a failure of its own instead of stopping the others."""

    file: str
    diagnostics: tuple[Diagnostic, ...]

    @property
    def name(self) -> str:
        """The file's stem: a file that does not validate may not have a usable ``name``."""
        return Path(self.file).stem

    def reason(self) -> str:
        """The diagnostics, one block each, after one line saying the file does not validate."""
        count = len(self.diagnostics)
        return (f"{self.file} does not validate ({count} error{'s' if count != 1 else ''}; "
                f"vitcg validate {self.file} lists them):\n" + "\n".join(d.format() for d in self.diagnostics))


def _split(result: LoadResult) -> list[Spec | InvalidSpec]:
    """The valid specs of ``result`` and one :class:`InvalidSpec` per invalid file, sorted by name."""
    invalid = [InvalidSpec(f, tuple(d for d in result.diagnostics if d.file == f)) for f in result.invalid_files]
    return sorted([*result.specs, *invalid], key=lambda entry: entry.name)


def select_specs(names: Sequence[str] | None, all_specs: bool = False,
                 specs_dir: str | Path = "specs") -> list[Spec | InvalidSpec]:
    """The specs named on a command line, in that order and each once, or every spec of ``specs_dir`` with
    ``all_specs``; a file that does not validate is an :class:`InvalidSpec` entry, never an exception.

    A name ending in ``.yaml``/``.yml`` is a file, loaded alone (a folder: its files); any other name is looked up in
    ``specs_dir``, whose other files may be broken without blocking it (a file called ``NAME.yaml`` that
    does not validate answers for ``NAME``). Raises UsageError when nothing is named, a file does not
    exist, or no spec has a name (with a did-you-mean).
    """
    if not names and not all_specs:
        raise UsageError("name specs to check, or pass --all")
    if all_specs:
        result = load_specs([specs_dir])
        if not result.files:
            raise UsageError(f"no spec files (*.yaml) under {specs_dir}")
        return _split(result)
    folder: dict[str, Spec | InvalidSpec] | None = None
    chosen: dict[str, Spec | InvalidSpec] = {}
    for name in names or ():
        if name.endswith(SPEC_SUFFIXES) or Path(name).is_dir():
            entries = _split(load_specs([Path(name)]))
        else:
            if folder is None:
                folder = {entry.name: entry for entry in _split(load_specs([specs_dir]))}
            if name not in folder:
                hint = suggest(name, folder)
                raise UsageError(f"no spec named {name!r} in {specs_dir}/" + (f"; {hint}" if hint else ""))
            entries = [folder[name]]
        # a spec once by name; a broken file once by path (two broken files may share a stem)
        chosen.update((entry.file if isinstance(entry, InvalidSpec) else entry.name, entry) for entry in entries)
    return list(chosen.values())
