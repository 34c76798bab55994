"""The budget graph manager: budgets, capture (CUDA) or static runs (CPU), packing, replay, fallback, stats.

It talks to a model only through :mod:`vitcg.runtime.protocol` (vLLM's protocol) and, where the model offers it,
:mod:`vitcg.runtime.extension`; it imports nothing of the spec language or the adapter, so it drives any
protocol implementation, hand-written ones included. Buffers are refilled through the model's padding
logics (callables), or zeroed and copied into when a key has none, exactly as vLLM's manager does.

Budgets follow vLLM's ``EncoderCudaGraphManager``: the configuration paths and invariants of vLLM PR
#38040 (:func:`plan_budgets`) and its doubling ladder (``ladder="pow2"`` for powers of two). Packing
``tight`` (default) chooses the packs whose replays cost least (replay times measured at capture on CUDA,
padded tokens on the static path); ``greedy`` is vLLM's: items sorted by output tokens, packed under the
largest budget and the item cap, a pack closed early when an item alone outweighs it. With the
extension, packs also respect the frame cap, and a video with more frames than a batch allows runs
eagerly. Each pack replays the smallest budget that fits; an item larger than every budget runs eagerly.
Results come back in the caller's item order, each cloned before the next replay can overwrite it.

Without CUDA the same buffers and padding are used and the fixed-shape forward runs directly: the
static-shape path that CPU tests compare against eager. There, host syncs and data-dependent shapes
raise (:mod:`vitcg.runtime.syncs`), as a capture would.

A poisoned item never changes another item's output: packed attention multiplies the zero weights between
segments by the other segments' values, and 0 * NaN is NaN, so one item with NaN or inf inputs would turn
its whole pack into NaN. With ``isolate_nonfinite`` (default) the floating inputs of a call that replays any
pack are checked (one device-to-host sync for all of them, outside the forward; a call served wholly by the
eager forward is what eager gives anyway and is not checked); items found non-finite run eagerly, each alone,
and get exactly what eager gives them.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import BudgetError, SpecRuntimeError
from .budgets import interpolate, plan_budgets
from .engine import EngineConfig, engine_config
from .extension import MIXED, SupportsVitcgExtension
from .graphs import capture_graph
from .padding import pad_zeros
from .protocol import (
    DEFAULT_PATH,
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    EncoderCudaGraphCaptureInputs,
    EncoderItemSpec,
    SupportsEncoderCudaGraph,
    postprocess_by_rows,
)
from .syncs import no_host_syncs
from .timing import timed

PACKING = ("tight", "greedy")
"""Packing policies. ``tight`` (default, a deliberate difference from vLLM): cost-aware, largest item
first, chooses the packs whose replays cost least (H100, Qwen2-VL-7B tower, mixed batch of 8 images:
129 ms against greedy's 206 ms and eager's 119 ms; benchmarks/RESULTS.md). ``greedy``: vLLM's
smallest-first policy with its early close, for drop-in parity: both managers then form the same packs."""

LEAN_ITEMS = 16
"""Items per pack when the engine leaves the count to be inferred and ``lean`` is on (vitcg's default).
vLLM infers ``max_budget // min_budget`` (128 for Qwen2-VL at 8192 tokens) and frames per pack as items
times frames per video (4096): capture buffers must then hold that many attention segments, and every
slot of ``cu_seqlens`` widens the flash kernel's grid at every layer. Measured on the H100 (Qwen2-VL-7B
tower, benchmarks/RESULTS.md), vLLM's caps made 8 images 1.4x and a mixed batch 2.3-2.8x slower than
these. Lean caps: this many items, and the frames of one longest video."""

COST_RUNS = 3
"""Timed replays per budget graph when replay costs are measured at capture (after one untimed replay)."""
EAGER_MARGIN = 0.9
"""Before a budget's eager call has been timed, a pack runs eagerly only when that is estimated at least 10%
cheaper than its replay: the estimate then comes from the fixed-shape forward, which skips the eager call's own
metadata work. Once timed (:attr:`EncoderCudaGraphManager.eager_samples`), whichever is cheaper runs."""
OBSERVED_REPLAYS = 2
"""Real replays, and explored eager calls, timed per budget before their cost is trusted (the fastest counts:
one cold call is no price)."""
EXPLORE_MS = 1.0
"""A replay costing more than this (ms) may lose to the model's own eager forward (a compute-bound pack, or a
batched eager call with no padding): the first calls of each size class (:func:`size_class`) whose largest
budget is such a one run wholly eagerly, timed, to calibrate :meth:`eager_cost` (the capture-time estimate
times the graph-less static forward, whose padding and launches an eager call does not have). Exploring never
costs more than eager: it is the eager call."""


@dataclass
class ManagerStats:
    """Counters since the manager was built. ``hits + misses == items`` always."""

    items: int = 0
    hits: int = 0
    """Items served by a budget graph."""
    misses: int = 0
    """Items that ran eagerly (larger than every budget, too many frames, or cheaper eagerly)."""
    routed_eager: int = 0
    """Of the misses, items that fit a budget but ran eagerly because that was estimated cheaper."""
    nonfinite_items: int = 0
    """Of the misses, items whose inputs held NaN or inf and so ran eagerly, each alone (``isolate_nonfinite``)."""
    graph_hits = property(lambda self: self.hits, doc="vLLM's name for :attr:`hits`.")
    graph_misses = property(lambda self: self.misses, doc="vLLM's name for :attr:`misses`.")
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
                "eager_calls": self.eager_calls, "nonfinite_items": self.nonfinite_items,
                "used_tokens": self.used_tokens,
                "padded_tokens": self.padded_tokens, "padding_waste": round(self.padding_waste, 4),
                "host_seconds": round(self.host_seconds, 6),
                "replays_per_budget": dict(sorted(self.replays_per_budget.items()))}


@dataclass
class _BudgetGraph:
    budget: int
    inputs: EncoderCudaGraphCaptureInputs
    pointers: dict[str, int]
    """Storage address of each tensor buffer at capture (buffer identity)."""
    axis_keys: tuple = ()
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
class PackPlan:
    """One planned replay: the budget it runs at, the items it holds (canonical indices), their tokens."""

    budget: int
    indices: tuple[int, ...]
    tokens: int


class EncoderCudaGraphManager:
    """Captures one graph per token budget and serves batches of items through them.

    Engine options come from ``vllm_config`` (a vLLM config, or :func:`vitcg.runtime.engine.engine_config`) or,
    when it is None, from the keyword arguments of the same names. ``device`` and ``dtype`` are the
    graphs' (as vLLM passes them); nothing is read from the model but the protocol. ``lean``: when items
    or frames per batch are left to be inferred, use :data:`LEAN_ITEMS` and one video's frames instead of
    vLLM's larger values (budgets are vLLM's either way). ``route_eager``: on CUDA, measure at capture
    what the forward costs without a graph and send packs that are cheaper eagerly to the eager call (so a
    compute-bound batch padded to a large budget is never slower than eager). ``isolate_nonfinite``: check the
    floating inputs for NaN and inf before replaying (one device-to-host sync per call that replays) and run the
    items that hold any eagerly, each alone, so that they cannot poison the other items of a pack."""

    def __init__(
        self,
        model: SupportsEncoderCudaGraph,
        *,
        vllm_config: EngineConfig | Any = None,
        token_budgets: Sequence[int] | None = None,
        max_items_per_batch: int = 0,
        max_frames_per_batch: int | None = None,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 32768,
        video: bool = True,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        use_cuda_graphs: bool | None = None,
        progress: bool = False,
        packing: str = "tight",
        ladder: str = "vllm",
        lean: bool = True,
        route_eager: bool = True,
        isolate_nonfinite: bool = True,
    ):
        self.model = model
        self.config = model.get_encoder_cudagraph_config()
        if set(self.config.paths) != {DEFAULT_PATH} or self.config.paths[DEFAULT_PATH].min_token_budget is not None:
            raise BudgetError(f"the model declares encoder paths {sorted(self.config.paths)}; vitcg's manager "
                              "serves one path, 'default', on the manager's own ladder")
        if vllm_config is None:
            vllm_config = engine_config(max_num_batched_tokens, max_model_len, token_budgets=token_budgets,
                                        max_items_per_batch=max_items_per_batch,
                                        max_frames_per_batch=max_frames_per_batch, video=video)
        self.vllm_config = vllm_config
        options = vllm_config.compilation_config
        video_limit = getattr(vllm_config, "video_limit_per_prompt", None)
        min_budget, max_budget = model.get_encoder_cudagraph_budget_range(vllm_config)
        self.plan = plan_budgets(min_budget, max_budget, options.encoder_cudagraph_token_budgets,
                                 options.encoder_cudagraph_max_vision_items_per_batch,
                                 options.encoder_cudagraph_max_frames_per_batch, self.config.max_frames_per_video,
                                 video="video" in self.config.modalities and video_limit != 0, ladder=ladder)
        if lean and not options.encoder_cudagraph_max_vision_items_per_batch:
            items = min(self.plan.max_items, LEAN_ITEMS)
            frames = self.plan.max_frames
            if options.encoder_cudagraph_max_frames_per_batch is None and frames:
                frames = min(frames, self.config.max_frames_per_video)
            self.plan = dataclasses.replace(self.plan, max_items=items, max_frames=frames)
        self.extension = model if isinstance(model, SupportsVitcgExtension) else None
        """The model's vitcg extension (frames per item, graph scope), or None for a protocol-only model."""
        self.scoped = bool(self.extension and self.extension.is_encoder_cudagraph_scoped())
        self.axes = tuple(tuple(axis) for axis in self.config.capture_axes)
        if any(not axis for axis in self.axes):
            raise BudgetError("capture_axes must each hold at least one key")
        self.device = torch.device(device)
        self.dtype = dtype
        self.use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        if self.use_cuda_graphs and self.device.type != "cuda":
            raise BudgetError("CUDA graphs need a CUDA device; use_cuda_graphs=False runs the static path")
        if packing not in PACKING:
            raise BudgetError(f"packing must be one of {', '.join(PACKING)}, got {packing!r}")
        self.packing = packing
        self.progress = progress
        self.graphs: dict[Any, _BudgetGraph] = {}
        """Captured graphs by budget, or by ``(budget, axis_keys)`` when the model has capture axes."""
        self.replay_costs: dict[int, float] = {}
        """Cost of one replay per budget, which ``tight`` packing minimizes: on CUDA the replay time measured
        at capture (ms); empty means the token model, budget plus the smallest budget per replay. A caller
        may set its own (any unit, every budget)."""
        self.route_eager = route_eager
        self.eager_costs: dict[int, float] = {}
        """Cost of the forward without a graph per budget (ms), measured at capture on CUDA when
        ``route_eager``: packs whose replay costs more than their tokens eagerly run eagerly. A caller may set
        its own (same unit as :attr:`replay_costs`)."""
        self.isolate_nonfinite = isolate_nonfinite
        self._observed_replays: dict[int, list[float]] = {}
        """Times (ms) of the first real replays per budget (see :meth:`_observe_replay`)."""
        self.eager_timings: dict[int, list[tuple[int, float]]] = {}
        """Real eager calls timed to calibrate :meth:`eager_cost`, by the size class of the call they replaced
        (:func:`size_class`): (output tokens, ms) each. Filled on CUDA when ``route_eager`` (see :data:`EXPLORE_MS`)."""
        self.stats = ManagerStats()
        self._forward_seconds = 0.0
        self._pool = None

    @property
    def budgets(self) -> tuple[int, ...]:
        return self.plan.budgets

    def _keys(self) -> list[Any]:
        """Graph keys, largest budget first: budgets, or (budget, axis keys) per combination."""
        if not self.axes:
            return sorted(self.budgets, reverse=True)
        return [(b, keys) for b in sorted(self.budgets, reverse=True) for keys in itertools.product(*self.axes)]

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
        keys = self._keys()
        with _progress(self.progress, len(keys), "capturing" if cuda else "allocating") as advance:
            for key in keys:
                budget, axis_keys = key if self.axes else (key, ())
                tic = time.perf_counter()
                self.graphs[key] = self._capture_one(budget, axis_keys)
                per_budget[budget] = per_budget.get(budget, 0.0) + time.perf_counter() - tic
                advance(budget)
        pool_bytes = 0
        if cuda:
            torch.cuda.synchronize(self.device)
            pool_bytes = torch.cuda.memory_allocated(self.device) - before
            # a replay costs milliseconds of launches whatever its size: measure, so that packing knows
            self.replay_costs = {entry.budget: timed(entry.graph.replay, COST_RUNS, 1, self.device)
                                 for entry in self.graphs.values()}
            if self.route_eager:
                self.eager_costs = self._measure_eager()
        return CaptureReport(time.perf_counter() - start, per_budget, pool_bytes, dict(self.replay_costs))

    def _measure_eager(self) -> dict[int, float]:
        """What the forward costs without a graph at each budget (ms): its kernels launched one by one, as
        an eager call of that many tokens launches them."""
        costs: dict[int, float] = {}
        for entry in self.graphs.values():
            def forward(values=entry.inputs.values):
                with torch.inference_mode():
                    self.model.encoder_cudagraph_forward({**values}, path=DEFAULT_PATH)
            cost = timed(forward, COST_RUNS, 1, self.device)
            costs[entry.budget] = min(cost, costs.get(entry.budget, cost))
        return costs

    @property
    def eager_samples(self) -> dict[int, tuple[int, float]]:
        """Per size class of :attr:`eager_timings`, its fastest timing per token: one cold call is no price."""
        return {size: min(seen, key=lambda sample: sample[1] / max(sample[0], 1))
                for size, seen in self.eager_timings.items() if seen}

    def eager_cost(self, tokens: int) -> float | None:
        """Estimated cost of one eager forward of ``tokens`` output tokens: :attr:`eager_costs` interpolated,
        scaled by what real eager calls took against that estimate (:attr:`eager_samples`, the sample nearest
        in tokens); None when the costs are unknown."""
        static = self._static_eager_cost(tokens)
        samples = self.eager_samples
        if static is None or not samples:
            return static
        sample_tokens, ms = min(samples.values(), key=lambda sample: abs(sample[0] - tokens))
        return static * ms / self._static_eager_cost(sample_tokens)

    def _static_eager_cost(self, tokens: int) -> float | None:
        if not self.eager_costs:
            return None
        return interpolate(sorted(self.eager_costs.items()), tokens, flat_below=True)

    def _route_eager(self, items: Sequence[EncoderItemSpec], packs: list[PackPlan], eager: list[int]
                     ) -> tuple[list[PackPlan], list[int]]:
        """Move packs to the eager call while that lowers the estimated cost: a compute-bound pack padded to
        a large budget costs more as a replay than its real tokens cost eagerly; then the whole call to it
        when one eager call of everything is estimated cheaper than the replays left plus the eager part."""
        if not (self.route_eager and self.eager_costs and self.replay_costs):
            return packs, eager
        eager_tokens = sum(items[i].output_tokens for i in eager)

        def eager_part(tokens: int) -> float:
            return self.eager_cost(tokens) if tokens else 0.0

        kept = []
        for pack in sorted(packs, key=lambda p: -p.budget):
            moved = eager_part(eager_tokens + pack.tokens) - eager_part(eager_tokens)
            margin = 1.0 if self._calibrated(pack.budget) else EAGER_MARGIN
            if moved < self.replay_cost(pack.budget) * margin:
                eager = [*eager, *pack.indices]
                eager_tokens += pack.tokens
            else:
                kept.append(pack)
        if kept:  # the whole call eagerly: several packs may each be cheaper replayed than alone eagerly, yet
            # cost more together than one eager call of everything (its fixed cost is paid once)
            together = eager_part(eager_tokens + sum(p.tokens for p in kept))
            split = sum(self.replay_cost(p.budget) for p in kept) + eager_part(eager_tokens)
            margin = 1.0 if all(self._calibrated(p.budget) for p in kept) else EAGER_MARGIN
            if together < split * margin:
                return [], [*eager, *(i for p in kept for i in p.indices)]
        return kept, eager

    def _calibrated(self, budget: int) -> bool:
        """Whether both sides of the choice at ``budget`` were measured on real calls (see :data:`EAGER_MARGIN`):
        its replays, and eager calls (which scale every eager estimate)."""
        return (sum(map(len, self.eager_timings.values())) >= OBSERVED_REPLAYS
                and len(self._observed_replays.get(budget, ())) >= OBSERVED_REPLAYS)

    def replay_cost(self, budget: int) -> float:
        """What one replay at ``budget`` costs for ``tight`` packing (:attr:`replay_costs`)."""
        if self.replay_costs:
            return self.replay_costs[budget]
        return budget + self.plan.budgets[0]  # tokens computed, plus at least the smallest graph per replay

    def _capture_one(self, budget: int, axis_keys: tuple) -> _BudgetGraph:
        inputs = self.model.prepare_encoder_cudagraph_capture_inputs(
            budget, self.plan.max_items, self.plan.max_frames, self.device, self.dtype, DEFAULT_PATH,
            axis_keys if self.axes else None)
        tensors = {k: v for k, v in inputs.values.items() if isinstance(v, torch.Tensor)}
        entry = _BudgetGraph(budget, inputs, {k: v.data_ptr() for k, v in tensors.items()}, axis_keys)
        if not self.use_cuda_graphs:
            return entry
        entry.graph, entry.output = capture_graph(
            lambda: self.model.encoder_cudagraph_forward({**inputs.values}, path=DEFAULT_PATH), self.device, self._pool)
        return entry

    def _fit(self, tokens: int) -> int | None:
        """The smallest budget holding ``tokens`` output tokens, or None."""
        return next((b for b in self.plan.budgets if b >= tokens), None)

    def plan_packs(self, items: Sequence[EncoderItemSpec], frames: Sequence[int] | None = None
                   ) -> tuple[list[PackPlan], list[int]]:
        """Split items into packs, one replay each: ``(packs, eager item indices)``.

        An item runs eagerly when no budget holds it or it has more ``frames`` than a batch allows.
        ``greedy`` (vLLM's policy) fills packs smallest item first up to the largest budget, closing a pack
        early when an item alone needs at least the pack's budget and splitting costs fewer budget tokens;
        ``tight`` packs largest first into the budgets whose replays cost least (:meth:`replay_cost`).
        A pack's indices are in the order its items were packed.
        """
        frames = list(frames) if frames is not None else [0] * len(items)
        eager = [i for i, item in enumerate(items)
                 if frames[i] > self.plan.max_frames or self._fit(item.output_tokens) is None]
        skip = set(eager)
        rest = [i for i in range(len(items)) if i not in skip]
        if self.packing == "tight":
            rest.sort(key=lambda i: (-items[i].output_tokens, i))
            return self._route_eager(items, self._tight(items, frames, rest), eager)
        rest.sort(key=lambda i: (items[i].output_tokens, i))
        packs: list[PackPlan] = []
        current: list[int] = []
        for i in rest:
            if current and (not self._feasible(items, frames, [*current, i], self.plan.budgets[-1])
                            or self._defer(items, current, i)):
                packs.append(self._pack(items, current))
                current = []
            current.append(i)
        if current:
            packs.append(self._pack(items, current))
        return self._route_eager(items, packs, eager)

    def _defer(self, items, current: list[int], i: int) -> bool:
        """vLLM's early close: item ``i`` alone needs at least the current pack's budget, and two replays
        cost fewer budget tokens than one merged replay."""
        tokens = sum(items[j].output_tokens for j in current)
        alone, now = self._fit(items[i].output_tokens), self._fit(tokens)
        merged = self._fit(tokens + items[i].output_tokens)
        return alone >= now and now + alone < merged

    def _feasible(self, items, frames, chosen: list[int], limit: int) -> bool:
        """Whether ``chosen`` forms one pack replayable at a budget no larger than ``limit``."""
        if len(chosen) > self.plan.max_items or sum(frames[j] for j in chosen) > self.plan.max_frames:
            return False
        fit = self._fit(sum(items[j].output_tokens for j in chosen))
        return fit is not None and fit <= limit

    def _pack(self, items, chosen: list[int]) -> PackPlan:
        tokens = sum(items[j].output_tokens for j in chosen)
        return PackPlan(self._fit(tokens), tuple(chosen), tokens)

    def _tight(self, items, frames, order: list[int]) -> list[PackPlan]:
        """The cheaper of: everything in one pack, or the largest budget not above the total filled
        largest item first, and the rest packed the same way. ``order``: largest item first."""
        if not order:
            return []
        candidates = []
        if self._feasible(items, frames, order, self.plan.budgets[-1]):
            candidates.append([self._pack(items, order)])
        total = sum(items[i].output_tokens for i in order)
        below = [b for b in self.plan.budgets if b <= total]
        if below and (not candidates or below[-1] < candidates[0][0].budget):
            chosen: list[int] = []
            for i in order:
                if self._feasible(items, frames, [*chosen, i], below[-1]):
                    chosen.append(i)
            if chosen:
                taken = set(chosen)
                candidates.append([self._pack(items, chosen),
                                   *self._tight(items, frames, [i for i in order if i not in taken])])
        if not candidates:  # nothing fits under the total: the largest item alone, then the rest
            candidates.append([self._pack(items, order[:1]), *self._tight(items, frames, order[1:])])
        return min(candidates, key=lambda packs: sum(self.replay_cost(p.budget) for p in packs))

    def execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """Encode every item of ``mm_kwargs``; one ``(output_tokens, hidden)`` tensor per item, caller's order."""
        start = time.perf_counter()
        self._forward_seconds = 0.0
        results = self._execute(mm_kwargs)
        self.stats.host_seconds += time.perf_counter() - start - self._forward_seconds
        return results

    def _select(self, mm_kwargs: Mapping[str, Any], indices: list[int]) -> tuple[dict[str, Any], tuple]:
        selected = dict(self.model.select_encoder_cudagraph_items(mm_kwargs, indices))
        axis_keys = tuple(selected.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, ()))
        if len(axis_keys) != len(self.axes):
            raise SpecRuntimeError(f"select_encoder_cudagraph_items returned {len(axis_keys)} capture axis keys; "
                                   f"the config declares {len(self.axes)} capture axes")
        return selected, axis_keys

    def _postprocess(self, output: torch.Tensor, indices: list[int], tokens: list[int], dest: dict,
                     selected: Mapping[str, Any], *, exact: bool, source: str) -> None:
        wanted = sum(tokens[i] for i in indices)
        rows = output.shape[0]
        if output.shape[-1] != self.config.out_hidden_size:
            # an engine sizes its embedding buffers by out_hidden_size: a wrong width corrupts them there
            raise SpecRuntimeError(
                f"the {source} returned rows of width {output.shape[-1]}, but get_encoder_cudagraph_config() says "
                f"out_hidden_size={self.config.out_hidden_size}: check the spec's out_hidden_size geometry")
        if rows < wanted or (exact and rows != wanted):
            raise SpecRuntimeError(
                f"the {source} returned {rows} rows for {len(indices)} items, but their output_tokens sum to "
                f"{wanted}: check the spec's items.output_tokens formula and its merge geometry")
        # a graph's output buffer is overwritten by its next replay: its rows are cloned; an eager (exact) output
        # is a fresh tensor, whose rows each item may keep as views
        postprocess = getattr(self.model, "postprocess_encoder_output", None)
        if postprocess is None:
            postprocess_by_rows({DEFAULT_PATH: output}, indices, tokens, dest, clone=not exact)
        else:
            postprocess({DEFAULT_PATH: output}, indices, tokens, dest, clone=not exact, batch_mm_kwargs=selected)

    def _execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        if all(value is None for value in mm_kwargs.values()):
            return []
        mixed = self.model.get_input_modality(mm_kwargs) == MIXED  # also: a clear error for unknown keys
        groups = getattr(self.model, "get_encoder_cudagraph_item_groups", None) if mixed else None
        if groups is not None:  # vitcg extension: items that may share an encoder call
            groups = groups(mm_kwargs)
            if len(groups) > 1:
                return self._execute_apart(mm_kwargs, groups)
        items = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        if not items:
            return []
        if not self.graphs:
            self.capture()
        frames = self.extension.get_encoder_cudagraph_item_frames(mm_kwargs) if self.extension else None
        packs, eager = self.plan_packs(items, frames)
        poisoned: list[int] = []
        if packs and self.isolate_nonfinite:
            # only a replay packs items together: a call that runs wholly eagerly needs no check (and no sync,
            # which would stall the host until the device catches up). Outside the forward: deliberate.
            poisoned = self._nonfinite_items(mm_kwargs, len(items))
            if poisoned:
                packs, eager = self._plan_except(items, frames, poisoned)
        packs, eager, explored = self._explore(packs, eager)
        tokens = [item.output_tokens for item in items]
        dest: dict[int, torch.Tensor] = {}
        for pack in packs:
            # mixed calls select images before videos (vitcg extension): ascending canonical order
            indices = sorted(pack.indices) if mixed or self.scoped else list(pack.indices)
            selected, axis_keys = self._select(mm_kwargs, indices)
            entry = self.graphs[(pack.budget, axis_keys) if self.axes else pack.budget]
            if self.scoped:
                output = self.extension.encoder_scoped_forward(
                    selected, lambda values, e=entry, b=pack.budget: self._replay(e, values, b))
                self._postprocess(output, indices, tokens, dest, selected, exact=True,
                                  source=f"forward around the budget {pack.budget} graph")
            else:
                fresh = self.model.prepare_encoder_cudagraph_replay_buffers(
                    selected, self.plan.max_items, self.plan.max_frames, DEFAULT_PATH)
                output = self._replay(entry, fresh.values, pack.budget)[0]
                self._postprocess(output, indices, tokens, dest, selected, exact=False,
                                  source=f"budget {pack.budget} graph")
            self.stats.replays += 1
            self.stats.replays_per_budget[pack.budget] += 1
            self.stats.hits += len(pack.indices)
            self.stats.used_tokens += pack.tokens
            self.stats.padded_tokens += pack.budget - pack.tokens
        if eager:
            if explored is None:
                self._run_eager(mm_kwargs, eager, tokens, dest)
            else:
                _, ms = self._synced_ms(lambda: self._run_eager(mm_kwargs, eager, tokens, dest))
                self.eager_timings.setdefault(explored, []).append((sum(tokens[i] for i in eager), ms))
            self.stats.routed_eager += sum(1 for i in eager if self._fit(tokens[i]) is not None
                                           and (frames is None or frames[i] <= self.plan.max_frames))
        for index in poisoned:
            self._run_eager(mm_kwargs, [index], tokens, dest)
        self.stats.nonfinite_items += len(poisoned)
        self.stats.items += len(items)
        missing = [i for i in range(len(items)) if i not in dest]
        if missing:
            raise SpecRuntimeError(f"postprocess_encoder_output left items {missing} without output")
        return [dest[i] for i in range(len(items))]

    def _execute_apart(self, mm_kwargs: Mapping[str, Any], groups: list[list[int]]) -> list[torch.Tensor]:
        """Each group of items encoded by a call of its own (packs, eager calls), results in the caller's order: a
        model whose modalities must not share an encoder call (a spec's ``separate``)."""
        results: dict[int, torch.Tensor] = {}
        for group in groups:
            selected, _ = self._select(mm_kwargs, group)
            results.update(zip(group, self._execute(selected)))
        return [results[i] for i in range(len(results))]

    def _replay(self, entry: _BudgetGraph, values: Mapping[str, Any], budget: int) -> tuple[Any, Mapping]:
        """:meth:`_run`, timed while the budget's real replays are still observed (:meth:`_observe_replay`), a
        graph-scoped spec's included: its scope's replay is what routing prices against the eager scope."""
        if not self._observe_replay(budget):
            return self._run(entry, values)
        result, ms = self._synced_ms(lambda: self._run(entry, values))
        seen = self._observed_replays.setdefault(budget, [])
        seen.append(ms)
        if len(seen) == OBSERVED_REPLAYS:  # the fastest of a few: one cold replay is no price
            self.replay_costs[budget] = max(self.replay_costs[budget], min(seen))
        return result

    def _synced_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """``fn()`` and its wall time in ms with the device synchronized on both sides (a one-off timing)."""
        torch.cuda.synchronize(self.device)
        tic = time.perf_counter()
        result = fn()
        torch.cuda.synchronize(self.device)
        return result, (time.perf_counter() - tic) * 1e3

    def _observe_replay(self, budget: int) -> bool:
        """Whether to time this replay: the first real replays of each budget on CUDA with ``route_eager``. The
        capture-time cost replays padding segments, which attend only to themselves; real images make long
        segments whose attention costs more, so the cost used for routing is the larger of the two."""
        return (self.route_eager and self.use_cuda_graphs and bool(self.replay_costs)
                and len(self._observed_replays.get(budget, ())) < OBSERVED_REPLAYS)

    def _explore(self, packs: list[PackPlan], eager: list[int]) -> tuple[list[PackPlan], list[int], int | None]:
        """On CUDA with ``route_eager``, when nothing else runs eagerly: the whole call runs eagerly instead, to be
        timed, while the call's size class (:func:`size_class` of its tokens) has fewer than
        :data:`OBSERVED_REPLAYS` such samples and its largest budget's replay costs over :data:`EXPLORE_MS` (one
        call calibrates every decision it holds, the whole-call one included). Per size class, not per budget: an
        eager call's cost is far from proportional to its tokens (8 images batched cost 2.7x one, not 8x, on the
        H100's Gemma 4 tower), so a small call's timing cannot price a call eight times larger. Returns the packs,
        the eager items and that size class (None when nothing is explored)."""
        if not (self.route_eager and self.use_cuda_graphs and self.eager_costs) or eager or not packs:
            return packs, eager, None
        size = size_class(sum(p.tokens for p in packs))
        if (len(self.eager_timings.get(size, ())) >= OBSERVED_REPLAYS
                or self.replay_cost(max(p.budget for p in packs)) <= EXPLORE_MS):
            return packs, eager, None
        return [], [i for p in packs for i in p.indices], size

    def _nonfinite_items(self, mm_kwargs: Mapping[str, Any], count: int) -> list[int]:
        """The items whose floating inputs hold NaN or inf. All inputs are checked at once first (one
        device-to-host sync); only when something is non-finite is each item selected and checked."""
        if _finite(mm_kwargs):
            return []
        return [i for i in range(count) if not _finite(self._select(mm_kwargs, [i])[0], exact=True)]

    def _plan_except(self, items: Sequence[EncoderItemSpec], frames: Sequence[int] | None, excluded: list[int]
                     ) -> tuple[list[PackPlan], list[int]]:
        """:meth:`plan_packs` over every item but ``excluded``, in the canonical indices of ``items``."""
        if not excluded:
            return self.plan_packs(items, frames)
        skip = set(excluded)
        rest = [i for i in range(len(items)) if i not in skip]
        packs, eager = self.plan_packs([items[i] for i in rest], [frames[i] for i in rest] if frames else None)
        return ([dataclasses.replace(p, indices=tuple(rest[j] for j in p.indices)) for p in packs],
                [rest[j] for j in eager])

    def _run_eager(self, mm_kwargs: Mapping[str, Any], indices: list[int], tokens: list[int], dest: dict) -> None:
        """One eager forward of the items at ``indices``, their outputs into ``dest``. The items are selected
        in ascending canonical order: a call holding images and videos lists its images first."""
        indices = sorted(indices)
        selected, _ = self._select(mm_kwargs, indices)
        tic = time.perf_counter()
        with torch.inference_mode():
            output = self.model.encoder_eager_forward(selected, path=DEFAULT_PATH)
        self._forward_seconds += time.perf_counter() - tic
        self._postprocess(output, indices, tokens, dest, selected, exact=True, source="eager forward")
        self.stats.eager_calls += 1
        self.stats.misses += len(indices)

    def _run(self, entry: _BudgetGraph, values: Mapping[str, Any]) -> tuple[Any, Mapping]:
        """Refill ``entry``'s buffers in place from ``values`` (None: leave as captured; a 0-d tensor: copied
        whole; else the key's padding logic, or zero + copy), then replay it (or run the static forward).
        Returns the output and the capture values it ran on."""
        for key, value in values.items():
            if value is None:
                continue
            dest = entry.inputs.values.get(key)
            if not isinstance(dest, torch.Tensor):
                raise SpecRuntimeError(f"replay value for {key!r}, which is no tensor buffer of the capture inputs")
            if dest.data_ptr() != entry.pointers[key]:
                raise SpecRuntimeError(f"buffer identity broken: capture buffer {key!r} of budget {entry.budget} "
                                       "was replaced after capture")
            logic = self.config.padding_logics.get(key)
            if isinstance(value, torch.Tensor) and value.ndim == 0:
                dest.copy_(value)
            elif logic is not None:
                logic(dest, value)
            else:  # the protocol's default: the new rows first, zeros after them
                pad_zeros(dest, value, dest.shape[0], key)
        tic = time.perf_counter()
        if entry.graph is not None:
            entry.graph.replay()
            output = entry.output
        else:
            with no_host_syncs(), torch.no_grad():  # what a capture would reject must fail here too
                output = self.model.encoder_cudagraph_forward({**entry.inputs.values}, path=DEFAULT_PATH)
        self._forward_seconds += time.perf_counter() - tic
        return output, entry.inputs.values


def size_class(tokens: int) -> int:
    """The power of two at or above ``tokens``: calls within a factor of two of each other share eager timings."""
    return 1 << max(tokens - 1, 0).bit_length()


def _finite(kwargs: Mapping[str, Any], exact: bool = False) -> bool:
    """Whether every floating tensor of ``kwargs`` is free of NaN and inf: one device-to-host sync for all.

    Quick (default): a tensor's float32 sum is NaN or inf whenever one of its values is (NaN and inf propagate,
    inf - inf is NaN), so one reduction per tensor answers; only huge finite values can overflow the sum too,
    and then the ``exact`` per-item check (every value tested) decides."""
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not tensors:
        return True
    if exact:
        checks = [torch.isfinite(v).all() for v in tensors]
        return bool(torch.stack([c.to(checks[0].device) for c in checks]).all())
    sums = [v.sum(dtype=torch.float32) for v in tensors]
    total = sums[0] if len(sums) == 1 else torch.stack([s.to(sums[0].device) for s in sums]).sum()
    return bool(torch.isfinite(total))


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
