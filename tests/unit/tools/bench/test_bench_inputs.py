"""``vitcg bench`` shapes workload inputs for every spec, as the model's processor would."""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.runtime.protocol import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from vitcg.tools.workloads import WORKLOADS, _item_size, make_inputs, on_device

SPECS = packaged()


@pytest.mark.parametrize("name", SPECS.names)
def test_every_spec_gets_inputs_the_adapter_accepts(name):
    spec = SPECS[name]
    adapter = tiny_adapter(spec)
    shaped = 0
    for workload in WORKLOADS.values():
        inputs = make_inputs(adapter, workload, torch.Generator().manual_seed(0))
        wanted = [m for m, entries in (("image", workload.images), ("video", workload.videos)) if entries]
        if inputs is None:  # only for a modality the spec lacks
            assert any(spec.modality(m) is None for m in wanted), workload.name
            continue
        shaped += 1
        items = adapter.get_encoder_cudagraph_item_specs(inputs)
        assert len(items) == len(workload.images) + len(workload.videos)  # one item per image or video
        # rows agree with the counts (select raises otherwise), every role is present
        everything = {}  # a spec with separate modalities selects each one apart and names its graphs
        for group in adapter.get_encoder_cudagraph_item_groups(inputs):
            everything.update(adapter.select_encoder_cudagraph_items(inputs, group))
        everything.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, None)
        assert sorted(everything) == sorted(inputs)
    assert shaped >= 1


def test_processor_shaped_sizes():
    qwen2 = tiny_adapter(SPECS["qwen2_vl"])
    image, video = SPECS["qwen2_vl"].modality("image"), SPECS["qwen2_vl"].modality("video")
    assert _item_size(qwen2, image, (480, 640)) == [1, 34, 46]  # rounded to 28 px: 476 x 644
    assert _item_size(qwen2, video, (4, 448, 448)) == [2, 32, 32]  # temporal patch 2
    internvl = SPECS["internvl"]
    tiles = tiny_adapter(internvl, "real", device="meta")
    assert _item_size(tiles, internvl.modality("image"), (448, 448)) == 1
    assert _item_size(tiles, internvl.modality("image"), (768, 1024)) == 3 * 2 + 1  # 6 tiles and a thumbnail
    assert _item_size(tiles, internvl.modality("video"), (4, 448, 448)) == 4  # one tile per frame
    siglip = tiny_adapter(SPECS["siglip"])
    assert _item_size(siglip, SPECS["siglip"].modality("image"), (720, 1280)) == 1  # resized to one tile


def test_inputs_move_to_the_device_but_counts_stay_on_the_host():
    spec = SPECS["idefics3"]
    adapter = tiny_adapter(spec, dtype=torch.bfloat16)
    moved = on_device(adapter, make_inputs(adapter, WORKLOADS["1x224"], torch.Generator()), torch.bfloat16)
    assert moved["pixel_values"].dtype == torch.bfloat16
    assert moved["patch_attention_mask"].dtype == torch.bool  # masks keep their dtype
    assert moved["num_patches"].dtype == torch.int64
