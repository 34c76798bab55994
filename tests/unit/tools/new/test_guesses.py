"""What a draft still guesses (issue 39, item 2): every ``# GUESS:`` line ``vitcg new`` writes and every placeholder
checkpoint is found, file and line, and nothing else is."""

from __future__ import annotations

from pathlib import Path

from support.specs import packaged
from vitcg.lang import SpecSource
from vitcg.tools.guesses import Guess, guesses, is_placeholder, placeholder_checkpoint
from vitcg.tools.new import scaffold


def _spec(path: Path):
    (spec,) = SpecSource.of_files([path], bindings=False).specs
    return spec


def test_every_guess_a_draft_marks_is_found_and_its_header_is_not(tmp_path: Path, monkeypatch):
    path = tmp_path / "kosmos_2_5.yaml"  # a whole draft: geometry, buffers, a commented-out budget with its guess
    monkeypatch.setattr(scaffold, "checkpoints_named", lambda config: [])  # the placeholder, as for a config
    text, count = scaffold.checked_draft("kosmos-2.5", path)                # that documents no checkpoint
    path.write_text(text)
    found = guesses(_spec(path))
    assert len(found) == count
    assert all(g.file == str(path) and "# GUESS: " in g.text for g in found)
    assert not any(g.text.startswith("# Draft written by") for g in found)
    (checkpoints,) = [g for g in found if g.text.startswith("checkpoints:")]
    assert checkpoints == Guess(str(path), text.splitlines().index(checkpoints.text) + 1, checkpoints.text)
    assert checkpoints.format() == f"{path}:{checkpoints.line}: checkpoints: [org/kosmos_2_5]   # GUESS: real checkpoint names"


def test_a_placeholder_checkpoint_is_a_guess_without_its_mark(tmp_path: Path):
    path = tmp_path / "llava_x.yaml"
    path.write_text("name: llava_x\nextends: clip\ncheckpoints: [llava-hf/llava-1.5-7b-hf, org/llava_x]\n"
                    "display_name: LLaVA X   # GUESS: the name\n")
    assert [(g.line, g.text) for g in guesses(_spec(path))] == [
        (3, "checkpoints: [llava-hf/llava-1.5-7b-hf, org/llava_x]"), (4, "display_name: LLaVA X   # GUESS: the name")]
    path.write_text("name: llava_x\nextends: clip\ncheckpoints: [llava-hf/llava-1.5-7b-hf]   # from org/llava_x\n")
    assert guesses(_spec(path)) == []  # a real checkpoint, and a comment that only mentions the placeholder


def test_the_harness_file_is_read_too_and_a_packaged_spec_has_no_guesses(tmp_path: Path):
    (tmp_path / "llava_x.yaml").write_text("name: llava_x\nextends: clip\n")
    (tmp_path / "llava_x.tests.yaml").write_text("vlm:\n  config: {}   # GUESS: the text config\n")
    (found,) = guesses(_spec(tmp_path / "llava_x.yaml"))
    assert (found.file, found.line) == (str(tmp_path / "llava_x.tests.yaml"), 2)
    assert not any(guesses(spec) for spec in packaged().specs)


def test_placeholder_checkpoints_are_the_drafts_own():
    assert placeholder_checkpoint("lfm2_vl") == "org/lfm2_vl" and is_placeholder("org/lfm2_vl")
    assert not is_placeholder("llava-hf/llava-1.5-7b-hf") and not is_placeholder("myorg/x")
