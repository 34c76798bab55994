"""A tiny integer formula language, parsed with ``ast`` against a whitelist and evaluated without ``eval``.

Grammar: integer literals, names from the field's vocabulary, ``+ - * // %``, ``**`` with a bounded
exponent, unary minus, parentheses, ``min(a, b, ...)``, ``max(a, b, ...)``, ``ceil_div(a, b)``.
Geometry formulas may also read the Hugging Face config: ``config.vision_config.patch_size[0]`` and
``len(config.deepstack_visual_indexes)``. Every value is a Python ``int``; anything else is an error.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormulaError, suggest

MAX_SOURCE_CHARS = 400
MAX_NODES = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 2**62

_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
               ast.Mod: operator.mod}
"""What each operator of :data:`_BINOPS` but ``**`` (bounded on its own) computes."""
_FUNCTIONS = {"min": (2, None), "max": (2, None), "ceil_div": (2, 2), "isqrt": (1, 1)}
CONFIG_ROOT = "config"


@dataclass(frozen=True)
class Formula:
    """A parsed, whitelisted formula; evaluate it with :meth:`evaluate`."""

    source: str
    names: frozenset[str]
    """Plain names the formula reads (``config`` excluded)."""
    config_paths: tuple[str, ...]
    """Config reads, as written: ``config.vision_config.patch_size[0]``."""
    _tree: ast.expr = field(repr=False, compare=False)

    def evaluate(self, values: Mapping[str, int], config: Any = None) -> int:
        """Evaluate with ``values`` for names and ``config`` (a nested dict) for ``config.*`` reads.

        Raises FormulaError for unknown names, division by zero, or out-of-range results.
        """
        return _Evaluator(values, config).run(self._tree)

    def __str__(self) -> str:
        return self.source

    def same_as(self, other: Formula) -> bool:
        """Whether ``other`` is the same expression, whatever its spacing and parentheses."""
        return ast.dump(self._tree) == ast.dump(other._tree)


def parse(source: Any, vocabulary: Iterable[str], *, allow_config: bool = False) -> Formula:
    """Parse ``source`` into a :class:`Formula` whose names all come from ``vocabulary``.

    An integer is accepted as a constant formula. Raises FormulaError with the 0-based column.
    """
    if isinstance(source, bool) or not isinstance(source, (int, str)):
        raise FormulaError(f"a formula must be an integer or a string, not {type(source).__name__}")
    if isinstance(source, int):
        _check_range(source, 0)
        source = str(source)
    if len(source) > MAX_SOURCE_CHARS:
        raise FormulaError(f"formula is {len(source):,} characters; formulas are limited to {MAX_SOURCE_CHARS}")
    if not source.strip():
        raise FormulaError("formula is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "invalid decimal literal" and friends: the error says it
            tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        col = max((exc.offset or 1) - 1, 0)
        raise FormulaError(f"invalid syntax: {exc.msg}", col=col) from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise FormulaError(f"cannot parse formula: {exc}") from None
    vocabulary = frozenset(vocabulary)
    checker = _Checker(vocabulary, allow_config)
    checker.visit_root(tree)
    return Formula(source.strip(), frozenset(checker.names), tuple(checker.config_paths), tree)


def _col(node: ast.AST) -> int:
    return getattr(node, "col_offset", 0)


def _check_range(value: int, col: int) -> int:
    if abs(value) > MAX_MAGNITUDE:
        raise FormulaError(f"value {value} is out of range (|x| <= 2**62)", col=col)
    return value


class _Checker:
    """Walks a parsed tree once and rejects every construct outside the whitelist."""

    def __init__(self, vocabulary: frozenset[str], allow_config: bool):
        self.vocabulary = vocabulary
        self.allow_config = allow_config
        self.names: set[str] = set()
        self.config_paths: list[str] = []
        self.count = 0

    def visit_root(self, node: ast.expr) -> None:
        self.visit(node)

    def visit(self, node: ast.AST) -> None:
        self.count += 1
        if self.count > MAX_NODES:
            raise FormulaError(f"formula has more than {MAX_NODES} parts", col=_col(node))
        if isinstance(node, ast.Constant):
            self._constant(node)
        elif isinstance(node, ast.Name):
            self._name(node)
        elif isinstance(node, ast.BinOp):
            self._binop(node)
        elif isinstance(node, ast.UnaryOp):
            self._unaryop(node)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            self._config_read(node)
        else:
            raise FormulaError(f"{type(node).__name__} is not allowed in a formula", col=_col(node))

    def _constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            kind = "float" if isinstance(node.value, float) else type(node.value).__name__
            raise FormulaError(
                f"only integer literals are allowed, not {kind} {node.value!r}",
                col=_col(node),
                hint="formulas are integer-only: use // for division" if kind == "float" else None,
            )
        _check_range(node.value, _col(node))

    def _binop(self, node: ast.BinOp) -> None:
        if type(node.op) not in _BINOPS:
            raise FormulaError(
                f"operator {type(node.op).__name__} is not allowed",
                col=_col(node),
                hint="use one of + - * // % **" + (" (// for division)" if isinstance(node.op, ast.Div) else ""),
            )
        self.visit(node.left)
        self.visit(node.right)

    def _unaryop(self, node: ast.UnaryOp) -> None:
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise FormulaError(f"operator {type(node.op).__name__} is not allowed", col=_col(node))
        self.visit(node.operand)

    def _name(self, node: ast.Name) -> None:
        if node.id == CONFIG_ROOT and self.allow_config:
            raise FormulaError("'config' must be followed by a field: config.patch_size", col=_col(node))
        if node.id not in self.vocabulary:
            vocab = sorted(self.vocabulary)
            hint = suggest(node.id, vocab) or (f"known names: {', '.join(vocab)}" if vocab else None)
            raise FormulaError(f"unknown name {node.id!r}", col=_col(node), hint=hint)
        self.names.add(node.id)

    def _call(self, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Name):
            raise FormulaError("only min, max, ceil_div, isqrt and len(config...) may be called", col=_col(node))
        if node.keywords:
            raise FormulaError(f"{func.id}() takes no keyword arguments", col=_col(node))
        if func.id == "len" and self.allow_config:
            self._len(node)
            return
        self._arity(func.id, node)
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise FormulaError("starred arguments are not allowed", col=_col(arg))
            self.visit(arg)

    def _len(self, node: ast.Call) -> None:
        if len(node.args) != 1 or not isinstance(node.args[0], (ast.Attribute, ast.Subscript)):
            raise FormulaError("len() takes one config field: len(config.deepstack_visual_indexes)", col=_col(node))
        self._config_read(node.args[0], is_len=True)

    def _arity(self, name: str, node: ast.Call) -> None:
        """Raise unless ``name`` is an allowed function and the call gives it as many arguments as it takes."""
        if name not in _FUNCTIONS:
            allowed = sorted(_FUNCTIONS) + (["len"] if self.allow_config else [])
            raise FormulaError(
                f"function {name!r} is not allowed",
                col=_col(node),
                hint=suggest(name, allowed) or f"allowed: {', '.join(allowed)}",
            )
        low, high = _FUNCTIONS[name]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            want = f"exactly {low}" if low == high else f"at least {low}"
            raise FormulaError(f"{name}() takes {want} arguments, got {len(node.args)}", col=_col(node))

    def _config_read(self, node: ast.expr, is_len: bool = False) -> None:
        if not self.allow_config:
            raise FormulaError(
                f"{type(node).__name__} is not allowed in this formula",
                col=_col(node),
                hint="only geometry formulas may read the HF config (config.patch_size)",
            )
        path = _config_path(node)
        self.config_paths.append(f"len({path})" if is_len else path)


def _config_path(node: ast.expr) -> str:
    """Render ``config.a.b[0]`` back to text, rejecting anything but attribute and integer-index steps."""
    if isinstance(node, ast.Attribute):
        return f"{_config_path(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        index = node.slice
        if not (isinstance(index, ast.Constant) and type(index.value) is int and 0 <= index.value < 16):
            raise FormulaError("config fields may only be indexed by a small integer: [0]", col=_col(node))
        return f"{_config_path(node.value)}[{index.value}]"
    if isinstance(node, ast.Name) and node.id == CONFIG_ROOT:
        return CONFIG_ROOT
    raise FormulaError("only config fields may be read with '.' or '[...]': config.patch_size", col=_col(node))


_MISSING = object()


class _Evaluator:
    def __init__(self, values: Mapping[str, int], config: Any):
        self.values = values
        self.config = config

    def run(self, node: ast.expr) -> int:
        return _check_range(self.eval(node), _col(node))

    def eval(self, node: ast.expr) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        return self._config_value(node)

    def _name(self, node: ast.Name) -> int:
        value = self.values.get(node.id, _MISSING)
        if value is _MISSING:
            raise FormulaError(f"no value for {node.id!r}", col=_col(node))
        if isinstance(value, bool) or not isinstance(value, int):
            raise FormulaError(f"{node.id!r} is {value!r}, not an integer", col=_col(node))
        return value

    def _config_value(self, node: ast.expr) -> int:
        """The integer a config read gives (an attribute or index of ``config``)."""
        value = self._read(node)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FormulaError(
                f"{_config_path(node)} is {value!r}, not an integer",
                col=_col(node),
                hint="index a list field ([0]) or take len(...)" if isinstance(value, (list, tuple)) else None,
            )
        return _check_range(value, _col(node))

    def _call(self, node: ast.Call) -> int:
        """One of the functions the parser lets through: len, min, max, isqrt, ceil_div."""
        name = node.func.id
        if name == "len":
            value = self._read(node.args[0])
            if not isinstance(value, (list, tuple)):
                raise FormulaError(f"len() needs a list, {_config_path(node.args[0])} is {value!r}", col=_col(node))
            return len(value)
        args = [self.eval(arg) for arg in node.args]
        if name == "min":
            return min(args)
        if name == "max":
            return max(args)
        if name == "isqrt":
            if args[0] < 0:
                raise FormulaError(f"isqrt of negative value {args[0]}", col=_col(node))
            return math.isqrt(args[0])
        if args[1] == 0:
            raise FormulaError("ceil_div by zero", col=_col(node))
        return -((-args[0]) // args[1])

    def _binop(self, node: ast.BinOp) -> int:
        left = self.eval(node.left)
        right = self.eval(node.right)
        op = type(node.op)
        if op in (ast.FloorDiv, ast.Mod) and right == 0:
            raise FormulaError(f"division by zero in {_BINOPS[op]}", col=_col(node))
        if op is ast.Pow:
            if right < 0 or right > MAX_EXPONENT:
                raise FormulaError(f"exponent {right} is out of range (0..{MAX_EXPONENT})", col=_col(node))
            # |left| >= 2**(bits-1), so this bound proves overflow without computing a huge power.
            if left not in (-1, 0, 1) and (abs(left).bit_length() - 1) * right > 62:
                raise FormulaError(f"{left} ** {right} is out of range (|x| <= 2**62)", col=_col(node))
            return _check_range(left**right, _col(node))
        return _check_range(_ARITHMETIC[op](left, right), _col(node))

    def _read(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            if self.config is None:
                raise FormulaError("this formula reads the HF config, but no config is available", col=_col(node))
            return self.config
        if isinstance(node, ast.Attribute):
            parent = self._read(node.value)
            value = parent.get(node.attr, _MISSING) if isinstance(parent, Mapping) else _MISSING
            if value is _MISSING:
                known = list(parent) if isinstance(parent, Mapping) else []
                raise FormulaError(
                    f"{_config_path(node)} does not exist",
                    col=_col(node),
                    hint=suggest(node.attr, [k for k in known if isinstance(k, str)]),
                )
            return value
        parent = self._read(node.value)
        index = node.slice.value
        if not isinstance(parent, (list, tuple)) or index >= len(parent):
            raise FormulaError(f"{_config_path(node)} does not exist ({_config_path(node.value)} is {parent!r})",
                               col=_col(node))
        return parent[index]
