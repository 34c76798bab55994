"""Example spec files: every valid one loads; every invalid one yields exactly its expected diagnostics.

Each ``tests/specs/invalid/NAME.yaml`` has ``NAME.expected`` beside it: one ``LINE: message`` per
diagnostic, in order.
"""

from __future__ import annotations

import pytest

from support import REPO
from vitcg.lang import SpecSource

CASES = REPO / "tests" / "specs"
VALID = sorted((CASES / "valid").glob("*.yaml"))
INVALID = sorted((CASES / "invalid").glob("*.yaml"))


def test_there_are_enough_cases():
    assert len(VALID) >= 3
    assert len(INVALID) >= 30


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_case(path):
    result = SpecSource.of_files([path])
    assert result.ok, "\n".join(d.format() for d in result.diagnostics)
    assert [s.name for s in result.specs] == [path.stem]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_case(path):
    expected = []
    for line in path.with_suffix(".expected").read_text().splitlines():
        number, _, fragment = line.partition(": ")
        expected.append((int(number), fragment))
    result = SpecSource.of_files([path])
    assert not result.ok
    assert not result.specs
    got = [(d.line, d.message) for d in result.diagnostics]
    assert len(got) == len(expected), "\n".join(d.format() for d in result.diagnostics)
    for (line, message), (want_line, fragment) in zip(got, expected):
        assert line == want_line, f"{message!r} at line {line}, expected line {want_line}"
        assert fragment in message
    for d in result.diagnostics:
        assert d.file == str(path)
        assert d.path.startswith("$")
        assert "Traceback" not in d.message


def test_every_invalid_case_has_its_expectation():
    for path in INVALID:
        assert path.with_suffix(".expected").is_file(), path
