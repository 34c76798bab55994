"""The buffer records: each provider states the leading rows its buffer must hold (``providers.CAPACITIES``), each
padding rule its empty value and what it needs of the buffer (``padding.PADDING_RULES``); the adapter asks them."""

from __future__ import annotations

import pytest
import torch

from vitcg.errors import InputError
from vitcg.lang import catalogue as cat
from vitcg.lang.model import Buffer
from vitcg.runtime import padding, providers
from vitcg.runtime.padding import EMPTY, BufferPadding, Capacities, fill

LIMITS = providers.CaptureLimits(items=3, segments=7, grid_rows=5, item_roles=frozenset({"instruction"}))


def buffer(provider: str, padding_rule: str = "zeros", **params) -> Buffer:
    return Buffer(name="b", arg="b", provider=provider, shape=None, value=None, padding=padding_rule, params=params)


def test_capacity_rules_belong_to_providers_with_tensor_buffers():
    assert set(providers.CAPACITIES) <= {p.name for p in cat.PROVIDERS.values() if p.kind != "host"}


@pytest.mark.parametrize(("record", "rows"), [
    (buffer("cu_seqlens", "trailing_segment"), 7 + 2),  # the leading zero, the segments, one padding segment
    (buffer("grid"), 5),  # a row per grid row the encoder sees
    (buffer("grid", "ones"), 5),
    (buffer("grid", "trailing_item"), 5 + 1),  # and the padding item's
    (buffer("aligned", role="instruction"), 3),  # a role aligned with the items: a row per item
    (buffer("aligned", role="pixel_attention_mask"), None),  # aligned with the pixels: the spec's shape
    (buffer("scope_arg", "trailing_segment"), 7 + 2),  # segment boundaries, as cu_seqlens
    (buffer("scope_arg", "trailing_item"), None),
    (buffer("scope_arg"), None),
    (buffer("cu_window_seqlens", "trailing_segment"), None),  # windows are not segments: the shape says
    (buffer("pixels"), None),
    (buffer("position_ids"), None),
])
def test_each_provider_states_its_capacity(record, rows):
    assert providers.min_rows(record, LIMITS) == rows


def test_a_segment_buffer_of_its_capacity_holds_every_segment_and_the_padding():
    dest = torch.zeros(providers.min_rows(buffer("cu_seqlens", "trailing_segment"), LIMITS), dtype=torch.int32)
    bounds = torch.arange(LIMITS.segments + 1, dtype=torch.int32) * 2
    fill("trailing_segment", dest, bounds, 20, "cu_seqlens")  # 14 rows of segments, 6 of padding
    assert dest.tolist()[-1] == 20 and dest.tolist()[:8] == bounds.tolist()
    with pytest.raises(InputError, match="leave no slot for padding"):
        fill("trailing_segment", dest[:-1], bounds, 20, "cu_seqlens")


def test_a_grid_of_its_capacity_holds_every_row_and_the_padding_item():
    dest = torch.zeros(providers.min_rows(buffer("grid", "trailing_item"), LIMITS), 3, dtype=torch.int64)
    grid = torch.tensor([[1, 2, 2]] * LIMITS.grid_rows)
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
