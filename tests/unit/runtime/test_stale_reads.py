"""The input reader never serves a changed input the answer of its last read (issue 27, item 6): a write through
a numpy view, a list or numpy counts changed in place, or a tensor resized in place bumps no version counter,
yet each is read again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()


@pytest.fixture(scope="module")
def built():
    made = {}

    def get(name):
        if name not in made:
            spec = SPECS[name]
            adapter = tiny_adapter(spec)
            made[name] = adapter, InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
        return made[name]
    return get


def test_pixtral_sizes_written_through_a_numpy_view_are_read_again(built):
    adapter, builder = built("pixtral")
    kwargs = builder.inputs("image", [builder.image(2, 4)])
    sizes = kwargs["image_sizes"]
    before = [s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(kwargs)]
    version = sizes._version
    sizes.numpy()[0, 1] //= 2  # a numpy view: no version bump
    assert sizes._version == version
    after = [s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(kwargs)]
    assert after == [before[0] // 2]


def test_qwen2_grid_written_through_a_numpy_view_is_served_as_written(built):
    """Through the manager: the second call's items are those of the grid as it is now, equal to the eager output."""
    adapter, builder = built("qwen2_vl")
    kwargs = builder.inputs("image", [builder.image(2, 4)])
    manager = tiny_manager(adapter)
    assert [o.shape[0] for o in manager.execute(kwargs)] == [8]
    adapter.get_encoder_cudagraph_item_specs(kwargs)  # the reader's last read: these very kwargs
    kwargs["image_grid_thw"].numpy()[0, 1:] = [8, 4]  # same rows, another shape: 8 tokens, other positions
    got = manager.execute(kwargs)
    want = adapter.encoder_eager_forward(kwargs)
    assert torch.allclose(torch.cat(got), want, atol=1e-5)


@pytest.mark.parametrize("kind", [list, np.array])
def test_counts_given_as_a_mutable_container_are_read_again(built, kind):
    adapter, builder = built("qwen2_vl")
    kwargs = builder.inputs("image", [builder.image(2, 4)])
    kwargs["image_grid_thw"] = kind(kwargs["image_grid_thw"].tolist())
    assert [s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(kwargs)] == [8]
    kwargs["image_grid_thw"][0][1:] = [8, 4]
    assert adapter._reader.read(kwargs)[0].counts_cpu.tolist() == [[1, 8, 4]]


def test_a_tensor_resized_in_place_is_read_again(built):
    adapter, builder = built("qwen2_vl")
    kwargs = builder.inputs("image", [builder.image(2, 2), builder.image(2, 2)])
    assert len(adapter.get_encoder_cudagraph_item_specs(kwargs)) == 2
    with torch.no_grad():
        kwargs["image_grid_thw"].resize_(1, 3)
        kwargs["pixel_values"].resize_(16, kwargs["pixel_values"].shape[1])
    assert len(adapter.get_encoder_cudagraph_item_specs(kwargs)) == 1


def test_unchanged_inputs_are_still_read_once(built, monkeypatch):
    adapter, builder = built("qwen2_vl")
    kwargs = builder.inputs("image", [builder.image(2, 4), builder.image(2, 2)])
    reads = []
    original = adapter._reader._read
    monkeypatch.setattr(adapter._reader, "_read", lambda mm: reads.append(1) or original(mm))
    for _ in range(3):
        adapter.get_encoder_cudagraph_item_specs(kwargs)
        adapter.get_encoder_cudagraph_item_frames(kwargs)
    assert len(reads) == 1
