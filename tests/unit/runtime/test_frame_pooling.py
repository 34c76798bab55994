"""Towers that pool each item's frames (Kimi-K2.5): the frame_index and temporal_merge_index providers, the
repeat padding rule, modalities kept ``separate`` (own packs, own graphs), and outputs whose rows come in blocks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import InputError
from vitcg.lang.model import Buffer
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.hf import Layout
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.runtime.padding import fill
from vitcg.runtime.protocol import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from vitcg.runtime.providers import Pack, RowCache, argument_rebuild, compute
from vitcg.tools.workloads import relative_error

kimi = pytest.importorskip("transformers.models.kimi_k25.modeling_kimi_k25")  # transformers >= 5.23

SPECS = packaged()
needs_kimi_spec = pytest.mark.skipif(bool(SPECS["kimi_k25"].unavailable), reason=str(SPECS["kimi_k25"].unavailable))
"""accelerate refuses, and check skips, a spec the installed transformers is too old for (5.17 has the module)."""
GEOMETRY = {"spatial_merge_size": 2}
# (t, h, w) in merged units: chunks of 1 to 4 frames, as Kimi-K2.5's video processor cuts them
ROWS = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4)


def pack_of(rows) -> Pack:
    grid = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in rows])
    return Pack(torch.zeros(0), grid, GEOMETRY, "clip", RowCache())


def buffer(provider: str, padding: str = "zeros") -> Buffer:
    return Buffer(provider, provider, provider, (), None, padding, {})


def pooled_by_the_model(hidden: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The installed model code's own temporal pooling of ``hidden`` (the rows of ``grid``'s items): a gather and a
    mean over the frames up to transformers 5.23, an ``index_add_`` of weighted rows from 5.24 on."""
    if hasattr(kimi.Kimi_K25VisionModel, "temporal_merge"):  # 5.24
        return kimi.Kimi_K25VisionModel.temporal_merge(None, hidden, grid, 2, 2)
    return hidden[kimi.get_vision_temporal_merge_index(grid, 2, 2)].mean(dim=1)


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_frame_index_is_the_models(rows):
    pack = pack_of(rows)
    assert torch.equal(compute(buffer("frame_index"), pack), kimi.get_vision_frame_index(pack.counts))


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_temporal_merge_index_pools_like_the_model(rows):
    """Per item, a mean over the index's frame slots equals the model's own pooling of that item (the model's
    helper cannot take a pack of mixed frame counts: its rows differ in length)."""
    pack = pack_of(rows)
    index = compute(buffer("temporal_merge_index", "repeat"), pack)
    hidden = torch.randn(int(pack.counts.prod(-1).sum()), 3)
    got, start, token = hidden[index].mean(dim=1), 0, 0
    for row in pack.counts:
        want = pooled_by_the_model(hidden[start:start + int(row.prod())], row[None])
        assert torch.allclose(got[token:token + want.shape[0]], want, atol=1e-6)
        start, token = start + int(row.prod()), token + want.shape[0]
    assert token == index.shape[0]


def test_temporal_merge_index_of_one_frame_count_is_the_models():
    """In the form the installed model code takes it (5.24's scatter form rebuilt from the stored gather index)."""
    pack = pack_of([(4, 2, 3), (4, 1, 1)])
    merge = buffer("temporal_merge_index", "repeat")
    want = kimi.get_vision_temporal_merge_index(pack.counts, 2, 2)
    index = compute(merge, pack)
    rebuild = argument_rebuild(merge)
    got = rebuild(index, int(pack.counts.prod(-1).sum())) if rebuild else index
    assert type(got) is type(want)
    for g, w in zip(*((got, want) if isinstance(want, tuple) else ((got,), (want,))), strict=True):
        assert torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w


def test_repeat_padding_fills_the_frame_slots_and_refuses_what_does_not_divide():
    src = torch.arange(2 * 3 * 4).view(2, 3, 4)
    dest = torch.full((4, 12, 4), -1)
    fill("repeat", dest, src, 4, "temporal_merge_index")
    assert torch.equal(dest[:2], src.repeat(1, 4, 1)) and not dest[2:].any()
    assert torch.equal(dest[:2].double().mean(1), src.double().mean(1))  # a mean over the slots is unchanged
    with pytest.raises(InputError, match="dim 1 must divide"):
        fill("repeat", torch.zeros(4, 4, 4, dtype=torch.long), src, 4, "temporal_merge_index")


@pytest.fixture(scope="module")
def kimi_adapter():
    spec = SPECS["kimi_k25"]
    return tiny_adapter(spec)


def grid_inputs(adapter, key: str, rows) -> dict:
    grid = torch.tensor(rows)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3, 14, 14, generator=torch.Generator().manual_seed(len(rows)))
    return {f"pixel_values{'_videos' if key == 'video' else ''}": pixels, f"{key}_grid_thw": grid}


def test_separate_modalities_get_graphs_of_their_own(kimi_adapter):
    config = kimi_adapter.get_encoder_cudagraph_config()
    assert config.capture_axes == (("image", "video"),)
    image = kimi_adapter.prepare_encoder_cudagraph_capture_inputs(256, 4, 4, axis_keys=("image",)).values
    video = kimi_adapter.prepare_encoder_cudagraph_capture_inputs(256, 4, 4, axis_keys=("video",)).values
    assert image["pixel_values"].shape[0] == 256 and video["pixel_values"].shape[0] == 4 * 256
    assert image["temporal_merge_index"].shape == (64, 1, 4) and video["temporal_merge_index"].shape == (64, 12, 4)


def test_a_selection_names_its_graphs_and_never_mixes_modalities(kimi_adapter):
    mixed = {**grid_inputs(kimi_adapter, "image", [[1, 4, 4]]),
             **grid_inputs(kimi_adapter, "video", [[4, 2, 2], [3, 2, 4]])}
    assert kimi_adapter.get_encoder_cudagraph_item_groups(mixed) == [[0], [1, 2]]
    assert kimi_adapter.select_encoder_cudagraph_items(mixed, [2, 1])[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] == ("video",)
    with pytest.raises(InputError, match="keeps modalities separate"):
        kimi_adapter.select_encoder_cudagraph_items(mixed, [0, 1])


def test_the_manager_encodes_separate_modalities_apart(kimi_adapter):
    """A call holding images and videos of 4 and 3 frames: every pack (and eager call) holds one modality, and
    every item matches the model's own forward on it alone."""
    manager = EncoderCudaGraphManager(kimi_adapter, max_num_batched_tokens=1024, max_model_len=1024)
    mixed = {**grid_inputs(kimi_adapter, "image", [[1, 4, 4], [1, 2, 6]]),
             **grid_inputs(kimi_adapter, "video", [[4, 2, 2], [3, 2, 4]])}
    seen = []
    select = kimi_adapter.select_encoder_cudagraph_items

    def spy(mm_kwargs, indices):
        selected = select(mm_kwargs, indices)
        seen.append(selected.get(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG))
        return selected

    kimi_adapter.select_encoder_cudagraph_items = spy
    try:
        outputs = manager.execute(mixed)
    finally:
        del kimi_adapter.select_encoder_cudagraph_items
    # the videos' 7 frames exceed a pack's 4 (the lean frame cap, one chunk's frames): two video packs
    assert ("image",) in seen and ("video",) in seen and manager.stats.replays == 3
    for index, got in enumerate(outputs):
        want = kimi_adapter.encoder_eager_forward(kimi_adapter.select_encoder_cudagraph_items(mixed, [index]))
        assert got.shape == want.shape and relative_error(got, want) <= 1e-5


def test_without_separate_a_pack_may_mix_modalities(kimi_adapter):
    spec = SPECS["kimi_k25"]
    spec = dataclasses.replace(spec, modalities=tuple(dataclasses.replace(m, separate=False) for m in spec.modalities))
    adapter = adapter_for(spec, kimi_adapter.module)
    mixed = {**grid_inputs(adapter, "image", [[1, 4, 4]]), **grid_inputs(adapter, "video", [[4, 2, 2]])}
    assert adapter.get_encoder_cudagraph_item_groups(mixed) == [[0, 1]]
    assert adapter.get_encoder_cudagraph_config().capture_axes == ()
    assert ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG not in adapter.select_encoder_cudagraph_items(mixed, [0, 1])


def test_output_rows_in_blocks_are_rebuilt_in_blocks():
    """Kimi-K2.5's pooler output is (tokens, 4, hidden): four rows per token, the tokens on dim 0."""
    spec = SPECS["kimi_k25"]
    layout = Layout.learn(spec, {"pooler_output": torch.zeros(6, 4, 8)}, 24)
    rebuilt = layout.build(torch.arange(40 * 8.0).view(40, 8))
    assert rebuilt["pooler_output"].shape == (10, 4, 8)
    assert torch.equal(rebuilt["pooler_output"].reshape(40, 8), torch.arange(40 * 8.0).view(40, 8))


@needs_kimi_spec
def test_accelerate_never_gives_the_manager_images_and_videos_in_one_call():
    """Under vitcg.accelerate the VLM reaches the tower through get_image_features and get_video_features, one
    modality per call: a forward with images and (one-frame) video chunks routes each apart, as it should."""
    from vitcg.runtime.accelerate import accelerate
    from vitcg.tools.check.vlm import build_vlm

    spec = SPECS["kimi_k25"]
    vlm = build_vlm(spec)
    image = grid_inputs(None, "image", [[1, 4, 4], [1, 2, 4]])
    video = grid_inputs(None, "video", [[1, 2, 2]])  # transformers 5.23 splits t > 1 chunks wrongly itself
    with torch.no_grad():
        want = [vlm.model.get_image_features(image["pixel_values"], image["image_grid_thw"]).pooler_output,
                vlm.model.get_video_features(video["pixel_values_videos"], video["video_grid_thw"]).pooler_output]
    handle = accelerate(vlm, spec=spec, max_num_batched_tokens=1024, max_model_len=1024)
    calls = []
    execute = handle.manager.execute
    handle.manager.execute = lambda mm: calls.append(sorted(mm)) or execute(mm)
    with torch.no_grad():
        vlm.model.get_image_features(image["pixel_values"], image["image_grid_thw"])  # learns the layout
        got = [vlm.model.get_image_features(image["pixel_values"], image["image_grid_thw"]).pooler_output,
               vlm.model.get_video_features(video["pixel_values_videos"], video["video_grid_thw"]).pooler_output]
    assert calls == [["image_grid_thw", "pixel_values"], ["pixel_values_videos", "video_grid_thw"]]
    for got_items, want_items in zip(got, want):
        assert all(relative_error(g, w) <= 1e-5 for g, w in zip(got_items, want_items, strict=True))


@needs_kimi_spec
def test_a_half_precision_check_of_separate_modalities_compares_with_float32():
    """The float32 reference of a half-precision check is fed the selection, capture axis key included (a list,
    not a tensor): the H100 run of check found it converting every value as a tensor."""
    from vitcg.tools.check.cases import check_spec

    report = check_spec(SPECS["kimi_k25"], dtype=torch.bfloat16, size="tiny")
    spec_cases = [c for c in report.cases if c.stage == "spec" and not c.skipped]
    assert report.error is None and spec_cases
    assert all(c.ok and c.graph_vs_fp32 is not None for c in spec_cases if c.items), \
        [(c.name, c.error) for c in spec_cases]


def test_the_vlm_stage_on_cuda_sizes_its_engine_by_its_items():
    """On CUDA the float32 vlm stage asks for four times its items' rows, not 8192 tokens: Kimi-K2.5's tiny tower
    asked the H100 for 64 GiB of attention scores at 8192 tokens of rows."""
    from vitcg.tools.check.vlm import _engine_tokens, build_vlm

    spec = SPECS["kimi_k25"]
    vlm = build_vlm(spec)
    assert _engine_tokens(spec, vlm, 100, "cpu") == 8192
    assert _engine_tokens(spec, vlm, 100, "cuda") == 400
