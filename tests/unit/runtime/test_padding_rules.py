"""Padding rules written directly: a grid that ends in a padding item, and a pack that fills every row."""

from __future__ import annotations

import pytest
import torch

from vitcg.errors import InputError
from vitcg.runtime.padding import fill


def test_trailing_item_makes_the_padding_rows_one_item_that_survives_the_merge():
    grid = torch.full((4, 2), 7, dtype=torch.int64)
    fill("trailing_item", grid, torch.tensor([[4, 8], [8, 4]]), 128, "target_sizes", merge=2)
    assert grid.tolist() == [[4, 8], [8, 4], [2, 32], [0, 0]]
    # the encoder's segments from this grid, before and after it divides the grid by the merge
    assert torch.cumsum(grid.prod(dim=1), 0).tolist() == [32, 64, 128, 128]
    assert torch.cumsum((grid // 2).prod(dim=1), 0).tolist() == [8, 16, 32, 32]


def test_trailing_item_with_a_time_column_and_without_padding():
    grid = torch.zeros(3, 3, dtype=torch.int64)
    fill("trailing_item", grid, torch.tensor([[1, 4, 4]]), 32, "grid", merge=2)
    assert grid.tolist() == [[1, 4, 4], [1, 2, 8], [0, 0, 0]]
    fill("trailing_item", grid, torch.tensor([[1, 4, 4], [2, 2, 2]]), 24, "grid", merge=2)
    assert grid.tolist() == [[1, 4, 4], [2, 2, 2], [0, 0, 0]]


def test_trailing_item_refuses_what_it_cannot_pad():
    grid = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(InputError, match="no row for the padding item"):
        fill("trailing_item", grid, torch.tensor([[2, 2], [2, 2]]), 16, "target_sizes", merge=2)
    with pytest.raises(InputError, match="no multiple of 4"):
        fill("trailing_item", grid, torch.tensor([[2, 3]]), 16, "target_sizes", merge=2)


def test_trailing_segment_of_a_pack_that_fills_every_row_needs_no_free_slot():
    bounds = torch.zeros(4, dtype=torch.int32)
    fill("trailing_segment", bounds, torch.tensor([0, 4, 8, 12], dtype=torch.int32), 12, "cu_window_seqlens")
    assert bounds.tolist() == [0, 4, 8, 12]
    with pytest.raises(InputError, match="leave no slot for padding"):
        fill("trailing_segment", bounds, torch.tensor([0, 4, 8, 12], dtype=torch.int32), 16, "cu_window_seqlens")
