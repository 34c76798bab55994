"""``vitcg new``: a draft spec from a transformers model type that validates, marks its guesses, and checks."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import vitcg


def test_draft_validates_and_passes_check(tmp_path):
    path = tmp_path / "glm_ocr.yaml"
    run = vitcg("new", "glm_ocr", "--output", str(path))
    assert run.returncode == 0, run.stderr
    assert "TODOs to confirm" in run.stdout
    text = path.read_text()
    assert "TODO(vitcg new)" in text
    assert "class: transformers.models.glm_ocr.modeling_glm_ocr.GlmOcrVisionModel" in text
    assert "style: packed" in text
    assert vitcg("validate", str(path)).returncode == 0
    check = vitcg("check", str(path))
    assert check.returncode == 0, check.stdout  # the guesses hold for this encoder


def test_draft_of_a_tile_encoder_is_valid_but_flags_what_check_disproves(tmp_path):
    path = tmp_path / "llava.yaml"
    assert vitcg("new", "llava", "--output", str(path)).returncode == 0
    assert vitcg("validate", str(path)).returncode == 0
    check = vitcg("check", str(path))
    assert check.returncode == 1  # CLIP keeps a CLS token: tokens_per_tile must be confirmed
    assert "items.output_tokens says 16" in check.stdout


def test_stdout_and_refusals(tmp_path):
    run = vitcg("new", "qwen2_vl", "--output", "-")
    assert run.returncode == 0 and run.stdout.startswith("# yaml-language-server")
    run = vitcg("new", "qwen2_vll", "--output", "-")
    assert run.returncode == 2 and "did you mean 'qwen2_vl'?" in run.stderr
    path = tmp_path / "x.yaml"
    path.write_text("keep me")
    run = vitcg("new", "qwen2_vl", "--output", str(path))
    assert run.returncode == 2 and "pass --force" in run.stderr
    assert path.read_text() == "keep me"
    assert vitcg("new", "qwen2_vl", "--output", str(path), "--force").returncode == 0


WALKTHROUGH = [
    "vitcg new cohere_compass",
    "vitcg validate specs/cohere_compass.yaml",
    "vitcg check specs/cohere_compass.yaml",
    "vitcg generate",
]


def test_readme_walkthrough_works_as_written(tmp_path):
    """The README's "Adding a model" commands, run in a copy of the project (the editor step aside)."""
    import shutil

    from helpers import REPO

    readme = (REPO / "README.md").read_text()
    for command in WALKTHROUGH:
        assert command in readme, command
    for folder in ("specs", "templates", "registry"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for command in WALKTHROUGH:
        run = vitcg(*command.split()[1:], cwd=tmp_path)
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
    assert "cohere_compass" in (tmp_path / "registry" / "SUPPORTED_MODELS.md").read_text()


@pytest.mark.parametrize("model_type, named", [
    ("llama", ["'llama' is not a vision model", "LlamaConfig has no vision_config", "LlamaModel takes 'input_ids'"]),
    ("pp_chart2table", ["'pp_chart2table' has no importable modeling code", "write the spec by hand"]),
])
def test_refuses_model_types_it_cannot_draft(tmp_path, model_type, named):
    if model_type == "pp_chart2table" and importlib.util.find_spec("transformers.models.pp_chart2table") is None:
        pytest.skip("this transformers has no pp_chart2table config")
    path = tmp_path / f"{model_type}.yaml"
    run = vitcg("new", model_type, "--output", str(path))
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    for fragment in named:
        assert fragment in lines[0], (fragment, lines[0])
    assert not path.exists()
