"""The one front door to spec files: a :class:`SpecSource` loads its folders once and answers every question
asked of them: every entry, a selection by names or files, a lookup by model type or architecture, one spec by
name, and the diagnostics.

Layering is written here only: the folders are layers in order (default :func:`.folders.spec_folders`: the packaged
specs, then ``$VITCG_SPECS_DIR``), and a later layer's entry replaces an earlier one's of the same name, logged
at INFO naming both files. Within one layer two specs of one name are an error naming both files. Each entry is
a valid :class:`~.model.Spec` or an :class:`InvalidSpec` (a file that does not validate, named by its stem, with
its diagnostics), so one broken file makes only its own spec unusable (DESIGN.md section 10): asking for it by
name raises its SpecError, every other name answers as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError, suggest
from .bindings import bindings_for
from .folders import folder_label, spec_folders
from .model import Spec

log = logging.getLogger(__name__)

SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class InvalidSpec:
    """A spec file that does not validate: a command that works file by file reports it as a failure of its own
    instead of stopping the others, and asking a source for its name reports why."""

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


Entry = Spec | InvalidSpec


class SpecSource:
    """The specs of ``folders`` (folders or spec files, each a layer; ``one_layer``: all of them one layer), loaded
    once, when the source is made.

    ``bindings`` (default True: import paths and configs checked, with the facts cached unless ``use_cache`` is
    False; False skips those checks, as hosts and ``generate`` do). ``host=True`` is the source of a host engine
    (the vLLM plugin, :func:`vitcg.accelerate`): with the default folders an entry of ``$VITCG_SPECS_DIR`` that is
    not a folder is skipped with a warning, and each file that does not validate is logged at WARNING once per
    process. Iterating gives the valid specs, sorted by name."""

    def __init__(self, folders: Sequence[str | Path] | None = None, *, bindings: bool = True,
                 use_cache: bool = True, host: bool = False, one_layer: bool = False):
        self.folders = spec_folders(skip_missing=host) if folders is None else [Path(f) for f in folders]
        self.where = ", ".join(map(folder_label, self.folders))
        """Where the specs come from, for messages."""
        self._bindings, self._use_cache = bindings, use_cache
        self.files: list[str] = []
        """Every spec file read, of every layer."""
        self.diagnostics: list[Diagnostic] = []
        """Every diagnostic of every file read, replaced layers included."""
        self._by_name: dict[str, list[Entry]] = {}
        self._replaced: dict[str, Spec] = {}
        """By name, the valid spec of an earlier layer that a later layer's broken file replaced: unusable by name,
        but :meth:`find` still answers with it (it cannot know the broken file's model types)."""
        self._load([self.folders] if one_layer else [[folder] for folder in self.folders])
        if host:
            for entry in self.invalid:
                _unusable(entry, self._replaced.get(entry.name))

    @classmethod
    def of_files(cls, paths: Sequence[str | Path], *, bindings: bool = True, use_cache: bool = True) -> SpecSource:
        """The spec files under ``paths`` as one layer (``vitcg validate PATH...``): two specs of one name among
        them are an error naming both files."""
        return cls(paths, bindings=bindings, use_cache=use_cache, one_layer=True)

    def _load(self, layers: list[list[Path]]) -> None:
        from . import load_layer

        bindings = bindings_for(self._bindings, self._use_cache)
        for paths in layers:
            result = load_layer(paths, bindings=bindings)
            self.files += result.files
            self.diagnostics += result.diagnostics
            layer: dict[str, list[Entry]] = {}
            for entry in _entries(result.specs, result.diagnostics):
                layer.setdefault(entry.name, []).append(entry)
            for name, entries in layer.items():
                if any(isinstance(entry, Spec) for entry in entries):
                    self._replaced.pop(name, None)
                elif name in self._by_name:
                    self._replaced.update((name, e) for e in self._by_name[name] if isinstance(e, Spec))
                if name in self._by_name:
                    log.info("spec %r: %s replaces %s (a later spec folder wins)", name, entries[0].file,
                             self._by_name[name][0].file)
            self._by_name.update(layer)
        if bindings is not None:
            bindings.save()
        self._by_name = dict(sorted(self._by_name.items()))

    # -- what was loaded -----------------------------------------------------------------------------------

    def all(self) -> list[Entry]:
        """Every entry (valid or not), sorted by name. Raises UsageError when the folders hold no spec file."""
        entries = [entry for entries in self._by_name.values() for entry in entries]
        if not entries:
            raise UsageError(f"no spec files (*.yaml) under {self.where}")
        return entries

    @property
    def specs(self) -> list[Spec]:
        """The valid specs, sorted by name."""
        return [entry for entries in self._by_name.values() for entry in entries if isinstance(entry, Spec)]

    @property
    def invalid(self) -> list[InvalidSpec]:
        """The files that do not validate (and are not replaced by a later layer), sorted by name and file."""
        return sorted((e for entries in self._by_name.values() for e in entries if isinstance(e, InvalidSpec)),
                      key=lambda entry: (entry.name, entry.file))

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

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def __iter__(self) -> Iterator[Spec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def __contains__(self, name: object) -> bool:
        return any(isinstance(e, Spec) for e in self._by_name.get(name, ()))  # type: ignore[arg-type]

    def require_valid(self) -> SpecSource:
        """This source, for a caller that needs every file valid (``vitcg generate``). Raises SpecError with every
        diagnostic, or UsageError when no spec file is found."""
        if not self.ok:
            raise SpecError(self.diagnostics)
        self.all()
        return self

    # -- questions -----------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Spec:
        return self.get(name)

    def get(self, name: str) -> Spec:
        """The spec called ``name``. Raises SpecError with the diagnostics of the files that answer for ``name``
        and do not validate (even where an earlier layer holds a valid spec of that name: the user's broken
        override is what was asked for), UsageError with a did-you-mean when nothing has that name."""
        entries = self._by_name.get(name, [])
        broken = [d for entry in entries if isinstance(entry, InvalidSpec) for d in entry.diagnostics]
        if broken:
            raise SpecError(broken)
        if not entries:
            hint = suggest(name, self._by_name)
            raise UsageError(f"no spec named {name!r} in {self.where}" + (f"; {hint}" if hint else ""))
        return entries[0]  # type: ignore[return-value]

    def select(self, names: Sequence[str]) -> list[Entry]:
        """The entries named on a command line, in that order and each once. A name ending in ``.yaml``/``.yml``
        (or naming a folder) is a file, loaded alone as one layer; any other name is looked up here, where other
        files may be broken without blocking it (a broken ``NAME.yaml`` answers for ``NAME``). Raises UsageError
        when nothing is named, a file does not exist, or no entry has a name (with a did-you-mean)."""
        if not names:
            raise UsageError("name specs to check, or pass --all")
        chosen: dict[str, Entry] = {}
        for name in names:
            if name.endswith(SPEC_SUFFIXES) or Path(name).is_dir():
                entries = SpecSource.of_files([Path(name)], bindings=self._bindings, use_cache=self._use_cache).all()
            else:
                entries = self._by_name.get(name, [])
                if not entries:
                    hint = suggest(name, self._by_name)
                    raise UsageError(f"no spec named {name!r} in {self.where}" + (f"; {hint}" if hint else ""))
            # a spec once by name; a broken file once by path (two broken files may share a stem)
            chosen.update((entry.file if isinstance(entry, InvalidSpec) else entry.name, entry) for entry in entries)
        return list(chosen.values())

    def find(self, model_type: str | None = None, architectures: Iterable[str] = ()) -> Spec | None:
        """The valid spec that lists one of ``architectures`` (checked first) or ``model_type``; None if none does.
        A valid spec replaced by a broken file of its name still answers here: the broken file's model types are
        unknown, and the warning of a host source says so."""
        architectures = set(architectures)
        candidates = sorted([*self.specs, *self._replaced.values()], key=lambda s: s.name)
        for spec in candidates:
            if architectures & set(spec.architectures):
                return spec
        return next((s for s in candidates if model_type in s.model_types), None)


def _entries(specs: list[Spec], diagnostics: list[Diagnostic]) -> list[Entry]:
    """The valid specs and one :class:`InvalidSpec` per file with diagnostics, sorted by name."""
    files = sorted({d.spec_file for d in diagnostics})
    invalid = [InvalidSpec(f, tuple(d for d in diagnostics if d.spec_file == f)) for f in files]
    return sorted([*specs, *invalid], key=lambda entry: entry.name)


_WARNED: set[tuple[str, str]] = set()
"""(file, first diagnostic) of the broken files already logged: a host builds a source for each model it loads,
and the same broken file is one warning per process (until its error changes)."""


def _unusable(entry: InvalidSpec, fallback: Spec | None) -> None:
    """The one warning for a file that does not validate in a host's source."""
    first, more = entry.diagnostics[0].format(), len(entry.diagnostics) - 1
    if (entry.file, first) in _WARNED:
        return
    _WARNED.add((entry.file, first))
    log.warning("spec %r is unusable: %s does not validate%s: %s%s", entry.name, entry.file,
                f" (lookups by model type use {fallback.file} instead)" if fallback is not None else "", first,
                f"\n(and {more} more; vitcg validate {entry.file} lists them)" if more else "")
