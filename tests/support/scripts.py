"""A script of ``benchmarks/`` imported by its path, so that a test reaches its functions without ``sys.path``."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from support import REPO


def benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a fresh module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
