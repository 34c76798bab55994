"""Property tests: arbitrary text and formulas never raise anything but spec errors, and never run code."""

from __future__ import annotations

import ast
import builtins
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitcg.errors import FormulaError, SpecError
from vitcg.lang import spec_from_text
from vitcg.lang.formulas import parse
from vitcg.lang.loader import load_text

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def no_code_execution():
    """Any eval, exec, or compile to code (not to an AST) inside the block fails the test."""
    real = builtins.eval, builtins.exec, builtins.compile

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called while handling untrusted text")

    def ast_only_compile(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & ast.PyCF_ONLY_AST:
            raise AssertionError("compile to code called while handling untrusted text")
        return real[2](source, filename, mode, flags, *args, **kwargs)

    builtins.eval, builtins.exec, builtins.compile = forbidden, forbidden, ast_only_compile
    try:
        yield
    finally:
        builtins.eval, builtins.exec, builtins.compile = real


@SETTINGS
@given(st.text(max_size=300))
def test_loader_never_crashes(text):
    with no_code_execution():
        loaded, problems = load_text(text, "x.yaml")
    assert (loaded is None) == bool(problems)
    if loaded is not None:
        assert isinstance(loaded.data, dict)


YAMLISH = st.recursive(
    st.one_of(st.integers(), st.text(max_size=20), st.booleans(), st.none(), st.floats(allow_nan=False)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(min_size=1, max_size=12), children, max_size=4)),
    max_leaves=20,
)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["name", "encoder", "geometry", "items", "budget", "buffers", "zzz"]),
                       YAMLISH, max_size=7))
def test_spec_loading_only_raises_spec_error(document):
    import yaml

    text = yaml.safe_dump(document)
    try:
        with no_code_execution():
            spec_from_text(text, "x.yaml")
    except SpecError as exc:
        assert exc.diagnostics
        for d in exc.diagnostics:
            assert d.file == "x.yaml" and d.line >= 1


ATOMS = st.one_of(
    st.sampled_from(["t", "h", "w", "m", "x", "config", "__import__", "eval", "min", "max", "ceil_div", "isqrt"]),
    st.integers(min_value=-10**20, max_value=10**20).map(str),
    st.sampled_from(["1.5", "'s'", "True", "None", "[1]", "{}", "lambda: 1", "()", "..."]),
)
OPS = st.sampled_from([" + ", " - ", " * ", " // ", " % ", " ** ", " / ", " < ", " and ", ".", ", ", "(", ")", "[0]"])


@SETTINGS
@given(st.lists(st.one_of(ATOMS, OPS), max_size=25).map("".join))
def test_formula_parse_and_evaluate_only_raise_formula_error(source):
    try:
        with no_code_execution():
            value = parse(source, ["t", "h", "w", "m"]).evaluate({"t": 2, "h": 3, "w": 5, "m": 0})
    except FormulaError:
        return
    assert isinstance(value, int) and abs(value) <= 2**62


@SETTINGS
@given(st.text(max_size=80))
def test_formula_arbitrary_text(source):
    try:
        with no_code_execution():
            parse(source, ["t"], allow_config=True).evaluate({"t": 1}, {"patch_size": 14})
    except FormulaError:
        pass


@SETTINGS
@given(st.integers(min_value=-10, max_value=10), st.integers(min_value=-100, max_value=100))
def test_power_bounds(base, exponent):
    try:
        value = parse("t ** h", ["t", "h"]).evaluate({"t": base, "h": exponent})
    except FormulaError:
        assert exponent < 0 or exponent > 64 or abs(base) ** exponent > 2**62
        return
    assert value == base**exponent
