"""Epilogues and items.valid: a forward ending in ``x[mask]`` captured at a fixed shape, its rows cut after the
graph by counts read from the items' padding (Gemma 4's tower)."""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import HostSyncError, InputError, SpecRuntimeError
from vitcg.runtime.epilogue import epilogue, kept_first, masked_rows
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.runtime.protocol import SupportsEncoderCudaGraph
from vitcg.runtime.syncs import no_host_syncs
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()


def test_kept_first_puts_the_kept_rows_first_in_order():
    rows = torch.arange(24.0).reshape(2, 4, 3)
    mask = torch.tensor([[True, False, True, False], [False, True, True, False]])
    out = kept_first(rows, mask)
    assert out.shape == (8, 3)
    assert torch.equal(out[:4], rows[mask])
    assert torch.equal(out[4:], rows[~mask])


def test_kept_first_refuses_a_mask_that_is_not_over_rows():
    with pytest.raises(SpecRuntimeError, match=r"mask of shape \(3,\) selects from a tensor of shape \(2, 4, 3\)"):
        kept_first(torch.zeros(2, 4, 3), torch.ones(3, dtype=torch.bool))


def test_masked_rows_answers_boolean_indexing_where_a_graph_would_fail():
    rows, mask = torch.randn(2, 5, 4), torch.rand(2, 5) > 0.5
    with pytest.raises(HostSyncError, match="boolean-mask indexing"), no_host_syncs():
        rows[mask]
    with no_host_syncs(), masked_rows():
        out = rows[mask] * 2  # what follows the selection runs on every row
    assert out.shape == (10, 4)
    assert torch.equal(out[:int(mask.sum())], rows[mask] * 2)
    with pytest.raises(SpecRuntimeError, match="inside a tuple index"), masked_rows():
        rows[0, mask[0]]
    with pytest.raises(SpecRuntimeError, match="'gather' is unknown"), epilogue("gather"):
        pass


needs_gemma4 = pytest.mark.skipif(bool(SPECS["gemma4"].unavailable), reason=str(SPECS["gemma4"].unavailable))


def _image(builder: InputBuilder, width: int, height: int) -> dict[str, torch.Tensor]:
    """One Gemma 4 image of ``width x height`` patches in its padded tile, as the processor lays it out."""
    kwargs = builder.inputs("image", [1])
    positions = torch.full_like(kwargs["image_position_ids"], -1)
    patches = width * height
    positions[0, :patches, 0] = torch.arange(patches) % width
    positions[0, :patches, 1] = torch.arange(patches) // width
    kwargs["image_position_ids"] = positions
    return kwargs


@needs_gemma4
def test_gemma4_rows_per_image_come_from_its_padding_and_match_eager():
    spec = SPECS["gemma4"]
    adapter = tiny_adapter(spec)
    assert isinstance(adapter, SupportsEncoderCudaGraph)  # an epilogue keeps the protocol
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
    example = builder.inputs("image", [1])["image_position_ids"]  # tests.inputs: formulas over `i`
    assert example[0, 1727].tolist() == [47, 35] and example[0, 1728].tolist() == [-1, -1]
    sizes = [(48, 36), (21, 12), (63, 39), (3, 3)]  # patches; soft tokens 192, 28, 273, 1
    parts = [_image(builder, w, h) for w, h in sizes]
    kwargs = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    tokens = [item.output_tokens for item in adapter.get_encoder_cudagraph_item_specs(kwargs)]
    assert tokens == [w * h // 9 for w, h in sizes]
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=1120, max_model_len=1120, device="cpu",
                                      dtype=torch.float32)
    outputs = manager.execute(kwargs)
    assert manager.stats.replays >= 1 and manager.stats.misses == 0
    for index, got in enumerate(outputs):
        want = adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
        assert got.shape == want.shape == (tokens[index], 64)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_gemma4
def test_gemma4_an_image_of_padding_only_is_refused():
    spec = SPECS["gemma4"]
    adapter = tiny_adapter(spec)
    kwargs = InputBuilder(spec, adapter, torch.Generator().manual_seed(0)).inputs("image", [1])
    kwargs["image_position_ids"] = torch.full_like(kwargs["image_position_ids"], -1)
    with pytest.raises(InputError, match="expected a positive input_size and output_tokens"):
        adapter.get_encoder_cudagraph_item_specs(kwargs)
