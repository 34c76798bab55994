"""Padding rules: how a new value is written into a fixed-size capture buffer, in place.

Each rule is one :class:`Padding` record: its function ``fill(dest, src, capacity, key, merge)``, the value
that means "no data", and what it needs of the buffer. :class:`BufferPadding` binds one rule to one buffer as
the protocol's padding logic, a callable ``(captured_buffer, new_value) -> None`` that any manager (vLLM's too)
calls without knowing the rule:

- ``zeros``: value rows first, zero rows after them;
- ``ones``: value rows first, rows of ones after them (attention masks of padding tiles);
- ``trailing_segment``: boundaries first, then the padding rows as trailing segments of their own that end
  at the buffer set's row capacity, spread over the free slots (real tokens never attend to padding,
  padding rows are computed so no uninitialized memory turns into NaN, and no long padding segment costs
  quadratic attention); without padding the free slots repeat the last offset;
- ``trailing_item``: grid rows first, then one row making the padding rows an item of their own (encoders that
  derive their segments from the grid), then zero rows;
- ``identity``: indices first, then each padding slot maps to itself;
- ``square_mask``: an attention mask whose rows are both its first (stored) and its last dimension, padded on
  both: the value's mask top-left, each padding row attends only to itself, real rows never to padding (a
  block-diagonal mask such as Pixtral's keeps its blocks, and padding adds one-row blocks);
- ``repeat``: value rows first, each one's dim 1 repeated to fill the buffer's (which it must divide), zero
  rows after them;
- ``fixed``: a host integer fixed at capture, never refilled (no padding logic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError

Rule = Callable[..., None]
"""``fill(dest, src, row_capacity, key, merge=1)``: writes ``src`` into ``dest`` in place; ``merge`` is the spec's
spatial_merge_size (only ``trailing_item`` reads it)."""


def no_rows(dest: torch.Tensor) -> torch.Tensor:
    """A value of no rows for ``dest``: every row is padding."""
    return dest.new_zeros((0, *dest.shape[1:]))


@dataclass(frozen=True)
class Padding:
    """One padding rule as the runtime applies it."""

    fill: Rule
    """Writes a value into a capture buffer in place."""
    empty: Callable[[torch.Tensor], torch.Tensor] = no_rows
    """The value meaning "no data" for a capture buffer (``src`` None or :data:`EMPTY`)."""
    at_capacity: bool = False
    """Its padding ends at the buffer set's row capacity (:class:`Capacities`), not at the buffer's own end."""


PADDING_RULES: dict[str, Padding] = {}
"""Padding rule name (:data:`vitcg.lang.catalogue.PADDINGS`) -> its record. ``fixed`` buffers are never refilled,
so that rule has none."""


def padding_rule(name: str, **record: Any) -> Callable[[Rule], Rule]:
    """Register ``fill`` as the function of the padding rule ``name``; ``record``: the other :class:`Padding`
    fields."""
    def register(fn: Rule) -> Rule:
        PADDING_RULES[name] = Padding(fn, **record)
        return fn
    return register


def _check_fits(dest: torch.Tensor, src: torch.Tensor, key: str) -> None:
    if src.shape[1:] != dest.shape[1:]:
        raise InputError(f"buffer {key!r}: value of shape {tuple(src.shape)} does not fit capture buffer "
                         f"{tuple(dest.shape)} (trailing dimensions differ)")
    if src.shape[0] > dest.shape[0]:
        raise InputError(f"buffer {key!r}: {src.shape[0]} rows do not fit the capture buffer of {dest.shape[0]} "
                         "rows; the spec's buffer shape is too small for this budget")


@padding_rule("zeros")
def pad_zeros(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    _check_fits(dest, src, key)
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    if n < dest.shape[0]:
        dest[n:].zero_()


@padding_rule("ones")
def pad_ones(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    """Value rows, then rows of ones: padding tiles with an all-true attention mask never see an empty
    softmax, so they cannot turn into NaN."""
    _check_fits(dest, src, key)
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    if n < dest.shape[0]:
        dest[n:].fill_(1)


def _no_segments(dest: torch.Tensor) -> torch.Tensor:
    """Boundaries of no segments: every row is padding."""
    return torch.zeros(1, dtype=dest.dtype)


@padding_rule("trailing_segment", empty=_no_segments, at_capacity=True)
def pad_trailing_segment(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    """``src`` = boundaries ``[0, ..., R]`` on the host; rows ``R..capacity`` become trailing padding segments.

    The padding rows are spread over every free slot (at most ``ceil(P / free)`` rows each) instead of
    one long segment, so attention over padding costs ``P * P / free`` rather than ``P * P``; with no
    padding, the free slots repeat the last offset (zero-length segments).
    """
    n, slots = src.shape[0], dest.shape[0]
    end = int(src[-1])
    padding = capacity - end
    if padding < 0:
        raise InputError(f"buffer {key!r}: segments end at row {end}, beyond the buffer's {capacity} rows")
    if n > slots or n == slots and padding:
        raise InputError(f"buffer {key!r}: {n - 1} segments leave no slot for padding ({slots - 1} slots); "
                         "the spec's buffer shape is too small for this pack")
    full = torch.empty(slots, dtype=dest.dtype, device=src.device)
    full[:n] = src
    free = slots - n
    if padding:
        chunk = -(-padding // min(free, padding))
        full[n:] = torch.arange(1, free + 1, dtype=dest.dtype, device=src.device).mul_(chunk).add_(end).clamp_(max=capacity)
    else:
        full[n:] = capacity
    dest.copy_(full, non_blocking=True)


@padding_rule("trailing_item", at_capacity=True)
def pad_trailing_item(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    """Grid rows (``(t, h, w)`` or ``(h, w)``) first, then one more row holding the padding rows as an item of
    their own, ``(1, merge, P // merge)`` (without t: ``(merge, P // merge)``), then zero rows. An encoder that
    takes its attention segments from its grid (a cumulative sum of the rows' products) computes the padding
    rows as a segment of their own, and still does after dividing its grid by ``merge`` (a merge inside the
    encoder: ``P // merge ** 2`` rows)."""
    _check_fits(dest, src, key)
    n = src.shape[0]
    real = int(src.prod(dim=1).sum()) if n else 0
    padding = capacity - real
    if padding < 0:
        raise InputError(f"buffer {key!r}: grid rows of {real} rows exceed the buffer set's {capacity} rows")
    if padding % (merge * merge):
        raise InputError(f"buffer {key!r}: {padding} padding rows are no multiple of {merge * merge} "
                         f"(spatial_merge_size {merge} squared); the grid rows cannot end in a padding item")
    if padding and n >= dest.shape[0]:
        raise InputError(f"buffer {key!r}: {n} grid rows leave no row for the padding item ({dest.shape[0]} rows); "
                         "the spec's buffer shape is too small for this pack")
    dest[:n].copy_(src, non_blocking=True)
    dest[n:].zero_()
    if padding:
        item = (merge, padding // merge) if dest.shape[1] == 2 else (1, merge, padding // merge)
        dest[n].copy_(torch.tensor(item, dtype=dest.dtype))


@padding_rule("identity")
def pad_identity(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    _check_fits(dest, src, key)
    n = src.shape[0]
    dest[:n].copy_(src, non_blocking=True)
    if n < dest.shape[0]:
        torch.arange(n, dest.shape[0], out=dest[n:])


def mask_values(dtype: torch.dtype) -> tuple[bool | int | float, bool | int | float]:
    """``(attend, masked)`` entries of an attention mask of ``dtype``: boolean and integer masks keep what is
    true (1); floating masks are additive, as transformers builds them (0 attends, the dtype's lowest value
    masks)."""
    if dtype.is_floating_point:
        return 0.0, torch.finfo(dtype).min
    return (True, False) if dtype == torch.bool else (1, 0)


def _no_mask(dest: torch.Tensor) -> torch.Tensor:
    """A mask over no rows: every row is padding."""
    return dest.new_zeros((0, *dest.shape[1:-1], 0))


@padding_rule("square_mask", empty=_no_mask)
def pad_square_mask(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    """``src`` is an ``(n, ..., n)`` mask (rows first, then whatever lies between, then the same rows as
    columns); ``dest`` is ``(N, ..., N)``. The value lands top-left; every other entry masks, except that each
    padding row attends to itself, so its softmax is never empty (no NaN) and no real row sees it."""
    size = dest.shape[0]
    if dest.ndim < 2 or dest.shape[-1] != size:
        raise InputError(f"buffer {key!r}: capture buffer {tuple(dest.shape)} is no square mask (its first and "
                         "last dimensions differ)")
    n = src.shape[0]
    if src.ndim != dest.ndim or src.shape[-1] != n or src.shape[1:-1] != dest.shape[1:-1]:
        raise InputError(f"buffer {key!r}: value of shape {tuple(src.shape)} is no square mask fitting capture "
                         f"buffer {tuple(dest.shape)}; expected ({n}, {', '.join(map(str, dest.shape[1:-1]))}"
                         f"{', ' if dest.ndim > 2 else ''}{n})")
    if n > size:
        raise InputError(f"buffer {key!r}: {n} rows do not fit the capture buffer of {size} rows; the spec's "
                         "buffer shape is too small for this budget")
    attend, masked = mask_values(dest.dtype)
    dest.fill_(masked)
    dest[:n, ..., :n].copy_(src, non_blocking=True)
    if n < size:
        padding = torch.arange(n, size, device=dest.device)
        dest[padding, ..., padding] = attend


@padding_rule("repeat")
def pad_repeat(dest: torch.Tensor, src: torch.Tensor, capacity: int, key: str, merge: int = 1) -> None:
    """Value rows whose dim 1 divides the buffer's, repeated along it to fill it (a mean over dim 1 is
    unchanged: a gather index of frames, each frame in the same number of slots); zero rows after them."""
    if src.dim() < 2 or dest.dim() != src.dim() or dest.shape[1] % max(src.shape[1], 1):
        raise InputError(f"buffer {key!r}: value of shape {tuple(src.shape)} does not repeat into capture buffer "
                         f"{tuple(dest.shape)}: its dim 1 must divide the buffer's (give the buffer a multiple of "
                         "every frame count)")
    pad_zeros(dest, src.repeat(1, dest.shape[1] // src.shape[1], *(1,) * (src.dim() - 2)) if src.shape[1] else
              src.new_zeros((src.shape[0], *dest.shape[1:])), capacity, key)


class _Empty:
    def __repr__(self) -> str:
        return "EMPTY"


EMPTY = _Empty()
"""A replay value meaning "no data": the buffer gets its all-padding value (an absent mask: all ones)."""


def one_segment(rows: int) -> torch.Tensor:
    """The boundaries of one segment over the call's ``rows``, ``[0, rows]`` on the host (no sync): what a
    ``trailing_segment`` buffer holds for a call whose rows all attend to each other."""
    return torch.tensor([0, rows], dtype=torch.int64)


ABSENT_VALUES: dict[str, Callable[[int], torch.Tensor]] = {"one_segment": one_segment}
"""Absence name (:data:`vitcg.lang.catalogue.ABSENCES`) -> the value of a scope_arg buffer whose argument the scoped
call leaves out, from the call's row count; the buffer's padding rule then pads it as any other value."""


def fill(rule: str, dest: torch.Tensor, src: torch.Tensor | None, capacity: int, key: str, merge: int = 1) -> None:
    """Write ``src`` into ``dest`` by ``rule``; ``src=None`` or EMPTY writes the rule's empty value. ``merge``: the
    spec's spatial_merge_size (``trailing_item`` shapes its padding item by it)."""
    padding = PADDING_RULES[rule]
    padding.fill(dest, padding.empty(dest) if src is None or src is EMPTY else src, capacity, key, merge)


class Capacities:
    """Row capacity of each capture buffer set, looked up by a buffer's storage address.

    A padding logic receives only ``(captured_buffer, new_value)``; rules that end padding at the row
    capacity (``trailing_segment``) find it here. The adapter records every buffer it allocates."""

    def __init__(self) -> None:
        self._by_pointer: dict[int, int] = {}

    def record(self, buffer: torch.Tensor, capacity: int) -> None:
        self._by_pointer[buffer.data_ptr()] = capacity

    def of(self, buffer: torch.Tensor, key: str) -> int:
        found = self._by_pointer.get(buffer.data_ptr())
        if found is None:
            raise InputError(f"buffer {key!r}: this capture buffer was not allocated by "
                             "prepare_encoder_cudagraph_capture_inputs of this adapter; refill only the "
                             "buffers it returned")
        return found


@dataclass(frozen=True)
class BufferPadding:
    """The padding logic of one buffer: ``(captured_buffer, new_value) -> None``, as the protocol calls it."""

    key: str
    rule: str
    capacities: Capacities
    merge: int = 1
    """The spec's spatial_merge_size (``trailing_item``)."""

    def __call__(self, dest: torch.Tensor, src: torch.Tensor | None) -> None:
        capacity = self.capacities.of(dest, self.key) if PADDING_RULES[self.rule].at_capacity else dest.shape[0]
        fill(self.rule, dest, src, capacity, self.key, self.merge)
