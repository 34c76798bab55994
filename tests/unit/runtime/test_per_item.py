"""Item-aligned input roles (``modalities.*.per_item``): one integer per item, not one row per pixel row.

VideoLLaMA3's tower takes ``merge_sizes`` beside its grid (1 per image, 2 per video from the processors). Such
an input is selected by item index, padded a row per item, read by the items formulas under its role name, and
fed by ``vitcg check`` and bench from its ``per_item`` value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from support.inputs import QWEN2_ROW
from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import InputError, SpecRuntimeError
from vitcg.lang import SpecSource
from vitcg.lang.formulas import parse
from vitcg.runtime.adapter import SpecAdapter
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.check import vlm
from vitcg.tools.workloads import InputBuilder, relative_error

SPECS = packaged()
PER_ITEM = SpecSource.of_files(["tests/specs/valid/per_item_inputs.yaml"]).specs[0]
VL3_ROW = 588  # tiny video_llama_3: 3 * 14 ** 2


@pytest.fixture(scope="module")
def qwen():
    return tiny_adapter(PER_ITEM, seed=1)


@pytest.fixture(scope="module")
def vl3():
    spec = SPECS["video_llama_3"]
    return tiny_adapter(spec, seed=1)


def images(merge_sizes, *grids):
    g = torch.tensor(grids, dtype=torch.int64)
    return {"pixel_values": torch.randn(int(g.prod(-1).sum()), QWEN2_ROW, generator=torch.Generator().manual_seed(0)),
            "image_grid_thw": g, "image_merge_sizes": torch.tensor(merge_sizes)}


def test_the_spec_reads_per_item_roles():
    (image, video) = PER_ITEM.modalities
    assert image.item_roles == ("merge_sizes",) and image.extra_roles == ()
    spec = SPECS["video_llama_3"]
    assert spec.item_sizes("image", [1, 4, 6], {}) == (24, 24, 0)  # per_item default: 1
    assert spec.item_sizes("video", [3, 4, 6], {"max_merge_size": 2}) == (72, 18, 3)  # default: max_merge_size
    assert spec.item_sizes("image", [1, 4, 6], {}, values={"merge_sizes": 2}) == (24, 6, 0)


def test_items_follow_each_items_value(qwen):
    kwargs = images([1, 2], [1, 4, 4], [1, 4, 8])
    specs = qwen.get_encoder_cudagraph_item_specs(kwargs)
    assert [(s.input_size, s.output_tokens) for s in specs] == [(16, 16), (32, 8)]


def test_selection_indexes_per_item_inputs(qwen):
    kwargs = images([1, 2, 4], [1, 4, 4], [1, 4, 8], [1, 8, 8])
    selected = qwen.select_encoder_cudagraph_items(kwargs, [2, 0])
    assert selected["image_merge_sizes"].tolist() == [4, 1]
    assert selected["image_grid_thw"].tolist() == [[1, 8, 8], [1, 4, 4]]
    assert torch.equal(selected["pixel_values"][:64], kwargs["pixel_values"][48:])


def test_buffers_hold_a_row_per_item(qwen):
    kwargs = images([1, 2], [1, 4, 4], [1, 4, 8])
    values = qwen.prepare_encoder_cudagraph_replay_buffers(kwargs, max_batch_size=2, max_frames_per_batch=0).values
    assert values["merge_sizes"].tolist() == [1, 2]
    capture = qwen.prepare_encoder_cudagraph_capture_inputs(64, 5, 0, device="cpu").values
    assert capture["merge_sizes"].shape == (5,) and capture["merge_sizes"].dtype == torch.int64
    narrow = [dataclasses.replace(b, shape=(parse("1", []),)) if b.provider == "aligned" else b
              for b in PER_ITEM.buffers]  # a shape short of a row per item is an error, never silently raised
    adapter = SpecAdapter(dataclasses.replace(PER_ITEM, buffers=tuple(narrow)), qwen.module)
    with pytest.raises(SpecRuntimeError, match=r"buffer 'merge_sizes' holds 1 rows \(1\) at budget=64, max_items=5"):
        adapter.prepare_encoder_cudagraph_capture_inputs(64, 5, 0, device="cpu")
    qwen.get_encoder_cudagraph_config().padding_logics["merge_sizes"](capture["merge_sizes"], values["merge_sizes"])
    assert capture["merge_sizes"].tolist() == [1, 2, 0, 0, 0]
    (call,) = qwen.eager_calls(kwargs)
    assert call["merge_sizes"].tolist() == [1, 2]


@pytest.mark.parametrize("given, message", [
    (torch.tensor([1, 2, 2]), r"'image_merge_sizes': expected shape \(2,\) \(one value per item"),
    (torch.tensor([1.0, 2.0]), r"'image_merge_sizes': expected an integer dtype"),
    (torch.tensor([[1], [2]]), r"expected shape \(2,\)"),
])
def test_bad_per_item_inputs_are_refused(qwen, given, message):
    kwargs = {**images([1, 2], [1, 4, 4], [1, 4, 8]), "image_merge_sizes": given}
    with pytest.raises(InputError, match=message):
        qwen.get_encoder_cudagraph_item_specs(kwargs)


def test_a_zero_merge_size_names_the_item(qwen):
    with pytest.raises(InputError, match=r"item 1 is \[1, 4, 8\] \(merge_sizes=0\)"):
        qwen.get_encoder_cudagraph_item_specs(images([1, 0], [1, 4, 4], [1, 4, 8]))


def test_check_feeds_the_per_item_values(vl3):
    builder = InputBuilder(vl3.spec, vl3, torch.Generator().manual_seed(0))
    assert builder.inputs("image", [[1, 4, 6], [1, 2, 2]])["image_merge_sizes"].tolist() == [1, 1]
    assert builder.inputs("video", [[2, 4, 4]])["video_merge_sizes"].tolist() == [2]


def test_videolllama3_mixed_merge_sizes_match_the_tower(vl3):
    """Images merged by 1, 2 and 3 and a video merged by 2 in one call: each item's rows match the tower's own
    forward on that item alone (the merge sizes are selected per item, and read by output_tokens)."""
    g = torch.Generator().manual_seed(0)
    grids = torch.tensor([[1, 4, 6], [1, 4, 4], [1, 6, 6]])
    kwargs = {"pixel_values": torch.randn(int(grids.prod(-1).sum()), VL3_ROW, generator=g),
              "image_grid_thw": grids, "image_merge_sizes": torch.tensor([1, 2, 3]),
              "pixel_values_videos": torch.randn(32, VL3_ROW, generator=g),
              "video_grid_thw": torch.tensor([[2, 4, 4]]), "video_merge_sizes": torch.tensor([2])}
    manager = EncoderCudaGraphManager(vl3, token_budgets=[64, 128], max_items_per_batch=4,
                                      max_num_batched_tokens=128, max_model_len=128)
    outputs = manager.execute(kwargs)
    assert [o.shape[0] for o in outputs] == [24, 4, 4, 8]
    assert manager.stats.replays >= 1
    calls = [({"pixel_values": kwargs["pixel_values"][a:b], "grid_thw": grids[i:i + 1],
               "merge_sizes": kwargs["image_merge_sizes"][i:i + 1]})
             for i, (a, b) in enumerate([(0, 24), (24, 40), (40, 76)])]
    calls.append({"pixel_values": kwargs["pixel_values_videos"], "grid_thw": kwargs["video_grid_thw"],
                  "merge_sizes": kwargs["video_merge_sizes"]})
    with torch.no_grad():
        for got, call in zip(outputs, calls, strict=True):
            assert relative_error(got, vl3.module(**call).last_hidden_state) <= 1e-5


def test_vlm_stage_gives_composed_videos_their_per_item_value():
    spec = SPECS["video_llama_3"]
    processor = vlm.build_processor(spec, vlm.build_vlm(spec))
    frames = np.random.default_rng(0).integers(0, 255, (3, 56, 84, 3), dtype=np.uint8)
    made = vlm.compose_videos(spec, processor, [frames, frames[:2]])
    assert made["video_merge_sizes"].tolist() == [2, 2]
    assert made["video_grid_thw"].tolist() == [[3, 4, 6], [2, 4, 6]]
