"""The vLLM plugin's vLLM-free half (vitcg.vllm_plugin.bridge): which spec serves a config, and how the backend's
batches are cut into items. The plugin against vLLM's real code is tests/vllm/test_plugin.py."""

from __future__ import annotations

import pytest
import torch
from transformers import Blip2Config, LlamaConfig, Qwen2VLConfig

from vitcg.errors import InputError
from vitcg.vllm_plugin.bridge import Declined, find_spec, item_counts, select_backend_items


def test_a_spec_is_found_by_architecture_and_model_type():
    assert find_spec(Qwen2VLConfig(architectures=["Qwen2VLForConditionalGeneration"])).name == "qwen2_vl"
    assert find_spec(Qwen2VLConfig()).name == "qwen2_vl"  # by model_type alone
    assert find_spec(Blip2Config()).name == "blip_2"


def test_no_spec_is_a_decline_that_says_why():
    with pytest.raises(Declined, match="no vitcg spec for model_type 'llama'"):
        find_spec(LlamaConfig(architectures=["LlamaForCausalLM"]))


def test_rows_flattened_over_items_are_cut_by_the_counts_in_the_order_asked():
    rows = torch.arange(9.0).reshape(9, 1)  # items of 2, 3 and 4 rows
    batch = {"pixel_values": rows, "image_grid_thw": torch.tensor([[1, 1, 2], [1, 1, 3], [1, 2, 2]]),
             "num_image_patches": torch.tensor([2, 3, 4]), "scale": 7}
    picked = select_backend_items(batch, "image", [2, 0])
    assert picked["pixel_values"].flatten().tolist() == [5, 6, 7, 8, 0, 1]
    assert picked["image_grid_thw"].tolist() == [[1, 2, 2], [1, 1, 2]]
    assert picked["num_image_patches"].tolist() == [4, 2]
    assert picked["scale"] == 7  # neither flattened nor one per item: kept


def test_a_leading_batch_dimension_puts_the_rows_on_dim_one():
    rows = torch.arange(5.0).reshape(1, 5, 1)
    picked = select_backend_items({"pixel_values": rows, "num_image_patches": torch.tensor([3, 2])}, "image", [1])
    assert picked["pixel_values"].shape == (1, 2, 1) and picked["pixel_values"].flatten().tolist() == [3, 4]


def test_one_row_per_item_and_lists_are_indexed():
    batch = {"pixel_values_videos": torch.arange(3.0).reshape(3, 1), "num_video_patches": torch.ones(3, dtype=torch.long),
             "names": ["a", "b", "c"]}
    picked = select_backend_items(batch, "video", [1, 2])
    assert picked["pixel_values_videos"].flatten().tolist() == [1, 2] and picked["names"] == ["b", "c"]


def test_missing_counts_name_the_key_and_what_was_given():
    with pytest.raises(InputError, match="'num_image_patches': expected the backend's per-item row counts, got none "
                                         r"\(keys: pixel_values\)"):
        item_counts({"pixel_values": torch.zeros(2, 3)}, "image")
