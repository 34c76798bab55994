"""``let:``: formulas a spec file names once and uses by name.

A spec file may hold ``let: {rows: 'budget * max(1, min(max_frames, temporal_patch_size))'}`` and write ``rows``
in any formula of its ``geometry``, ``items``, ``budget``, ``buffers`` and ``modalities`` (a later ``let`` may use
an earlier one). Resolution expands each name where it is used, in the file that writes the ``let``, before that
file is merged over its parent: a ``let`` is the file's own, neither inherited by a child nor seen by a parent's
formulas, and ``vitcg validate --resolved`` prints the formulas written out. A name no formula could read
otherwise (not a geometry name, a limit, a buffer or item name, a function); a formula, checked for syntax where
the ``let`` writes it and for its names where it is used; a name that no formula uses is an error (a misspelt use
would otherwise read as an unknown name elsewhere).
"""

from __future__ import annotations

import ast
import keyword
import warnings
from typing import Any

from ..errors import Diagnostic
from . import catalogue as cat
from .formulas import MAX_SOURCE_CHARS
from .loader import LoadedYaml, Path_

LET = "let"
SECTIONS = ("geometry", "items", "budget", "buffers", "modalities")
"""The top-level keys whose strings are formulas (or hold formulas) that may use a ``let`` name."""
FUNCTIONS = ("min", "max", "ceil_div", "isqrt", "len", "config")


def reserved(data: dict, inherited: dict | None = None) -> set[str]:
    """Names a ``let`` may not take: every name some formula of the spec language reads, the geometry names of the
    file and of what it inherits (``inherited``: its parent's data), and the formula language's functions and
    Python's keywords."""
    geometry = {**_mapping(inherited, "geometry"), **_mapping(data, "geometry")}
    return {*cat.LIMIT_NAMES, *cat.BUFFER_NAMES, *cat.CAPACITY_NAMES, "valid", *FUNCTIONS, *keyword.kwlist,
            *(n for style in cat.STYLES.values() for n in style.item_names),
            *(n for names in cat.SHAPING_NAMES.values() for n in names),
            *geometry}


def _mapping(data: dict | None, key: str) -> dict:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def expand(loaded: LoadedYaml, inherited: dict | None = None) -> list[Diagnostic]:
    """Expand ``loaded``'s own ``let`` names in place and drop its ``let`` mapping; the diagnostics of a ``let``
    that cannot be used (none: done). ``inherited``: the resolved parent's data, whose geometry names a ``let``
    may not take either."""
    data = loaded.data
    if not isinstance(data, dict) or LET not in data:
        return []
    used: set[str] = set()
    lets, problems = _lets(loaded, data[LET], used, reserved(data, inherited))
    if not problems:
        for section in SECTIONS:
            if section in data:
                data[section] = _expanded(data[section], lets, used)
        problems = [loaded.diagnostic((LET, name), f"let {name!r} is not used by any formula",
                                      hint="use it in a formula of geometry, items, budget, buffers or modalities, "
                                           "or delete it", code="let", key=True)
                    for name in lets if name not in used]
    if not problems:
        del data[LET]
    return problems


def _lets(loaded: LoadedYaml, written: Any, used: set[str],
          taken: set[str]) -> tuple[dict[str, ast.expr], list[Diagnostic]]:
    """The ``let`` mapping as parsed formulas (each with the earlier names it uses, added to ``used``, expanded),
    or its diagnostics."""
    if not isinstance(written, dict) or not written:
        return {}, [loaded.diagnostic((LET,), "let must be a mapping of names to formulas",
                                      hint="let: {rows: 'budget * 2'}", code="let")]
    lets: dict[str, ast.expr] = {}
    problems = []
    for name, value in written.items():
        at: Path_ = (LET, name)
        if not isinstance(name, str) or not name.isidentifier():
            problems.append(loaded.diagnostic(at, f"let name {name!r} is not a name", code="let", key=True,
                                              hint="a letter or underscore, then letters, digits or underscores"))
        elif name in taken:
            problems.append(loaded.diagnostic(at, f"let name {name!r} is a name formulas already read", code="let",
                                              key=True, hint="choose another name"))
        elif isinstance(value, bool) or not isinstance(value, (int, str)):
            problems.append(loaded.diagnostic(at, f"let {name!r} must be a formula (a string or an integer), not "
                                                  f"{type(value).__name__}", code="let"))
        else:
            tree = _parse(str(value))
            if isinstance(tree, str):
                problems.append(loaded.diagnostic(at, f"let {name!r}: {tree}", code="let"))
            else:
                tree = _Substitute(lets, used).visit(tree)
                size = len(ast.unparse(tree))
                if size > MAX_SOURCE_CHARS:  # the bound of a formula, kept as names nest (no let bomb)
                    problems.append(loaded.diagnostic(at, f"let {name!r} is {size:,} characters written out; a "
                                                          f"formula is at most {MAX_SOURCE_CHARS}", code="let"))
                else:
                    lets[name] = tree
    return lets, problems


def _parse(source: str) -> ast.expr | str:
    """The expression of ``source``, or why it is none."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        return f"invalid syntax: {exc.msg}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"cannot parse formula: {exc}"


def _expanded(value: Any, lets: dict[str, ast.expr], used: set[str]) -> Any:
    """``value`` (a section's data) with every ``let`` name in its formula strings written out."""
    if isinstance(value, dict):
        return {k: _expanded(v, lets, used) for k, v in value.items()}
    if isinstance(value, list):
        return [_expanded(v, lets, used) for v in value]
    if not isinstance(value, str) or not any(name in value for name in lets):
        return value
    tree = _parse(value)
    if isinstance(tree, str):
        return value  # not a formula: the checks say what it is
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & set(lets)
    if not named:
        return value
    used.update(named)
    return ast.unparse(_Substitute(lets, used).visit(tree))


class _Substitute(ast.NodeTransformer):
    """Replaces each ``let`` name by (a copy of) its formula; ast.unparse adds the parentheses precedence needs."""

    def __init__(self, lets: dict[str, ast.expr], used: set[str]):
        self.lets, self.used = lets, used

    def visit_Name(self, node: ast.Name) -> ast.expr:
        formula = self.lets.get(node.id)
        if formula is None:
            return node
        self.used.add(node.id)
        return ast.parse(ast.unparse(formula), mode="eval").body
