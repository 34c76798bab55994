"""The buffer records: each provider states the leading rows its buffer needs (``Provider.capacity`` in the
catalogue), each padding rule its empty value and what it needs of the buffer (``padding.PADDING_RULES``); the
adapter asks them."""

from __future__ import annotations

import pytest
import torch

from vitcg.errors import InputError
from vitcg.lang import catalogue as cat
from vitcg.runtime import padding
from vitcg.runtime.padding import EMPTY, BufferPadding, Capacities, fill

NAMES = {"max_items": 3, "max_segments": 7, "grid_rows": 5}
ROLES = frozenset({"instruction"})


def rows(provider: str, padding_rule: str = "zeros", role: str | None = None) -> int | None:
    """The rows a buffer of ``provider`` padded by ``padding_rule`` needs at :data:`NAMES`, or None."""
    need = cat.PROVIDERS[provider].needs(padding_rule, role, ROLES)
    return need.evaluate(NAMES) if need is not None else None


def test_capacities_belong_to_tensor_providers_and_their_paddings():
    for provider in cat.PROVIDERS.values():
        if provider.capacity is not None:
            assert provider.kind != "host", provider.name
            assert set(provider.capacity.rows) <= set(provider.paddings), provider.name
            for rule in provider.capacity.rows:
                assert provider.needs(rule, "instruction", ROLES).names <= set(cat.CAPACITY_NAMES)


@pytest.mark.parametrize(("provider", "rule", "role", "want"), [
    ("cu_seqlens", "trailing_segment", None, 7 + 2),  # the leading zero, the segments, one padding segment
    ("grid", "zeros", None, 5),  # a row per grid row the encoder sees
    ("grid", "ones", None, 5),
    ("grid", "trailing_item", None, 5 + 1),  # and the padding item's
    ("aligned", "zeros", "instruction", 3),  # a role aligned with the items: a row per item
    ("aligned", "zeros", "pixel_attention_mask", None),  # aligned with the pixels: the spec's shape
    ("scope_arg", "trailing_segment", None, 7 + 2),  # segment boundaries, as cu_seqlens
    ("scope_arg", "trailing_item", None, None),
    ("scope_arg", "zeros", None, None),
    ("cu_window_seqlens", "trailing_segment", None, None),  # windows are not segments: the shape says
    ("pixels", "zeros", None, None),
    ("position_ids", "zeros", None, None),
])
def test_each_provider_states_its_capacity(provider, rule, role, want):
    assert rows(provider, rule, role) == want


def test_grid_rows_are_segments_only_where_a_modality_splits_items_by_frames():
    assert cat.capacity_names(64, 2, 8, split=True)["grid_rows"] == 10
    assert cat.capacity_names(64, 2, 8, split=False)["grid_rows"] == 2
    assert cat.capacity_names(4, 2, 8, split=True)["grid_rows"] == 4  # never more segments than the budget


def test_a_segment_buffer_of_its_capacity_holds_every_segment_and_the_padding():
    dest = torch.zeros(rows("cu_seqlens", "trailing_segment"), dtype=torch.int32)
    bounds = torch.arange(NAMES["max_segments"] + 1, dtype=torch.int32) * 2
    fill("trailing_segment", dest, bounds, 20, "cu_seqlens")  # 14 rows of segments, 6 of padding
    assert dest.tolist()[-1] == 20 and dest.tolist()[:8] == bounds.tolist()
    with pytest.raises(InputError, match="leave no slot for padding"):
        fill("trailing_segment", dest[:-1], bounds, 20, "cu_seqlens")


def test_a_grid_of_its_capacity_holds_every_row_and_the_padding_item():
    dest = torch.zeros(rows("grid", "trailing_item"), 3, dtype=torch.int64)
    grid = torch.tensor([[1, 2, 2]] * NAMES["grid_rows"])
    fill("trailing_item", dest, grid, 24, "grid", merge=2)  # 20 rows of items, 4 of padding
    assert dest[-1].tolist() == [1, 2, 2]
    with pytest.raises(InputError, match="no row for the padding item"):
        fill("trailing_item", dest[:-1], grid, 24, "grid", merge=2)


def test_every_refilled_rule_has_a_record_with_its_function():
    assert set(padding.PADDING_RULES) == {r.name for r in cat.PADDINGS.values() if r.refilled}
    assert all(callable(r.fill) and callable(r.empty) for r in padding.PADDING_RULES.values())


@pytest.mark.parametrize(("rule", "shape", "dtype", "want"), [
    ("zeros", (3, 2), torch.float32, torch.zeros(3, 2)),
    ("ones", (3, 2), torch.float32, torch.ones(3, 2)),
    ("trailing_segment", (4,), torch.int32, torch.tensor([0, 2, 4, 6], dtype=torch.int32)),  # 6 rows in 3 segments
    ("trailing_item", (3, 3), torch.int64, torch.tensor([[1, 1, 6], [0, 0, 0], [0, 0, 0]])),  # one item of 6 rows
    ("identity", (4,), torch.int64, torch.arange(4)),
    ("square_mask", (3, 3), torch.bool, torch.eye(3, dtype=torch.bool)),  # padding rows see only themselves
    ("repeat", (2, 4), torch.int64, torch.zeros(2, 4, dtype=torch.int64)),
])
def test_each_rules_empty_value_is_all_padding(rule, shape, dtype, want):
    for empty in (None, EMPTY):
        dest = torch.full(shape, 7, dtype=dtype)
        fill(rule, dest, empty, 6, "b")
        assert torch.equal(dest, want), (rule, empty)


EMPTY_SHAPES = {"zeros": (4, 2), "ones": (4, 2), "trailing_segment": (4,), "trailing_item": (4, 3), "identity": (4,),
                "square_mask": (4, 4), "repeat": (4, 2)}


@pytest.mark.parametrize("rule", sorted(padding.PADDING_RULES))
def test_rules_at_capacity_read_the_recorded_capacity_and_others_the_buffer(rule):
    """A rule whose padding ends at the row capacity must find it recorded for the buffer; the others never ask."""
    record = padding.PADDING_RULES[rule]
    dest = torch.zeros(EMPTY_SHAPES[rule], dtype=torch.bool if rule == "square_mask" else torch.int64)
    logic = BufferPadding("b", rule, Capacities(), merge=1)
    if record.at_capacity:
        with pytest.raises(InputError, match="was not allocated by"):
            logic(dest, None)
    else:
        logic(dest, None)
    assert record.at_capacity == (rule in ("trailing_segment", "trailing_item"))
