"""Helpers the rule modules share: semantic diagnostics, YAML path lookup, formulas parsed with their positions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import Diagnostic, FormulaError
from ..formulas import Formula, parse
from ..loader import LoadedYaml, Path_, Position, sexagesimal_hint


def error(loaded: LoadedYaml, path: Path_, message: str, *, hint: str | None = None, code: str = "semantic",
          key: bool = False) -> Diagnostic:
    """A diagnostic at ``path`` (at its key with ``key=True``), of code ``semantic`` unless told."""
    return loaded.diagnostic(path, message, hint=hint, code=code, key=key)


def value_at(data: Any, path: Path_) -> Any:
    """The node of ``data`` at a YAML path."""
    node = data
    for part in path:
        node = node[part]
    return node


def formula_diagnostic(loaded: LoadedYaml, path: Path_, exc: FormulaError, context: str = "") -> Diagnostic:
    """A formula error located at its character inside the formula's YAML scalar, when the scalar is one line."""
    probe, pos = loaded.locate(path)
    source = value_at(loaded.data, path)
    style = loaded.styles.get(path)
    quoted = 1 if style in ("'", '"') else 0
    lead = len(source) - len(source.lstrip()) if isinstance(source, str) else 0
    col = pos.col + quoted + lead + exc.col if style in (None, "'", '"') else pos.col
    message = exc.message + (f" ({context})" if context else "")
    hint = exc.hint or sexagesimal_hint(loaded, path, source)
    if isinstance(path[-1], int) and ("never closed" in exc.message or "unmatched ')'" in exc.message):
        hint = "in a YAML [...] list a comma splits items: quote a formula that holds commas"
    return loaded.at(probe, Position(pos.line, col), path, message, hint, "formula")


def parse_at(loaded: LoadedYaml, path: Path_, vocabulary: Iterable[str], *,
             allow_config: bool = False) -> tuple[Formula | None, list[Diagnostic]]:
    """The formula at ``path`` parsed against ``vocabulary``, or None and the diagnostic saying why not."""
    try:
        return parse(value_at(loaded.data, path), vocabulary, allow_config=allow_config), []
    except FormulaError as exc:
        return None, [formula_diagnostic(loaded, path, exc)]
