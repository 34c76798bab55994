"""``vitcg generate`` and ``vitcg compile-config`` driven like a user would: a subprocess, exit codes, output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO, vitcg


def test_registry_of_the_repository_is_current():
    run = vitcg("generate", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    count = len(list((REPO / "specs").glob("*.yaml")))
    assert run.stdout == f"registry/ is up to date (5 files from {count} specs)\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of specs/, templates/ and registry/: the command runs there with its default paths."""
    for folder in ("specs", "templates", "registry"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_spec_change_without_regeneration_fails_the_check(project):
    assert vitcg("generate", "--check", cwd=project).returncode == 0
    spec = project / "specs" / "qwen2_vl.yaml"
    spec.write_text(spec.read_text().replace("display_name: Qwen2-VL\n", "display_name: Qwen2-VL (renamed)\n"))
    before = snapshot(project / "registry")

    run = vitcg("generate", "--check", cwd=project)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "stale: registry/SUPPORTED_MODELS.md: differs",
        "stale: registry/index.json: differs",
        "registry/ is stale (2 files); run `vitcg generate` and commit the result",
    ]
    assert snapshot(project / "registry") == before  # --check writes nothing

    run = vitcg("generate", cwd=project)
    assert run.returncode == 0, run.stderr
    assert "wrote registry/SUPPORTED_MODELS.md (differs)" in run.stdout
    assert "Qwen2-VL (renamed)" in (project / "registry" / "SUPPORTED_MODELS.md").read_text()
    assert vitcg("generate", "--check", cwd=project).returncode == 0


def test_missing_and_extra_files_are_stale(project):
    (project / "registry" / "index.json").unlink()
    (project / "registry" / "OLD_LIST.md").write_text("<!-- generated from specs/ by vitcg — do not edit -->\n")
    run = vitcg("generate", "--check", cwd=project)
    assert run.returncode == 1
    assert "stale: registry/OLD_LIST.md: not produced by any template" in run.stdout
    assert "stale: registry/index.json: missing" in run.stdout

    run = vitcg("generate", cwd=project)
    assert run.returncode == 0
    assert "removed registry/OLD_LIST.md (not produced by any template)" in run.stdout
    assert not (project / "registry" / "OLD_LIST.md").exists()
    assert (project / "registry" / "index.json").read_bytes() == (REPO / "registry" / "index.json").read_bytes()


def test_explicit_folders(tmp_path):
    out = tmp_path / "out"
    run = vitcg("generate", "--specs", "tests/specs/render/specs", "--templates", "templates", "--out", str(out))
    assert run.returncode == 0, run.stderr
    golden = REPO / "tests" / "specs" / "render" / "golden"
    for path in out.iterdir():
        assert path.read_text() == (golden / f"{path.name}.golden").read_text(), path.name


def test_template_with_a_missing_field_fails_loudly(project):
    (project / "templates" / "broken.md.j2").write_text(
        "<!-- {{ header }} -->\n{% for spec in specs %}{{ spec.docs.summary }}{% endfor %}\n")
    run = vitcg("generate", "--check", cwd=project)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    first = sorted(p.stem for p in (project / "specs").glob("*.yaml"))[0]  # specs render sorted by name
    assert run.stderr.startswith(f"error: templates/broken.md.j2:2: spec '{first}' (specs/{first}.yaml) "
                                 "has no field 'docs.summary'")


def test_invalid_spec_is_reported_without_traceback(project):
    spec = project / "specs" / "qwen2_vl.yaml"
    spec.write_text(spec.read_text().replace("max_model_len: 8192", "max_model_len: eight"))
    run = vitcg("generate", "--check", cwd=project)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "specs/qwen2_vl.yaml:" in run.stderr


def test_missing_templates_folder_is_a_usage_error(project):
    run = vitcg("generate", "--templates", "nowhere", cwd=project)
    assert run.returncode == 2
    assert run.stderr == "error: no such templates folder: nowhere\n"


@pytest.mark.parametrize("modality, items", [("image", 1), ("video", 1), ("image+video", 2)])
def test_compile_config_per_modality(modality, items):
    run = vitcg("compile-config", "--modality", modality)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"cudagraph_mm_encoder": True,
                                      "encoder_cudagraph_max_vision_items_per_batch": items}


def test_compile_config_merges_into_base():
    run = vitcg("compile-config", "--modality", "image+video", "--base", '{"mode": 3, "cudagraph_mode": "FULL"}',
                "--budgets", "2048,1024", "--max-frames", "32")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {
        "mode": 3, "cudagraph_mode": "FULL", "cudagraph_mm_encoder": True,
        "encoder_cudagraph_max_vision_items_per_batch": 2, "encoder_cudagraph_token_budgets": [1024, 2048],
        "encoder_cudagraph_max_frames_per_batch": 32}


@pytest.mark.parametrize("args, message", [
    (["--modality", "audio"], "error: modality must be one of image, video, image+video, got 'audio'"),
    (["--modality", "image", "--base", "[1]"], "error: --base must be a JSON object"),
    (["--modality", "image", "--base", "{"], "error: --base is not valid JSON"),
    (["--modality", "image", "--budgets", "0,1024"], "error: encoder_cudagraph_token_budgets must be positive"),
    (["--modality", "image", "--budgets", "1024,big"], "error: --budgets must be comma-separated integers"),
    (["--modality", "image", "--budgets", "1,4096", "--max-items", "2"],
     "error: encoder_cudagraph_max_vision_items_per_batch=2 exceeds the smallest token budget 1"),
])
def test_compile_config_errors(args, message):
    run = vitcg("compile-config", *args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith(message), run.stderr
    assert "Traceback" not in run.stderr
