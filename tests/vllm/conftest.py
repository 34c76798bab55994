"""tests/vllm run vLLM 0.33.0's own code (.ci/setup-vllm makes its venv): CPU platform, skip or fail without vLLM.

vLLM picks its platform when first imported, from ``VLLM_TARGET_DEVICE``: it is set to ``cpu`` here, before any
test module imports vLLM (unset, vLLM finds no platform on this machine: "unspecified"). Without an importable
vLLM every test module here is skipped with the import error as the reason, unless ``VITCG_REQUIRE_VLLM=1``: then
collection fails on that error, so a CI stage meant to run these tests never passes by skipping them all. Torch
runs one thread (:func:`one_thread`). The test doubles of vLLM code are in ``doubles.py`` beside this file.
"""

from __future__ import annotations

import os
import socket

import pytest

os.environ["VLLM_TARGET_DEVICE"] = "cpu"

REQUIRED = os.environ.get("VITCG_REQUIRE_VLLM") == "1"


def _vllm_missing() -> str | None:
    """Why vLLM's encoder graph manager cannot be imported, or None when it can."""
    try:
        import vllm.v1.worker.encoder_cudagraph  # noqa: F401  (the module every test here drives)
    except ImportError as exc:
        # without vLLM installed, this folder itself (on sys.path as tests/vllm) may pass for a namespace
        # package named vllm: the error then reads "No module named 'vllm.v1'"
        why = f"vLLM is not importable (vllm.v1.worker.encoder_cudagraph: {exc})"
        if REQUIRED:
            raise ImportError(f"VITCG_REQUIRE_VLLM=1 but {why}; run .ci/setup-vllm and use its venv "
                              "(.venv-vllm/bin/python -m pytest tests/vllm)") from exc
        return f"{why}; .ci/setup-vllm makes a venv with it"
    return None


MISSING = _vllm_missing()


class _WithoutVllm(pytest.Module):
    """A test module that is reported as skipped, without being imported (its imports need vLLM)."""

    def collect(self):
        pytest.skip(MISSING)


def pytest_pycollect_makemodule(module_path, parent):
    if MISSING is not None:
        return _WithoutVllm.from_parent(parent, path=module_path)
    return None


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """One intra-op thread for the session, restored after. The encoders here are tiny: a second thread buys
    nothing, and on this 2-core machine with other processes running, two threads waiting on each other made
    tests/vllm/test_real_manager.py take 160 s instead of 12 s (OMP_NUM_THREADS=1, same load)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def vllm_distributed():
    """vLLM's process groups for one process (world size 1, gloo on 127.0.0.1), as the model loader needs them;
    torn down at the end of the session. The groups are sized under a default ``VllmConfig``, since vLLM reads
    the current config while it builds them."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with socket.socket() as probe:  # a free port for the one-process rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


def pytest_collection_modifyitems(config, items):
    """Tests that load models with vLLM's model loader run last: building a model, vLLM's Transformers backend
    decorates the transformers classes it serves for torch.compile, process-wide, and a decorated class can no
    longer be built outside a vLLM config (as the encoder-only tests build theirs)."""
    items.sort(key=lambda item: "loader" in getattr(item, "fixturenames", ()))
