"""Inductor-compiled blocks inside real CUDA graphs (skipped without CUDA): a whole-tower spec, one with window
and full attention blocks, a graph-scoped layer stack and a tile encoder each replay equal to eager.

Tolerance: bf16 relative error ||graph - eager|| / ||eager|| per item <= 1e-2, as in test_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.compile_cache import capture_compiled
from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error

pytestmark = pytest.mark.gpu
REGISTRY = packaged()


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "pixtral", "internvl"])
def test_compiled_blocks_replay_equal_to_eager(name):
    spec = REGISTRY[name]
    module = build_encoder(spec, device="cuda", dtype=torch.bfloat16)
    adapter = adapter_for(spec, module, compile_forward=True)
    assert adapter._blocks, "no repeated blocks found to compile"
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=2048, device="cuda", dtype=torch.bfloat16,
                                      options=ManagerOptions(route_eager=False))
    manager.capture()
    # every block call compiled ahead of time (InternVL's once its attention's output-capturing hook is left out)
    ahead = adapter.ahead
    assert ahead.disabled is None and ahead.compiled > 0 and ahead.fallbacks == 0, ahead.disabled
    for workload in ("1x224", "mixed"):
        inputs = on_device(adapter, make_inputs(adapter, WORKLOADS[workload], torch.Generator().manual_seed(3)),
                           torch.bfloat16)
        got = manager.execute(inputs)
        assert manager.stats.replays > 0
        reference = adapter.encoder_eager_forward(inputs)
        start = 0
        for item in got:
            expected = reference[start:start + item.shape[0]]
            start += item.shape[0]
            assert relative_error(item, expected) <= 1e-2, (workload, relative_error(item, expected))
        assert start == reference.shape[0]
    assert all("forward" not in vars(block) for block in adapter._blocks)


def _replays_equal_to_eager(adapter, manager, seed):
    inputs = on_device(adapter, make_inputs(adapter, WORKLOADS["8x224"], torch.Generator().manual_seed(seed)),
                       torch.bfloat16)
    got = manager.execute(inputs)
    reference = adapter.encoder_eager_forward(inputs)
    assert manager.stats.replays > 0
    assert relative_error(torch.cat(got), reference) <= 1e-2


def test_block_functions_stored_then_loaded_without_compiling(monkeypatch, tmp_path):
    """The first capture compiles the blocks ahead of time and stores them (``KEY.aot``); a second adapter loads
    them from that file and captures without compiling anything, replaying equal to eager."""
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    spec = REGISTRY["qwen2_vl"]
    module = build_encoder(spec, device="cuda", dtype=torch.bfloat16)
    uses = []
    for seed in (0, 1):
        adapter = adapter_for(spec, module, compile_forward=True)
        manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=1024, device="cuda",
                                          dtype=torch.bfloat16, options=ManagerOptions(route_eager=False))
        _, use = capture_compiled(manager, spec)
        uses.append((use, adapter.ahead.compiled, len(adapter.ahead.blobs)))
        _replays_equal_to_eager(adapter, manager, seed)
    (first, compiled_first, stored), (second, compiled_second, loaded) = uses
    assert not first.loaded and first.saved_bytes > 0 and compiled_first == stored > 0
    assert first.path.suffix == ".aot" and not first.path.with_suffix(".bin").exists()  # nothing fell back
    assert second.loaded and second.path.suffix == ".aot" and compiled_second == 0 and loaded == stored
    assert adapter.ahead.fallbacks == 0  # the loaded functions served every block call
