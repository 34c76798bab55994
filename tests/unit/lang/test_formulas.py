"""The restricted formula language: what it accepts, what it rejects, and where it points."""

from __future__ import annotations

import pytest

from vitcg.errors import FormulaError
from vitcg.lang.formulas import parse

VOCAB = ["t", "h", "w", "m"]


@pytest.mark.parametrize(
    ("source", "values", "expected"),
    [
        ("t * h * w", {"t": 2, "h": 4, "w": 6}, 48),
        ("t * (h // m) * (w // m)", {"t": 2, "h": 4, "w": 6, "m": 2}, 12),
        ("ceil_div(h, m)", {"h": 5, "m": 2}, 3),
        ("min(t, h, w)", {"t": 3, "h": 1, "w": 2}, 1),
        ("max(t, h) % 3", {"t": 7, "h": 2}, 1),
        ("-t + +h", {"t": 1, "h": 5}, 4),
        ("m ** 2", {"m": 3}, 9),
        ("isqrt(h)", {"h": 2304}, 48),
        (64, {}, 64),
        ("  t  ", {"t": 3}, 3),
    ],
)
def test_evaluates(source, values, expected):
    assert parse(source, VOCAB).evaluate(values) == expected


def test_names_are_recorded():
    formula = parse("t * (h // m)", VOCAB)
    assert formula.names == frozenset({"t", "h", "m"})


@pytest.mark.parametrize(
    ("source", "fragment", "col"),
    [
        ("t * x", "unknown name 'x'", 4),
        ("t / 2", "operator Div is not allowed", 0),
        ("1.5 * t", "only integer literals", 0),
        ("True + t", "only integer literals", 0),
        ("'a'", "only integer literals", 0),
        ("eval('1')", "function 'eval' is not allowed", 0),
        ("__import__('os')", "function '__import__' is not allowed", 0),
        ("t.real", "Attribute is not allowed", 0),
        ("t[0]", "Subscript is not allowed", 0),
        ("[t]", "List is not allowed", 0),
        ("t if h else w", "IfExp is not allowed", 0),
        ("t < h", "Compare is not allowed", 0),
        ("lambda: 1", "Lambda is not allowed", 0),
        ("min(t)", "takes at least 2 arguments", 0),
        ("ceil_div(t, h, w)", "takes exactly 2 arguments", 0),
        ("min(t, *h)", "starred", 7),
        ("max(t, key=h)", "no keyword arguments", 0),
        ("t *", "invalid syntax", None),
        ("", "formula is empty", 0),
        ("t" * 401, "formula is 401 characters; formulas are limited to 400", 0),
        ("+".join(["t"] * 150), "more than 200 parts", None),
        ("config.patch_size", "Attribute is not allowed", 0),
        ("t ~ h", "invalid syntax", None),
        ("~t", "operator Invert is not allowed", 0),
        ("t << 2", "operator LShift is not allowed", 0),
    ],
)
def test_rejects_at_column(source, fragment, col):
    with pytest.raises(FormulaError) as info:
        parse(source, VOCAB)
    assert fragment in info.value.message
    if col is not None:  # None: the column is Python's parser's to choose
        assert info.value.col == col


def test_unknown_name_suggests_close_match():
    with pytest.raises(FormulaError) as info:
        parse("spatial_merge_sise * 2", ["spatial_merge_size"])
    assert info.value.hint == "did you mean 'spatial_merge_size'?"


@pytest.mark.parametrize(
    ("source", "values", "fragment"),
    [
        ("t // h", {"t": 1, "h": 0}, "division by zero"),
        ("t % h", {"t": 1, "h": 0}, "division by zero"),
        ("ceil_div(t, h)", {"t": 1, "h": 0}, "ceil_div by zero"),
        ("t ** h", {"t": 2, "h": 65}, "exponent 65 is out of range"),
        ("t ** h", {"t": 2, "h": -1}, "exponent -1 is out of range"),
        ("t ** h", {"t": 3, "h": 60}, "out of range"),
        ("t * h * w", {"t": 2**40, "h": 2**40, "w": 1}, "out of range"),
        ("isqrt(t - h)", {"t": 1, "h": 2}, "isqrt of negative"),
        ("t + h", {"t": 1}, "no value for 'h'"),
    ],
)
def test_evaluation_errors(source, values, fragment):
    formula = parse(source, VOCAB)
    with pytest.raises(FormulaError) as info:
        formula.evaluate(values)
    assert fragment in info.value.message


def test_huge_literal_rejected_at_parse():
    with pytest.raises(FormulaError, match="out of range"):
        parse(str(2**70), VOCAB)


CONFIG = {"patch_size": 14, "vision_config": {"patch_size": [14, 14], "image_size": [448, 448]},
          "deepstack_visual_indexes": [8, 16, 24], "name": "x", "flag": True}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("config.patch_size", 14),
        ("config.vision_config.patch_size[0]", 14),
        ("(config.vision_config.image_size[1] // config.patch_size) ** 2", 1024),
        ("len(config.deepstack_visual_indexes)", 3),
        ("config.deepstack_visual_indexes[2] + 1", 25),
    ],
)
def test_config_reads(source, expected):
    assert parse(source, [], allow_config=True).evaluate({}, CONFIG) == expected


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("config.patch_sise", "config.patch_sise does not exist"),
        ("config.vision_config.patch_size", "is [14, 14], not an integer"),
        ("config.name", "is 'x', not an integer"),
        ("config.flag", "is True, not an integer"),
        ("config.vision_config.patch_size[5]", "does not exist"),
        ("len(config.patch_size)", "len() needs a list"),
    ],
)
def test_config_read_errors(source, fragment):
    with pytest.raises(FormulaError) as info:
        parse(source, [], allow_config=True).evaluate({}, CONFIG)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("config", "must be followed by a field"),
        ("config.patch_size[t]", "indexed by a small integer"),
        ("config.__class__.__mro__[1]", None),  # parses, but only dict keys are ever read
        ("len(t)", "len() takes one config field"),
        ("x.patch_size", "only config fields"),
    ],
)
def test_config_syntax_rules(source, fragment):
    if fragment is None:
        formula = parse(source, ["t"], allow_config=True)
        with pytest.raises(FormulaError, match="does not exist"):
            formula.evaluate({}, CONFIG)
        return
    with pytest.raises(FormulaError) as info:
        parse(source, ["t"], allow_config=True)
    assert fragment in info.value.message


def test_config_suggests_close_field():
    with pytest.raises(FormulaError) as info:
        parse("config.patch_sise", [], allow_config=True).evaluate({}, CONFIG)
    assert info.value.hint == "did you mean 'patch_size'?"
