"""Per-item comparisons that several test folders share (tests/ is on sys.path through its conftest.py).

float32 on both sides: each item's relative error ``||got - want|| / ||want||`` <= 1e-5, shapes equal, every
output finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vitcg.tools.workloads import relative_error

TOLERANCE = 1e-5


def assert_items_match(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tolerance: float = TOLERANCE,
                       what: str = "") -> None:
    """Item by item: the same number, the same shapes, finite, within ``tolerance``; ``what`` prefixes messages."""
    assert len(got) == len(want), f"{what}{len(got)} items, expected {len(want)}"
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}item {index}: {tuple(g.shape)} vs {tuple(w.shape)}"
        assert torch.isfinite(g).all(), f"{what}item {index} is not finite"
        error = relative_error(g, w)
        assert error <= tolerance, f"{what}item {index}: relative error {error:.2e}"


def assert_matches_eager(adapter: Any, kwargs: dict, outputs: Sequence[torch.Tensor]) -> None:
    """Each of ``outputs`` equals the adapter's eager forward of that item of ``kwargs`` alone."""
    items = adapter.get_encoder_cudagraph_item_specs(kwargs)
    want = [adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
            for index in range(len(items))]
    assert_items_match(outputs, want, what="vs eager, ")
