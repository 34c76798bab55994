"""Metadata providers and padding rules: the data-dependent half of a vision encoder, outside the graph.

Each provider named in :mod:`vitcg.spec.catalogue` computes the unpadded value of one buffer for the
items of a pack, wrapping ``transformers.vision_utils`` (the same helpers the encoders call when a key
is not precomputed). Each padding rule writes such a value into a fixed-size capture buffer in place:

- ``zeros``: value rows first, zero rows after them;
- ``trailing_segment``: boundaries first, then the padding rows as one trailing segment ending at the
  buffer's row capacity, unused slots repeating that last offset (real tokens never attend to padding,
  and padding rows are computed, so no uninitialized memory turns into NaN);
- ``identity``: indices first, then each padding slot maps to itself;
- ``fixed``: a host integer fixed at capture, never refilled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import vision_utils

from .errors import InputError
from .spec.catalogue import PROVIDERS
from .spec.model import Buffer


@dataclass(frozen=True)
class Pack:
    """The items of one replay, in canonical order (images first, then videos)."""

    pixels: torch.Tensor
    """Packed patch rows, or tiles on dim 0."""
    counts: torch.Tensor
    """(items, 3) t/h/w grid on the CPU (packed, windowed), or (items,) tile counts (tiles)."""
    geometry: Mapping[str, int]
    segments: str
    """``frame``, ``clip`` or ``tile``."""


def _merge(pack: Pack) -> int:
    return pack.geometry.get("spatial_merge_size", 1)


def _window(pack: Pack) -> tuple[torch.Tensor, torch.Tensor]:
    g = pack.geometry
    return vision_utils.get_vision_window_index(pack.counts, g["spatial_merge_size"], g["window_size"], g["patch_size"])


def _interp(pack: Pack, params: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return vision_utils.get_vision_interpolation_indices_and_weights(
        pack.counts,
        pack.geometry["num_grid_per_side"],
        mode=params.get("mode", "bilinear"),
        align_corners=params.get("align_corners", False),
        spatial_merge_size=_merge(pack),
        padding=params.get("padding", "border"),
    )


_COMPUTE: dict[str, Callable[[Pack, Mapping[str, Any]], torch.Tensor]] = {
    "pixels": lambda pack, params: pack.pixels,
    "grid": lambda pack, params: pack.counts,
    "cu_seqlens": lambda pack, params: vision_utils.get_vision_cu_seqlens(
        pack.counts, merge_temporal=pack.segments == "clip"),
    "position_ids": lambda pack, params: vision_utils.get_vision_position_ids(
        pack.counts, _merge(pack), include_temporal=params.get("include_temporal", False)),
    "window_index": lambda pack, params: _window(pack)[0],
    "cu_window_seqlens": lambda pack, params: _window(pack)[1],
    "interp_indices": lambda pack, params: _interp(pack, params)[0],
    "interp_weights": lambda pack, params: _interp(pack, params)[1],
}
"""Tensor providers: unpadded value for a pack. Host providers (``max_seqlen``...) have no entry."""


def compute(buffer: Buffer, pack: Pack) -> torch.Tensor | None:
    """The unpadded value of ``buffer`` for ``pack``, or None for a host integer (fixed at capture)."""
    if PROVIDERS[buffer.provider].kind == "host":
        return None
    return _COMPUTE[buffer.provider](pack, buffer.params)


def _check_fits(dest: torch.Tensor, src: torch.Tensor, key: str) -> None:
    if src.shape[1:] != dest.shape[1:]:
        raise InputError(f"buffer {key!r}: value of shape {tuple(src.shape)} does not fit capture buffer "
                         f"{tuple(dest.shape)} (trailing dimensions differ)")
    if src.shape[0] > dest.shape[0]:
        raise InputError(f"buffer {key!r}: {src.shape[0]} rows do not fit the capture buffer of {dest.shape[0]} "
                         "rows; the spec's buffer shape is too small for this budget")


def pad_zeros(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str) -> None:
    _check_fits(dest, src, key)
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    dest[n:].zero_()


def pad_trailing_segment(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str) -> None:
    """``src`` = boundaries ``[0, ..., R]``; padding rows ``R..capacity`` become one trailing segment."""
    if src.shape[0] >= dest.shape[0]:
        raise InputError(f"buffer {key!r}: {src.shape[0] - 1} segments leave no slot for the padding segment "
                         f"({dest.shape[0] - 1} slots); the spec's buffer shape is too small for this pack")
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    dest[n:].fill_(capacity)


def pad_identity(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str) -> None:
    _check_fits(dest, src, key)
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    torch.arange(n, dest.shape[0], out=dest[n:])


PADDING_RULES: dict[str, Callable[[torch.Tensor, torch.Tensor, int, str], None]] = {
    "zeros": pad_zeros,
    "trailing_segment": pad_trailing_segment,
    "identity": pad_identity,
}
"""Padding rule -> ``fill(dest, src, row_capacity, key)``. ``fixed`` buffers are never refilled."""


def fill(rule: str, dest: torch.Tensor, src: torch.Tensor | None, capacity: int, key: str) -> None:
    """Write ``src`` into ``dest`` by ``rule``; ``src=None`` writes the all-padding value (an empty pack)."""
    if src is None:
        src = dest.new_zeros((1,) if rule == "trailing_segment" else (0, *dest.shape[1:]))
    PADDING_RULES[rule](dest, src, capacity, key)


DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32}
