"""Geometry and attention rules: geometry formulas in order, the names every spec or style needs, segments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import Diagnostic, FormulaError
from .. import catalogue as cat
from ..formulas import Formula, parse
from ..loader import LoadedYaml
from .common import error, formula_diagnostic

REQUIRED_GEOMETRY = {"out_hidden_size": "the width of one output row (all output fields concatenated)"}


def parse_geometry(loaded: LoadedYaml) -> tuple[list[tuple[str, Formula]], list[Diagnostic]]:
    """Each geometry entry parses, reading config fields and only the names defined above it."""
    geometry: dict[str, Any] = loaded.data["geometry"]
    declared = list(geometry)
    out: list[tuple[str, Formula]] = []
    problems: list[Diagnostic] = []
    for index, name in enumerate(declared):
        try:
            out.append((name, parse(geometry[name], declared[:index], allow_config=True)))
        except FormulaError as exc:
            later = [n for n in declared[index:] if exc.message == f"unknown name {n!r}"]
            if later:
                exc.hint = f"{later[0]!r} is defined below; geometry entries may only use names above them"
            problems.append(formula_diagnostic(loaded, ("geometry", name), exc))
    return out, problems


def geometry_defines_required(loaded: LoadedYaml) -> Iterator[Diagnostic]:
    """The geometry defines the names every spec needs (``out_hidden_size``)."""
    for name, hint in REQUIRED_GEOMETRY.items():
        if name not in loaded.data["geometry"]:
            yield error(loaded, ("geometry",), f"geometry must define {name!r}", hint=hint)


def geometry_defines_style_names(loaded: LoadedYaml, style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """The geometry defines the names the attention style reads."""
    for name in style.geometry:
        if name not in loaded.data["geometry"]:
            yield error(loaded, ("geometry",), f"{style.name} style needs geometry {name!r}",
                        hint=f"a {style.name} spec defines: {', '.join(style.geometry)}")


def segments_apply(loaded: LoadedYaml, style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """``attention.segments``, when given, is one the style supports."""
    given = loaded.data["attention"].get("segments")
    if given is not None and given not in style.segments:
        yield error(loaded, ("attention", "segments"),
                    f"{style.name} style: {cat.SEGMENT_DOCS[style.segments[0]]}; 'segments' does not apply",
                    hint="remove 'segments'")
