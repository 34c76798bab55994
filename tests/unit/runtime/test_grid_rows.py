"""Grid rows the encoder sees apart from the items: ``split: frames`` (GLM-4.1V videos: one (1, h, w) row per
frame) and ``grid_columns: [h, w]`` ((h, w) grids without t, as MiniCPM-V's tgt_sizes). Items, output tokens and
frames stay per item (what a vLLM-style manager packs by); only the encoder's grid changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import InputError, SpecRuntimeError
from vitcg.lang import SpecSource
from vitcg.lang.formulas import parse
from vitcg.lang.harness import Placeholder
from vitcg.lang.model import Modality
from vitcg.runtime.adapter import SpecAdapter
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.check import vlm
from vitcg.tools.workloads import relative_error

SPECS = packaged()
ROW = 1176  # tiny glm4v and qwen2_vl: in_channels 3 * temporal_patch_size 2 * patch_size 14 ** 2
HW_GRID = SpecSource.of_files(["tests/specs/valid/hw_grid.yaml"]).specs[0]


@pytest.fixture(scope="module")
def glm():
    return tiny_adapter(SPECS["glm4v"], seed=1)


@pytest.fixture(scope="module")
def hw():
    return tiny_adapter(HW_GRID, seed=1)


def video(*grids):
    g = torch.tensor(grids, dtype=torch.int64)
    rows = int(g.prod(-1).sum())
    return {"pixel_values_videos": torch.randn(rows, ROW, generator=torch.Generator().manual_seed(0)),
            "video_grid_thw": g}


def test_modality_rows():
    split = Modality("video", {}, 8, split="frames")
    assert split.encoder_rows([3, 4, 6]) == [[1, 4, 6]] * 3
    assert split.reshapes_grid
    plain = Modality("video", {}, 8)
    assert plain.encoder_rows([3, 4, 6]) == [[3, 4, 6]] and not plain.reshapes_grid
    hw = Modality("image", {}, 1, grid_columns=("h", "w"))
    assert hw.item_row([4, 6]) == [1, 4, 6]
    assert hw.encoder_grid([1, 4, 6]) == [4, 6]
    with pytest.raises(ValueError):
        hw.item_row([1, 4, 6])


def test_a_split_video_stays_one_item(glm):
    """vLLM packs by items: a video of 3 frames is one item of 3 * 2 * 2 tokens and 3 frames, not 3 items."""
    kwargs = video([3, 4, 4], [2, 4, 8])
    specs = glm.get_encoder_cudagraph_item_specs(kwargs)
    assert [(s.input_size, s.output_tokens) for s in specs] == [(48, 12), (64, 16)]
    assert glm.get_encoder_cudagraph_item_frames(kwargs) == [3, 2]
    assert glm.get_input_modality(kwargs) == "video"
    selected = glm.select_encoder_cudagraph_items(kwargs, [1])
    assert selected["video_grid_thw"].tolist() == [[2, 4, 8]]  # the item as given, not its frames
    assert torch.equal(selected["pixel_values_videos"], kwargs["pixel_values_videos"][48:])


def test_the_encoder_sees_one_row_per_frame(glm):
    kwargs = video([3, 4, 4])
    values = glm.prepare_encoder_cudagraph_replay_buffers(kwargs, max_batch_size=1, max_frames_per_batch=3).values
    assert values["grid_thw"].tolist() == [[1, 4, 4]] * 3
    assert values["cu_seqlens"].tolist() == [0, 16, 32, 48]
    (call,) = glm.eager_calls(kwargs)
    assert call["grid_thw"].tolist() == [[1, 4, 4]] * 3


def test_split_video_graph_matches_eager(glm):
    kwargs = video([3, 4, 4], [1, 8, 4], [2, 4, 8])
    manager = EncoderCudaGraphManager(glm, token_budgets=[64, 128], max_items_per_batch=4,
                                      max_frames_per_batch=8, max_num_batched_tokens=128, max_model_len=128)
    manager.capture()
    outputs = manager.execute(kwargs)
    assert [o.shape[0] for o in outputs] == [12, 8, 16]
    for index, got in enumerate(outputs):
        want = glm.encoder_eager_forward(glm.select_encoder_cudagraph_items(kwargs, [index]))
        assert relative_error(got, want) <= 1e-5


def test_grid_buffer_holds_a_row_per_frame(glm):
    """A split spec's grid buffer holds a row per possible segment; a shape short of that is an error, never
    silently raised."""
    spec = glm.spec
    assert glm.prepare_encoder_cudagraph_capture_inputs(64, 2, 8, device="cpu").values["grid_thw"].shape[0] >= 2 + 8
    narrow = [dataclasses.replace(b, shape=(parse("max_items", ["max_items"]), parse("3", []))) if b.provider == "grid"
              else b for b in spec.buffers]
    adapter = SpecAdapter(dataclasses.replace(spec, buffers=tuple(narrow)), glm.module)
    with pytest.raises(SpecRuntimeError, match=r"'grid_thw' holds 2 rows \(max_items\) .* can need 10 \(grid_rows\)"):
        adapter.prepare_encoder_cudagraph_capture_inputs(64, 2, 8, device="cpu")


def test_hw_grid_items_and_encoder_rows(hw):
    kwargs = {"pixel_values": torch.randn(40, ROW), "tgt_sizes": torch.tensor([[4, 4], [4, 6]])}
    assert [(s.input_size, s.output_tokens) for s in hw.get_encoder_cudagraph_item_specs(kwargs)] == [(16, 4), (24, 6)]
    values = hw.prepare_encoder_cudagraph_replay_buffers(kwargs, max_batch_size=2, max_frames_per_batch=0).values
    assert values["grid_thw"].tolist() == [[4, 4], [4, 6]]
    assert values["cu_seqlens"].tolist() == [0, 16, 40]
    assert values["position_ids"].shape == (40, 2)
    (call,) = hw.eager_calls(kwargs)
    assert call["grid_thw"].tolist() == [[4, 4], [4, 6]]
    capture = hw.prepare_encoder_cudagraph_capture_inputs(64, 2, 0, device="cpu").values
    assert capture["grid_thw"].shape[1] == 2


def test_hw_grid_refuses_thw_rows(hw):
    with pytest.raises(InputError, match=r"'tgt_sizes' must have shape \(items, 2\) \(h, w\), got \(1, 3\)"):
        hw.get_encoder_cudagraph_item_specs({"pixel_values": torch.randn(16, ROW),
                                             "tgt_sizes": torch.tensor([[1, 4, 4]])})


def test_vlm_stage_prompt_groups():
    """Videos of a per-frame placeholder get one group per frame (GLM's rope consumes one grid row per group)."""
    test = SPECS["glm4v"].tests.vlm
    assert test.video == Placeholder("image_token_id", ("image_start_token_id",), ("image_end_token_id",), True)
    groups = vlm._groups(test, [12, 8], 2, [3, 2])
    assert [(rows, kind) for _, rows, kind in groups] == [(4, 2)] * 3 + [(4, 2)] * 2
    whole = dataclasses.replace(test, video=dataclasses.replace(test.video, per_frame=False))
    assert [(rows, kind) for _, rows, kind in vlm._groups(whole, [12, 8], 2, [3, 2])] == [(12, 2), (8, 2)]
    assert [rows for _, rows, _ in vlm._groups(test, [4, 6], 2, None)] == [4, 6]


def test_vlm_stage_composes_videos_from_frames():
    spec = SPECS["glm4v"]
    model = vlm.build_vlm(spec)
    processor = vlm.build_processor(spec, model)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, 56, 84, 3), dtype=np.uint8)
    made = vlm.compose_videos(spec, processor, [frames])
    one = processor(images=[frames[0]], return_tensors="pt")
    t, h, w = made["video_grid_thw"].tolist()[0]
    assert t == 3 and [h, w] == one["image_grid_thw"].tolist()[0][1:]
    assert made["pixel_values_videos"].shape[0] == 3 * one["pixel_values"].shape[0]
    assert torch.equal(made["pixel_values_videos"][:h * w], one["pixel_values"])
