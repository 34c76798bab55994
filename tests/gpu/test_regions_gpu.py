"""Inductor-compiled blocks inside real CUDA graphs (skipped without CUDA): a whole-tower spec, one with window
and full attention blocks, a graph-scoped layer stack and a tile encoder each replay equal to eager.

Tolerance: bf16 relative error ||graph - eager|| / ||eager|| per item <= 1e-2, as in test_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch

from vitcg.lang import load_registry
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error

pytestmark = pytest.mark.gpu
REGISTRY = load_registry(["vitcg/specs"])


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "pixtral", "internvl"])
def test_compiled_blocks_replay_equal_to_eager(name):
    spec = REGISTRY[name]
    module = build_encoder(spec, device="cuda", dtype=torch.bfloat16)
    adapter = adapter_for(spec, module, compile_forward=True)
    assert adapter._blocks, "no repeated blocks found to compile"
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=2048, device="cuda", dtype=torch.bfloat16,
                                      options=ManagerOptions(route_eager=False))
    manager.capture()
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
