"""The vLLM plugin's compiled blocks (``VITCG_COMPILE_BLOCKS``), on the CPU through the backend stand-in and the
vLLM-style consumer: where they are on by default, and that a compilation that fails costs the graphs inductor's
kernels, never the graphs (the stock path does not take over). The GPU side, with inductor and the persistent
cache, is tests/engine/test_vllm_protocol_cuda.py."""

from __future__ import annotations

import logging

import pytest
import torch
from backend_standin import plugged
from test_vllm_protocol import REGISTRY
from vllm_consumer import ProtocolConsumer

from support.eager import assert_items_match
from vitcg.runtime import regions
from vitcg.runtime.engine import engine_config
from vitcg.tools.check.vlm import Unavailable, backend_batches, build_vlm
from vitcg.vllm_plugin import bridge as bridge_module

NAME = "qwen2_vl"


@pytest.fixture(scope="module")
def vlm_and_batch():
    spec = REGISTRY[NAME]
    try:
        vlm = build_vlm(spec)
        batches = backend_batches(spec, vlm)
    except Unavailable as exc:
        pytest.skip(str(exc))
    return vlm, batches["image"]


def _plugged_and_profiled(vlm, batch):
    model = plugged(vlm)
    with torch.inference_mode():
        want = model.embed_multimodal(**batch)  # the profiling batch: it builds the adapter
    assert type(model).__name__ == "PluggedStandIn", "the plugin declined the backend's batch"
    return model, want


def _consumer(model):
    """vLLM's manager as the tests' consumer stands in for it: the spec's test budgets, 8 items a pack, no graphs."""
    return ProtocolConsumer(engine_config(1 << 14, 1 << 14, token_budgets=list(REGISTRY[NAME].tests.budgets),
                                          max_items_per_batch=8), torch.device("cpu"), torch.float32, model)


@pytest.mark.parametrize("value, on_cuda, compiles", [
    (None, False, False), (None, True, True), ("0", True, False), ("1", False, True), (" 1 ", False, True)])
def test_blocks_compile_where_the_tower_is_on_cuda_unless_the_variable_says(value, on_cuda, compiles, monkeypatch,
                                                                            vlm_and_batch):
    if value is None:
        monkeypatch.delenv(bridge_module.COMPILE_BLOCKS, raising=False)
    else:
        monkeypatch.setenv(bridge_module.COMPILE_BLOCKS, value)
    monkeypatch.setattr(bridge_module, "compiles_by_default", lambda encoder: on_cuda)
    model, _ = _plugged_and_profiled(*vlm_and_batch)
    assert model._vitcg.adapter.compiles is compiles
    assert bool(model._vitcg.adapter._blocks) is compiles  # qwen2_vl has repeated blocks: they are what compiles


def test_another_value_of_the_variable_is_one_warning_and_the_default(monkeypatch, caplog, vlm_and_batch):
    monkeypatch.setenv(bridge_module.COMPILE_BLOCKS, "yes")
    with caplog.at_level(logging.WARNING, logger=bridge_module.__name__):
        model, _ = _plugged_and_profiled(*vlm_and_batch)
    assert not model._vitcg.adapter.compiles  # the default: the tower is on the CPU
    assert [r.getMessage() for r in caplog.records] == [
        "vitcg: VITCG_COMPILE_BLOCKS: expected 0 or 1, got 'yes'; compiling the blocks where the tower is on CUDA"]


def test_a_failed_compilation_leaves_the_graphs_on_with_plain_blocks(monkeypatch, caplog, vlm_and_batch):
    """Every compilation fails (ahead of time and the plain one): the first budget's warm-up forward runs again with
    the tower's own blocks, one warning says why, every later budget is captured plain, and every item of the
    batch comes from a replay and equals the stock backend's, with the graphs still on."""
    vlm, batch = vlm_and_batch

    def no_kernel(*args, **kwargs):
        def compiled(*args, **kwargs):
            raise RuntimeError("inductor: no kernel for this block")
        return compiled
    monkeypatch.setenv(bridge_module.COMPILE_BLOCKS, "1")
    monkeypatch.setattr(regions.torch, "compile", no_kernel)
    model, want = _plugged_and_profiled(vlm, batch)
    assert model._vitcg.adapter.compiles
    consumer = _consumer(model)
    with caplog.at_level(logging.WARNING, logger=bridge_module.__name__):
        consumer.capture()
        with torch.inference_mode():
            got = consumer.execute(batch)
    assert model._vitcg.off is None and not model._vitcg.adapter.compiles
    assert consumer.hits == len(want) and consumer.misses == 0
    assert_items_match(got, want)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"vitcg: spec {NAME}: a forward with compiled blocks failed: RuntimeError: "
                                  "inductor: no kernel for this block")
    assert messages[0].endswith("its graphs hold the tower's own blocks from here on")


def test_a_forward_that_fails_plain_too_turns_the_graphs_off_with_one_warning(monkeypatch, caplog, vlm_and_batch):
    """A failure that is not the compiler's (the plain forward fails as well) is the plugin's usual fail-safe: the
    stock path answers, and the one warning is the graphs', not a second one about compiled blocks."""
    vlm, batch = vlm_and_batch
    monkeypatch.setenv(bridge_module.COMPILE_BLOCKS, "1")
    model, want = _plugged_and_profiled(vlm, batch)

    def broken(inputs, path="default"):
        raise RuntimeError("a kernel the device cannot hold")
    monkeypatch.setattr(model._vitcg.adapter, "encoder_cudagraph_forward", broken)
    consumer = _consumer(model)
    with caplog.at_level(logging.WARNING, logger=bridge_module.__name__):
        consumer.capture()
        with torch.inference_mode():
            got = consumer.execute(batch)
    assert model._vitcg.off is not None and "a kernel the device cannot hold" in model._vitcg.off
    assert_items_match(got, want)
    assert len(caplog.records) == 1 and "the model's encoder CUDA graphs are off" in caplog.records[0].getMessage()
