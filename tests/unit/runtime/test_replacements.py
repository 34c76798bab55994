"""``replace``: the gather form of a per-item grid convolution equals the convolution over each frame's grid, the
form stands aside where its buffer is absent, and a grid kept on the host is baked in at capture, never read at
replay (LFM3-VL, `vitcg/specs/lfm3_vl.yaml`). Graph against eager per item is `vitcg check lfm3_vl`'s."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from support.specs import packaged, skip_unavailable
from support.tiny import tiny_adapter
from vitcg.errors import HostSyncError, SpecRuntimeError
from vitcg.lang.model import Buffer, Replace
from vitcg.runtime import replacements
from vitcg.runtime.providers import Pack, RowCache, compute, frame_neighbours
from vitcg.runtime.replacements import grid_conv
from vitcg.runtime.syncs import no_host_syncs

GRIDS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4)


def per_frame_conv(values: torch.Tensor, conv: nn.Conv2d, rows: list[list[int]], merge: int) -> torch.Tensor:
    """The reference: each frame's rows (merge-block order) laid out on its raster grid, convolved, laid back."""
    out, start = [], 0
    channels = values.shape[-1]
    for t, h, w in rows:
        for _ in range(t):
            frame = values[start:start + h * w].view(h // merge, w // merge, merge, merge, channels)
            image = frame.permute(4, 0, 2, 1, 3).reshape(1, channels, h, w)
            image = F.conv2d(image, conv.weight, conv.bias, padding=conv.padding, groups=channels)
            back = image.view(channels, h // merge, merge, w // merge, merge).permute(1, 3, 2, 4, 0)
            out.append(back.reshape(h * w, channels))
            start += h * w
    return torch.cat(out)


def neighbours(rows: list[list[int]], kernel: int, merge: int, cache: RowCache | None = None) -> torch.Tensor:
    buffer = Buffer("n", "n", "grid_neighbours", (), None, "zeros", {"spatial_merge_size": merge})
    geometry = {"spatial_merge_size": merge, "conv_kernel_size": kernel}
    return compute(buffer, Pack(torch.zeros(0), torch.tensor(rows), geometry, "frame", cache or RowCache()))


@settings(max_examples=40, deadline=None)
@given(grids=GRIDS, merge=st.sampled_from([1, 2]), kernel=st.sampled_from([1, 3, 5]), bias=st.booleans())
def test_the_gather_equals_the_convolution_of_each_frame(grids, merge, kernel, bias):
    rows = [[t, h * merge, w * merge] for t, h, w in grids]
    channels = 6
    conv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels, bias=bias)
    values = torch.randn(sum(t * h * w for t, h, w in rows), channels, dtype=torch.float64)
    conv = conv.double()
    cache = RowCache()
    for _ in range(2):  # the second round reads the cache
        got = grid_conv(values, conv, neighbours(rows, kernel, merge, cache))
        torch.testing.assert_close(got, per_frame_conv(values, conv, rows, merge), rtol=1e-12, atol=1e-12)


def test_neighbours_stay_inside_their_frame():
    index = frame_neighbours(2, 4, 3, 2)  # one 2x4 frame in 2x2 blocks: rows 0-3 the left block, 4-7 the right
    assert index.shape == (8, 9)
    # row 1 is raster cell (0, 1): above it nothing, left of it row 0, right of it row 4 (the right block's first)
    assert index[1].tolist() == [-1, -1, -1, 0, 1, 4, 2, 3, 6]
    rows = neighbours([[2, 2, 4], [1, 2, 2]], 3, 2)
    assert rows[8:16].max() < 16 and rows[8:16][rows[8:16] >= 0].min() >= 8  # frame 2 reads frame 2 only
    assert rows[16:][rows[16:] >= 0].min() >= 16


class Gated(nn.Module):
    """A stand-in with LFM-VL's gated short convolution's parts (its own forward is never the gather)."""

    def __init__(self, channels: int = 8, kernel: int = 3, groups: int | None = None):
        super().__init__()
        self.in_proj = nn.Linear(channels, 3 * channels, bias=False)
        self.spatial_conv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=groups or channels,
                                      bias=False)
        self.out_proj = nn.Linear(channels, channels, bias=False)

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        return hidden_states * 2


class Holder(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)


def gated_spec():
    """lfm3_vl's spec with its form put in place of :class:`Gated` modules."""
    return replace(packaged()["lfm3_vl"], replace=(Replace("Gated", "gated_grid_conv", "conv_neighbours"),))


def test_the_form_stands_aside_without_its_buffer_and_serves_with_it():
    layer = Gated()
    encoder = Holder(layer)
    replacements.install(gated_spec(), encoder)
    replacements.install(gated_spec(), encoder)  # once only
    x = torch.randn(8, 8)
    assert torch.equal(layer(x, grid_thw=[[1, 2, 4]]), x * 2)  # the module's own forward
    index = neighbours([[1, 2, 4]], 3, 2)
    gate, out_gate, values = layer.in_proj(x).chunk(3, dim=-1)
    want = layer.out_proj(out_gate * per_frame_conv(gate * values, layer.spatial_conv, [[1, 2, 4]], 2))
    torch.testing.assert_close(layer(x, grid_thw=[[9, 9, 9]], conv_neighbours=index), want)
    assert getattr(layer, replacements.MARK) == "gated_grid_conv"


@pytest.mark.parametrize(("encoder", "fragment"), [
    (Holder(nn.Linear(2, 2)), "holds no module of class 'Gated'"),
    (Holder(Gated(groups=1)), "has no depthwise 'same' spatial_conv"),
])
def test_a_module_the_form_cannot_read_is_refused(encoder, fragment):
    with pytest.raises(SpecRuntimeError, match=fragment):
        replacements.install(gated_spec(), encoder)


def test_a_module_without_the_parts_is_refused():
    layer = Gated()
    del layer.out_proj
    with pytest.raises(SpecRuntimeError, match="lacks out_proj"):
        replacements.install(gated_spec(), Holder(layer))


def test_host_reads_are_allowed_on_host_buffers_only():
    host, other = torch.tensor([[1, 2, 2]]), torch.tensor([[1, 2, 2]])
    with no_host_syncs((host,)):
        assert host.tolist() == [[1, 2, 2]]
        with pytest.raises(HostSyncError, match="tolist"):
            other.tolist()


def test_a_grid_on_the_host_is_baked_in_at_capture_and_never_refilled():
    skip_unavailable("lfm3_vl")
    adapter = tiny_adapter("lfm3_vl")
    assert adapter.host_buffers == ("grid_thw",)
    inputs = adapter.prepare_encoder_cudagraph_capture_inputs(256, 4, 4)
    captured = inputs.values["grid_thw"].clone()
    rows = [[1, 4, 6], [2, 2, 4]]
    mm = {"pixel_values": torch.randn(sum(t * h * w for t, h, w in rows), 3 * 2 * 16 * 16),
          "image_grid_thw": torch.tensor(rows)}
    fresh = adapter.prepare_encoder_cudagraph_replay_buffers(mm, 4, 4)
    assert fresh.values["grid_thw"] is None  # nothing to refill: the graph baked in the capture's grid
    assert fresh.values["conv_neighbours"].shape == (24 + 16, 9)
    assert torch.equal(inputs.values["grid_thw"], captured)


def test_the_lfm3_vl_convolution_layers_run_the_gather_in_the_graphs_only():
    skip_unavailable("lfm3_vl")
    from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionShortConv
    adapter = tiny_adapter("lfm3_vl")
    convs = [m for m in adapter.module.modules() if isinstance(m, Lfm3VlVisionShortConv)]
    assert len(convs) == 3 and all(getattr(m, replacements.MARK) == "gated_grid_conv" for m in convs)
    rows = [[1, 4, 6], [2, 2, 4]]
    x = torch.randn(sum(t * h * w for t, h, w in rows), adapter.geometry["out_hidden_size"])
    with torch.no_grad():
        own = convs[0](x, grid_thw=rows)
        gathered = convs[0](x, grid_thw=[[1, 1, 1]], conv_neighbours=neighbours(rows, 3, 2))
    torch.testing.assert_close(gathered, own, rtol=1e-5, atol=1e-6)


def test_one_class_serves_every_replaced_module_so_shared_compiled_blocks_trace_it_once():
    """A form set per instance would make each layer a new guard of the block compiled once for all of them
    (dynamo stopped at its recompile limit on LFM3-VL's 14 layers): the replaced modules share one subclass."""
    from torch._dynamo.testing import CompileCounter

    first, second = Gated(), Gated()
    replacements.install(gated_spec(), Holder(first, second))
    assert type(first) is type(second) and isinstance(first, Gated) and type(first) is not Gated
    assert type(first).__name__ == "Gated"
    counter = CompileCounter()
    call = torch.compile(lambda module, x, index: module(x, conv_neighbours=index), backend=counter, dynamic=False)
    x, index = torch.randn(8, 8), neighbours([[1, 2, 4]], 3, 2)
    with torch.no_grad():
        torch.testing.assert_close(call(first, x, index), first(x, conv_neighbours=index))
        call(second, x, index)
    torch._dynamo.reset()
    assert counter.frame_count == 1


def test_taps_that_are_not_the_kernels_are_refused():
    """A geometry conv_kernel_size that is not the module's kernel gives neighbours of the wrong width."""
    conv = nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
    with pytest.raises(SpecRuntimeError, match="holds 25 cells per row, but the convolution's kernel has 9"):
        grid_conv(torch.randn(8, 4), conv, neighbours([[1, 2, 4]], 5, 2))
