"""The vLLM-style consumer under real ``torch.cuda.graph`` capture for the seed specs (skipped without CUDA).

float32 with TF32 off on both paths, tiny encoders: each item's relative error against its eager output
<= 1e-5, as on the CPU; the consumer replays its own graphs, knowing only the protocol.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_vllm_protocol import REGISTRY, assert_matches_eager, sizes_for
from vllm_consumer import ProtocolConsumer

from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.engine import engine_config
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import InputBuilder

pytestmark = pytest.mark.gpu
SEEDS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "internvl"]
assert Path(__file__).parent.name == "engine"


@pytest.mark.parametrize("name", SEEDS)
def test_seed_spec_under_cuda_graphs(name, no_tf32):
    spec = REGISTRY[name]
    adapter = adapter_for(spec, build_encoder(spec, device="cuda", dtype=torch.float32, seed=3))
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(7))
    low, _ = adapter.get_encoder_cudagraph_budget_range(engine_config(1 << 20, 1 << 20))
    consumer = ProtocolConsumer(engine_config(4 * low, 1 << 20), torch.device("cuda"), torch.float32, adapter,
                                cuda_graphs=True)
    consumer.capture()
    for modality in adapter.get_encoder_cudagraph_config().modalities:
        kwargs = {k: v.cuda() for k, v in builder.inputs(modality, sizes_for(builder, modality)).items()}
        assert_matches_eager(adapter, kwargs, consumer.execute(kwargs))
        assert_matches_eager(adapter, kwargs, consumer.execute_dp(kwargs, ranks=2))
    assert consumer.hits > 0
    item = 1 if spec.style == "tiles" else builder.image(1, 1)
    first = adapter.get_encoder_cudagraph_config().modalities[0]
    many = {k: v.cuda() for k, v in builder.inputs(first, [item] * 40).items()}
    tokens = max(40, sum(s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(many)))
    forty = ProtocolConsumer(engine_config(tokens, 1 << 20, token_budgets=[tokens], max_items_per_batch=40),
                             torch.device("cuda"), torch.float32, adapter, cuda_graphs=True)
    forty.capture()
    assert_matches_eager(adapter, many, forty.execute(many))
    assert forty.misses == 0
