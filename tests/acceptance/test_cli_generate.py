"""``vitcg generate`` and ``vitcg compile-config`` driven like a user would: exit codes, output. One test per
command runs the console entry point in a subprocess; the others call the same entry point in this process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from support.cli import REPO, snapshot, vitcg
from support.inprocess import vitcg_inprocess
from support.specs import copy_spec


def test_registry_of_the_repository_is_current():
    run = vitcg("generate", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    count = len([p for p in (REPO / "vitcg" / "specs").glob("*.yaml") if not p.name.endswith(".tests.yaml")])
    assert run.stdout == f"registry/ is up to date (5 files from {count} specs)\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder holding a copy of registry/ (the default --out): the command runs there with the packaged specs
    and templates."""
    shutil.copytree(REPO / "registry", tmp_path / "registry", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def own_spec(project: Path, name: str = "qwen2_vl", folder: str = "specs") -> Path:
    """A copy of the packaged spec ``name`` in a folder of the user's inside ``project``: given to --specs, it
    replaces the packaged one."""
    return copy_spec(name, project / folder)


def test_spec_change_without_regeneration_fails_the_check(project):
    assert vitcg_inprocess("generate", "--check", cwd=project).returncode == 0
    spec = own_spec(project)
    spec.write_text(spec.read_text().replace("display_name: Qwen2-VL\n", "display_name: Qwen2-VL (renamed)\n"))
    before = snapshot(project / "registry")

    run = vitcg_inprocess("generate", "--check", "--specs", "specs", cwd=project)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "stale: registry/SUPPORTED_MODELS.md: differs",
        "stale: registry/index.json: differs",
        "registry/ is stale (2 files); run `vitcg generate` and commit the result",
    ]
    assert snapshot(project / "registry") == before  # --check writes nothing

    run = vitcg_inprocess("generate", "--specs", "specs", cwd=project)
    assert run.returncode == 0, run.stderr
    assert "wrote registry/SUPPORTED_MODELS.md (differs)" in run.stdout
    text = (project / "registry" / "SUPPORTED_MODELS.md").read_text()
    assert "Qwen2-VL (renamed)" in text and "[`specs/qwen2_vl.yaml`](../specs/qwen2_vl.yaml)" in text
    assert vitcg_inprocess("generate", "--check", "--specs", "specs", cwd=project).returncode == 0


def test_missing_and_extra_files_are_stale(project):
    (project / "registry" / "index.json").unlink()
    (project / "registry" / "OLD_LIST.md").write_text("<!-- generated from specs/ by vitcg — do not edit -->\n")
    run = vitcg_inprocess("generate", "--check", cwd=project)
    assert run.returncode == 1
    assert "stale: registry/OLD_LIST.md: not produced by any template" in run.stdout
    assert "stale: registry/index.json: missing" in run.stdout

    run = vitcg_inprocess("generate", cwd=project)
    assert run.returncode == 0
    assert "removed registry/OLD_LIST.md (not produced by any template)" in run.stdout
    assert not (project / "registry" / "OLD_LIST.md").exists()
    assert (project / "registry" / "index.json").read_bytes() == (REPO / "registry" / "index.json").read_bytes()


def test_explicit_folders(tmp_path):
    """--specs adds a folder to the packaged specs; --templates replaces the packaged templates."""
    out = tmp_path / "out"
    run = vitcg_inprocess("generate", "--specs", "tests/specs/render/specs", "--templates", "vitcg/templates",
                          "--out", str(out))
    assert run.returncode == 0, run.stderr
    golden = json.loads((REPO / "tests" / "specs" / "render" / "golden" / "index.json.golden").read_text())["specs"]
    rendered = json.loads((out / "index.json").read_text())["specs"]
    packaged = json.loads((REPO / "registry" / "index.json").read_text())["specs"]
    assert sorted(rendered) == sorted({**packaged, **golden})
    assert {name: rendered[name] for name in golden} == golden


def display_names(out: Path) -> dict[str, str]:
    return {name: s["display_name"] for name, s in json.loads((out / "index.json").read_text())["specs"].items()}


def test_later_folders_replace_earlier_specs_by_name(project):
    """The packaged specs, then $VITCG_SPECS_DIR's folders in order, then each --specs in order: the last
    folder holding a spec name wins."""
    for folder in ("a", "b", "c"):
        spec = own_spec(project, folder=folder)
        spec.write_text(spec.read_text().replace("display_name: Qwen2-VL\n", f"display_name: Qwen2-VL {folder}\n"))
    env = {**os.environ, "VITCG_SPECS_DIR": os.pathsep.join([str(project / "b"), str(project / "a")])}
    cases = [(("--specs", "a", "--specs", "b"), {}, "Qwen2-VL b"), (("--specs", "b", "--specs", "a"), {}, "Qwen2-VL a"),
             ((), env, "Qwen2-VL a"), (("--specs", "c"), env, "Qwen2-VL c")]
    for index, (args, environment, shown) in enumerate(cases):
        out = project / f"out{index}"
        run = vitcg_inprocess("generate", *args, "--out", str(out), cwd=project, env=environment or None)
        assert run.returncode == 0, (args, run.stderr)
        names = display_names(out)
        assert names["qwen2_vl"] == shown, (args, environment.get("VITCG_SPECS_DIR"))
        assert names["qwen2_5_vl"] == "Qwen2.5-VL"  # the other packaged specs stay


def test_spec_folder_that_does_not_exist_is_a_usage_error(project):
    run = vitcg_inprocess("generate", "--check", "--specs", "nowhere", cwd=project)
    assert run.returncode == 2 and run.stderr == "error: no such specs folder: nowhere\n"
    env = {**os.environ, "VITCG_SPECS_DIR": "nowhere"}
    run = vitcg_inprocess("generate", "--check", cwd=project, env=env)
    assert run.returncode == 2 and run.stderr == "error: $VITCG_SPECS_DIR names 'nowhere', which is not a folder\n"


def test_template_with_a_missing_field_fails_loudly(project):
    shutil.copytree(REPO / "vitcg" / "templates", project / "templates")
    (project / "templates" / "broken.md.j2").write_text(
        "<!-- {{ header }} -->\n{% for spec in specs %}{{ spec.docs.summary }}{% endfor %}\n")
    run = vitcg_inprocess("generate", "--check", "--templates", "templates", cwd=project)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    first = sorted(p.stem for p in (REPO / "vitcg" / "specs").glob("*.yaml"))[0]  # specs render sorted by name
    assert run.stderr.startswith(f"error: templates/broken.md.j2:2: spec '{first}' (vitcg/specs/{first}.yaml) "
                                 "has no field 'docs.summary'")


def test_invalid_spec_is_reported_without_traceback(project):
    spec = own_spec(project)
    spec.write_text(spec.read_text() + "geometry:\n  patch_size: fourteen\n")  # a duplicate key
    run = vitcg_inprocess("generate", "--check", "--specs", "specs", cwd=project)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "specs/qwen2_vl.yaml:" in run.stderr


def test_missing_templates_folder_is_a_usage_error(project):
    run = vitcg_inprocess("generate", "--templates", "nowhere", cwd=project)
    assert run.returncode == 2
    assert run.stderr == "error: no such templates folder: nowhere\n"


@pytest.mark.parametrize("modality, items", [("image", 1), ("video", 1), ("image+video", 2)])
def test_compile_config_per_modality(modality, items):
    run = vitcg_inprocess("compile-config", "--modality", modality)
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
    run = vitcg_inprocess("compile-config", *args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith(message), run.stderr
    assert "Traceback" not in run.stderr
