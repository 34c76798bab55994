"""``vitcg check`` as a user runs it: one line per spec and a summary (a table per spec on failure or with
``--verbose``), exit 0 when all match, 1 on any mismatch. ``check`` and ``demo`` each keep one test of the real
console entry point in a subprocess; the others call the same entry point in this process (tests/acceptance/
inprocess.py), which imports torch and transformers once instead of once per command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import REPO, vitcg
from support.inprocess import vitcg_inprocess
from support.specs import copy_spec

FAILS = REPO / "tests" / "specs" / "check_fails"


def test_passing_specs_print_one_line_each_and_a_summary():
    """A passing spec is one line (proven: both stages passed) and the summary. gemma4's tiny config makes
    transformers warn ("Last layer must use `full_attention`"): the warning is kept with its report, and stderr
    stays empty. A subprocess: what a fresh process prints, import-time warnings included."""
    run = vitcg("check", "qwen2_vl", "gemma4")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["qwen2_vl  proven: 6 cases, and the VLM end to end on 3 items",
                                       "gemma4    proven: 3 cases, and the VLM end to end on 3 items",
                                       "2 specs checked: 2 passed (2 proven)"]
    assert run.stderr == ""


def test_check_all_prints_one_line_per_spec_and_a_summary(tmp_path: Path, monkeypatch):
    """--all: every spec of the registry's folders, one line each in name order, then the summary, nothing
    else. The registry here is a folder holding copies of two packaged specs (all 66 take minutes: the README's
    main job runs them)."""
    import vitcg.lang.folders

    folder = tmp_path / "specs"
    for name in ("qwen2_vl", "internvl"):
        copy_spec(name, folder)
    # the packaged folder itself, not a module's name for spec_folders: a module that imports it while patched
    # would keep the patch after this test
    monkeypatch.setattr(vitcg.lang.folders, "packaged_specs_dir", lambda: folder)
    run = vitcg_inprocess("check", "--all")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3, run.stdout
    assert lines[0].startswith("internvl  proven: ") and lines[1].startswith("qwen2_vl  proven: "), run.stdout
    assert lines[2] == "2 specs checked: 2 passed (2 proven)"
    assert run.stderr == ""


def test_check_verbose_prints_the_table_and_shows_progress_on_a_terminal():
    """--verbose: the table of cases under the spec's line. With stderr a terminal, as a user runs it, stderr
    shows which spec runs, and nothing else (a redirected stderr gets nothing: the test above)."""
    run = vitcg_inprocess("check", "qwen2_vl", "--verbose", terminal=True)
    assert run.stderr == "\r\x1b[K[1/1] qwen2_vl\r\x1b[K", repr(run.stderr)
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()
    assert lines[0].startswith("qwen2_vl  proven: ")
    assert lines[1].startswith("  cpu, float32; budgets 64/128/256")
    for case in ("one small image", "images of different sizes", "one video", "image and video in one call",
                 "item larger than the largest budget", "empty batch"):
        assert any(line.split(None, 1)[1].startswith(case) and line.rstrip().endswith("ok")
                   for line in lines if line.startswith("  spec ")), case
    # the end-to-end stage: the full VLM's own features and greedy tokens, with and without vitcg
    (vlm,) = [line for line in lines if line.startswith("  vlm ")]
    assert "VLM features and generate" in vlm and vlm.rstrip().endswith("ok"), vlm
    assert lines[-1] == "1 spec checked: 1 passed (1 proven)"


@pytest.mark.parametrize("path", sorted(FAILS.glob("*.yaml")), ids=lambda p: p.stem)
def test_specs_that_do_not_describe_their_encoder_fail_clearly(path):
    """Each file in tests/specs/check_fails validates but fails vitcg check with the message beside it."""
    from vitcg.lang import SpecSource

    (spec,) = SpecSource.of_files([path], bindings=False).specs
    if spec.unavailable:
        pytest.skip(f"{path.stem}: {spec.unavailable}")
    assert vitcg_inprocess("validate", str(path)).returncode == 0  # the spec is well-formed ...
    run = vitcg_inprocess("check", str(path))
    assert run.returncode == 1  # ... but does not describe the encoder
    assert run.stdout.startswith(f"{path.stem}  FAILED: ")  # its line says why, its table below it
    assert path.with_suffix(".expected").read_text().strip() in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"1 spec checked: 0 passed, 1 failed ({path.stem})"


def test_check_usage_errors():
    run = vitcg_inprocess("check")
    assert run.returncode == 2 and "name specs to check, or pass --all" in run.stderr
    run = vitcg_inprocess("check", "qwen2_vll")
    assert run.returncode == 2 and "did you mean 'qwen2_vl'?" in run.stderr
    run = vitcg_inprocess("check", "qwen2_vl", "--device", "tpu")
    assert run.returncode == 2


def test_check_json():
    run = vitcg_inprocess("check", "internvl", "--json")
    assert run.returncode == 0
    document = json.loads(run.stdout)
    assert document["ok"] and document["specs"][0]["budgets"] == [4, 8, 16]


def test_demo_accelerates_a_tiny_vlm_and_keeps_its_tokens():
    run = vitcg("demo")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "qwen2_vl: tiny Qwen2VLForConditionalGeneration" in run.stdout
    assert "generate: the same greedy tokens (encoder: 2 replays, 0 eager)" in run.stdout
    refused = vitcg_inprocess("demo", "tests/specs/check_fails/wrong_width.yaml")
    assert refused.returncode == 1 and "out_hidden_size=96" in refused.stderr, refused.stderr


def test_check_passes_a_spec_with_per_item_outputs():
    """tests/specs/valid/per_item_outputs.yaml captures PaddleOCR-VL's get_image_features, whose pooler_output is
    one tensor per image (``pooler_output[*]``): every case and the end-to-end stage pass."""
    run = vitcg_inprocess("check", "tests/specs/valid/per_item_outputs.yaml")
    assert run.returncode == 0, run.stdout + run.stderr
    # proven: the end-to-end stage ran and passed
    assert run.stdout.splitlines()[0].startswith("per_item_outputs  proven: "), run.stdout
    assert run.stdout.splitlines()[-1] == "1 spec checked: 1 passed (1 proven)"


def _specs_folder(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "specs"
    folder.mkdir()
    for name in names:
        copy_spec(name, folder)
    (folder / "broken.yaml").write_text((REPO / "tests" / "specs" / "invalid" / "duplicate_key.yaml").read_text())
    return folder


def test_a_broken_spec_in_the_folder_blocks_nothing(tmp_path: Path):
    """A draft that does not validate, beside good specs in a --specs folder: checking a good one by name works,
    and checking both reports the broken one as a failed row of its own while the other still runs (--all
    does the same over every spec: tests/unit/lang/test_spec_source.py selects them)."""
    folder = _specs_folder(tmp_path, "internvl")
    run = vitcg_inprocess("check", "internvl", "--specs", str(folder))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "1 spec checked: 1 passed (1 proven)"
    run = vitcg_inprocess("check", "broken", "internvl", "--specs", str(folder))
    assert run.returncode == 1
    assert "Traceback" not in run.stdout + run.stderr
    assert f"FAILED before any case: {folder / 'broken.yaml'} does not validate (1 error" in run.stdout
    assert "duplicate key" in run.stdout
    # its line: the reason cut at a word to 120 characters, ending in "..." (in full below it, as asserted above).
    # Where the cut falls depends on the length of the temporary folder's path (longer under pytest-xdist).
    line = run.stdout.splitlines()[0]
    (reason,) = [r.split("FAILED before any case: ", 1)[1] for r in run.stdout.splitlines() if "FAILED before any" in r]
    assert len(line) <= 120 and line.endswith("...") and line.startswith("broken    FAILED: before any case"), line
    assert f"broken    FAILED: before any case: {reason}".startswith(line[:-3]), (line, reason)
    assert run.stdout.splitlines()[-1] == "2 specs checked: 1 passed (1 proven), 1 failed (broken)"


def test_a_broken_file_in_the_environment_folder_blocks_nothing(tmp_path: Path, monkeypatch):
    """DESIGN.md section 10: a clip.yaml in $VITCG_SPECS_DIR that does not parse leaves `vitcg check qwen2_vl`
    as it was; `vitcg check clip` reports the broken file (the user's, not the packaged clip)."""
    broken = tmp_path / "clip.yaml"
    broken.write_text((REPO / "tests" / "specs" / "invalid" / "duplicate_key.yaml").read_text())
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    run = vitcg_inprocess("check", "qwen2_vl")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "1 spec checked: 1 passed (1 proven)"
    run = vitcg_inprocess("check", "clip", "--json")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    (report,) = json.loads(run.stdout)["specs"]
    assert not report["ok"] and str(broken) in report["error"] and "duplicate key" in report["error"]


@pytest.mark.parametrize("how", ["file", "name"])
def test_check_of_a_broken_file_is_its_row(tmp_path: Path, how: str):
    folder = _specs_folder(tmp_path)
    target = str(folder / "broken.yaml") if how == "file" else "broken"
    run = vitcg_inprocess("check", target, "--specs", str(folder), "--json")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    (report,) = json.loads(run.stdout)["specs"]
    assert report["spec"] == "broken" and not report["ok"] and "duplicate key" in report["error"]


def test_check_of_a_file_checks_that_file_only(tmp_path: Path):
    folder = _specs_folder(tmp_path, "internvl", "qwen2_vl")
    run = vitcg_inprocess("check", str(folder / "internvl.yaml"))
    assert run.returncode == 0, run.stdout
    assert run.stdout.splitlines()[0].startswith("internvl  proven: ")
    assert run.stdout.splitlines()[-1] == "1 spec checked: 1 passed (1 proven)"


def test_every_invalid_example_is_a_failed_row():
    """All of tests/specs/invalid in one command: one failed row each, no traceback, exit 1."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "specs" / "invalid").glob("*.yaml"))
    run = vitcg_inprocess("check", *files)
    assert run.returncode == 1 and "Traceback" not in run.stdout + run.stderr, run.stderr[-2000:]
    assert run.stdout.count("FAILED before any case: ") == len(files)
    assert run.stdout.splitlines()[-1].startswith(f"{len(files)} specs checked: 0 passed, {len(files)} failed")


def test_check_of_a_draft_never_tracebacks(tmp_path: Path):
    """minicpmv4_6's draft: its guesses fail against the encoder, and check says so in its table."""
    path = tmp_path / "minicpmv4_6.yaml"
    assert vitcg_inprocess("new", "minicpmv4_6", "-o", str(path)).returncode == 0
    run = vitcg_inprocess("check", str(path))
    assert run.returncode in (0, 1) and "Traceback" not in run.stdout + run.stderr, run.stderr
    assert run.stdout.splitlines()[-1].startswith("1 spec checked: ")
