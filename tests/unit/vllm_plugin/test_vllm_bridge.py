"""The vLLM plugin's vLLM-free half (vitcg.vllm_plugin.bridge): which spec serves a config, and how the backend's
batches are cut into items. The plugin against vLLM's real code is tests/vllm/test_plugin.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Blip2Config, LlamaConfig, Qwen2VLConfig

from vitcg.errors import InputError
from vitcg.vllm_plugin.bridge import (
    Declined,
    data_parallel,
    find_spec,
    item_counts,
    replicated,
    select_backend_items,
)


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


def test_counts_with_an_empty_item_cut_the_rows_by_the_counts():
    # three items over three rows: as many rows as items, but item 0 owns two rows and item 1 none
    batch = {"pixel_values": torch.arange(3.0).reshape(3, 1), "num_image_patches": torch.tensor([2, 0, 1]),
             "image_grid_thw": torch.tensor([[1, 1, 2], [1, 0, 0], [1, 1, 1]])}
    picked = select_backend_items(batch, "image", [0])
    assert picked["pixel_values"].flatten().tolist() == [0, 1]
    assert picked["image_grid_thw"].tolist() == [[1, 1, 2]]  # one row per item, whatever the counts
    assert select_backend_items(batch, "image", [2])["pixel_values"].flatten().tolist() == [2]


def test_no_items_selects_no_rows():
    batch = {"pixel_values": torch.arange(5.0).reshape(5, 1), "num_image_patches": torch.tensor([2, 3])}
    assert select_backend_items(batch, "image", [])["pixel_values"].shape == (0, 1)


BAD_BATCHES = {
    "counts short of the rows": ({"num_image_patches": torch.tensor([3, 3])},
                                 r"'pixel_values': expected 6 rows \(the sum of 'num_image_patches' \[3, 3\]\) on dim 0 "
                                 r"or 1, got shape \(10, 4\)"),
    "fractional counts": ({"num_image_patches": torch.tensor([2.5, 7.5])},
                          "'num_image_patches': expected a tensor of integer row counts, got torch.float32 on cpu"),
    "bool counts": ({"num_image_patches": torch.tensor([True, True])}, "integer row counts, got torch.bool"),
    "NaN counts": ({"num_image_patches": torch.tensor([float("nan"), 10.0])}, "integer row counts, got torch.float32"),
    "negative counts": ({"num_image_patches": torch.tensor([12, -2])},
                        r"num_image_patches\[1\]: expected a non-negative integer row count, got -2"),
    "counts on the meta device": ({"num_image_patches": torch.tensor([4, 6], device="meta")},
                                  "integer row counts, got torch.int64 on meta"),
    "a list of floats": ({"num_image_patches": [4.0, 6.0]},
                         r"num_image_patches\[0\]: expected a non-negative integer row count, got 4.0"),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_counts_that_do_not_describe_the_rows_are_refused_before_any_row_is_taken(case):
    change, message = BAD_BATCHES[case]
    batch = {"pixel_values": torch.zeros(10, 4), **change}
    with pytest.raises(InputError, match=message):
        select_backend_items(batch, "image", [0])


@pytest.mark.parametrize(("indices", "message"), [
    ([2], r"indices: expected item indices in 0..1 \(the batch has 2 items\), got 2"),
    ([-1], "got -1"),
    ([0.5], r"indices\[0\]: expected an integer item index, got 0.5"),
])
def test_indices_outside_the_batch_are_refused(indices, message):
    batch = {"pixel_values": torch.zeros(10, 4), "num_image_patches": torch.tensor([4, 6])}
    with pytest.raises(InputError, match=message):
        select_backend_items(batch, "image", indices)


def test_an_unknown_modality_names_the_known_ones():
    with pytest.raises(InputError, match=r"modality: expected one of \['image', 'video'\], got 'audio'"):
        select_backend_items({"pixel_values": torch.zeros(2, 1)}, "audio", [0])


def test_a_broken_or_missing_user_spec_folder_blocks_no_other_model(tmp_path, monkeypatch, caplog):
    (tmp_path / "clip.yaml").write_text("name: [\n")
    monkeypatch.setenv("VITCG_SPECS_DIR", f"{tmp_path}:{tmp_path / 'missing'}")
    with caplog.at_level("WARNING"):
        with pytest.raises(Declined, match="no vitcg spec for model_type 'llama'"):
            find_spec(LlamaConfig(architectures=["LlamaForCausalLM"]))
        assert find_spec(Qwen2VLConfig()).name == "qwen2_vl"
    assert "clip.yaml" in caplog.text and "missing" in caplog.text


def vllm_config(mode: str | None, tp: int) -> SimpleNamespace:
    """The two fields of vLLM's config that data-parallel encoding reads."""
    return SimpleNamespace(model_config=SimpleNamespace(multimodal_config=SimpleNamespace(mm_encoder_tp_mode=mode)),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp))


def test_data_parallel_encoding_needs_mode_data_and_more_than_one_rank():
    assert data_parallel(vllm_config("data", 2))
    assert not data_parallel(vllm_config("data", 1))
    assert not data_parallel(vllm_config("weights", 4))
    assert not data_parallel(SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None),
                                             parallel_config=SimpleNamespace(tensor_parallel_size=2)))


def test_a_tower_with_a_sharded_layer_declines_naming_it_and_counting_them():
    tower = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    replicated(tower, lambda module: False)  # whole on every rank: no decline
    with pytest.raises(Declined, match=r"2 of Sequential's layers hold a shard of their weight \(0: Linear\)"):
        replicated(tower, lambda module: isinstance(module, torch.nn.Linear))
