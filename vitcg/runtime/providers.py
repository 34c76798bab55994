"""Metadata providers: the data-dependent half of a vision encoder, computed outside the graph.

Each provider named in :mod:`vitcg.lang.catalogue` computes the unpadded value of one buffer for the
items of a pack, wrapping ``transformers.vision_utils`` (the same helpers the encoders call when a key
is not precomputed). :mod:`vitcg.runtime.padding` writes such a value into a fixed-size capture buffer, of the
spec's shape: a provider whose value grows with the items or segments of a pack states the rows it needs
(:attr:`vitcg.lang.catalogue.Provider.capacity`), ``vitcg validate`` holds the spec's shape to it, and a capture
never allocates more than the spec says.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import vision_utils

from ..errors import InputError
from ..lang.bindings import release, transformers_version
from ..lang.catalogue import GRID_COLUMNS, INTERP_AXES, PROVIDERS
from ..lang.model import Buffer

Compute = Callable[["Pack", Mapping[str, Any]], torch.Tensor]
PROVIDED: dict[str, Compute] = {}
"""Tensor provider name (:data:`vitcg.lang.catalogue.PROVIDERS`) -> its unpadded value for a pack. Host
providers (``max_seqlen``...) are fixed at capture and have no function; ``scope_arg`` values come from
the model's own eager prologue."""


def provider(name: str) -> Callable[[Compute], Compute]:
    """Register the function of the tensor provider ``name``."""
    def register(fn: Compute) -> Compute:
        PROVIDED[name] = fn
        return fn
    return register


@dataclass(frozen=True)
class Pack:
    """The items of one replay, in canonical order (images first, then videos)."""

    pixels: torch.Tensor
    """Packed patch rows, or tiles on dim 0."""
    counts: torch.Tensor
    """The t/h/w grid rows the encoder sees, on the CPU (packed, windowed: one per item, or one per frame of a
    modality with ``split: frames``), or (items,) tile counts (tiles)."""
    geometry: Mapping[str, int]
    segments: str
    """``frame``, ``clip`` or ``tile``."""
    cache: RowCache = field(default_factory=lambda: RowCache(), compare=False)
    """Per-item results of the vision_utils helpers; owned by the adapter, shared across packs."""
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Extra inputs by role, aligned with the pixels on dim 0."""
    grid_columns: tuple[str, ...] = GRID_COLUMNS
    """The columns of the grid the encoder receives (:attr:`counts` always holds all of t, h, w)."""

    @property
    def rows(self) -> list:
        return self.counts.tolist()


class RowCache:
    """Per-item results of the vision_utils helpers by (helper, params, grid row): serving sees the same
    image sizes again and again. Row-sized tensors are kept on the encoder's device, so a pack is composed
    there with one ``cat`` and no host-to-device copy; the cache is bounded by bytes."""

    def __init__(self, device: torch.device | str = "cpu", max_bytes: int = 64 * 2**20):
        self.device = torch.device(device)
        self.max_bytes = max_bytes
        self._entries: dict[tuple, Any] = {}
        self._bytes = 0

    def get(self, key: tuple, compute: Callable[[], Any], on_device: bool) -> Any:
        key = (*key, on_device)
        found = self._entries.get(key)
        if found is None:
            found = compute()
            if on_device:
                found = tuple(t.to(self.device) for t in found) if isinstance(found, tuple) else found.to(self.device)
            size = sum(t.numel() * t.element_size() for t in (found if isinstance(found, tuple) else (found,)))
            if self._bytes + size > self.max_bytes:
                self._entries.clear()
                self._bytes = 0
            self._entries[key] = found
            self._bytes += size
        return found


def _per_row(pack: Pack, name: str, params: Mapping[str, Any], row: list, fn: Callable[[torch.Tensor], Any],
             on_device: bool = True):
    key = (name, tuple(sorted(params.items())), tuple(row))
    return pack.cache.get(key, lambda: fn(torch.tensor([row], dtype=torch.int64)), on_device)


def _merge(pack: Pack, params: Mapping[str, Any]) -> int:
    """The merge block size rows are ordered by: ``params.spatial_merge_size`` where the encoder's helpers use
    their own (PaddleOCR-VL's tower: 1, its projector merges by 2), else the geometry's (the providers that call
    this declare it)."""
    return params.get("spatial_merge_size", pack.geometry["spatial_merge_size"])


def _cat(parts: list[torch.Tensor], empty_shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The parts joined on dim 0; one part is returned as it is (no copy kernel: buffers copy from it anyway)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else torch.zeros(empty_shape, dtype=dtype, device=device)


@provider("cu_seqlens")
def _cu_seqlens(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """Boundaries per frame (or per clip): the arithmetic of ``get_vision_cu_seqlens``, without torch ops."""
    bounds = [0]
    for t, h, w in pack.rows:
        for length in ([t * h * w] if pack.segments == "clip" else [h * w] * t):
            bounds.append(bounds[-1] + length)
    return torch.tensor(bounds, dtype=torch.int32)


@provider("position_ids")
def _position_ids(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    temporal = params.get("include_temporal", False)
    parts = [_per_row(pack, "position_ids", params, row, lambda g: vision_utils.get_vision_position_ids(
        g, _merge(pack, params), include_temporal=temporal)) for row in pack.rows]
    return _cat(parts, (0, 3 if temporal else 2), torch.int64, pack.cache.device)


@provider("nearest_position_ids")
def _nearest_position_ids(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """``get_vision_nearest_position_ids`` per (h, w) item (cached), once per frame."""
    side = pack.geometry["num_grid_per_side"]

    def one(grid: torch.Tensor) -> torch.Tensor:
        return vision_utils.get_vision_nearest_position_ids(grid[:, 1:], side).repeat(int(grid[0, 0]))

    parts = [_per_row(pack, "nearest_position_ids", params, row, one) for row in pack.rows]
    return _cat(parts, (0,), torch.int64, pack.cache.device)


def _window(pack: Pack, params: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_vision_window_index`` per item (cached), shifted into place: the same result as the batch call.
    The index is composed on the device; the boundaries stay on the host (the padding rule reads them)."""
    g = pack.geometry
    m = _merge(pack, params)

    def one(grid: torch.Tensor):
        return vision_utils.get_vision_window_index(grid, m, g["window_size"], g["patch_size"])

    indices, bounds, units, rows = [], [torch.zeros(1, dtype=torch.int32)], 0, 0
    for row in pack.rows:
        indices.append(_per_row(pack, "window", params, row, lambda grid: one(grid)[0]) + units)
        bounds.append(_per_row(pack, "window_bounds", params, row, lambda grid: one(grid)[1], on_device=False)[1:]
                      + rows)
        t, h, w = row
        units += t * (h // m) * (w // m)
        rows += t * h * w
    return _cat(indices, (0,), torch.int64, pack.cache.device), torch.cat(bounds)


def _interp(pack: Pack, params: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The helper per item (cached), on the grid's columns in ``params.axes`` order: ``twh`` swaps h and w, as an
    encoder that passes ``grid_thw[:, [0, 2, 1]]`` does. Rows stay t * h * w per item either way."""
    axes = list(INTERP_AXES[params.get("axes", "thw")])

    def one(grid: torch.Tensor):
        return vision_utils.get_vision_interpolation_indices_and_weights(
            grid[:, axes], pack.geometry["num_grid_per_side"], mode=params.get("mode", "bilinear"),
            align_corners=params.get("align_corners", False), spatial_merge_size=_merge(pack, params),
            padding=params.get("padding", "border"))

    parts = [_per_row(pack, "interp", params, row, one) for row in pack.rows]
    taps = 4 if params.get("mode", "bilinear") == "bilinear" else 16
    device = pack.cache.device
    return (_cat([p[0] for p in parts], (0, taps), torch.int64, device),
            _cat([p[1] for p in parts], (0, taps), torch.float32, device))


@provider("pixel_shuffle_index")
def _pixel_shuffle_index(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """Per frame, its raster rows in ``m x m`` block order (blocks in raster order, each block's rows row by row),
    offset to the frame's and item's first row: a gather that makes each block ``m * m`` consecutive rows."""
    m = pack.geometry["spatial_merge_size"]

    def one(grid: torch.Tensor) -> torch.Tensor:
        t, h, w = grid[0].tolist()
        index = torch.arange(t * h * w, dtype=torch.int64).view(t, h // m, m, w // m, m)
        return index.permute(0, 1, 3, 2, 4).reshape(-1)

    parts, start = [], 0
    for row in pack.rows:
        parts.append(_per_row(pack, "pixel_shuffle_index", {}, row, one) + start)
        start += row[0] * row[1] * row[2]
    return _cat(parts, (0,), torch.int64, pack.cache.device)


@provider("frame_index")
def _frame_index(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """Per row: 0 in a one-frame item, f + 1 in frame f of a longer one (row 0 of the temporal table is zero)."""
    def one(grid: torch.Tensor) -> torch.Tensor:
        t, h, w = grid[0].tolist()
        return (torch.arange(t, dtype=torch.int64) + int(t > 1)).repeat_interleave(h * w)

    return _cat([_per_row(pack, "frame_index", {}, row, one) for row in pack.rows], (0,), torch.int64,
                pack.cache.device)


@provider("temporal_merge_index")
def _temporal_merge_index(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """Per merged token, the packed rows of its ``m x m`` block in each frame of its item: ``(tokens, slots,
    m * m)`` with ``slots`` the least common multiple of the pack's frame counts, each of an item's t frames in
    ``slots / t`` of them, so a mean over dim 1 is the mean over the item's frames. The ``repeat`` padding
    widens dim 1 to the buffer's."""
    m = pack.geometry["spatial_merge_size"]
    rows = pack.rows
    slots = math.lcm(*(row[0] for row in rows)) if rows else 1

    def one(grid: torch.Tensor) -> torch.Tensor:
        t, h, w = grid[0].tolist()
        index = torch.arange(t * h * w, dtype=torch.int64).view(t, h // m, m, w // m, m)
        return index.permute(1, 3, 0, 2, 4).reshape((h // m) * (w // m), t, m * m)

    parts, start = [], 0
    for row in rows:
        index = _per_row(pack, "temporal_merge_index", {}, row, one)
        parts.append(index.repeat(1, slots // row[0], 1) + start)
        start += row[0] * row[1] * row[2]
    return _cat(parts, (0, slots, m * m), torch.int64, pack.cache.device)


def frame_neighbours(height: int, width: int, kernel: int, merge: int) -> torch.Tensor:
    """``(height * width, kernel ** 2)``: for each row of one frame, in merge-block order (``merge`` by ``merge``
    blocks in raster order, raster inside each block; ``merge`` 1 is raster order), the rows of the cells a 'same'
    ``kernel x kernel`` convolution reads, in the kernel's row-major order; -1 where the cell lies outside."""
    order = torch.arange(height * width).view(height // merge, width // merge, merge, merge)
    order = order.permute(0, 2, 1, 3).reshape(height, width)  # order[y, x]: the row of raster cell (y, x)
    ys, xs = torch.empty(height * width, dtype=torch.int64), torch.empty(height * width, dtype=torch.int64)
    ys[order.reshape(-1)] = torch.arange(height).repeat_interleave(width)
    xs[order.reshape(-1)] = torch.arange(width).repeat(height)
    reach = torch.arange(kernel) - kernel // 2
    y = (ys[:, None] + reach[:, None].expand(kernel, kernel).reshape(-1))
    x = (xs[:, None] + reach.repeat(kernel))
    inside = (y >= 0) & (y < height) & (x >= 0) & (x < width)
    return torch.where(inside, order[y.clamp(0, height - 1), x.clamp(0, width - 1)], -1)


@provider("grid_neighbours")
def _grid_neighbours(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    """:func:`frame_neighbours` of every frame of every item (cached per grid row), shifted to the frame's rows."""
    kernel, merge = pack.geometry["conv_kernel_size"], _merge(pack, params)

    def one(grid: torch.Tensor) -> torch.Tensor:
        t, h, w = grid[0].tolist()
        frame = frame_neighbours(h, w, kernel, merge)
        shifts = (torch.arange(t) * h * w).repeat_interleave(h * w)[:, None]
        frames = frame.repeat(t, 1)
        return torch.where(frames >= 0, frames + shifts, -1)

    parts, start = [], 0
    for row in pack.rows:
        index = _per_row(pack, "grid_neighbours", params, row, one)
        parts.append(torch.where(index >= 0, index + start, -1) if start else index)
        start += row[0] * row[1] * row[2]
    return _cat(parts, (0, kernel * kernel), torch.int64, pack.cache.device)


Rebuild = Callable[[torch.Tensor, int], Any]
REBUILDS: dict[tuple[str, str], Rebuild] = {}
"""(provider name, release) -> the rebuild of one of its later argument forms
(:attr:`vitcg.lang.catalogue.Provider.forms`): the stored value and the rows of the call (the pixel buffer's) ->
the argument that release's model code takes. It runs inside the fixed-shape forward: torch ops of fixed
shapes only, no host syncs."""


def rebuild(name: str, since: str) -> Callable[[Rebuild], Rebuild]:
    """Register the rebuild of provider ``name``'s argument form of transformers ``since`` on."""
    def register(fn: Rebuild) -> Rebuild:
        REBUILDS[(name, since)] = fn
        return fn
    return register


def argument_rebuild(buffer: Buffer, version: str | None = None) -> Rebuild | None:
    """The rebuild ``buffer``'s argument needs under the installed transformers (or ``version``): the newest of its
    provider's forms whose release is not after it, or None where the stored value is the argument. Asked once,
    where the graph boundary is built, never per call."""
    installed = release(version or transformers_version())
    forms = [f for f in PROVIDERS[buffer.provider].forms if release(f.since) <= installed]
    return REBUILDS[(buffer.provider, forms[-1].since)] if forms else None


@rebuild("temporal_merge_index", since="5.24")
def _temporal_merge_scatter(index: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The gather index ``(tokens, slots, m * m)`` in the form transformers 5.24's Kimi-K2.5 merger pops from its
    kwargs: ``(destination, weight, tokens)``, with ``destination`` (rows,) the slot ``token * m * m + k`` each row
    of the tower is added to, ``weight`` (rows,) float32 ``1 / t`` of its item, and ``tokens`` the index's dim 0, a
    host int fixed by the buffer's shape (so no sync). Fixed-shape ops only: this runs inside the graph.

    Every real row sits in one ``(token, k)`` of the index, in ``slots / t`` of its slots, so the count of its
    slots over ``slots`` is ``1 / t`` (exactly: both are integers). The zero rows the ``repeat`` padding writes
    after the real tokens point at row 0 too, with targets past every real token's; row 0 keeps its real target
    0 (the least) and counts only the slots that agree with it. Rows no token points at (padding rows) get
    destination 0 and weight 0: they add nothing. (In an empty pack every token is padding and row 0 counts for
    token 0: nothing of it is kept.)"""
    tokens, slots, kernel = index.shape
    flat = index.reshape(-1)
    target = (torch.arange(tokens, device=index.device)[:, None, None] * kernel
              + torch.arange(kernel, device=index.device)).expand(tokens, slots, kernel).reshape(-1)
    destination = torch.zeros(rows, dtype=torch.int64, device=index.device).scatter_reduce_(
        0, flat, target, "amin", include_self=False)
    agrees = (destination[flat] == target).to(torch.float32)
    weight = torch.zeros(rows, dtype=torch.float32, device=index.device).index_add_(0, flat, agrees) / slots
    return destination, weight, tokens


@provider("pixels")
def _pixels(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return pack.pixels


@provider("aligned")
def _aligned(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    role = params["role"]
    if role not in pack.extras:  # a pack of no items: no modality gave this role, and no rows are copied
        if pack.counts.shape[0] == 0:
            return pack.pixels.new_empty((0,), device=pack.cache.device)
        raise InputError(f"input role {role!r}: expected it beside the pixels of {pack.counts.shape[0]} items, got none")
    return pack.extras[role].to(pack.cache.device)


def encoder_grid(counts: torch.Tensor, columns: tuple[str, ...]) -> torch.Tensor:
    """Full ``(t, h, w)`` grid rows in the columns the encoder receives (``grid_columns``)."""
    if tuple(columns) == GRID_COLUMNS:
        return counts
    return counts[:, [GRID_COLUMNS.index(name) for name in columns]]


@provider("grid")
def _grid(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return encoder_grid(pack.counts, pack.grid_columns)


@provider("window_index")
def _window_index(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return _window(pack, params)[0]


@provider("cu_window_seqlens")
def _cu_window_seqlens(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return _window(pack, params)[1]


@provider("interp_indices")
def _interp_indices(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return _interp(pack, params)[0]


@provider("interp_weights")
def _interp_weights(pack: Pack, params: Mapping[str, Any]) -> torch.Tensor:
    return _interp(pack, params)[1]


def compute(buffer: Buffer, pack: Pack) -> torch.Tensor | None:
    """The unpadded value of ``buffer`` for ``pack``, or None for a host integer (fixed at capture) and for a buffer
    kept on the host (``on_host``: the capture's value is what the graph baked in, so it is never refilled)."""
    if PROVIDERS[buffer.provider].kind == "host" or buffer.params.get("on_host"):
        return None
    return PROVIDED[buffer.provider](pack, buffer.params)


DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32, "bool": torch.bool}
