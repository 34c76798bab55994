"""Spec files -> diagnostics or typed specs: discovery, the per-file pipeline, and the registry.

Pipeline per file: :mod:`.loader` (YAML with positions) -> :mod:`.resolve` (the spec it ``extends``, its
``NAME.tests.yaml`` harness, the language's defaults) -> :mod:`.checks` (schema, formulas, semantics, bindings)
-> :class:`.model.Spec`. Within one folder, names must be unique; across folders, a later folder's
spec replaces an earlier one of the same name (:mod:`.folders` has the order: the packaged specs, then
``$VITCG_SPECS_DIR``, then the caller's folders). The registry is sorted by name. A host's registry
(``load_registry(skip_invalid=True)``) keeps each file that does not validate as an :class:`InvalidSpec`
beside the valid specs, so that it blocks only its own spec (DESIGN.md section 10).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError, suggest
from .bindings import Bindings
from .checks import check, schema
from .folders import folder_label, packaged_specs_dir, spec_folders
from .loader import LoadedYaml
from .model import Spec
from .registry import InvalidSpec, Registry
from .resolve import Resolver, folder_finder, is_harness_file

__all__ = ["Bindings", "InvalidSpec", "LoadResult", "Registry", "Spec", "discover", "load_layers", "load_registry",
           "load_specs", "packaged_specs_dir", "resolve_file", "resolver", "schema", "select_specs", "spec_folders",
           "spec_from_text"]

log = logging.getLogger(__name__)

SPEC_SUFFIXES = (".yaml", ".yml")


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


def spec_from_text(text: str, file: str = "<text>", bindings: Bindings | None = None) -> Spec:
    """Validate one spec given as text (it may extend a spec of :func:`spec_folders`). Raises SpecError with every
    diagnostic."""
    loaded, problems = resolver().resolve_text(text, file)
    spec = None
    if loaded is not None:
        spec, problems = check(loaded, bindings)
    if problems or spec is None:
        raise SpecError(problems)
    return spec


def _bindings(bindings: Bindings | None | bool, use_cache: bool) -> Bindings | None:
    if bindings is True:
        return Bindings(use_cache=use_cache)
    return None if bindings is False else bindings


def load_specs(paths: Sequence[str | Path], *, bindings: Bindings | None | bool = True,
               use_cache: bool = True) -> LoadResult:
    """Load and check every spec under ``paths`` as one set: two specs of one name are an error naming both
    files. Never raises for a bad spec (UsageError for bad paths).

    ``bindings=True`` checks import paths and configs (cached); ``False`` skips those checks.
    """
    bindings = _bindings(bindings, use_cache)
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


def load_layers(folders: Sequence[str | Path], *, bindings: Bindings | None | bool = True,
                use_cache: bool = True) -> LoadResult:
    """Load each of ``folders`` (folders, or spec files) as one layer, in order: a spec of a later layer replaces
    the spec of the same ``name`` from an earlier one, logged at INFO naming both files; within one layer,
    :func:`load_specs`' rule holds (two specs of one name are an error naming both). ``files`` and
    ``diagnostics`` cover every layer. Never raises for a bad spec (UsageError for bad paths)."""
    bindings = _bindings(bindings, use_cache)
    result = LoadResult()
    chosen: dict[str, Spec] = {}
    for folder in folders:
        layer = load_specs([folder], bindings=bindings)
        result.files.extend(layer.files)
        result.diagnostics.extend(layer.diagnostics)
        for spec in layer.specs:
            if spec.name in chosen:
                _replaced(spec.name, spec.file, chosen[spec.name].file)
            chosen[spec.name] = spec
    result.specs = sorted(chosen.values(), key=lambda s: s.name)
    return result


def load_registry(paths: Sequence[str | Path] | None = None, *, skip_invalid: bool = False,
                  bindings: Bindings | None | bool = True, use_cache: bool = True) -> Registry:
    """The specs of ``paths`` as a :class:`Registry`, each path a layer of :func:`load_layers` (later ones
    replace earlier specs by name). The default is :func:`spec_folders`: the packaged specs, then
    ``$VITCG_SPECS_DIR``. ``bindings`` and ``use_cache`` go to :func:`load_layers`. Raises SpecError if any file
    is invalid, UsageError for bad paths or when no spec is found.

    ``skip_invalid=True`` is the host's registry (the vLLM plugin, :func:`vitcg.accelerate`), where a broken
    file makes only its own spec unusable (DESIGN.md section 10): each file that does not validate is logged
    at WARNING with its first diagnostic (once per process) and kept in :attr:`Registry.invalid`, so asking
    for it by name raises SpecError with its diagnostics; its name is the file's stem and replaces an earlier folder's spec of
    that name as a valid file would, though :meth:`Registry.find` still answers with that earlier spec (it
    cannot know the broken file's model types) and the warning says so. With the default ``paths``, an entry
    of ``$VITCG_SPECS_DIR`` that is not a folder is skipped with a warning (:func:`spec_folders`'
    ``skip_missing``). Then only a bad path the caller names, or no valid spec at all, raises (UsageError)."""
    paths = spec_folders(skip_missing=skip_invalid) if paths is None else list(paths)
    source = ", ".join(map(folder_label, paths))
    invalid: list[InvalidSpec] = []
    fallbacks: dict[str, Spec] = {}
    if skip_invalid:
        by_name, fallbacks = _layered_entries(paths, _bindings(bindings, use_cache))
        entries = [entry for name in sorted(by_name) for entry in by_name[name]]
        specs = [entry for entry in entries if isinstance(entry, Spec)]
        invalid = [entry for entry in entries if isinstance(entry, InvalidSpec)]
        for entry in invalid:
            _unusable(entry, fallbacks.get(entry.name))
    else:
        result = load_layers(paths, bindings=bindings, use_cache=use_cache)
        if not result.ok:
            raise SpecError(result.diagnostics)
        specs = result.specs
    if not specs:
        raise UsageError(f"no spec files under {', '.join(map(str, paths))}")
    return Registry(specs, source, invalid, fallbacks.values())


_WARNED: set[tuple[str, str]] = set()
"""(file, first diagnostic) of the broken files already logged: a host loads its registry for each model it
builds, and the same broken file is one warning per process (until its error changes)."""


def _unusable(entry: InvalidSpec, fallback: Spec | None) -> None:
    """The one warning for a file that does not validate in a host's registry."""
    first, more = entry.diagnostics[0].format(), len(entry.diagnostics) - 1
    if (entry.file, first) in _WARNED:
        return
    _WARNED.add((entry.file, first))
    log.warning("spec %r is unusable: %s does not validate%s: %s%s", entry.name, entry.file,
                f" (lookups by model type use {fallback.file} instead)" if fallback is not None else "", first,
                f"\n(and {more} more; vitcg validate {entry.file} lists them)" if more else "")


def _split(result: LoadResult) -> list[Spec | InvalidSpec]:
    """The valid specs of ``result`` and one :class:`InvalidSpec` per invalid file, sorted by name."""
    invalid = [InvalidSpec(f, tuple(d for d in result.diagnostics if d.spec_file == f)) for f in result.invalid_files]
    return sorted([*result.specs, *invalid], key=lambda entry: entry.name)


def _layered_entries(folders: Sequence[str | Path], bindings: Bindings | None | bool = True
                     ) -> tuple[dict[str, list[Spec | InvalidSpec]], dict[str, Spec]]:
    """The specs and invalid files of ``folders`` by name (an invalid file's name is its stem), a later folder's
    replacing an earlier one's as in :func:`load_layers`; and, by name, each valid spec that a later folder's
    invalid files replaced (the latest one, while no valid spec of that name comes after them)."""
    bindings = _bindings(bindings, use_cache=True)
    by_name: dict[str, list[Spec | InvalidSpec]] = {}
    replaced: dict[str, Spec] = {}
    for folder in folders:
        layer: dict[str, list[Spec | InvalidSpec]] = {}
        for entry in _split(load_specs([folder], bindings=bindings)):
            layer.setdefault(entry.name, []).append(entry)
        for name, entries in layer.items():
            if any(isinstance(entry, Spec) for entry in entries):
                replaced.pop(name, None)
            elif name in by_name:
                replaced.update((name, e) for e in by_name[name] if isinstance(e, Spec))
            if name in by_name:
                _replaced(name, entries[0].file, by_name[name][0].file)
        by_name.update(layer)
    return by_name, replaced


def _replaced(name: str, new: str, old: str) -> None:
    log.info("spec %r: %s replaces %s (a later spec folder wins)", name, new, old)


def select_specs(names: Sequence[str] | None, all_specs: bool = False,
                 folders: Sequence[str | Path] | None = None) -> list[Spec | InvalidSpec]:
    """The specs named on a command line, in that order and each once, or every spec of ``folders`` with
    ``all_specs``; a file that does not validate is an :class:`InvalidSpec` entry, never an exception.

    ``folders`` are layered as in :func:`load_layers` (default :func:`spec_folders`: the packaged specs, then
    ``$VITCG_SPECS_DIR``). A name ending in ``.yaml``/``.yml`` is a file, loaded alone (a folder: its files);
    any other name is looked up in ``folders``, whose other files may be broken without blocking it (a file
    called ``NAME.yaml`` that does not validate answers for ``NAME``). Raises UsageError when nothing is named,
    a file does not exist, or no spec has a name (with a did-you-mean).
    """
    if not names and not all_specs:
        raise UsageError("name specs to check, or pass --all")
    folders = spec_folders() if folders is None else list(folders)
    where = ", ".join(map(folder_label, folders))
    if all_specs:
        entries, _ = _layered_entries(folders)
        if not entries:
            raise UsageError(f"no spec files (*.yaml) under {where}")
        return [entry for name in sorted(entries) for entry in entries[name]]
    by_name: dict[str, list[Spec | InvalidSpec]] | None = None
    chosen: dict[str, Spec | InvalidSpec] = {}
    for name in names or ():
        if name.endswith(SPEC_SUFFIXES) or Path(name).is_dir():
            entries = _split(load_specs([Path(name)]))
        else:
            if by_name is None:
                by_name, _ = _layered_entries(folders)
            if name not in by_name:
                hint = suggest(name, by_name)
                raise UsageError(f"no spec named {name!r} in {where}" + (f"; {hint}" if hint else ""))
            entries = by_name[name]
        # a spec once by name; a broken file once by path (two broken files may share a stem)
        chosen.update((entry.file if isinstance(entry, InvalidSpec) else entry.name, entry) for entry in entries)
    return list(chosen.values())
