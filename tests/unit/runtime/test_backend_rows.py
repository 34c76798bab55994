"""What vLLM's Transformers backend and manager need of the adapter beyond the protocol's signatures: the
backend's rows per item (``num_image_patches`` / ``num_video_patches``) accepted, checked and kept out of the
encoder call, and capture-axis keys that can key a dict. tests/vllm/test_real_manager.py drives both through
vLLM's own manager."""

from __future__ import annotations

import pytest
import torch

from support.inputs import assert_refused, qwen2_images
from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.errors import InputError
from vitcg.runtime.protocol import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()


@pytest.fixture(scope="module")
def qwen2():
    return tiny_adapter(SPECS["qwen2_vl"])


def images(*grids, rows=None):
    """qwen2_vl image kwargs of ``grids`` with the backend's rows per item (``rows``; default: the grids')."""
    kwargs = qwen2_images(*grids)
    grid = kwargs["image_grid_thw"]
    return {**kwargs, "num_image_patches": grid.prod(-1) if rows is None else torch.tensor(rows)}


def test_backend_rows_are_accepted_and_never_reach_the_encoder(qwen2):
    kwargs = images([1, 4, 4], [1, 4, 8])
    without = {k: v for k, v in kwargs.items() if k != "num_image_patches"}
    assert [s.input_size for s in qwen2.get_encoder_cudagraph_item_specs(kwargs)] == [16, 32]
    assert qwen2.get_input_modality(kwargs) == "image"
    assert all("num_image_patches" not in call for call in qwen2.eager_calls(kwargs))
    assert torch.equal(qwen2.encoder_eager_forward(kwargs), qwen2.encoder_eager_forward(without))


def test_a_selection_carries_the_backend_rows_of_its_items_in_order(qwen2):
    kwargs = images([1, 4, 4], [1, 4, 8], [1, 2, 2])
    selected = qwen2.select_encoder_cudagraph_items(kwargs, [2, 0])
    assert selected["num_image_patches"].tolist() == [4, 16]
    assert selected["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4]]
    assert [s.input_size for s in qwen2.get_encoder_cudagraph_item_specs(selected)] == [4, 16]  # checked again


def test_vitcgs_manager_serves_kwargs_with_backend_rows(qwen2):
    kwargs = images([1, 4, 4], [1, 4, 8])
    outputs = tiny_manager(qwen2).execute(kwargs)
    assert [tuple(o.shape) for o in outputs] == [(4, 48), (8, 48)]


@pytest.mark.parametrize("rows, fragments", [
    ([32, 16], ["'num_image_patches'", "expected [16, 32]", "'pixel_values' of each image item", "got [32, 16]"]),
    ([16], ["'num_image_patches'", "expected [16, 32]", "got [16]"]),
    ([16.0, 32.0], ["'num_image_patches'", "expected a tensor of integers", "torch.float32"]),
])
def test_backend_rows_that_differ_from_the_items_are_an_input_error(qwen2, rows, fragments):
    kwargs = images([1, 4, 4], [1, 4, 8], rows=rows)
    assert_refused([qwen2.get_input_modality, qwen2.get_encoder_cudagraph_item_specs, qwen2.encoder_eager_forward],
                   kwargs, *fragments)


def test_backend_rows_of_a_modality_absent_from_the_call_are_an_input_error(qwen2):
    kwargs = {**images([1, 4, 4]), "num_video_patches": torch.tensor([8])}
    with pytest.raises(InputError, match=r"'num_video_patches': expected no entries, as the call has no video "
                                         r"items; got \[8\]"):
        qwen2.get_encoder_cudagraph_item_specs(kwargs)
    assert len(qwen2.get_encoder_cudagraph_item_specs({**kwargs, "num_video_patches": torch.zeros(0, dtype=torch.int64)})) == 1


@pytest.mark.parametrize("name", ["kimi_k25"])
def test_capture_axis_keys_are_a_hashable_tuple(name):
    """vLLM's manager looks its graphs up by ``(budget, axis keys)``: the keys must be hashable, a tuple as vLLM's
    own models return them."""
    spec = SPECS[name]
    adapter = tiny_adapter(spec)
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
    kwargs = builder.inputs("image", [builder.image(2, 2)])
    keys = adapter.select_encoder_cudagraph_items(kwargs, [0])[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG]
    assert keys == ("image",)
    assert {(64, ("image",)): "graph"}[(64, keys)] == "graph"
