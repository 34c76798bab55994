"""Every spec vLLM's manager can drive, under vLLM 0.33.0's real ``EncoderCudaGraphManager``.

tests/engine/test_vllm_protocol.py drives the adapters with vitcg's own reading of the protocol
(tests/engine/vllm_consumer.py); here the consumer is vLLM's manager itself, built from vLLM's real config
classes, with one test double: capture on a CPU (``CpuCaptureManager`` in doubles.py). Its packing, budgets,
replay buffers, padding logics, postprocessing and hit and miss counts are vLLM's code.

Per spec (graph-scoped specs excepted: their graphs cannot be refilled from kwargs; specs the installed
transformers cannot run are skipped by name) and per modality, with the multimodal kwargs as vLLM's
Transformers backend hands them over (``num_image_patches`` / ``num_video_patches`` included):
- items of several sizes through ``manager.execute`` equal the adapter's ``encoder_eager_forward`` per item
  (CPU, float32, relative error ``||got - eager|| / ||eager||`` <= 1e-5, finite), each item a graph hit;
- an item larger than every budget is a miss, runs eagerly, and still equals eager (skipped for tile encoders
  whose every item is one tile: no item outgrows the smallest budget, which is one tile's tokens).
Two defects only vLLM's code showed have a test each: capture-axis keys must be hashable (a spec with separate
modalities), and the backend's ``num_image_patches`` is accepted and checked against the items.
Budgets are ``low, 2 * low, 4 * low`` (the ladder vLLM makes over ``[low, 4 * low]``; none above the spec's
largest), from the adapter's budget range of a real ``VllmConfig``, with at most three items per batch, so the
items of a call span several packs and budgets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from doubles import CpuCaptureManager

from support.eager import assert_matches_eager
from support.specs import packaged, spec_text
from support.tiny import tiny_adapter
from vitcg.errors import InputError
from vitcg.lang import spec_from_text
from vitcg.runtime.adapter import SpecAdapter
from vitcg.runtime.inputs import BACKEND_ROW_KEYS
from vitcg.tools.workloads import InputBuilder

REGISTRY = packaged()
PLAIN = [spec.name for spec in REGISTRY if not spec.graph_scope]
ITEMS_PER_BATCH = 3
"""Fewer than a modality's items in :func:`sizes_for`: every call spans several packs."""


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    """vLLM's ``ModelConfig`` of a tiny LLaVA saved once in a temporary folder (config, a word-level tokenizer,
    the PIL CLIP image processor), served as the Transformers backend. The manager reads only its multimodal
    limits and the adapters its ``max_model_len``: which VLM it is does not matter here."""
    from engine_run import make_folder
    from vllm.config import ModelConfig

    folder = tmp_path_factory.mktemp("tiny_llava")
    make_folder(str(folder))
    return ModelConfig(model=str(folder), model_impl="transformers", dtype="float32", max_model_len=1 << 16)


def vllm_config(model_config, token_budgets: list[int] | None = None, items_per_batch: int = 0):
    """A real ``VllmConfig`` with encoder graphs on; budgets and items per batch as the user options (None and 0:
    vLLM's defaults, inferred from the model)."""
    from vllm.config import CompilationConfig, VllmConfig

    options = {} if token_budgets is None else {"encoder_cudagraph_token_budgets": token_budgets}
    return VllmConfig(model_config=model_config, compilation_config=CompilationConfig(
        cudagraph_mm_encoder=True, encoder_cudagraph_max_vision_items_per_batch=items_per_batch, **options))


@pytest.fixture(scope="module")
def defaults(model_config):
    """A ``VllmConfig`` with vLLM's defaults, shared by every spec for its budget range."""
    return vllm_config(model_config)


def manager_for(adapter, defaults) -> CpuCaptureManager:
    """vLLM's manager over ``adapter``, captured, with budgets ``low, 2 * low, 4 * low`` (none above the spec's
    largest) and up to :data:`ITEMS_PER_BATCH` items per batch."""
    low, high = adapter.get_encoder_cudagraph_budget_range(defaults)
    budgets = sorted({min(low * 2 ** k, high) for k in range(3)})
    config = vllm_config(defaults.model_config, budgets, min(ITEMS_PER_BATCH, low))
    manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, adapter)
    manager.capture(graph_pool=None)
    return manager


def backend_kwargs(adapter, builder, modality: str, sizes: list) -> dict:
    """Multimodal kwargs of ``sizes`` as the Transformers backend passes them: the modality's inputs plus its
    rows per item (``num_image_patches`` / ``num_video_patches``, an int64 CPU tensor)."""
    kwargs = builder.inputs(modality, sizes)
    rows = [item.input_size for item in adapter.get_encoder_cudagraph_item_specs(kwargs)]
    return {**kwargs, BACKEND_ROW_KEYS[modality]: torch.tensor(rows, dtype=torch.int64)}


def sizes_for(builder: InputBuilder, modality: str) -> list:
    """Items of several sizes, more than one batch holds (:data:`ITEMS_PER_BATCH`), none larger than the largest
    budget."""
    if builder.spec.style == "tiles":
        return [1, 3, 2, 1, 2] if builder.spec.modality(modality).count_key else [1] * 4
    if modality == "video":
        frames = min(2, builder.spec.modality("video").max_frames_per_video)
        return [builder.video(frames, 2, 2), builder.video(1, 4, 2), builder.video(frames, 2, 4), builder.video(1, 2, 2)]
    return [builder.image(a, b) for a, b in ((2, 2), (4, 6), (2, 4), (6, 8), (4, 4))]


def oversized(adapter, builder: InputBuilder, modality: str, budget: int):
    """The smallest item of a growing series whose output tokens exceed ``budget``; None when every item of
    the modality has the same size (one tile per item)."""
    m = builder.spec.modality(modality)
    if builder.spec.style == "tiles" and m.count_key is None:
        return None
    for side in range(2, 257, 2):
        item = (side if builder.spec.style == "tiles" else
                builder.video(1, side, side) if modality == "video" else builder.image(side, side))
        tokens = adapter.get_encoder_cudagraph_item_specs(builder.inputs(modality, [item]))[0].output_tokens
        if tokens > budget:
            return item
    raise AssertionError(f"{builder.spec.name}: no {modality} item up to 256 exceeds {budget} tokens")


def execute(manager, adapter, kwargs) -> tuple[int, int]:
    """Runs ``kwargs`` through the manager as vLLM's model runner does (inference mode) and checks every item
    against the adapter's eager forward of that item alone; returns the hits and misses the call added."""
    hits, misses = manager.graph_hits, manager.graph_misses
    with torch.inference_mode():
        outputs = manager.execute(kwargs)
    assert_matches_eager(adapter, kwargs, outputs)
    return manager.graph_hits - hits, manager.graph_misses - misses


@dataclass
class Served:
    """One spec's encoder under vLLM's manager."""

    adapter: SpecAdapter
    builder: InputBuilder
    manager: CpuCaptureManager


def serve(spec, defaults) -> Served:
    """``spec``'s tiny encoder (seeded), its adapter and vLLM's manager over it, captured."""
    if spec.unavailable:
        pytest.skip(f"{spec.name}: {spec.unavailable}")
    adapter = tiny_adapter(spec, seed=3)
    return Served(adapter, InputBuilder(spec, adapter, torch.Generator().manual_seed(7)), manager_for(adapter, defaults))


@pytest.fixture(scope="module", params=PLAIN)
def name(request) -> str:
    """The spec under test: module-scoped, so pytest runs a spec's tests together and builds one encoder and
    one manager at a time."""
    return request.param


@pytest.fixture(scope="module")
def served(name, defaults) -> Served:
    return serve(REGISTRY[name], defaults)


def test_items_of_several_sizes_replay_and_equal_eager(served):
    for modality in served.adapter.get_encoder_cudagraph_config().modalities:
        assert served.manager.supports_modality(modality)
        sizes = sizes_for(served.builder, modality)
        hits, misses = execute(served.manager, served.adapter,
                               backend_kwargs(served.adapter, served.builder, modality, sizes))
        assert (hits, misses) == (len(sizes), 0), f"{modality}: every item fits a budget and must replay"


def test_an_item_over_every_budget_is_a_miss_and_equals_eager(served):
    budget = served.manager.token_budgets[-1]
    checked = []
    for modality in served.adapter.get_encoder_cudagraph_config().modalities:
        big = oversized(served.adapter, served.builder, modality, budget)
        if big is None:
            continue
        small = sizes_for(served.builder, modality)[0]
        kwargs = backend_kwargs(served.adapter, served.builder, modality, [small, big])
        hits, misses = execute(served.manager, served.adapter, kwargs)
        assert (hits, misses) == (1, 1), f"{modality}: the item over every budget must be the one miss"
        checked.append(modality)
    if not checked:
        pytest.skip(f"{served.builder.spec.name}: every item is one tile of a fixed size, within the smallest "
                    "budget")


def separate_variant(name: str):
    """Spec ``name`` with its video modality kept ``separate`` (capture axes by modality), validated from text:
    kimi_k25, the one packaged spec with separate modalities, needs a transformers newer than vLLM 0.33.0's."""
    text = spec_text(name)  # the packaged spec with its harness written in
    anchor = "    max_frames_per_video: 32\n"
    assert text.count(anchor) == 1
    return spec_from_text(text.replace(f"name: {name}\n", f"name: {name}_separate\n", 1)
                          .replace(anchor, anchor + "    separate: true\n"), file=f"{name}_separate.yaml")


def test_separate_modalities_select_hashable_axis_keys(defaults):
    """vLLM keys its graphs by ``(budget, axis keys)``: a list of keys crashed its lookup (unhashable)."""
    spec = separate_variant("qwen2_vl")
    assert spec.separate_modalities
    served = serve(spec, defaults)
    adapter, builder, manager = served.adapter, served.builder, served.manager
    assert manager.get_num_graphs_to_capture() == 2 * len(manager.token_budgets)  # per budget, per modality
    for modality in ("image", "video"):
        kwargs = backend_kwargs(adapter, builder, modality, sizes_for(builder, modality))
        hits, misses = execute(manager, adapter, kwargs)
        assert (hits, misses) == (len(sizes_for(builder, modality)), 0)
        assert adapter.select_encoder_cudagraph_items(kwargs, [0])["encoder_cudagraph_axis_keys"] == (modality,)


def test_backend_rows_that_differ_from_the_items_are_refused(defaults):
    """The backend's rows per item are checked: a count that does not match the items fails in vLLM's
    manager with an InputError naming the key, the expected and the actual counts."""
    served = serve(REGISTRY["qwen2_vl"], defaults)
    adapter, builder, manager = served.adapter, served.builder, served.manager
    kwargs = backend_kwargs(adapter, builder, "image", [builder.image(2, 2), builder.image(2, 4)])
    assert kwargs["num_image_patches"].tolist() == [16, 32]
    with pytest.raises(InputError, match=r"'num_image_patches': expected \[16, 32\].*got \[32, 16\]"):
        manager.execute({**kwargs, "num_image_patches": torch.tensor([32, 16])})
