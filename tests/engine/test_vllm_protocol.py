"""Every spec under a vLLM-style consumer (tests/engine/vllm_consumer.py): each item equals its eager output.

CPU, float32, tiny encoders: relative error ||got - eager|| / ||eager|| <= 1e-5 per item, every output
finite. One modality per call, as vLLM's runner sends them. Graph-scoped specs cannot be driven by a
protocol-only consumer: their adapters must say so (no protocol claim, a named error).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from vllm_consumer import ProtocolConsumer

from support.eager import assert_matches_eager
from support.specs import packaged
from vitcg.errors import UnsupportedError
from vitcg.runtime import protocol
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.engine import engine_config
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import InputBuilder

REPO = Path(__file__).resolve().parents[2]
REGISTRY = packaged()
PLAIN = [spec.name for spec in REGISTRY if not spec.graph_scope]
SCOPED = [spec.name for spec in REGISTRY if spec.graph_scope]


def sizes_for(builder: InputBuilder, modality: str) -> list:
    """Items of several sizes (more than one pack holds at the smallest budgets)."""
    if builder.spec.style == "tiles":
        return [1, 3, 2, 1, 2] if builder.spec.modality(modality).count_key else [1] * 5
    if modality == "video":
        frames = min(2, builder.spec.modality("video").max_frames_per_video)
        return [builder.video(frames, 2, 2), builder.video(1, 4, 2), builder.video(frames, 2, 4)]
    return [builder.image(a, b) for a, b in ((2, 2), (4, 6), (2, 4), (6, 8), (4, 4))]


def with_tiny_config(name: str, overrides: Mapping[str, object]):
    """The spec ``name`` with ``overrides`` merged into its tiny config (the encoder's geometry still comes
    from the spec's formulas over that config)."""
    spec = REGISTRY[name]
    if not overrides:
        return spec
    tiny = {**spec.tests.tiny_config, **overrides}
    return dataclasses.replace(spec, tests=dataclasses.replace(spec.tests, tiny_config=tiny))


@pytest.fixture(scope="module")
def built():
    """Per spec name (and tiny-config overrides) its adapter over a tiny encoder and a freshly seeded input
    builder. "name" is a module-scoped parameter, so pytest runs each spec's tests one after another: each
    encoder is built once, and only one is alive at a time (memory stays flat)."""
    cache = {}

    def get(name, overrides: Mapping[str, object] | None = None):
        spec = with_tiny_config(name, overrides or {})
        key = (name, tuple(sorted((overrides or {}).items())))
        if key not in cache:
            cache.clear()
            encoder = build_encoder(spec, seed=3)
            for field, value in (overrides or {}).items():  # an override the config class ignores is no override
                assert getattr(encoder.config, field) == value, (name, field, getattr(encoder.config, field))
            cache[key] = adapter_for(spec, encoder)
        adapter = cache[key]
        return adapter, InputBuilder(spec, adapter, torch.Generator().manual_seed(7))
    return get


def test_protocol_members_match_vllm():
    """Names, parameters and defaults of the protocol tracked in vitcg.runtime.protocol."""
    assert protocol.VLLM_VERSION == "0.33.0"
    members = {name: inspect.signature(getattr(protocol.SupportsEncoderCudaGraph, name))
               for name in dir(protocol.SupportsEncoderCudaGraph)
               if name.startswith(("get_", "select_", "prepare_", "encoder_", "postprocess_"))}
    assert list(members["prepare_encoder_cudagraph_capture_inputs"].parameters)[1:] == [
        "token_budget", "max_batch_size", "max_frames_per_batch", "device", "dtype", "path", "axis_keys"]
    assert list(members["postprocess_encoder_output"].parameters)[1:] == [
        "outputs", "indices", "per_item_out_tokens", "dest", "clone", "batch_mm_kwargs"]
    for name in ("prepare_encoder_cudagraph_replay_buffers", "encoder_cudagraph_forward", "encoder_eager_forward"):
        assert members[name].parameters["path"].default == "default"
    assert "get_max_frames_per_video" in members
    assert protocol.SupportsEncoderCudaGraph.supports_encoder_cudagraph is True
    config = protocol.EncoderCudaGraphConfig(["image"], ["x"], 8)
    assert config.paths == {"default": protocol.EncoderCudaGraphPathConfig()} and config.capture_axes == ()
    item = protocol.EncoderItemSpec(4, 2)
    assert item.get_path_output_tokens("default") == 2 and item.get_path_output_tokens("other") == 0


@pytest.mark.parametrize("name", PLAIN, scope="module")
def test_spec_under_a_vllm_style_consumer(name, built):
    adapter, builder = built(name)
    assert isinstance(adapter, protocol.SupportsEncoderCudaGraph)
    assert type(adapter).supports_encoder_cudagraph is True
    config = adapter.get_encoder_cudagraph_config()
    assert all(callable(logic) for logic in config.padding_logics.values())
    low, _ = adapter.get_encoder_cudagraph_budget_range(engine_config(1 << 20, 1 << 20))
    consumer = ProtocolConsumer(engine_config(4 * low, 1 << 20), torch.device("cpu"), torch.float32, adapter)
    consumer.capture()
    for modality in config.modalities:
        kwargs = builder.inputs(modality, sizes_for(builder, modality))
        outputs, shared = consumer.execute(kwargs), consumer.execute_dp(kwargs, ranks=2)
        with torch.inference_mode():  # the eager reference needs no autograd graph
            assert_matches_eager(adapter, kwargs, outputs)
            assert_matches_eager(adapter, kwargs, shared)
    assert consumer.hits > 0


ITEMS = 40
"""Items in the one pack: far above the 16 items the manager caps itself to by default (budgets.LEAN_ITEMS)."""
LEAN = {"gemma4": {"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1},
        "idefics2": {"num_hidden_layers": 1, "num_attention_heads": 1},
        "pix2struct": {"num_hidden_layers": 1, "num_attention_heads": 1}}
"""Tiny-config overrides for the one-pack test where even the tiny encoder's smallest item is large: every gemma4
image is a tile of 2520 patches (its spec's max_soft_tokens 280 x pooling 3 x 3), idefics2's smallest item a tile
of 4900 (70 x 70). Through two layers of four heads, replayed and then one by one in eager, 40 gemma4 tiles took
31 CPU s and 40 idefics2 tiles 55 (the test then took only 20 of them); one layer of one head takes less than
half as long (pix2struct's 40 smallest items, one layer of one head: a run of that test alone took 11.8 CPU s
instead of 16.4 on 2026-11-29). How many items a pack's buffers hold, and where each item's rows land, depends on the geometry,
which stays the spec's, not on layers or heads (the consumer test above runs the spec's own tiny config)."""


def test_lean_configs_name_specs_of_this_test():
    assert set(LEAN) <= set(PLAIN), set(LEAN) - set(PLAIN)


@pytest.mark.parametrize("name", PLAIN, scope="module")
def test_forty_small_items_in_one_pack(name, built):
    """40 of the smallest items with that many items per batch: the capture buffers must hold any such pack."""
    adapter, builder = built(name, LEAN.get(name))
    modality = adapter.get_encoder_cudagraph_config().modalities[0]
    item = (1 if builder.spec.style == "tiles" else
            builder.image(1, 1) if modality == "image" else builder.video(1, 1, 1))
    kwargs = builder.inputs(modality, [item] * ITEMS)
    tokens = max(ITEMS, sum(s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(kwargs)))
    consumer = ProtocolConsumer(engine_config(tokens, 1 << 20, token_budgets=[tokens], max_items_per_batch=ITEMS),
                                torch.device("cpu"), torch.float32, adapter)
    consumer.capture()
    assert consumer.packs([1] * ITEMS) == [list(range(ITEMS))]
    outputs = consumer.execute(kwargs)
    with torch.inference_mode():  # the eager reference needs no autograd graph (40 of them cost a third more)
        assert_matches_eager(adapter, kwargs, outputs)
    assert consumer.misses == 0


@pytest.mark.parametrize("name", SCOPED)
def test_scoped_specs_do_not_claim_the_protocol(name, built):
    adapter, _ = built(name)
    assert not isinstance(adapter, protocol.SupportsEncoderCudaGraph)
    with pytest.raises(UnsupportedError, match="graph-scoped"):
        adapter.prepare_encoder_cudagraph_replay_buffers({}, 1, 1)
    assert not hasattr(adapter, "supports_encoder_cudagraph")
