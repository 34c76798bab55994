"""Inputs that many tests feed a tiny adapter (qwen2_vl's pixel rows and grids), and the check that every entry
point refuses a hostile input by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch

from vitcg.errors import InputError

QWEN2_ROW = 1176
"""One pixel row of tiny qwen2_vl: in_channels 3 * temporal_patch_size 2 * patch_size 14 ** 2."""


def qwen2_images(*grids, seed: int = 0, key: str = "pixel_values", grid_key: str = "image_grid_thw",
                 dim: int = QWEN2_ROW) -> dict[str, torch.Tensor]:
    """qwen2_vl image kwargs of ``grids`` (``[t, h, w]`` each): seeded random pixel rows and the grid."""
    grid = torch.tensor(grids, dtype=torch.int64)
    rows = int(grid.prod(-1).sum())
    return {key: torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)), grid_key: grid}


def qwen2_videos(*grids, seed: int = 1) -> dict[str, torch.Tensor]:
    """qwen2_vl video kwargs of ``grids`` (``[t, h, w]`` each)."""
    return qwen2_images(*grids, seed=seed, key="pixel_values_videos", grid_key="video_grid_thw")


def assert_refused(calls: Iterable[Callable[[Any], Any]], kwargs: Any, *fragments: str) -> None:
    """Each of ``calls`` given ``kwargs`` raises InputError whose message holds every one of ``fragments``."""
    for call in calls:
        with pytest.raises(InputError) as caught:
            call(kwargs)
        for fragment in fragments:
            assert fragment in str(caught.value), (fragment, str(caught.value))
