"""Hostile runtime inputs: every protocol entry point rejects them with an InputError naming the key, the
expected and the actual, before any tensor work (and before transformers could fail deep inside)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.inputs import QWEN2_ROW
from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.errors import InputError
from vitcg.runtime.inputs import item_indices

SPECS = packaged()


@pytest.fixture(scope="module")
def adapters():
    return {name: tiny_adapter(SPECS[name]) for name in ("qwen2_vl", "internvl")}


def grid(*rows, dtype=torch.int64):
    return torch.tensor(rows, dtype=dtype)


def pixels(rows, *row):
    return torch.randn(rows, *(row or (QWEN2_ROW,)))


def tiles(n, side=56):
    return torch.randn(n, 3, side, side)


# (spec, kwargs, fragments the message must hold: the key, the expected, the actual)
CASES = {
    "numpy pixels": ("qwen2_vl", lambda: {"pixel_values": np.zeros((16, QWEN2_ROW), np.float32),
                                          "image_grid_thw": grid([1, 4, 4])},
                     ["'pixel_values'", "expected a torch.Tensor", "got numpy.ndarray"]),
    "list pixels": ("qwen2_vl", lambda: {"pixel_values": [[0.0] * QWEN2_ROW] * 16, "image_grid_thw": grid([1, 4, 4])},
                    ["'pixel_values'", "expected a torch.Tensor", "got list"]),
    "meta pixels": ("qwen2_vl", lambda: {"pixel_values": torch.zeros(16, QWEN2_ROW, device="meta"),
                                         "image_grid_thw": grid([1, 4, 4])},
                    ["'pixel_values'", "encoder's device cpu", "got one on meta"]),
    "meta grid": ("qwen2_vl", lambda: {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4]).to("meta")},
                  ["'image_grid_thw'", "expected a tensor with data", "meta"]),
    "h not a multiple of the merge size": ("qwen2_vl", lambda: {"pixel_values": pixels(12), "image_grid_thw": grid([1, 3, 4])},
                                           ["'image_grid_thw'", "item 0 is [1, 3, 4]", "multiples of spatial_merge_size 2",
                                            "h is not"]),
    "w not a multiple of the merge size": ("qwen2_vl", lambda: {"pixel_values": pixels(36),
                                                               "image_grid_thw": grid([1, 4, 4], [1, 4, 5])},
                                           ["'image_grid_thw'", "item 1 is [1, 4, 5]", "spatial_merge_size 2", "w is not"]),
    "zero in the grid": ("qwen2_vl", lambda: {"pixel_values": pixels(0), "image_grid_thw": grid([1, 0, 4])},
                         ["'image_grid_thw'", "item 0 is [1, 0, 4]", "expected positive t, h, w"]),
    "negative in the grid": ("qwen2_vl", lambda: {"pixel_values": pixels(16), "image_grid_thw": grid([1, -4, -4])},
                             ["'image_grid_thw'", "item 0 is [1, -4, -4]", "expected positive"]),
    "float grid": ("qwen2_vl", lambda: {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4], dtype=torch.float32)},
                   ["'image_grid_thw'", "expected an integer dtype", "got torch.float32"]),
    "bool grid": ("qwen2_vl", lambda: {"pixel_values": pixels(1), "image_grid_thw": grid([1, 1, 1], dtype=torch.bool)},
                  ["'image_grid_thw'", "expected an integer dtype", "got torch.bool"]),
    "empty grid with pixel rows": ("qwen2_vl", lambda: {"pixel_values": pixels(16),
                                                        "image_grid_thw": torch.zeros(0, 3, dtype=torch.int64)},
                                   ["'pixel_values' has 16 rows", "'image_grid_thw' describes 0", "t * h * w"]),
    "fewer rows than the grid": ("qwen2_vl", lambda: {"pixel_values": pixels(15), "image_grid_thw": grid([1, 4, 4])},
                                 ["'pixel_values' has 15 rows", "'image_grid_thw' describes 16"]),
    "pixels with an extra dim": ("qwen2_vl", lambda: {"pixel_values": pixels(16, QWEN2_ROW, 1),
                                                      "image_grid_thw": grid([1, 4, 4])},
                                 ["'pixel_values'", f"expected shape (rows, {QWEN2_ROW})", f"got (16, {QWEN2_ROW}, 1)"]),
    "pixels with a wrong last dim": ("qwen2_vl", lambda: {"pixel_values": pixels(16, 1), "image_grid_thw": grid([1, 4, 4])},
                                     ["'pixel_values'", f"expected shape (rows, {QWEN2_ROW})", "got (16, 1)"]),
    "integer pixels": ("qwen2_vl", lambda: {"pixel_values": torch.zeros(16, QWEN2_ROW, dtype=torch.int64),
                                            "image_grid_thw": grid([1, 4, 4])},
                       ["'pixel_values'", "expected a floating dtype", "got torch.int64"]),
    "unknown extra key": ("qwen2_vl", lambda: {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4]),
                                               "image_grid_tw": grid([1, 4, 4])},
                          ["unknown input key 'image_grid_tw'", "pixel_values, image_grid_thw, pixel_values_videos",
                           "did you mean 'image_grid_thw'?"]),
    "float tile counts": ("internvl", lambda: {"pixel_values_flat": tiles(2), "image_num_patches": torch.tensor([2.0])},
                          ["'image_num_patches'", "expected an integer dtype", "got torch.float32"]),
    "zero tiles": ("internvl", lambda: {"pixel_values_flat": tiles(2), "image_num_patches": torch.tensor([2, 0])},
                   ["'image_num_patches'", "item 1 is 0", "expected positive n"]),
    "tiles of the wrong size": ("internvl", lambda: {"pixel_values_flat": tiles(2, 55), "image_num_patches": torch.tensor([2])},
                                ["'pixel_values_flat'", "expected shape (rows, 3, 56, 56)", "got (2, 3, 55, 55)"]),
    "more tiles than counted": ("internvl", lambda: {"pixel_values_flat": tiles(3), "image_num_patches": torch.tensor([2])},
                                ["'pixel_values_flat' has 3 rows", "'image_num_patches' describes 2"]),
}


def _raises(call, fragments):
    with pytest.raises(InputError) as caught:
        call()
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


@pytest.mark.parametrize("case", CASES)
def test_protocol_entry_points_reject(case, adapters):
    name, make, fragments = CASES[case]
    adapter = adapters[name]
    kwargs = make()
    _raises(lambda: adapter.get_input_modality(kwargs), fragments)
    _raises(lambda: adapter.get_encoder_cudagraph_item_specs(kwargs), fragments)
    _raises(lambda: adapter.select_encoder_cudagraph_items(kwargs, []), fragments)
    _raises(lambda: adapter.encoder_eager_forward(kwargs), fragments)


@pytest.mark.parametrize("case", ["numpy pixels", "meta pixels", "h not a multiple of the merge size", "float grid",
                                  "empty grid with pixel rows", "pixels with a wrong last dim", "unknown extra key",
                                  "zero tiles"])
def test_the_manager_rejects_before_any_replay(case, adapters):
    name, make, fragments = CASES[case]
    manager = tiny_manager(adapters[name])
    _raises(lambda: manager.execute(make()), fragments)
    assert manager.stats.replays == manager.stats.eager_calls == 0


def test_none_values_and_empty_selections_stay_valid(adapters):
    qwen2 = adapters["qwen2_vl"]
    kwargs = {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4]), "image_embeds": None,
              "pixel_values_videos": None, "video_grid_thw": None}
    assert [s.output_tokens for s in qwen2.get_encoder_cudagraph_item_specs(kwargs)] == [4]
    empty = {"pixel_values": pixels(0), "image_grid_thw": torch.zeros(0, 3, dtype=torch.int64)}
    assert qwen2.get_encoder_cudagraph_item_specs(empty) == []
    assert tiny_manager(qwen2).execute(empty) == []
    int32 = {"pixel_values": pixels(16).double(), "image_grid_thw": grid([1, 4, 4], dtype=torch.int32)}
    assert len(qwen2.get_encoder_cudagraph_item_specs(int32)) == 1  # any integer grid, any floating pixels


def test_reads_are_reused_only_while_the_inputs_are_unchanged(adapters):
    """The manager reads one call's kwargs several times; the second read of the very same objects is the first's
    answer, but a grid changed in place (or a new object) is read, and checked, again."""
    qwen2 = adapters["qwen2_vl"]
    reader = qwen2._reader
    kwargs = {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4])}
    first = reader.read(kwargs)
    assert reader.read(kwargs) == first and reader.read(kwargs)[0].pixels is kwargs["pixel_values"]
    kwargs["image_grid_thw"][0, 1] = 3  # in place: 3 rows is no multiple of the merge size
    _raises(lambda: reader.read(kwargs), ["'image_grid_thw'", "multiples of spatial_merge_size"])
    kwargs["image_grid_thw"] = grid([1, 2, 8])  # a new object with the same row count
    assert reader.read(kwargs)[0].counts_cpu.tolist() == [[1, 2, 8]]
    with torch.inference_mode():  # inference tensors keep no version counter: never reused
        frozen = {"pixel_values": pixels(16), "image_grid_thw": grid([1, 4, 4])}
        reader.read(frozen)
        frozen["image_grid_thw"][0, 2] = 0
        _raises(lambda: reader.read(frozen), ["'image_grid_thw'", "expected positive"])


@pytest.mark.parametrize("bad", [[1.7], ["1"], [True], [None], [float("nan")], [torch.tensor(0.5)], 3])
def test_item_indices_that_are_not_integers_are_refused_by_name(bad):
    """They were converted with int(): 1.7 became 1, "1" and True were taken, None and NaN raised TypeError."""
    with pytest.raises(InputError, match=r"indices(\[0\])?: expected"):
        item_indices(bad)


def test_item_indices_of_any_integer_kind_are_plain_ints():
    chosen = item_indices([0, np.int64(2), torch.tensor(1)])
    assert chosen == [0, 2, 1] and all(type(i) is int for i in chosen)
