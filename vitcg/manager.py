"""The budget graph manager: budgets, capture (CUDA) or static runs (CPU), packing, replay, fallback, stats.

Budgets follow vLLM's ``EncoderCudaGraphManager`` and the invariants of vLLM PR #38040 (checked in
:func:`plan_budgets`). Items are sorted by output tokens, packed greedily under the largest budget, the
item cap and the frame cap; each pack replays the smallest budget that fits; an item larger than every
budget (or with more frames than a batch allows) runs eagerly. Results come back in the caller's order
(the adapter's canonical item order), each cloned before the next replay can overwrite it.

Without CUDA the same buffers and padding are used and the fixed-shape forward runs directly: the
static-shape path that CPU tests compare against eager.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import metadata
from .errors import BudgetError, InputError
from .protocol import EncoderCudaGraphCaptureInputs, EncoderItemSpec, SupportsEncoderCudaGraph


@dataclass(frozen=True)
class BudgetPlan:
    """The token budgets and batch limits one manager captures."""

    budgets: tuple[int, ...]
    """Ascending token budgets (output tokens); one graph each."""
    max_items: int
    """Most items in one pack (``max_batch_size`` of the protocol)."""
    max_frames: int
    """Most video frames in one pack (0 when video is disabled)."""
    min_budget: int
    max_budget: int


def power_of_two_budgets(start: int, max_budget: int) -> list[int]:
    """Powers of two from the first one >= ``start`` up to ``max_budget``, which is always included."""
    budgets, value = [], 1 << max(start - 1, 0).bit_length()
    while value < max_budget:
        budgets.append(value)
        value *= 2
    budgets.append(max_budget)
    return budgets


def plan_budgets(
    min_budget: int,
    max_budget: int,
    token_budgets: Sequence[int] | None = None,
    max_items: int = 0,
    max_frames_per_batch: int | None = None,
    max_frames_per_video: int = 1,
    video: bool = True,
) -> BudgetPlan:
    """Resolve budgets and limits from the engine options, enforcing vLLM's invariants.

    - budgets and items given: ``items <= min(budgets)``;
    - only items given: budgets are generated from ``max(min_budget, items)``;
    - only budgets given, or neither: ``items = min(max_budget // min_budget, min(budgets))``;
    - ``0 < min_budget <= max_budget``; every budget > 0 and <= max_budget;
    - ``max_frames_per_batch``: None means items x max_frames_per_video, and 0 when video is disabled.

    Raises BudgetError naming the values and a remedy.
    """
    if min_budget <= 0 or max_budget <= 0:
        raise BudgetError(f"token budget range must be positive, got min={min_budget}, max={max_budget}; "
                          "raise max_num_batched_tokens / max_model_len or fix the spec's budget formulas")
    if min_budget > max_budget:
        raise BudgetError(f"min token budget {min_budget} is larger than max token budget {max_budget} "
                          "(min(max_num_batched_tokens, max_model_len)); raise those limits to at least "
                          f"{min_budget}")
    if max_items < 0:
        raise BudgetError(f"encoder_cudagraph_max_vision_items_per_batch must be >= 0 (0 = auto), got {max_items}")
    if token_budgets is not None:
        token_budgets = list(token_budgets)
        if not token_budgets:
            raise BudgetError("encoder_cudagraph_token_budgets is empty; give at least one budget or omit it")
        bad = [b for b in token_budgets if not isinstance(b, int) or isinstance(b, bool) or b <= 0]
        if bad:
            raise BudgetError(f"encoder_cudagraph_token_budgets must be positive integers, got {bad}")
        too_big = [b for b in token_budgets if b > max_budget]
        if too_big:
            raise BudgetError(f"token budgets {too_big} exceed the max token budget {max_budget} "
                              "(min(max_num_batched_tokens, max_model_len)); drop them or raise those limits")
        budgets = sorted(set(token_budgets))
        if max_items and max_items > budgets[0]:
            raise BudgetError(
                f"encoder_cudagraph_max_vision_items_per_batch={max_items} exceeds the smallest token budget "
                f"{budgets[0]}: every item needs at least one token. Set max items <= {budgets[0]} or drop "
                f"budgets smaller than {max_items}")
    else:
        budgets = power_of_two_budgets(max(min_budget, max_items), max_budget)
        if max_items > max_budget:
            raise BudgetError(f"encoder_cudagraph_max_vision_items_per_batch={max_items} exceeds the max token "
                              f"budget {max_budget}; lower it or raise max_num_batched_tokens")
    if not max_items:
        max_items = max(1, min(max_budget // min_budget, budgets[0]))
    if max_frames_per_batch is None:
        max_frames_per_batch = max_items * max_frames_per_video if video else 0
    elif max_frames_per_batch < 0:
        raise BudgetError(f"encoder_cudagraph_max_frames_per_batch must be >= 0, got {max_frames_per_batch}")
    return BudgetPlan(tuple(budgets), max_items, max_frames_per_batch, min_budget, max_budget)


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

    @property
    def padding_waste(self) -> float:
        """Fraction of replayed budget tokens that were padding."""
        total = self.used_tokens + self.padded_tokens
        return self.padded_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"items": self.items, "hits": self.hits, "misses": self.misses, "replays": self.replays,
                "eager_calls": self.eager_calls, "used_tokens": self.used_tokens,
                "padded_tokens": self.padded_tokens, "padding_waste": round(self.padding_waste, 4),
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
        self.progress = progress
        self.graphs: dict[int, _BudgetGraph] = {}
        self.stats = ManagerStats()
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
        return CaptureReport(time.perf_counter() - start, per_budget, pool_bytes)

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

    def plan_packs(self, items: Sequence[EncoderItemSpec]) -> tuple[list[Pack], list[int]]:
        """Greedy smallest-first packing: ``(packs, eager item indices)``."""
        largest = self.plan.budgets[-1]
        eager = [i for i, item in enumerate(items)
                 if item.output_tokens > largest or item.frames > self.plan.max_frames]
        skip = set(eager)
        rest = sorted((i for i in range(len(items)) if i not in skip), key=lambda i: (items[i].output_tokens, i))
        packs: list[Pack] = []
        current: list[int] = []
        tokens = frames = 0

        def close() -> None:
            if current:
                budget = next(b for b in self.plan.budgets if b >= tokens)
                packs.append(Pack(budget, tuple(sorted(current)), tokens))

        for i in rest:
            item = items[i]
            fits = (tokens + item.output_tokens <= largest and len(current) < self.plan.max_items
                    and frames + item.frames <= self.plan.max_frames)
            if not fits:
                close()
                current, tokens, frames = [], 0, 0
            current.append(i)
            tokens += item.output_tokens
            frames += item.frames
        close()
        return packs, eager

    def execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """Encode every item of ``mm_kwargs``; one ``(output_tokens, hidden)`` tensor per item, caller's order."""
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
            output = self._replay(pack, mm_kwargs)
            self._split(output, pack.indices, items, results, exact=False, source=f"budget {pack.budget} graph")
            self.stats.replays += 1
            self.stats.replays_per_budget[pack.budget] += 1
            self.stats.hits += len(pack.indices)
            self.stats.used_tokens += pack.tokens
            self.stats.padded_tokens += pack.budget - pack.tokens
        if eager:
            output = self.model.encoder_eager_forward(self.model.select_encoder_cudagraph_items(mm_kwargs, eager))
            self._split(output, eager, items, results, exact=True, source="eager forward")
            self.stats.eager_calls += 1
            self.stats.misses += len(eager)
        self.stats.items += len(items)
        return results

    def _replay(self, pack: Pack, mm_kwargs: Mapping[str, Any]) -> torch.Tensor:
        entry = self.graphs[pack.budget]
        selected = self.model.select_encoder_cudagraph_items(mm_kwargs, list(pack.indices))
        fresh = self.model.prepare_encoder_cudagraph_replay_buffers(selected, self.plan.max_items, self.plan.max_frames)
        for key, value in fresh.values.items():
            if value is None:
                continue
            dest = entry.inputs.values[key]
            if dest.data_ptr() != entry.pointers[key]:
                raise RuntimeError(f"buffer identity broken: capture buffer {key!r} of budget {pack.budget} "
                                   "was replaced after capture")
            metadata.fill(self.config.padding_logics[key], dest, value, entry.capacity, key)
        if entry.graph is not None:
            entry.graph.replay()
            return entry.output
        return self.model.encoder_cudagraph_forward(entry.inputs.values)

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
