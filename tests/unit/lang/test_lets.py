"""``let:`` (issue 39 item 6): a formula named once in a spec file, written out where it is used, before the file
is merged over its parent."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from support.specs import harness_path, packaged, spec_path, spec_text
from vitcg.errors import SpecError
from vitcg.lang import SpecSource, spec_from_text

ROWS = "budget * max(1, min(max_frames, temporal_patch_size))"


def _child(lets: str, buffers: str = "  - {name: max_seqlen, value: rows * 2}") -> str:
    return f"name: let_child\nextends: kimi_k25\nlet:\n{lets}\nbuffers:\n{buffers}\n"


def _problems(text: str) -> list:
    with pytest.raises(SpecError) as raised:
        spec_from_text(text, "let_child.yaml")
    return raised.value.diagnostics


def test_kimi_k25_names_its_pixel_rows_once_and_means_what_it_meant_written_out(tmp_path: Path):
    """The packaged spec with its let written out by hand resolves to the same spec, every formula alike."""
    text = spec_path("kimi_k25").read_text()
    assert text.count(ROWS) == 1 and text.count("pixel_rows") >= 6
    written_out = re.sub(r"\nlet:\n  pixel_rows: .*\n", "\n", text).replace("pixel_rows", f"'{ROWS}'")
    (tmp_path / "kimi_k25.yaml").write_text(written_out)
    shutil.copy(harness_path("kimi_k25"), tmp_path / "kimi_k25.tests.yaml")
    mine = SpecSource.of_files([tmp_path / "kimi_k25.yaml"])
    assert mine.ok, [d.format() for d in mine.diagnostics]
    written, shipped = mine.specs[0].to_json(), packaged()["kimi_k25"].to_json()
    assert {**written, "file": None} == {**shipped, "file": None}


def test_a_let_is_written_out_with_the_parentheses_its_use_needs():
    spec = spec_from_text(_child("  base: budget + 1\n  rows: base * 3"), "let_child.yaml")
    (seqlen,) = [b for b in spec.buffers if b.name == "max_seqlen"]
    assert str(seqlen.value) == "(budget + 1) * 3 * 2"
    assert seqlen.value.evaluate({"budget": 4}) == 30


@pytest.mark.parametrize("lets, message", [
    ("  budget: 4", "let name 'budget' is a name formulas already read"),
    ("  patch_size: 4", "let name 'patch_size' is a name formulas already read"),  # the parent's geometry name
    ("  min: 4", "let name 'min' is a name formulas already read"),
    ("  rows: budget *", "let 'rows': invalid syntax"),
    ("  rows: [1, 2]", "let 'rows' must be a formula (a string or an integer), not list"),
    ("  rows: budget\n  spare: 2", "let 'spare' is not used by any formula"),
])
def test_a_let_that_cannot_be_used_is_reported_at_its_line(lets, message):
    problems = _problems(_child(lets))
    assert any(message in p.message and p.line >= 4 and p.code == "let" for p in problems), \
        [p.format() for p in problems]


def test_let_must_be_a_mapping():
    problems = _problems("name: let_child\nextends: kimi_k25\nlet: [rows]\n")
    assert [p.message for p in problems] == ["let must be a mapping of names to formulas"] and problems[0].line == 3


def test_a_let_is_the_files_own_a_child_does_not_inherit_it(tmp_path: Path):
    """kimi_k25 names pixel_rows; a child that uses the name without its own let reads an unknown name."""
    problems = _problems("name: let_child\nextends: kimi_k25\nbuffers:\n  - {name: max_seqlen, value: pixel_rows}\n")
    assert any("unknown name 'pixel_rows'" in p.message for p in problems), [p.format() for p in problems]


def test_a_spec_text_with_a_let_of_its_own_validates_and_the_resolved_text_has_none():
    spec = spec_from_text(spec_text("kimi_k25"), "kimi_k25.yaml")
    assert all("pixel_rows" not in str(b.shape) for b in spec.buffers)


def test_names_that_nest_cannot_grow_a_formula_past_its_bound():
    """Each let doubling the one before would be 2**40 names long written out: refused at the first too long."""
    lets = "  a0: budget + budget\n" + "".join(f"  a{i}: a{i - 1} + a{i - 1}\n" for i in range(1, 40))
    problems = _problems(_child(lets.rstrip("\n"), "  - {name: max_seqlen, value: a39}"))
    assert any(p.message.startswith("let 'a5' is ") and "a formula is at most 400" in p.message for p in problems), \
        [p.format() for p in problems]
