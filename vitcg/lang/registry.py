"""The loaded specs as one object: lookup by name (with a did-you-mean), by model type or architecture, and the
spec files that did not validate."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import Diagnostic, SpecError, UsageError, suggest
from .model import Spec


@dataclass(frozen=True)
class InvalidSpec:
    """A spec file that does not validate, selected by name or path: a command that works file by file
    reports it as a failure of its own instead of stopping the others, and a host's registry keeps it so that
    asking for it by name reports why."""

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


class Registry:
    """Specs sorted by name. ``registry[name]`` / :meth:`get` raise UsageError with a did-you-mean for an
    unknown name, and SpecError with the file's diagnostics for a name in :attr:`invalid`; :meth:`find` looks a
    model up by its ``model_type`` or architecture class name."""

    def __init__(self, specs: Iterable[Spec], source: str = "vitcg/specs/", invalid: Iterable[InvalidSpec] = (),
                 fallbacks: Iterable[Spec] = ()):
        self._specs = {s.name: s for s in sorted(specs, key=lambda s: s.name)}
        self.source = source
        """Where the specs came from, for messages."""
        self.invalid = sorted(invalid, key=lambda entry: (entry.name, entry.file))
        """Spec files that did not validate (``load_registry(skip_invalid=True)``): their names (the file's
        stem) are unusable, and asking for one raises SpecError with its file's diagnostics."""
        self._fallbacks = sorted(fallbacks, key=lambda s: s.name)
        """Valid specs of an earlier folder that a broken file of the same name replaced: unusable by name, but
        :meth:`find` still answers with them (it cannot know the broken file's model types)."""

    def __iter__(self) -> Iterator[Spec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __getitem__(self, name: str) -> Spec:
        return self.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def get(self, name: str) -> Spec:
        """The spec called ``name``. Raises SpecError with the diagnostics of the files in :attr:`invalid` that
        answer for ``name`` (even where an earlier folder holds a valid spec of that name: the user's broken
        override is what was asked for), UsageError with a did-you-mean when no spec has that name."""
        broken = [d for entry in self.invalid if entry.name == name for d in entry.diagnostics]
        if broken:
            raise SpecError(broken)
        found = self._specs.get(name)
        if found is None:
            hint = suggest(name, [*self._specs, *(entry.name for entry in self.invalid)])
            raise UsageError(f"no spec named {name!r} in {self.source}" + (f"; {hint}" if hint else ""))
        return found

    def find(self, model_type: str | None = None, architectures: Iterable[str] = ()) -> Spec | None:
        """The spec that lists one of ``architectures`` (checked first) or ``model_type``; None if none does.
        A valid spec replaced by a broken file of its name still answers here (see :attr:`invalid`)."""
        architectures = list(architectures)
        candidates = sorted([*self, *self._fallbacks], key=lambda s: s.name)
        for spec in candidates:
            if set(architectures) & set(spec.architectures):
                return spec
        return next((s for s in candidates if model_type in s.model_types), None)
