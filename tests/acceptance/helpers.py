"""Run the ``vitcg`` command like a user: a subprocess in the repository root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def vitcg(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    exe = shutil.which("vitcg")
    command = [exe, *args] if exe else [sys.executable, "-m", "vitcg", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=os.environ.copy(), timeout=600)
