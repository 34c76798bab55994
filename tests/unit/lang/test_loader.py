"""YAML with positions: duplicate keys, unsafe tags, size and alias limits, exact lines and columns."""

from __future__ import annotations

import pytest

from vitcg.errors import Diagnostic
from vitcg.lang.loader import MAX_FILE_BYTES, format_path, load_file, load_text


def test_positions_of_values_and_keys():
    loaded, problems = load_text("a: 1\nb:\n  c: [x, {d: 2}]\n", "f.yaml")
    assert not problems
    assert loaded.data == {"a": 1, "b": {"c": ["x", {"d": 2}]}}
    assert loaded.values[("a",)].line == 1 and loaded.values[("a",)].col == 4
    assert loaded.keys[("b", "c")].line == 3 and loaded.keys[("b", "c")].col == 3
    assert loaded.values[("b", "c", 1, "d")].line == 3
    assert loaded.values[("b", "c", 1, "d")].col == 14


def test_position_falls_back_to_parent():
    loaded, _ = load_text("a:\n  b: 1\n", "f.yaml")
    assert loaded.position(("a", "missing")).line == 2


def test_quoted_scalar_style_is_recorded():
    loaded, _ = load_text("a: 't * h'\nb: t\n", "f.yaml")
    assert loaded.styles[("a",)] == "'"
    assert loaded.styles[("b",)] is None


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("a: 1\na: 2\n", 2, "duplicate key 'a' (first defined at line 1)"),
        ("x:\n  a: 1\n  b: 2\n  a: 3\n", 4, "duplicate key 'a'"),
        ("- 1\n- 2\n", 1, "must be a mapping, not a list"),
        ("just text\n", 1, "must be a mapping, not a scalar"),
        ("", 1, "file is empty"),
        ("# only a comment\n", 1, "file is empty"),
        ("a: !!python/object/apply:os.system ['ls']\n", 1, "unsupported YAML tag"),
        ("a: !custom 1\n", 1, "unsupported YAML tag"),
        ("1: x\n", 1, "mapping keys must be strings"),
        ("? [a]\n: x\n", 1, "mapping keys must be strings"),
        ("true: x\n", 1, "mapping keys must be strings"), ("1: x\n", 1, "mapping keys must be strings"),
        ("a: &x {b: 1}\nc:\n  <<: *x\n", 3, "merge keys"),
        ("a: [1, 2\n", 2, "invalid YAML"),
        ("a: 1\n---\nb: 2\n", 2, "invalid YAML"),
        ("a:\n\tb: 1\n", 2, "invalid YAML"),
        ("a: .nan\n", 1, "NaN"),
        ("a: {b: .inf}\n", 1, "'.inf' is infinite; numbers in a spec must be finite"),
        ("a:\n  - -.Inf\n", 2, "infinite"),
        ("a: 1.0e+999\n", 1, "infinite"),
        ("a: 1\nb: \"x\x01\"\n", 2, "unacceptable character #x0001: control characters are not allowed"),
        ("a: \x00\n", 1, "NUL byte"),
    ],
)
def test_rejections(text, line, fragment):
    loaded, problems = load_text(text, "f.yaml")
    assert loaded is None
    assert len(problems) == 1
    assert problems[0].line == line
    assert fragment in problems[0].message


def test_all_duplicate_keys_reported():
    _, problems = load_text("a: 1\na: 2\nb: 1\nb: 2\n", "f.yaml")
    assert [p.line for p in problems] == [2, 4]


def test_alias_bomb_is_bounded():
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for name, prev in zip("bcdefg", "abcdef"):
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    loaded, problems = load_text(text, "f.yaml")
    assert loaded is None
    assert "more than 20000 YAML nodes" in problems[0].message


def test_recursive_alias_is_bounded():
    loaded, problems = load_text("a: &a [*a]\n", "f.yaml")
    assert loaded is None
    assert problems


def test_deep_nesting_is_an_error_not_a_crash():
    loaded, problems = load_text("a: " + "[" * 5000 + "]" * 5000 + "\n", "f.yaml")
    assert loaded is None
    assert "nested" in problems[0].message


def test_large_file_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * MAX_FILE_BYTES + "\n")
    loaded, problems = load_file(path)
    assert loaded is None
    assert "limited to 1 MiB" in problems[0].message


def test_non_utf8_refused(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    loaded, problems = load_file(path)
    assert loaded is None
    assert problems[0].line == 2
    assert "UTF-8" in problems[0].message


def test_missing_file_is_a_diagnostic(tmp_path):
    loaded, problems = load_file(tmp_path / "nope.yaml")
    assert loaded is None
    assert "cannot read file" in problems[0].message


def test_format_path():
    assert format_path(()) == "$"
    assert format_path(("buffers", 0, "shape", 1)) == "$.buffers[0].shape[1]"


def test_paths_quote_keys_that_are_not_plain_words():
    assert format_path(("tests", "runner_kwargs", "a b", 0, "x\x1ey", "k.v")) == \
        "$.tests.runner_kwargs['a b'][0]['x\\x1ey']['k.v']"
    assert format_path(("k" * 100,)) == "$['" + "k" * 56 + "...]"


def test_a_diagnostic_is_one_line_and_a_hint_whatever_the_spec_holds():
    # str.splitlines() breaks at \x1e and \u2028 too: a key holding one once split a diagnostic in two.
    d = Diagnostic("f.yaml", 2, 3, format_path(("a\x1eb",)), "unknown key 'a\nb'", hint="did you mean\u2028'ab'?")
    assert d.format().splitlines() == ["f.yaml:2:3: $['a\\x1eb']: unknown key 'a\\nb'", "    hint: did you mean\\u2028'ab'?"]


@pytest.mark.parametrize(("text", "value"), [
    ("1:30", "1:30"),  # YAML 1.1: 90 (base 60)
    ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("Y", "Y"),  # YAML 1.1: booleans
    ("010", 10), ("0o10", 8), ("0x1f", 31), ("-7", -7), ("+3", 3),  # YAML 1.1: 010 is octal 8
    ("0b101", "0b101"), ("1_000", "1_000"),  # YAML 1.1: integers
    ("1e3", 1000.0), ("-.5", -0.5), ("2.", 2.0),  # YAML 1.1: 1e3 is a string (no dot)
    ("true", True), ("False", False), ("~", None), ("null", None), ("", None),
    ("'1:30'", "1:30"), ('"010"', "010"),
])
def test_plain_scalars_follow_yaml_1_2_core(text, value):
    loaded, problems = load_text(f"a: {text}\n", "f.yaml")
    assert not problems
    assert loaded.data["a"] == value and type(loaded.data["a"]) is type(value)


@pytest.mark.parametrize(("text", "col", "char"), [
    ('a: "x\\x01y"\n', 4, "U+0001"),
    ('b:\n  c: "\\e[31m"\n', 6, "U+001B"),
    ('"k\\x7f": 1\n', 1, "U+007F"),
    ('d: "\\x85"\n', 4, "U+0085"),
])
def test_control_characters_are_refused_with_line_and_column(text, col, char):
    loaded, problems = load_text(text, "f.yaml")
    assert loaded is None and len(problems) == 1
    problem = problems[0]
    assert char in problem.message and problem.col == col and problem.line == text.count("\n", 0, text.index("\\"))+1


def test_tabs_and_newlines_are_text():
    loaded, problems = load_text('a: "x\\ty"\nb: |\n  one\n  two\n', "f.yaml")
    assert not problems and loaded.data == {"a": "x\ty", "b": "one\ntwo\n"}
