"""A spec's tiny encoder behind its adapter (:func:`tiny_adapter`), vitcg's manager over it (:func:`tiny_manager`),
and the qwen2_vl inputs that many tests feed them (:func:`qwen2_images`, :func:`qwen2_videos`)."""

from __future__ import annotations

from typing import Any

import torch

from support.specs import packaged
from vitcg.lang import Spec
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.encoders import build_encoder

QWEN2_ROW = 1176
"""One pixel row of tiny qwen2_vl: in_channels 3 * temporal_patch_size 2 * patch_size 14 ** 2."""


def tiny_adapter(spec: Spec | str, size: str = "tiny", *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, **options: Any):
    """The adapter of ``spec`` (a :class:`Spec` or a packaged spec's name) over its encoder built at ``size`` with
    seeded random weights; ``options`` go to the adapter (``compile_forward=True``)."""
    if isinstance(spec, str):
        spec = packaged()[spec]
    return adapter_for(spec, build_encoder(spec, size, device=device, dtype=dtype, seed=seed), **options)


def tiny_manager(adapter, max_num_batched_tokens: int = 256, **options: Any) -> EncoderCudaGraphManager:
    """vitcg's manager over ``adapter`` with a small token budget (256 by default), on the CPU path."""
    return EncoderCudaGraphManager(adapter, max_num_batched_tokens=max_num_batched_tokens, **options)


def qwen2_images(*grids, seed: int = 0, key: str = "pixel_values", grid_key: str = "image_grid_thw",
                 dim: int = QWEN2_ROW) -> dict[str, torch.Tensor]:
    """qwen2_vl image kwargs of ``grids`` (``[t, h, w]`` each): seeded random pixel rows and the grid."""
    grid = torch.tensor(grids, dtype=torch.int64)
    rows = int(grid.prod(-1).sum())
    return {key: torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)), grid_key: grid}


def qwen2_videos(*grids, seed: int = 1) -> dict[str, torch.Tensor]:
    """qwen2_vl video kwargs of ``grids`` (``[t, h, w]`` each)."""
    return qwen2_images(*grids, seed=seed, key="pixel_values_videos", grid_key="video_grid_thw")
