"""Shared fixtures: repository paths and an isolated bindings cache for the whole session."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "vitcg" / "specs"
CASES = REPO / "tests" / "specs"


def pytest_configure(config):
    # The registry is the packaged specs then $VITCG_SPECS_DIR's folders: a developer's own folders must not
    # change what the suite sees. Tests that need the variable set it themselves.
    os.environ.pop("VITCG_SPECS_DIR", None)
    # One cache for the session, outside the user's home: tests never depend on earlier runs. Under pytest-xdist
    # (CI runs the suite with `-n 2`) each worker process has a cache of its own, as it has a session of its own
    # (the workers inherit the variable from the controlling process, which set it here first).
    cache = Path(config.rootpath if hasattr(config, "rootpath") else REPO) / ".pytest_cache" / "vitcg-bindings"
    os.environ.setdefault("VITCG_CACHE_DIR", str(cache))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        if os.environ["VITCG_CACHE_DIR"] == str(cache):
            os.environ["VITCG_CACHE_DIR"] = str(cache.with_name(f"{cache.name}-{worker}"))
        # The workers share the machine's cores: one intra-op thread each, in the worker and in the commands its
        # tests start as subprocesses. Two threads per process on a 2-core machine wait on each other
        # (tests/vllm/conftest.py: 160 s instead of 12 s). torch may be imported already (by a conftest file).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # Hypothesis keeps examples and the constants it scrapes from the code under ./.hypothesis: not in the checkout.
    from hypothesis.configuration import set_hypothesis_home_dir

    config._vitcg_hypothesis_home = tempfile.mkdtemp(prefix="vitcg-hypothesis-")
    set_hypothesis_home_dir(config._vitcg_hypothesis_home)


def pytest_unconfigure(config):
    home = getattr(config, "_vitcg_hypothesis_home", None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def _unavailable_specs() -> dict[str, str]:
    """Spec name -> why the installed transformers cannot run it (too old for the spec's ``transformers``)."""
    from support.specs import packaged

    return {s.name: s.unavailable for s in packaged().unavailable}


def pytest_collection_modifyitems(config, items):
    # Tests parametrized over spec names skip the specs this transformers is too old for, saying so; CI runs
    # the suite on the newest supported transformers too, where every spec runs.
    unavailable = _unavailable_specs()
    for item in items:
        name = getattr(getattr(item, "callspec", None), "params", {}).get("name")
        if isinstance(name, str) and name in unavailable:
            item.add_marker(pytest.mark.skip(reason=f"{name}: {unavailable[name]}"))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def no_tf32():
    """float32 comparisons at 1e-5 on CUDA need full-precision convolutions and matmuls on both paths."""
    from vitcg.tools.check.vlm import no_tf32 as full_precision

    with full_precision():
        yield
