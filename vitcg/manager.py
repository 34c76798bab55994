"""The budget graph manager: budgets, capture (CUDA) or static runs (CPU), packing, replay, fallback, stats.

Budgets follow vLLM's ``EncoderCudaGraphManager`` and the invariants of vLLM PR #38040 (checked in
:func:`plan_budgets`). Items are sorted by output tokens, packed greedily under the largest budget, the
item cap, the frame cap and the segment capacity; each pack replays the smallest budget that fits; an
item larger than every budget (or with more frames than a batch allows) runs eagerly. That is vLLM's
``packing="greedy"``; the default ``packing="tight"`` chooses the packs whose replays cost least (replay
times measured at capture on CUDA, padded tokens on the static path). Results come back in the caller's
order (the adapter's canonical item order), each cloned before the next replay can overwrite it.

Without CUDA the same buffers and padding are used and the fixed-shape forward runs directly: the
static-shape path that CPU tests compare against eager. There, host syncs and data-dependent shapes
raise (:mod:`vitcg.syncs`), as a capture would.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import metadata
from .budgets import plan_budgets
from .errors import BudgetError, InputError
from .syncs import no_host_syncs
from .timing import timed
from .protocol import EncoderCudaGraphCaptureInputs, EncoderItemSpec, SupportsEncoderCudaGraph


PACKING = ("tight", "greedy")
"""Packing policies. ``tight`` (default): cost-aware, largest item first, chooses the packs whose replays
cost least (1.05x the exact-shape graph on the mixed workload of benchmarks/RESULTS.md, against 1.69x for
greedy). ``greedy``: vLLM's smallest-first policy, for drop-in parity."""

COST_RUNS = 3
"""Timed replays per budget graph when replay costs are measured at capture (after one untimed replay)."""


@dataclass
class ManagerStats:
    """Counters since the manager was built. ``hits + misses == items`` always."""

    items: int = 0
    hits: int = 0
    """Items served by a budget graph."""
    misses: int = 0
    """Items that ran eagerly (larger than every budget, or too many frames)."""
    replays: int = 0
    eager_calls: int = 0
    used_tokens: int = 0
    """Real output tokens produced by replays."""
    padded_tokens: int = 0
    """Budget tokens replays computed for padding (waste)."""
    replays_per_budget: Counter = field(default_factory=Counter)
    host_seconds: float = 0.0
    """Host time spent in ``execute`` outside graph launches and forwards: what vitcg adds per call."""

    @property
    def padding_waste(self) -> float:
        """Fraction of replayed budget tokens that were padding."""
        total = self.used_tokens + self.padded_tokens
        return self.padded_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"items": self.items, "hits": self.hits, "misses": self.misses, "replays": self.replays,
                "eager_calls": self.eager_calls, "used_tokens": self.used_tokens,
                "padded_tokens": self.padded_tokens, "padding_waste": round(self.padding_waste, 4),
                "host_seconds": round(self.host_seconds, 6),
                "replays_per_budget": dict(sorted(self.replays_per_budget.items()))}


@dataclass
class _BudgetGraph:
    budget: int
    inputs: EncoderCudaGraphCaptureInputs
    pointers: dict[str, int]
    """Storage address of each tensor buffer at capture (buffer identity)."""
    capacity: int
    """Rows the pixel buffer holds: where the trailing padding segment ends (0 when no buffer needs it)."""
    graph: Any = None
    """``torch.cuda.CUDAGraph``, or None on the static (CPU) path."""
    output: torch.Tensor | None = None


@dataclass(frozen=True)
class CaptureReport:
    seconds: float
    per_budget: dict[int, float]
    pool_bytes: int
    """GPU memory held after capture beyond what was held before (graph pool plus buffers)."""
    replay_ms: dict[int, float] = field(default_factory=dict)
    """Measured GPU time of one replay per budget (CUDA graphs only; empty otherwise)."""


@dataclass(frozen=True)
class Pack:
    budget: int
    indices: tuple[int, ...]
    tokens: int


class EncoderCudaGraphManager:
    """Captures one graph per token budget and serves batches of items through them."""

    def __init__(
        self,
        model: SupportsEncoderCudaGraph,
        *,
        token_budgets: Sequence[int] | None = None,
        max_items_per_batch: int = 0,
        max_frames_per_batch: int | None = None,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 32768,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        use_cuda_graphs: bool | None = None,
        progress: bool = False,
        packing: str = "tight",
    ):
        self.model = model
        self.config = model.get_encoder_cudagraph_config()
        min_budget, max_budget = model.get_encoder_cudagraph_budget_range(
            {"max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len})
        self.plan = plan_budgets(min_budget, max_budget, token_budgets, max_items_per_batch, max_frames_per_batch,
                                 self.config.max_frames_per_video, video="video" in self.config.modalities)
        self.device = torch.device(device) if device is not None else getattr(model, "device", torch.device("cpu"))
        self.dtype = dtype or getattr(model, "dtype", torch.float32)
        self.use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        if self.use_cuda_graphs and self.device.type != "cuda":
            raise BudgetError("CUDA graphs need a CUDA device; use_cuda_graphs=False runs the static path")
        if packing not in PACKING:
            raise BudgetError(f"packing must be one of {', '.join(PACKING)}, got {packing!r}")
        self.packing = packing
        self.progress = progress
        self.graphs: dict[int, _BudgetGraph] = {}
        self.replay_costs: dict[int, float] = {}
        """Cost of one replay per budget, which ``tight`` packing minimizes: on CUDA the replay time measured
        at capture (ms); empty means the token model, budget plus the smallest budget per replay. A caller
        may set its own (any unit, every budget)."""
        self.stats = ManagerStats()
        self._forward_seconds = 0.0
        self._pool = None

    @property
    def budgets(self) -> tuple[int, ...]:
        return self.plan.budgets

    def capture(self) -> CaptureReport:
        """Allocate every budget's buffers and capture its graph, largest budget first, into one shared pool."""
        if self.graphs:
            return CaptureReport(0.0, {}, 0)
        cuda = self.use_cuda_graphs
        if cuda:
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            self._pool = torch.cuda.graph_pool_handle()
        per_budget: dict[int, float] = {}
        start = time.perf_counter()
        with _progress(self.progress, len(self.budgets), "capturing" if cuda else "allocating") as advance:
            for budget in sorted(self.budgets, reverse=True):
                tic = time.perf_counter()
                self.graphs[budget] = self._capture_one(budget)
                per_budget[budget] = time.perf_counter() - tic
                advance(budget)
        pool_bytes = 0
        if cuda:
            torch.cuda.synchronize(self.device)
            pool_bytes = torch.cuda.memory_allocated(self.device) - before
            # a replay costs milliseconds of launches whatever its size: measure, so that packing knows
            self.replay_costs = {budget: timed(entry.graph.replay, COST_RUNS, 1, self.device)
                                 for budget, entry in self.graphs.items()}
        return CaptureReport(time.perf_counter() - start, per_budget, pool_bytes, dict(self.replay_costs))

    def replay_cost(self, budget: int) -> float:
        """What one replay at ``budget`` costs for ``tight`` packing (:attr:`replay_costs`)."""
        if self.replay_costs:
            return self.replay_costs[budget]
        return budget + self.plan.budgets[0]  # tokens computed, plus at least the smallest graph per replay

    def _capture_one(self, budget: int) -> _BudgetGraph:
        inputs = self.model.prepare_encoder_cudagraph_capture_inputs(
            budget, self.plan.max_items, self.plan.max_frames, self.device, self.dtype)
        tensors = {k: v for k, v in inputs.values.items() if isinstance(v, torch.Tensor)}
        # A trailing-segment buffer captured empty holds the padding segment's end (the row capacity) last.
        ends = {int(tensors[k][-1]) for k, rule in self.config.padding_logics.items()
                if rule == "trailing_segment" and k in tensors}
        if len(ends) > 1:
            raise BudgetError(f"budget {budget}: trailing-segment buffers end at different rows {sorted(ends)}")
        entry = _BudgetGraph(budget, inputs, {k: v.data_ptr() for k, v in tensors.items()}, ends.pop() if ends else 0)
        if not self.use_cuda_graphs:
            return entry
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.model.encoder_cudagraph_forward(inputs.values)  # warm-up: lazy init, autotuning
        torch.cuda.current_stream(self.device).wait_stream(side)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self._pool):
            entry.output = self.model.encoder_cudagraph_forward(inputs.values)
        return entry

    def segment_capacity(self, budget: int) -> int | None:
        """Segments one pack may hold at ``budget`` (slots of the segment buffer minus the leading zero and
        one padding segment), or None when the model has no segment buffer."""
        key = self.config.segment_key
        if key is None:
            return None
        if not self.graphs:
            self.capture()
        return self.graphs[budget].inputs.values[key].shape[0] - 2

    def _fit(self, tokens: int, segments: int) -> int | None:
        """The smallest budget holding ``tokens`` output tokens and ``segments`` segments, or None."""
        for budget in self.plan.budgets:
            if budget >= tokens:
                cap = self.segment_capacity(budget)
                if cap is None or segments <= cap:
                    return budget
        return None

    def plan_packs(self, items: Sequence[EncoderItemSpec]) -> tuple[list[Pack], list[int]]:
        """Split items into packs, one replay each: ``(packs, eager item indices)``.

        An item runs eagerly when no budget holds it (too many tokens or segments) or it has more frames
        than a batch allows. ``greedy`` (vLLM's policy) fills packs smallest item first up to the largest
        budget; ``tight`` packs largest first into the budgets whose replays cost least
        (:meth:`replay_cost`: measured on CUDA, padded tokens otherwise).
        """
        eager = [i for i, item in enumerate(items)
                 if item.frames > self.plan.max_frames or self._fit(item.output_tokens, item.segments) is None]
        skip = set(eager)
        rest = [i for i in range(len(items)) if i not in skip]
        if self.packing == "tight":
            rest.sort(key=lambda i: (-items[i].output_tokens, i))
            return self._tight(items, rest), eager
        rest.sort(key=lambda i: (items[i].output_tokens, i))
        packs: list[Pack] = []
        current: list[int] = []
        for i in rest:
            if current and not self._feasible(items, [*current, i], self.plan.budgets[-1]):
                packs.append(self._pack(items, current))
                current = []
            current.append(i)
        if current:
            packs.append(self._pack(items, current))
        return packs, eager

    def _feasible(self, items, chosen: list[int], limit: int) -> bool:
        """Whether ``chosen`` forms one pack replayable at a budget no larger than ``limit``."""
        if len(chosen) > self.plan.max_items or sum(items[j].frames for j in chosen) > self.plan.max_frames:
            return False
        tokens = sum(items[j].output_tokens for j in chosen)
        fit = self._fit(tokens, sum(items[j].segments for j in chosen)) if tokens <= limit else None
        return fit is not None and fit <= limit

    def _pack(self, items, chosen: list[int]) -> Pack:
        tokens = sum(items[j].output_tokens for j in chosen)
        return Pack(self._fit(tokens, sum(items[j].segments for j in chosen)), tuple(sorted(chosen)), tokens)

    def _tight(self, items, order: list[int]) -> list[Pack]:
        """The cheaper of: everything in one pack, or the largest budget not above the total filled
        largest item first, and the rest packed the same way. ``order``: largest item first."""
        if not order:
            return []
        candidates = []
        if self._feasible(items, order, self.plan.budgets[-1]):
            candidates.append([self._pack(items, order)])
        total = sum(items[i].output_tokens for i in order)
        below = [b for b in self.plan.budgets if b <= total]
        if below and (not candidates or below[-1] < candidates[0][0].budget):
            chosen: list[int] = []
            for i in order:
                if self._feasible(items, [*chosen, i], below[-1]):
                    chosen.append(i)
            if chosen:
                taken = set(chosen)
                candidates.append([self._pack(items, chosen), *self._tight(items, [i for i in order if i not in taken])])
        if not candidates:  # nothing fits under the total: the largest item alone, then the rest
            candidates.append([self._pack(items, order[:1]), *self._tight(items, order[1:])])
        return min(candidates, key=lambda packs: sum(self.replay_cost(p.budget) for p in packs))

    def execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """Encode every item of ``mm_kwargs``; one ``(output_tokens, hidden)`` tensor per item, caller's order."""
        start = time.perf_counter()
        self._forward_seconds = 0.0
        results = self._execute(mm_kwargs)
        self.stats.host_seconds += time.perf_counter() - start - self._forward_seconds
        return results

    def _execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        if all(value is None for value in mm_kwargs.values()):
            return []
        self.model.get_input_modality(mm_kwargs)  # clear error for unknown keys
        items = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        if not items:
            return []
        if not self.graphs:
            self.capture()
        packs, eager = self.plan_packs(items)
        results: list[torch.Tensor | None] = [None] * len(items)
        for pack in packs:
            if self.config.scoped:
                selected = self.model.select_encoder_cudagraph_items(mm_kwargs, list(pack.indices))
                entry = self.graphs[pack.budget]
                output = self.model.encoder_scoped_forward(selected, lambda values, e=entry: self._run(e, values))
                self._split(output, pack.indices, items, results, exact=True,
                            source=f"forward around the budget {pack.budget} graph")
            else:
                output = self._replay(pack, mm_kwargs)
                self._split(output, pack.indices, items, results, exact=False, source=f"budget {pack.budget} graph")
            self.stats.replays += 1
            self.stats.replays_per_budget[pack.budget] += 1
            self.stats.hits += len(pack.indices)
            self.stats.used_tokens += pack.tokens
            self.stats.padded_tokens += pack.budget - pack.tokens
        if eager:
            selected = self.model.select_encoder_cudagraph_items(mm_kwargs, eager)
            tic = time.perf_counter()
            output = self.model.encoder_eager_forward(selected)
            self._forward_seconds += time.perf_counter() - tic
            self._split(output, eager, items, results, exact=True, source="eager forward")
            self.stats.eager_calls += 1
            self.stats.misses += len(eager)
        self.stats.items += len(items)
        return results

    def _replay(self, pack: Pack, mm_kwargs: Mapping[str, Any]) -> torch.Tensor:
        entry = self.graphs[pack.budget]
        selected = self.model.select_encoder_cudagraph_items(mm_kwargs, list(pack.indices))
        fresh = self.model.prepare_encoder_cudagraph_replay_buffers(selected, self.plan.max_items, self.plan.max_frames)
        return self._run(entry, fresh.values)[0]

    def _run(self, entry: _BudgetGraph, values: Mapping[str, torch.Tensor | None]) -> tuple[Any, Mapping]:
        """Refill ``entry``'s buffers in place from ``values`` (None: leave as captured; EMPTY: all padding),
        then replay it (or run the static forward). Returns the output and the capture values it ran on."""
        for key, value in values.items():
            dest = entry.inputs.values[key]
            if isinstance(dest, torch.Tensor) and dest.data_ptr() != entry.pointers[key]:
                raise RuntimeError(f"buffer identity broken: capture buffer {key!r} of budget {entry.budget} "
                                   "was replaced after capture")
            if value is not None:
                metadata.fill(self.config.padding_logics[key], dest, value, entry.capacity, key)
        tic = time.perf_counter()
        if entry.graph is not None:
            entry.graph.replay()
            output = entry.output
        else:
            with no_host_syncs():  # what a capture would reject must fail here too
                output = self.model.encoder_cudagraph_forward(entry.inputs.values)
        self._forward_seconds += time.perf_counter() - tic
        return output, entry.inputs.values

    def _split(self, output: torch.Tensor, indices: Sequence[int], items: Sequence[EncoderItemSpec],
               results: list, *, exact: bool, source: str) -> None:
        wanted = sum(items[i].output_tokens for i in indices)
        rows = output.shape[0]
        if rows < wanted or (exact and rows != wanted):
            raise InputError(
                f"the {source} returned {rows} rows for {len(indices)} items, but items.output_tokens sums to "
                f"{wanted}: check the spec's items.output_tokens formula and its merge geometry")
        offset = 0
        for i in indices:
            n = items[i].output_tokens
            results[i] = output[offset:offset + n].clone()
            offset += n


class _progress:
    """A rich progress bar over the budgets, or nothing."""

    def __init__(self, enabled: bool, total: int, verb: str):
        self.enabled, self.total, self.verb = enabled, total, verb

    def __enter__(self):
        if not self.enabled:
            return lambda budget: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), transient=True)
        self._bar.start()
        task = self._bar.add_task(f"{self.verb} {self.total} budgets", total=self.total)

        def advance(budget: int) -> None:
            self._bar.update(task, advance=1, description=f"{self.verb} budget {budget}")
        return advance

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.stop()
