"""The loaded specs as one object: lookup by name (with a did-you-mean), by model type or architecture."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..errors import UsageError, suggest
from .model import Spec


class Registry:
    """Specs sorted by name. ``registry[name]`` / :meth:`get` raise UsageError with a did-you-mean for an
    unknown name; :meth:`find` looks a model up by its ``model_type`` or architecture class name."""

    def __init__(self, specs: Iterable[Spec], source: str = "vitcg/specs/"):
        self._specs = {s.name: s for s in sorted(specs, key=lambda s: s.name)}
        self.source = source
        """Where the specs came from, for messages."""

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
        found = self._specs.get(name)
        if found is None:
            hint = suggest(name, self._specs)
            raise UsageError(f"no spec named {name!r} in {self.source}" + (f"; {hint}" if hint else ""))
        return found

    def find(self, model_type: str | None = None, architectures: Iterable[str] = ()) -> Spec | None:
        """The spec that lists one of ``architectures`` (checked first) or ``model_type``; None if none does."""
        architectures = list(architectures)
        for spec in self:
            if set(architectures) & set(spec.architectures):
                return spec
        return next((s for s in self if model_type in s.model_types), None)
