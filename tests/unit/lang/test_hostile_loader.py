"""Input bounds of the spec loader (issue #13): size and nesting are checked before anything can recurse.

The 25,000-bracket file that crashed libyaml's composer runs in a subprocess
(tests/acceptance/test_hostile_cli.py); these cases stay shallow enough to be safe in-process either way.
"""

from __future__ import annotations

from pathlib import Path

from vitcg.lang.loader import MAX_DEPTH, MAX_FILE_BYTES, load_file, load_text


def test_text_over_the_size_bound_is_refused_before_parsing():
    text = "a: [" + "1, " * (MAX_FILE_BYTES // 3) + "1]\n"
    loaded, problems = load_text(text, "big.yaml")
    assert loaded is None
    (problem,) = problems
    assert problem.message == f"file is {len(text)} bytes; specs are limited to 1 MiB ({MAX_FILE_BYTES} bytes)"


def test_size_counts_utf8_bytes():
    text = "a: " + "é" * (MAX_FILE_BYTES // 2) + "\n"  # fewer characters than the bound, more bytes
    loaded, problems = load_text(text, "wide.yaml")
    assert loaded is None and f"file is {len(text.encode())} bytes" in problems[0].message


def test_file_read_is_bounded(tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"x" * MAX_FILE_BYTES)
    loaded, problems = load_file(path)
    assert loaded is None and f"file is {MAX_FILE_BYTES + 3} bytes" in problems[0].message
    assert f"({MAX_FILE_BYTES} bytes)" in problems[0].message


def test_flow_nesting_is_located_where_the_limit_is_crossed():
    text = "name: x\nbuffers:\n  " + "[" * 200 + "\n"
    loaded, problems = load_text(text, "deep.yaml")
    assert loaded is None
    (problem,) = problems
    # the top mapping is at depth 0, so the 65th bracket is the first collection deeper than 64
    assert (problem.file, problem.line, problem.col) == ("deep.yaml", 3, 3 + MAX_DEPTH)
    assert problem.message == f"YAML is nested deeper than {MAX_DEPTH} levels"
    assert problem.code == "yaml" and problem.hint


def test_block_nesting_by_indentation_is_bounded():
    text = "".join("  " * level + f"k{level}:\n" for level in range(200)) + "  " * 200 + "v\n"
    loaded, problems = load_text(text, "indent.yaml")
    assert loaded is None
    assert problems[0].message == f"YAML is nested deeper than {MAX_DEPTH} levels"
    assert problems[0].line == MAX_DEPTH + 2  # line 1 opens depth 0, line 66 the mapping at depth 65


def test_nesting_at_the_limit_is_not_an_error():
    text = "a: " + "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1) + "\n"
    loaded, problems = load_text(text, "ok.yaml")
    assert problems == [] and loaded is not None


def test_invalid_yaml_is_still_reported_by_the_parser():
    loaded, problems = load_text("a: [1, 2\n", "bad.yaml")
    assert loaded is None and problems[0].message.startswith("invalid YAML")
