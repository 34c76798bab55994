"""The output layout of :mod:`vitcg.runtime.hf`: an output read as rows (:func:`combine_output`) and rebuilt from rows
(:class:`Layout`) is the output it was, whatever its form (a tensor, a tuple or list of tensors, one layer of
``hidden_states``, several fields side by side, one tensor per item), and it scales with the rows of the next call.
Tiny CPU tensors only: no model is built."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vitcg.errors import InputError, SpecRuntimeError
from vitcg.lang import SpecSource
from vitcg.runtime.hf import Layout, LayoutEntry, combine_output

SPECS = SpecSource.of_files(["vitcg/specs/qwen2_vl.yaml", "vitcg/specs/clip.yaml"], bindings=False)
PACKED = SPECS["qwen2_vl"]
"""A segmented spec: the rows of a call may lie on any dimension of the output."""
TILES = SPECS["clip"]
"""A tiles spec: the tile batch is dimension 0 of the output."""


@dataclasses.dataclass
class Features:
    """A ModelOutput-like dataclass that is no Mapping: rebuilt by keyword."""

    pooler_output: Any = None
    last_hidden_state: Any = None


def with_outputs(spec, *outputs: str):
    return dataclasses.replace(spec, encoder=dataclasses.replace(spec.encoder, outputs=outputs))


def no_rows() -> torch.Tensor:
    return torch.zeros(0, 4)


def values(rows: int, *shape: int) -> torch.Tensor:
    """Distinct values, so a row put back in the wrong place shows."""
    return torch.arange(rows * torch.Size(shape).numel(), dtype=torch.float32).reshape(rows, *shape)


def same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(same, got, want))
    return got is want


def round_trip(spec, output: Any, parts: list[int] | None = None) -> Any:
    """``output`` read as rows, then rebuilt by the layout learned from it (per item when ``parts`` gives the items'
    rows)."""
    combined = combine_output(spec, output, no_rows)
    layout = Layout.learn(spec, output, combined.shape[0])
    assert layout is not None
    return layout.build(combined, list(combined.split(parts)) if parts else None)


@pytest.mark.parametrize("output", [
    BaseModelOutputWithPooling(pooler_output=values(6, 4)),
    {"pooler_output": values(6, 4)},
    Features(pooler_output=values(6, 4)),
    BaseModelOutputWithPooling(pooler_output=values(1, 6, 4)),  # a leading batch dimension: the rows on dim 1
    BaseModelOutputWithPooling(pooler_output=values(3, 2, 4)),  # rows in blocks of 2 per leading index
], ids=["model-output", "dict", "dataclass", "batch-dim", "blocks"])
def test_a_tensor_field_comes_back_as_it_was(output):
    rebuilt = round_trip(with_outputs(PACKED, "pooler_output"), output)
    assert type(rebuilt) is type(output)
    want = output["pooler_output"] if isinstance(output, dict) else output.pooler_output
    got = rebuilt["pooler_output"] if isinstance(rebuilt, dict) else rebuilt.pooler_output
    assert same(got, want)


def test_a_tuple_field_comes_back_as_a_list_of_its_tensors():
    output = {"pooler_output": (values(6, 4), values(6, 2) + 100)}
    rebuilt = round_trip(with_outputs(PACKED, "pooler_output"), output)
    assert same(rebuilt["pooler_output"], list(output["pooler_output"]))


def test_one_layer_of_hidden_states_comes_back_in_its_place_and_none_elsewhere():
    hidden = (values(6, 4), values(6, 4) + 100, values(6, 4) + 200)
    rebuilt = round_trip(with_outputs(PACKED, "hidden_states[-2]"), BaseModelOutputWithPooling(hidden_states=hidden))
    assert len(rebuilt.hidden_states) == 3
    assert rebuilt.hidden_states[0] is None and rebuilt.hidden_states[2] is None
    assert same(rebuilt.hidden_states[1], hidden[1])


def test_fields_side_by_side_come_back_each_with_its_own_columns():
    output = BaseModelOutputWithPooling(last_hidden_state=values(1, 6, 3), pooler_output=values(6, 5) + 100)
    spec = with_outputs(PACKED, "pooler_output", "last_hidden_state")
    assert combine_output(spec, output, no_rows).shape == (6, 8)
    rebuilt = round_trip(spec, output)
    assert same(rebuilt.pooler_output, output.pooler_output)
    assert same(rebuilt.last_hidden_state, output.last_hidden_state)


@pytest.mark.parametrize("container", [tuple, list])
def test_per_item_tensors_are_split_back_by_item(container):
    items = container([values(2, 4), values(3, 4) + 100, values(1, 4) + 200])
    spec = with_outputs(PACKED, "pooler_output[*]")
    assert same(combine_output(spec, Features(pooler_output=items), no_rows), torch.cat(list(items)))
    rebuilt = round_trip(spec, Features(pooler_output=items), [2, 3, 1])
    assert same(rebuilt.pooler_output, items)


def test_per_item_tensors_keep_their_leading_dimensions():
    items = (values(1, 2, 4), values(1, 3, 4) + 100)
    rebuilt = round_trip(with_outputs(PACKED, "pooler_output[*]"), {"pooler_output": items}, [2, 3])
    assert same(rebuilt["pooler_output"], items)


def test_a_per_item_field_after_a_tensor_field_reads_its_own_columns_of_each_item():
    """The per-item field's columns sit after the tensor field's: each item's part holds both."""
    output = Features(last_hidden_state=values(5, 3), pooler_output=(values(2, 4) + 100, values(3, 4) + 200))
    rebuilt = round_trip(with_outputs(PACKED, "last_hidden_state", "pooler_output[*]"), output, [2, 3])
    assert same(rebuilt.last_hidden_state, output.last_hidden_state)
    assert same(rebuilt.pooler_output, output.pooler_output)


def test_the_layout_scales_with_the_rows_of_a_later_call():
    spec = with_outputs(PACKED, "pooler_output")
    layout = Layout.learn(spec, BaseModelOutputWithPooling(pooler_output=values(1, 6, 4)), 6)
    assert layout.entries == (LayoutEntry(field="pooler_output", shapes=((1, 6, 4),), rows_dims=(1,)),)
    later = values(10, 4)
    assert same(layout.build(later).pooler_output, later.reshape(1, 10, 4))


def test_tiles_scale_on_the_tile_batch():
    layout = Layout.learn(TILES, {"hidden_states": (values(2, 5, 4), values(2, 5, 4))}, 2)
    assert layout.entries[0].rows_dims == (0,) and layout.entries[0].index == -2
    rebuilt = layout.build(values(15, 4))
    assert same(rebuilt["hidden_states"][-2], values(15, 4).reshape(3, 5, 4))


def test_an_ambiguous_output_is_not_learned_yet():
    """One row of a packed encoder could scale along either dimension of size 1."""
    assert Layout.learn(with_outputs(PACKED, "pooler_output"), {"pooler_output": values(1, 1, 4)}, 1) is None
    assert Layout.learn(with_outputs(PACKED, "pooler_output"), {"pooler_output": values(6, 4)}, 5) is None


def test_an_output_without_the_spec_field_or_items_is_an_error_of_the_spec():
    with pytest.raises(SpecRuntimeError, match="without 'pooler_output'"):
        Layout.learn(with_outputs(PACKED, "pooler_output"), {"last_hidden_state": values(6, 4)}, 6)
    with pytest.raises(SpecRuntimeError, match="not a tuple or list of per-item tensors"):
        Layout.learn(with_outputs(PACKED, "pooler_output[*]"), {"pooler_output": values(6, 4)}, 6)


def test_rows_that_fit_no_learned_shape_are_refused():
    layout = Layout.learn(with_outputs(PACKED, "pooler_output"), {"pooler_output": values(3, 2, 4)}, 6)
    with pytest.raises(InputError, match="7 rows do not fit an output of shape"):
        layout.build(values(7, 4))


def test_no_items_combine_to_the_empty_rows():
    spec = with_outputs(PACKED, "pooler_output[*]")
    assert same(combine_output(spec, {"pooler_output": ()}, no_rows), no_rows())


def test_a_layout_entry_is_a_frozen_record():
    entry = LayoutEntry(field="pooler_output", shapes=((6, 4),), rows_dims=(0,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.index = 1
    assert entry.width == 4 and entry.items is None and not entry.is_list
