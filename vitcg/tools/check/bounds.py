"""Host bounds proven on the CPU: ``max_seqlen`` and ``max_window_seqlen`` against the segments they bound.

A host integer such as ``max_seqlen`` is fixed at capture and read only by the CUDA varlen kernel, which sizes
its grid by it: a segment longer than the bound is silently cut short there. The CPU path runs SDPA with a mask
built from the boundaries and never reads the integer, so a wrong value (one counted in merged tokens where the
boundaries count patch rows) passes every CPU comparison. ``vitcg check`` therefore reads the boundaries the
adapter builds, in the model's own units, and compares their longest segment with what the capture holds:

- at capture, for each budget: the boundaries of the capture fill (padding only) and of the longest segments a
  one-item pack of that budget can hold (a long strip, a square, a two-frame video; the adapter's own providers
  build them, nothing is replayed);
- at every replay: the boundaries the graph ran on, the items' segments and the padding segments vitcg adds.

A graph-scoped spec passes its bounds as ``scope_arg`` values taken from the model's own prologue, which the
model computes itself; it has no bound buffer here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import InputError
from ...lang.model import Spec

BOUNDED = {"max_seqlen": "cu_seqlens", "max_window_seqlen": "cu_window_seqlens"}
"""Host provider -> the provider of the boundaries whose longest segment it bounds (transformers' own
``get_max_seqlen`` computes it from exactly those boundaries when the value is not passed)."""


@dataclass(frozen=True)
class Bound:
    """A host buffer and the boundary buffers whose segments it must hold."""

    host: str
    """Name of the host buffer (a ``max_seqlen``-like provider)."""
    boundaries: tuple[str, ...]
    """Names of the buffers of the paired boundary provider."""


def bounds_of(spec: Spec) -> list[Bound]:
    """The spec's host bounds that have boundary buffers beside them, in buffer order."""
    found = []
    for buffer in spec.buffers:
        paired = BOUNDED.get(buffer.provider)
        names = tuple(b.name for b in spec.buffers if paired and b.provider == paired)
        if buffer.is_host and names:
            found.append(Bound(buffer.name, names))
    return found


@dataclass(frozen=True)
class Overrun:
    """A segment longer than the host bound that the kernel would read it with."""

    bound: Bound
    boundaries: str
    """The boundary buffer holding the segment."""
    held: int
    """The host value the capture holds."""
    needed: int
    """The segment's length (rows, as the boundaries count them)."""
    budget: int
    where: str
    """When it was found: ``at capture (...)`` or ``at replay (...)``."""
    padding: bool = False
    """The segment is one of the padding segments vitcg writes after the items' rows."""

    def message(self, merge: int) -> str:
        """What is wrong, where, and the likely fix (``merge``: the spec's spatial_merge_size)."""
        kind = "a padding segment vitcg writes" if self.padding else "a segment"
        text = (f"buffer {self.bound.host!r} holds {self.held} for budget {self.budget}, but {self.boundaries!r} "
                f"{self.where} has {kind} of {self.needed} rows: the CUDA varlen kernel reads at most "
                f"{self.bound.host} rows per segment, so the rest would be cut (the CPU path never reads it)")
        return text + "; " + self.hint(merge)

    def hint(self, merge: int) -> str:
        if self.padding:
            return (f"give {self.boundaries!r} more slots (its shape) so that padding spreads over more segments, or "
                    f"raise {self.bound.host!r}'s value")
        if merge > 1 and self.held * merge ** 2 >= self.needed:
            return (f"the value looks counted in merged tokens, and the boundaries count rows before the merge: "
                    f"multiply it by spatial_merge_size ** 2 ({self.held} * {merge ** 2} = {self.held * merge ** 2})")
        return (f"make {self.bound.host!r}'s value the longest segment any pack of the budget can hold, in rows "
                "as the boundaries count them (budget * spatial_merge_size ** 2 for a frame of a packed tower)")


def longest(boundaries: torch.Tensor) -> tuple[int, int]:
    """``(length, start)`` of the longest segment of ``[0, ..., R]`` boundaries (``(0, 0)`` without one)."""
    bounds = [int(b) for b in boundaries.reshape(-1).tolist()]
    if len(bounds) < 2:
        return 0, 0
    length, start = max((b - a, a) for a, b in zip(bounds, bounds[1:]))
    return length, start


def audit(bounds: Iterable[Bound], values: Mapping[str, Any], held: Mapping[str, Any], budget: int, where: str,
          real_rows: Mapping[str, int] | None = None) -> list[Overrun]:
    """The overruns of ``values``' boundaries against the host values in ``held``. ``real_rows``: per boundary
    buffer, where the items' rows end (a longer segment starting there or later is padding); None: no padding."""
    found = []
    for bound in bounds:
        value = held.get(bound.host)
        if not isinstance(value, int):
            continue
        for name in bound.boundaries:
            boundaries = values.get(name)
            if not isinstance(boundaries, torch.Tensor):
                continue
            length, start = longest(boundaries)
            if length > value:
                end = (real_rows or {}).get(name)
                found.append(Overrun(bound, name, value, length, budget, where,
                                     padding=end is not None and start >= end))
    return found


def probe_rows(budget: int, frames: int) -> list[tuple[int, int, int]]:
    """``(frames, a, b)`` items of ``a x b`` merged tokens whose segments are the longest a pack of ``budget``
    tokens can hold: a strip (one frame of every token), a square (full windows), a video of ``frames`` frames
    (a clip); the caller keeps those whose output tokens fit the budget."""
    side = max(1, math.isqrt(budget))
    rows = [(0, 1, budget), (0, side, budget // side)]
    if frames > 1:
        rows.append((frames, 1, max(1, budget // frames)))
    return rows


class Watch:
    """Collects the overruns of every replay of a manager's graphs: wraps ``graphs.run``, which returns the
    capture values a replay ran on, and audits them after the run."""

    def __init__(self, spec: Spec, graphs: Any):
        self.bounds = bounds_of(spec)
        self.overruns: list[Overrun] = []
        self._graphs = graphs
        if self.bounds:
            run = graphs.run
            graphs.run = lambda key, values: self._audited(run, key, values)

    def _audited(self, run: Callable, key: Any, values: Mapping[str, Any]) -> Any:
        output, held = run(key, values)
        budget = key[0] if isinstance(key, tuple) else key
        ends = {name: int(v.reshape(-1)[-1]) for name, v in values.items()
                if isinstance(v, torch.Tensor) and v.numel() and any(name in b.boundaries for b in self.bounds)}
        self.overruns += audit(self.bounds, held, held, budget, "at replay", ends)
        return output, held


def capture_overruns(spec: Spec, adapter: Any, builder: Any, manager: Any) -> list[Overrun]:
    """The overruns of every captured budget: its capture fill, and the one-item packs of :func:`probe_rows`
    built by ``builder`` (:class:`~vitcg.tools.workloads.InputBuilder`) through the adapter's own providers."""
    bounds = bounds_of(spec)
    if not bounds:
        return []
    found = []
    for key, entry in manager.graphs.entries.items():
        held = entry.inputs.values
        found += audit(bounds, held, held, entry.budget, "at capture (the capture fill)", {})
        modalities = key[1] if isinstance(key, tuple) else tuple(m.name for m in spec.modalities)
        for name in modalities:
            found += _probe(spec, adapter, builder, manager, entry.budget, name, bounds, held)
    return sorted(found, key=lambda overrun: overrun.budget)  # the smallest budget that overruns first


def _probe(spec: Spec, adapter: Any, builder: Any, manager: Any, budget: int, modality: str,
           bounds: list[Bound], held: Mapping[str, Any]) -> list[Overrun]:
    from ..workloads import on_device

    found: list[Overrun] = []
    if modality not in spec.modality_names or not hasattr(adapter, "prepare_encoder_cudagraph_replay_buffers"):
        return found
    video = spec.modality("video")
    frames = min(2, video.max_frames_per_video) if modality == "video" and video else 0
    for t, a, b in probe_rows(budget, frames):
        if (t > 0) != (modality == "video"):
            continue
        row = builder.video(t, a, b) if t else builder.image(a, b)
        if adapter.item_spec(spec.modality(modality), row).output_tokens > budget:
            continue
        inputs = on_device(adapter, builder.inputs(modality, [row]))
        try:
            values = adapter.prepare_encoder_cudagraph_replay_buffers(inputs, manager.plan.max_items,
                                                                      manager.plan.max_frames).values
        except InputError:  # a pack these buffers refuse (too many frames) never replays: nothing to bound
            continue
        shape = f"{'a video of ' + str(t) + ' frames of ' if t else 'an image of '}{a}x{b} merged tokens"
        found += audit(bounds, values, held, budget, f"at capture (a one-item pack: {shape})")
    return found
