"""The vLLM-style consumer under real ``torch.cuda.graph`` capture for the seed specs (skipped without CUDA).

float32 with TF32 off on both paths, tiny encoders: each item's relative error against its eager output
<= 1e-5, as on the CPU; the consumer replays its own graphs, knowing only the protocol. The vLLM plugin's
members, on a stand-in for vLLM's Transformers backend (backend_standin.py: vLLM cannot be installed on the GPU
machine), are driven the same way with the backend's batches, against the backend's own feature call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from backend_standin import plugged
from test_vllm_protocol import REGISTRY, sizes_for
from vllm_consumer import ProtocolConsumer

from support.eager import assert_items_match, assert_matches_eager
from support.tiny import tiny_adapter
from vitcg.runtime.engine import engine_config
from vitcg.tools.check.vlm import Unavailable, backend_batches, build_vlm
from vitcg.tools.workloads import InputBuilder
from vitcg.vllm_plugin.bridge import COMPILE_BLOCKS

pytestmark = pytest.mark.gpu
SEEDS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "internvl"]
assert Path(__file__).parent.name == "engine"


@pytest.mark.parametrize("name", SEEDS)
def test_seed_spec_under_cuda_graphs(name, no_tf32):
    spec = REGISTRY[name]
    adapter = tiny_adapter(spec, device="cuda", dtype=torch.float32, seed=3)
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


@pytest.mark.parametrize("name", SEEDS)
def test_seed_vlm_through_the_plugin_under_cuda_graphs(name, no_tf32, monkeypatch):
    """The tiny VLM's own processor batches, laid out as the Transformers backend passes them, through the
    plugin's members under real capture: every item equals the backend's feature call (the stand-in's
    ``embed_multimodal``) and every item replays, on the pack that learns the tower's output and after it. With the
    tower's own blocks (``VITCG_COMPILE_BLOCKS=0``): the compiled default is the next test's, on one spec."""
    monkeypatch.setenv(COMPILE_BLOCKS, "0")
    spec = REGISTRY[name]
    if spec.unavailable:
        pytest.skip(spec.unavailable)
    try:
        vlm = build_vlm(spec, device="cuda")
        batches = backend_batches(spec, vlm)
    except Unavailable as exc:
        pytest.skip(str(exc))
    model = _served_by_the_plugin(name, spec, vlm, batches)
    assert not model._vitcg.adapter.compiles


def _served_by_the_plugin(name, spec, vlm, batches, replays=True):
    """The plugin's members on the stand-in, profiled with each batch and captured by the consumer; each batch is
    then served twice (with ``replays``, every item replayed), each item equal to the backend's own. Without
    ``replays``, each batch is served four times: the first two replays price the budgets, the next calls run on
    the eager forward where the router explores them. Returns the plugged model."""
    model = plugged(vlm)
    want = {}
    with torch.inference_mode():
        for modality, batch in batches.items():
            batches[modality] = batch = {k: v.cuda() if k.startswith("pixel_values") else v for k, v in batch.items()}
            try:
                want[modality] = model.embed_multimodal(**batch)  # the profiling batch: the spec must read it
            except TypeError as exc:
                pytest.skip(f"the Transformers backend cannot encode {name}'s {modality} batch itself: {exc}")
    assert type(model).__name__ == "PluggedStandIn", "the plugin declined the backend's batch"
    consumer = ProtocolConsumer(engine_config(1 << 14, 1 << 14, token_budgets=list(spec.tests.budgets),
                                              max_items_per_batch=8),
                                torch.device("cuda"), torch.float32, model, cuda_graphs=True)
    consumer.capture()
    attempts = ("learning the layout", "graph rows") if replays else ("first", "second", "third", "fourth")
    for modality, batch in batches.items():
        for attempt in attempts:
            hits = consumer.hits
            got = consumer.execute(batch)
            if replays:
                assert consumer.hits - hits == len(want[modality]), f"{modality} ({attempt}): not every item replayed"
            assert_items_match(got, want[modality], what=f"{modality} ({attempt}): ")
    assert model._vitcg.off is None, model._vitcg.off
    return model


def test_the_plugin_compiles_blocks_on_cuda_and_a_later_start_loads_them(no_tf32, monkeypatch, tmp_path):
    """The default on CUDA: the plugin's graphs hold qwen2_vl's blocks compiled by inductor, every item equal to the
    backend's (float32, 1e-5), and the block functions compiled at each budget's warm-up are stored in the
    persistent cache; a second model of the same spec (a later start of the server) loads them and compiles none."""
    monkeypatch.delenv(COMPILE_BLOCKS, raising=False)
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    spec = REGISTRY["qwen2_vl"]
    vlm = build_vlm(spec, device="cuda")
    batches = backend_batches(spec, vlm)
    first = _served_by_the_plugin("qwen2_vl", spec, vlm, dict(batches))._vitcg.adapter
    assert first.compiles and first.ahead is not None and not first.ahead.disabled, first.ahead
    assert first.ahead.compiled >= len(spec.tests.budgets)  # at least one function per budget
    stored = list((tmp_path / "compile").glob("*.aot"))
    assert len(stored) == 1 and stored[0].stat().st_size > 0
    second = _served_by_the_plugin("qwen2_vl", spec, vlm, dict(batches))._vitcg.adapter
    assert second.compiles and second.ahead.compiled == 0 and second.ahead.load_seconds, second.ahead.blobs.keys()
    assert second.eager_compiled and second.on_eager_compiled is not None  # the eager forward's, in KEY.eager.aot


def test_the_router_explores_a_costly_call_on_the_compiled_eager_forward(no_tf32, monkeypatch, tmp_path):
    """On CUDA the plugin's router times the first replays of each budget; a call whose replay it finds costly
    (here: every replay, the threshold lowered to nothing) runs on the eager forward with compiled blocks, no graph
    replayed, every item equal to the backend's, and the functions it compiled are stored for a later start."""
    from vitcg.runtime import costs

    monkeypatch.delenv(COMPILE_BLOCKS, raising=False)
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(costs, "EXPLORE_MS", 0.0)
    spec = REGISTRY["qwen2_vl"]
    vlm = build_vlm(spec, device="cuda")
    batches = backend_batches(spec, vlm)
    model = _served_by_the_plugin("qwen2_vl", spec, vlm, dict(batches), replays=False)
    router, adapter = model._vitcg.router, model._vitcg.adapter
    assert router.eager_calls > 0 and router.costs.eager_samples, router.describe()
    assert adapter.eager_compiled and adapter.eager_ahead.compiled > 0
    assert list((tmp_path / "compile").glob("*.eager.aot"))
