"""The built wheel works outside the checkout: it holds the specs and templates, and a fresh virtual environment
with only the wheel installed runs ``vitcg demo``, ``validate``, ``check``, ``generate``, ``new`` and
``vitcg.accelerate`` from a folder that is not the repository.

The fresh environment borrows its dependencies (torch, transformers, ...) from the running interpreter's
site-packages through a ``.pth`` line, so nothing is downloaded. Such a line only adds the folder to
``sys.path``: the ``.pth`` files inside it, among them the hook of the editable install that points at this
checkout, are not run, and the fresh site-packages comes first. The test asserts that ``vitcg`` is imported
from the fresh environment all the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import REPO

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "README.md", "vitcg")
"""What the build reads. It runs on a copy: setuptools leaves build/ behind, and a build/ left by an earlier
build would put files deleted since into the wheel."""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    site: Path
    """The fresh environment's site-packages, where the wheel's files are."""
    work: Path
    """A folder outside the checkout where the commands run."""
    env: dict[str, str]

    def run(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout)

    def vitcg(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(str(self.venv / "bin" / "vitcg"), *args)


def _call(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    # no build isolation: setuptools comes from this environment, so the build needs no index
    _call(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
          str(source))
    (wheel,) = (root / "dist").glob("vitcg-*.whl")

    venv = root / "venv"
    _call(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    site = Path(_call(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "borrowed_dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed))
    _call(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel))

    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VITCG_SPECS_DIR", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    return Installed(wheel, venv, python, site, work, env)


def test_the_wheel_holds_the_specs_templates_and_schema(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    specs = {f"vitcg/specs/{p.name}" for p in (REPO / "vitcg" / "specs").glob("*.yaml")}
    templates = {f"vitcg/templates/{p.name}" for p in (REPO / "vitcg" / "templates").glob("*.j2")}
    assert len(specs) > 50 and len(templates) == 5
    assert specs | templates | {"vitcg/lang/schema.json"} <= names
    assert {n for n in names if n.startswith("vitcg/specs/")} == specs  # nothing else rides along


def test_vitcg_is_imported_from_the_fresh_environment(installed):
    run = installed.run(str(installed.python), "-c", "import vitcg, torch; print(vitcg.__file__)")
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).is_relative_to(installed.site)
    assert (installed.venv / "bin" / "vitcg").is_file()


def test_commands_work_outside_the_checkout(installed):
    run = installed.vitcg("demo")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("qwen2_vl: tiny Qwen2VLForConditionalGeneration with random weights")
    assert "generate: the same greedy tokens" in run.stdout

    run = installed.vitcg("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    count = len([p for p in (REPO / "vitcg" / "specs").glob("*.yaml") if not p.name.endswith(".tests.yaml")])
    assert run.stdout.splitlines()[-1].startswith(f"{count} spec files checked: all valid")

    run = installed.vitcg("check", "qwen2_vl")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["qwen2_vl  proven: 6 cases, and the VLM end to end on 3 items",
                                       "1 spec checked: 1 passed (1 proven)"]


def test_generate_renders_the_repository_registry_from_the_packaged_templates(installed):
    run = installed.vitcg("generate", "--out", "registry")
    assert run.returncode == 0, run.stdout + run.stderr
    made = {p.name: p.read_bytes() for p in (installed.work / "registry").iterdir()}
    assert made == {p.name: p.read_bytes() for p in (REPO / "registry").iterdir() if p.is_file()}


def test_new_writes_into_the_working_folder_never_the_package(installed):
    before = sorted((installed.site / "vitcg" / "specs").iterdir())
    run = installed.vitcg("new", "glm_ocr")
    assert run.returncode == 0, run.stdout + run.stderr
    draft = installed.work / "glm_ocr.yaml"
    schema = Path(draft.read_text().splitlines()[0].split("$schema=", 1)[1])
    assert schema == installed.site / "vitcg" / "lang" / "schema.json" and schema.is_file()
    assert sorted((installed.site / "vitcg" / "specs").iterdir()) == before
    draft.unlink()


ACCELERATE = """
import json, numpy, torch, vitcg
from vitcg.lang import SpecSource
from vitcg.tools.check.vlm import build_processor, build_vlm

spec = SpecSource()["qwen2_vl"]
vlm = build_vlm(spec)
images = [numpy.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=numpy.uint8)]
made = build_processor(spec, vlm)(images=images, return_tensors="pt")
inputs = {"pixel_values": made["pixel_values"], "image_grid_thw": made["image_grid_thw"]}

def features():
    with torch.no_grad():
        out = vlm.model.get_image_features(**inputs)
    out = getattr(out, "pooler_output", out)
    return torch.cat(list(out)) if isinstance(out, (list, tuple)) else out

want = features()
handle = vitcg.accelerate(vlm, progress=False)  # the spec found by architecture, in the packaged specs
with handle:
    features()  # the first call runs the original and learns the output layout
    got = features()
print(json.dumps({"vitcg": vitcg.__file__, "spec": handle.spec.name, "file": handle.spec.file,
                  "routed": handle.stats.routed, "error": float((got - want).norm() / want.norm())}))
"""


def test_accelerate_finds_the_packaged_spec(installed):
    run = installed.run(str(installed.python), "-c", ACCELERATE)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert Path(found["vitcg"]).is_relative_to(installed.site)
    assert found["spec"] == "qwen2_vl" and Path(found["file"]) == installed.site / "vitcg" / "specs" / "qwen2_vl.yaml"
    assert found["routed"] >= 1 and found["error"] <= 1e-5
