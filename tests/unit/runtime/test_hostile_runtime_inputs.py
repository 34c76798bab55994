"""Runtime inputs the model's own forward cannot take (issue 27, item 4): each is refused by the input reader with an
InputError naming the key, what was expected and what was given, on every protocol entry point, where it once
failed inside transformers (or, for Gemma 4, returned a different number of rows than the model, silently)."""

from __future__ import annotations

import pytest
import torch

from support.inputs import assert_refused
from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import InputError
from vitcg.runtime.inputs import INDEX_DTYPES, dtype_problem, role_dtypes
from vitcg.tools.workloads import InputBuilder

SPECS = {spec.name: spec for spec in packaged()}
NAMES = ("qwen2_vl", "video_llama_3", "gemma4", "instructblip", "idefics2", "mllama", "siglip2")


@pytest.fixture(scope="module")
def built():
    """(adapter, a valid call of one small image) per spec."""
    out = {}
    for name in NAMES:
        spec = SPECS[name]
        adapter = tiny_adapter(spec)
        builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
        item = 1 if not spec.attention_style.segmented else builder.image(2, 4)
        out[name] = adapter, builder.inputs("image", [item])
    return out


def refused(adapter, kwargs, *fragments: str) -> None:
    """Every entry point that reads ``kwargs`` raises InputError holding ``fragments``."""
    assert_refused([adapter.get_encoder_cudagraph_item_specs, adapter.encoder_eager_forward,
                    lambda kw: adapter.select_encoder_cudagraph_items(kw, [])], kwargs, *fragments)


def changed(kwargs, key, value):
    return {**kwargs, key: value}


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_narrow_integer_grids_are_refused(built, dtype):
    # they passed "an integer dtype" and failed in transformers' repeat_interleave (NotImplementedError)
    adapter, kwargs = built["qwen2_vl"]
    refused(adapter, changed(kwargs, "image_grid_thw", kwargs["image_grid_thw"].to(dtype)), "'image_grid_thw'",
            "expected an integer dtype (torch.int64 or torch.int32)", f"got {dtype}")


def test_int32_grids_and_item_values_are_served(built):
    adapter, kwargs = built["video_llama_3"]
    narrow = {k: v.to(torch.int32) if not v.is_floating_point() else v for k, v in kwargs.items()}
    assert adapter.get_encoder_cudagraph_item_specs(narrow) == adapter.get_encoder_cudagraph_item_specs(kwargs)
    torch.testing.assert_close(adapter.encoder_eager_forward(narrow), adapter.encoder_eager_forward(kwargs))


def test_a_negative_merge_size_is_refused(built):
    # h // -1 squared is positive: the item formulas passed it and the tower's reshape failed (RuntimeError)
    adapter, kwargs = built["video_llama_3"]
    refused(adapter, changed(kwargs, "image_merge_sizes", torch.tensor([-1])), "'image_merge_sizes'", "item 0",
            "expected a positive integer", "got -1")
    refused(adapter, changed(kwargs, "image_merge_sizes", torch.tensor([2], dtype=torch.int8)), "'image_merge_sizes'",
            "torch.int64 or torch.int32", "got torch.int8")


@pytest.mark.parametrize("name, key", [("siglip2", "pixel_values"), ("video_llama_3", "pixel_values")])
def test_pixels_without_values_are_refused(built, name, key):
    # a graph-scoped spec has no pixel buffer whose row shape would catch it: (rows, 0) reached a matmul or a
    # reshape inside the model (7 specs)
    adapter, kwargs = built[name]
    pixels = kwargs[key]
    refused(adapter, changed(kwargs, key, pixels[..., :0]), f"'{key}'", "expected rows with values",
            f"got shape {tuple(pixels.shape[:-1]) + (0,)}")


@pytest.mark.parametrize("name, key, make, expected", [
    ("instructblip", "qformer_input_ids", lambda v: v.float(), "expected torch.int64 or torch.int32 (indices)"),
    ("instructblip", "qformer_input_ids", lambda v: v.to(torch.int8), "expected torch.int64 or torch.int32"),
    ("instructblip", "qformer_input_ids", lambda v: v - 10**6, "expected indices in [0, 128)"),
    ("mllama", "aspect_ratio_ids", lambda v: v.double(), "expected torch.int64 or torch.int32 (indices)"),
    ("mllama", "aspect_ratio_ids", lambda v: v * 0 - 3, "expected indices in [0, 9)"),
    ("idefics2", "patch_attention_mask", lambda v: v.float(), "expected torch.bool (a mask)"),
    ("idefics2", "patch_attention_mask", lambda v: v.long(), "expected torch.bool (a mask)"),
    ("siglip2", "spatial_shapes", lambda v: v.float(), "expected torch.int64 or torch.int32 (indices)"),
    ("siglip2", "spatial_shapes", lambda v: -v, "expected indices of 0 or more"),
    ("gemma4", "image_position_ids", lambda v: v.float(), "expected torch.int64 or torch.int32 (indices)"),
])
def test_extra_inputs_of_the_wrong_kind_are_refused(built, name, key, make, expected):
    # each failed inside the model (RuntimeError from an embedding or torch.where, IndexError, ValueError); Gemma 4's
    # float positions were cast silently on the graph path where the model's own forward raises
    adapter, kwargs = built[name]
    value = make(kwargs[key])
    refused(adapter, changed(kwargs, key, value), f"'{key}'", expected, "got ")


def test_declared_dtypes_come_from_buffers_then_examples():
    assert role_dtypes(SPECS["gemma4"]) == {"positions": "int64"}
    assert role_dtypes(SPECS["idefics2"])["mask"] == "bool"
    assert role_dtypes(SPECS["siglip2"]) == {"shapes": "int64"}  # graph-scoped: its example says it; a bool mask
    # example says too little (the processor gives int32 masks, which the model takes)
    assert dtype_problem(torch.float16, "model") is None and dtype_problem(torch.int64, "model")
    assert all(dtype_problem(d, "int64") is None for d in INDEX_DTYPES)


# Gemma 4: items.valid must give the model's own row count, or the input is refused

def positions(valid: int, width: int = 48, patches: int = 2520) -> torch.Tensor:
    """One tile's patch positions as Gemma 4's processor makes them: ``valid`` patches row-major over ``width``
    columns, then (-1, -1) padding."""
    index = torch.arange(patches)
    table = torch.stack([index % width, index // width], dim=-1)
    table[valid:] = -1
    return table.unsqueeze(0)


def test_gemma4_processor_positions_give_the_models_rows(built):
    adapter, kwargs = built["gemma4"]
    for valid, width in ((1728, 48), (576, 24), (81, 9)):
        call = changed(kwargs, "image_position_ids", positions(valid, width))
        (item,) = adapter.get_encoder_cudagraph_item_specs(call)
        assert item.output_tokens == valid // 9 == adapter.encoder_eager_forward(call).shape[0]


def test_gemma4_valid_counts_that_make_no_whole_token_are_refused(built, monkeypatch):
    # 1720 patches: the spec's valid // 9 said 191 rows; the model pools the remainder into a row of its own (192)
    adapter, kwargs = built["gemma4"]
    call = changed(kwargs, "image_position_ids", positions(1720))
    with torch.no_grad():  # what the model itself returns
        assert adapter.module(pixel_values=call["pixel_values"],
                              pixel_position_ids=call["image_position_ids"]).last_hidden_state.shape[0] == 192
    refused(adapter, call, "'image_position_ids'", "row 0", "grid row by row", "got 1720 patches")
    # the rule for any items.valid, positions or not: whole output tokens
    monkeypatch.setattr(adapter._reader, "pooled_side", None)
    monkeypatch.setattr(adapter._reader, "_last", None)
    refused(adapter, call, "'image_position_ids'", "item 0", "a multiple of 9, the rows of one output token",
            "got 1720")


def test_gemma4_padding_between_patches_is_refused(built):
    adapter, kwargs = built["gemma4"]
    table = positions(1728)
    table[0, 100] = -1  # a padding patch among the image's patches, one more after them
    table[0, 1728] = torch.tensor([0, 36])
    refused(adapter, changed(kwargs, "image_position_ids", table), "'image_position_ids'", "row 0",
            "in one block after its 1728 other patches", "got padding between them")
    half = positions(1728)
    half[0, 5] = torch.tensor([-1, 0])  # not padding (one field only) but a negative position
    refused(adapter, changed(kwargs, "image_position_ids", half), "'image_position_ids'", "row 0",
            "expected indices in [0, 10240) (params.below: position_embedding_size) (a padding patch is -1 in every "
            "field)", "got -1")


@pytest.mark.parametrize("valid, width, model_rows", [(1728, 45, 195), (1584, 44, 169)])
def test_gemma4_positions_off_the_pooling_grid_are_refused(built, valid, width, model_rows):
    # whole tokens and trailing padding, but a grid 45 wide (a partial last row) or 44 wide (no multiple of the
    # 3x3 pooling blocks): the model pools by position into more rows than valid // 9
    adapter, kwargs = built["gemma4"]
    call = changed(kwargs, "image_position_ids", positions(valid, width))
    with torch.no_grad():
        assert adapter.module(pixel_values=call["pixel_values"],
                              pixel_position_ids=call["image_position_ids"]).last_hidden_state.shape[0] == model_rows
    assert model_rows != valid // 9
    refused(adapter, call, "'image_position_ids'", "row 0", "grid row by row whose sides are multiples of 3",
            f"got {valid} patches up to x = {width - 1}")


def test_gemma4_pools_three_by_three():
    from vitcg.runtime.inputs import pooled_side

    spec = SPECS["gemma4"]
    adapter = tiny_adapter(spec)
    assert pooled_side(spec, adapter.geometry) == 3
    assert pooled_side(SPECS["qwen2_vl"], {}) is None


@pytest.mark.parametrize("name", ["idefics2", "gemma4"])
def test_an_empty_call_gets_empty_replay_buffers_even_with_aligned_roles(name):
    """Was KeyError: 'mask' (idefics2) from the aligned provider: no modality gave the role, and no item needs it."""
    spec = packaged()[name]
    buffers = tiny_adapter(spec).prepare_encoder_cudagraph_replay_buffers({}, 4, 0)
    aligned = [b.name for b in spec.buffers if b.provider == "aligned"]
    assert aligned and all(buffers.values[n].numel() == 0 for n in aligned)


@pytest.mark.parametrize("sizes", [(-1, 2, 0), (64, 0, 0), (64, 2, -1), (64.0, 2, 0), (True, 2, 0)])
def test_capture_sizes_are_refused_by_name(sizes):
    """Was a RuntimeError from torch.zeros on every spec for a negative budget, items or frames."""

    spec = packaged()["qwen2_vl"]
    with pytest.raises(InputError, match=r"^(token_budget|max_batch_size|max_frames_per_batch): expected an integer"):
        tiny_adapter(spec).prepare_encoder_cudagraph_capture_inputs(*sizes)
