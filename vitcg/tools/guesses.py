"""What a draft still guesses: the ``# GUESS:`` lines ``vitcg new`` writes and its placeholder checkpoints.

A draft that passes ``vitcg check`` is not finished while these remain: a guess the check cannot see (a display
name, a note, a checkpoint) is still unconfirmed, and a placeholder checkpoint (``org/NAME``) names no model at all.
``vitcg check`` reads them from the spec's own files (the spec file and its ``NAME.tests.yaml``; a parent spec it
``extends`` is not the draft) and says "proven, with N guesses left" instead of "proven" (:mod:`.report`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..lang.model import Spec
from ..lang.resolve import harness_files

MARK = "# GUESS: "
"""How a guessed line of a draft ends: ``key: value   # GUESS: what to verify``."""
PLACEHOLDER_ORG = "org"
"""The organisation of the placeholder checkpoint a draft writes (``org/NAME``) where it knows no real one."""
_PLACEHOLDER = re.compile(rf"(?<![\w./-]){PLACEHOLDER_ORG}/[\w.-]+")
_MARKED = re.compile(rf"(?:^|\s){re.escape(MARK.strip())}")
"""A guess comment: at the start of a line or after blank space, also after a commented-out line (a draft's
``# budget: ...   # GUESS: ...``); ``"# GUESS:"`` quoted in a draft's header is no guess of its own."""


def placeholder_checkpoint(name: str) -> str:
    """The checkpoint a draft of spec ``name`` writes until the real one is known: ``org/NAME``."""
    return f"{PLACEHOLDER_ORG}/{name}"


def is_placeholder(checkpoint: str) -> bool:
    """Whether ``checkpoint`` is a draft's placeholder (``org/NAME``), not a real checkpoint."""
    return _PLACEHOLDER.fullmatch(checkpoint) is not None


@dataclass(frozen=True)
class Guess:
    """One line of a spec's own files that is still a guess."""

    file: str
    line: int
    """1-based."""
    text: str
    """The line as written, stripped (``checkpoints: [org/x]   # GUESS: real checkpoint names``)."""

    def format(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "text": self.text}


def guesses(spec: Spec) -> list[Guess]:
    """Every line of the spec's own files that holds a ``# GUESS:`` comment or one of the spec's placeholder
    checkpoints, in file order (a line holding both counts once). A file that cannot be read holds none: it was
    read moments ago to load the spec, and a check never fails for this note."""
    placeholders = [c for c in spec.checkpoints if is_placeholder(c)]
    found = []
    for path in [Path(spec.file), *harness_files(Path(spec.file))]:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        display = spec.file if path == Path(spec.file) else str(path)
        for number, line in enumerate(lines, 1):
            code = line.split("#", 1)[0]
            if _MARKED.search(line) or any(_mentions(code, c) for c in placeholders):
                found.append(Guess(display, number, line.strip()))
    return found


def _mentions(code: str, checkpoint: str) -> bool:
    return any(m.group(0) == checkpoint for m in _PLACEHOLDER.finditer(code))
