"""Run the ``vitcg`` command like a user (a subprocess in the repository root), and compare what it leaves in a folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support import REPO


def vitcg_command() -> list[str]:
    """The ``vitcg`` console script when it is on PATH, else ``python -m vitcg``."""
    exe = shutil.which("vitcg")
    return [exe] if exe else [sys.executable, "-m", "vitcg"]


def vitcg(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*vitcg_command(), *args], cwd=cwd, capture_output=True, text=True, env=os.environ.copy(),
                          timeout=600)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes: equal before and after a command that
    must write nothing there."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
