"""The one public errors module: diagnostics and the exceptions that carry them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import asdict, dataclass


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """A "did you mean" hint for an unknown ``name``, or None when nothing is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


SHOWN_CHARS = 60
"""Longest echo of a user's value in a message: a diagnostic names the value, it does not reprint a file."""


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters with ``...`` when longer."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
"""Characters that end a line (``str.splitlines``), as escapes: a diagnostic is one line whatever the spec holds."""


@dataclass(frozen=True)
class Diagnostic:
    """One problem in one spec file, located as precisely as the YAML allows."""

    file: str
    """Path of the spec file, as the user named it."""
    line: int
    """1-based line of the offending node (0 when the file could not be read at all)."""
    col: int
    """1-based column of the offending node (0 when unknown)."""
    path: str
    """YAML path of the offending node, JSONPath style: ``$.geometry.patch_size``."""
    message: str
    """What is wrong, in one line."""
    hint: str | None = None
    """How to fix it, when there is something useful to say."""
    code: str = "spec"
    """Stable category: ``yaml``, ``schema``, ``formula``, ``semantic``, ``binding``, ``duplicate``, ``extends``,
    ``let``."""
    via: str | None = None
    """The spec file being checked, when the location is in another file: a parent it ``extends`` or its
    ``NAME.tests.yaml`` harness. None: the location is in the spec file itself."""

    @property
    def spec_file(self) -> str:
        """The spec file this diagnostic makes invalid."""
        return self.via or self.file

    def location(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def format(self) -> str:
        """``file:line:col: path: message`` plus an indented ``hint:`` line."""
        text = f"{self.location()}: {self.path}: {self.message}".translate(_LINE_BREAKS)
        if self.via:
            text += f" (checking {self.via})".translate(_LINE_BREAKS)
        if self.hint:
            text += f"\n    hint: {self.hint.translate(_LINE_BREAKS)}"
        return text

    def to_json(self) -> dict:
        return asdict(self)


class VitcgError(Exception):
    """Base class of every error vitcg raises on purpose."""

    exit_code = 1


class SpecError(VitcgError, ValueError):
    """One or more spec files are invalid; ``diagnostics`` says where and why."""

    def __init__(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...]):
        self.diagnostics = tuple(diagnostics)
        lines = [d.format() for d in self.diagnostics] or ["invalid spec"]
        super().__init__("\n".join(lines))


class UsageError(VitcgError, ValueError):
    """The command was used wrongly: a path that does not exist, an option out of range."""

    exit_code = 2


class FormulaError(VitcgError, ValueError):
    """A formula failed to parse or evaluate; ``col`` is the 0-based offset inside the formula text."""

    def __init__(self, message: str, *, col: int = 0, hint: str | None = None):
        self.message = message
        self.col = col
        self.hint = hint
        super().__init__(message)


class BudgetError(VitcgError, ValueError):
    """Token budgets or batch limits violate an invariant of the graph manager."""


class InputError(VitcgError, ValueError):
    """A caller's bad input at run time: multimodal kwargs that do not match what the spec declares (missing
    keys, bad shapes), item indices out of range, engine limits that are missing."""


class SpecRuntimeError(VitcgError, RuntimeError):
    """A spec that validated fails against the real encoder at run time: an output field the encoder does
    not return, rows that do not add up to ``items.output_tokens``, a graph scope that is never called."""


class HostSyncError(VitcgError, RuntimeError):
    """The fixed-shape forward does something a CUDA graph cannot capture (a host sync, a shape from data)."""


class UnsupportedError(VitcgError, AttributeError):
    """A protocol member this adapter cannot provide (a graph-scoped spec under a protocol-only manager).
    An AttributeError, so ``hasattr`` and protocol checks see the member as absent."""


class RenderError(VitcgError, ValueError):
    """A template could not be rendered from the specs (missing field, bad template)."""
