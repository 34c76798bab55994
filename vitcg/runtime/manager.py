"""The budget graph manager: composes budget graphs, packing, costs and routing, and non-finite isolation.

It talks to a model only through :mod:`vitcg.runtime.protocol` (vLLM's protocol) and, where the model offers it,
:mod:`vitcg.runtime.extension`; it imports nothing of the spec language or the adapter, so it drives any protocol
implementation, hand-written ones included. The parts: :mod:`~vitcg.runtime.graphs` (capture, refill, replay,
buffer identity), :mod:`~vitcg.runtime.packing` (which items share a replay), :mod:`~vitcg.runtime.costs` (what a
replay and an eager call cost, and the router), :mod:`~vitcg.runtime.nonfinite`.

Budgets follow vLLM's ``EncoderCudaGraphManager`` (:func:`~vitcg.runtime.budgets.plan_budgets`). Where the
model tells each item's frames (the extension's ``get_encoder_cudagraph_item_frames``, which every spec adapter
offers), packs also respect the frame cap, and a video with more frames than a pack allows runs eagerly. Each
pack replays the smallest budget that fits; an item larger than every budget runs eagerly. Results come back in
the caller's item order, a graph's rows cloned before the next replay can overwrite them.

Threads: one manager serves one call at a time. :meth:`EncoderCudaGraphManager.execute` and
:meth:`~EncoderCudaGraphManager.capture` hold the manager's lock, so threads sharing a manager each get correct
results, one after another (the graphs' buffers and the cost model are the manager's state).

The log ``vitcg.runtime`` says at INFO what was captured and at DEBUG where each call went and why.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import BudgetError, SpecRuntimeError, UsageError
from .budgets import lean_caps, plan_budgets
from .costs import CostModel, Route, route
from .engine import EngineConfig, engine_config
from .extension import MIXED, Extension
from .graphs import BudgetGraphs, CaptureReport, ScopedReplay, WholeReplay, progress_bar
from .nonfinite import nonfinite_items
from .options import ManagerOptions
from .packing import PackPlan, plan_except
from .protocol import DEFAULT_PATH, ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, SupportsEncoderCudaGraph, postprocess_by_rows
from .stats import ManagerStats

__all__ = ["CaptureReport", "EncoderCudaGraphManager", "ManagerOptions", "ManagerStats", "PackPlan"]

log = logging.getLogger("vitcg.runtime")

ENGINE_LIMITS = frozenset(inspect.signature(engine_config).parameters)
"""The keyword arguments the manager takes in place of a ``vllm_config``."""

def _one_path_config(model: SupportsEncoderCudaGraph) -> Any:
    """The model's encoder graph config; BudgetError unless it declares the one path the manager serves."""
    config = model.get_encoder_cudagraph_config()
    if set(config.paths) != {DEFAULT_PATH} or config.paths[DEFAULT_PATH].min_token_budget is not None:
        raise BudgetError(f"the model declares encoder paths {sorted(config.paths)}; vitcg's manager "
                          "serves one path, 'default', on the manager's own ladder")
    return config


def _engine_config(limits: Mapping[str, Any]) -> EngineConfig:
    """:func:`engine_config` of the manager's keyword limits; UsageError naming any it does not know."""
    if unknown := sorted(set(limits) - ENGINE_LIMITS):
        raise UsageError(f"EncoderCudaGraphManager: unknown engine limits {unknown}; the limits are "
                         f"{sorted(ENGINE_LIMITS)}, and packing and routing are ManagerOptions fields")
    return engine_config(**limits)


class EncoderCudaGraphManager:
    """Captures one graph per token budget and serves batches of items through them.

    Engine options come from ``vllm_config`` (a vLLM config, or :func:`vitcg.runtime.engine.engine_config`) or,
    when it is None, from ``engine_limits`` (:func:`~vitcg.runtime.engine.engine_config`'s keywords). ``device``
    and ``dtype`` are the graphs' (as vLLM passes them); nothing is read from the model but the protocol.
    ``options``: :class:`ManagerOptions`; packing and routing may change between calls (``manager.options``)."""

    def __init__(self, model: SupportsEncoderCudaGraph, *, vllm_config: EngineConfig | Any = None,
                 options: ManagerOptions | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, **engine_limits: Any):
        self.model = model
        self.config = _one_path_config(model)
        options = options or ManagerOptions()
        self.vllm_config = vllm_config if vllm_config is not None else _engine_config(engine_limits)
        self.plan = self._plan_budgets(options)
        self.extension = Extension.of(model)
        """The members of the vitcg extension the model offers (frames per item, item groups, graph scope)."""
        self.boundary = ScopedReplay() if self.extension.scoped else WholeReplay()
        self.axes = tuple(tuple(axis) for axis in self.config.capture_axes)
        if any(not axis for axis in self.axes):
            raise BudgetError("capture_axes must each hold at least one key")
        self.device, self.dtype = torch.device(device), dtype
        self.use_cuda_graphs = self.device.type == "cuda" if options.use_cuda_graphs is None else options.use_cuda_graphs
        if self.use_cuda_graphs and self.device.type != "cuda":
            raise BudgetError("CUDA graphs need a CUDA device; use_cuda_graphs=False runs the static path")
        self.graphs = BudgetGraphs(model, self.plan, self.axes, self.device, dtype, self.use_cuda_graphs,
                                   self.config.padding_logics)
        self.costs = CostModel()
        self.options = options
        self.stats = ManagerStats()
        self._lock = threading.RLock()
        """Held by every call: one call at a time uses the graphs' buffers and the counters."""

    @property
    def options(self) -> ManagerOptions:
        return self._options

    @options.setter
    def options(self, options: ManagerOptions) -> None:
        self._options = options
        self.costs.learn = self.use_cuda_graphs and options.route_eager

    @property
    def budgets(self) -> tuple[int, ...]:
        return self.plan.budgets

    def _plan_budgets(self, options: ManagerOptions):
        engine = self.vllm_config.compilation_config
        video_limit = getattr(self.vllm_config, "video_limit_per_prompt", None)
        min_budget, max_budget = self.model.get_encoder_cudagraph_budget_range(self.vllm_config)
        plan = plan_budgets(min_budget, max_budget, engine.encoder_cudagraph_token_budgets,
                            engine.encoder_cudagraph_max_vision_items_per_batch,
                            engine.encoder_cudagraph_max_frames_per_batch, self.config.max_frames_per_video,
                            video="video" in self.config.modalities and video_limit != 0, ladder=options.ladder)
        if not options.lean or engine.encoder_cudagraph_max_vision_items_per_batch:
            return plan
        return lean_caps(plan, self.config.max_frames_per_video, engine.encoder_cudagraph_max_frames_per_batch is None)

    def capture(self) -> CaptureReport:
        """Every budget's buffers and graph, largest budget first, into one shared pool (once)."""
        with self._lock, progress_bar(self.options.progress and not self.graphs.entries,
                                      len(self.graphs.planned()),
                                      "capturing" if self.use_cuda_graphs else "allocating") as advance:
            report = self.graphs.capture(advance)
            if report.replay_ms:
                self.costs.replay.update(report.replay_ms)
        return report

    def route(self, tokens: Sequence[int], frames: Sequence[int] | None = None,
              poisoned: Sequence[int] = ()) -> Route:
        """Where a call's items go: packed (all but ``poisoned``), then routed by the measured costs."""
        policy, price = self.options.packing, (self.costs.replay.__getitem__ if self.costs.replay else None)
        packs, eager = plan_except(tokens, self.plan, poisoned, frames=frames, policy=policy, price=price)
        if not self.options.route_eager or not (self.costs.replay or self.costs.eager):
            return Route(packs, eager, "routing off" if not self.options.route_eager else "nothing measured")
        if not eager and self.costs.explores(sum(p.tokens for p in packs), packs):
            return Route([], sorted(i for p in packs for i in p.indices), "exploring: eager calls of this size "
                         "are not yet measured, and the largest replay may cost more", len(tokens) - len(poisoned))
        return route(tokens, packs, eager, self.costs)

    def execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """Encode every item of ``mm_kwargs``; one ``(output_tokens, hidden)`` tensor per item, caller's order.
        Calls from several threads run one at a time (the manager's lock)."""
        with self._lock:
            start = time.perf_counter()
            self.graphs.forward_seconds = 0.0
            results = self._execute(mm_kwargs)
            self.stats.host_seconds += time.perf_counter() - start - self.graphs.forward_seconds
            return results

    def _execute(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        if all(value is None for value in mm_kwargs.values()):
            return []
        mixed = self.model.get_input_modality(mm_kwargs) == MIXED  # also: a clear error for unknown keys
        groups = self.extension.item_groups if mixed else None
        if groups is not None and len(groups := groups(mm_kwargs)) > 1:  # vitcg extension: modalities kept apart
            return self._execute_apart(mm_kwargs, groups)
        tokens = [item.output_tokens for item in self.model.get_encoder_cudagraph_item_specs(mm_kwargs)]
        if not tokens:
            return []
        self.capture()
        return self._encode(mm_kwargs, tokens, mixed)

    def _encode(self, mm_kwargs: Mapping[str, Any], tokens: list[int], mixed: bool) -> list[torch.Tensor]:
        """Every item of a call, routed, replayed or run eagerly; the results in the caller's order."""
        routed, poisoned = self._route_call(mm_kwargs, tokens)
        dest: dict[int, torch.Tensor] = {}
        for pack in routed.packs:
            self._replay_pack(mm_kwargs, pack, tokens, dest, mixed)
        if routed.eager:
            self._run_eager(mm_kwargs, routed.eager, tokens, dest)
        for index in poisoned:
            self._run_eager(mm_kwargs, [index], tokens, dest)
        self.stats.routed_eager += routed.moved
        self.stats.nonfinite_items += len(poisoned)
        self.stats.items += len(tokens)
        if missing := [i for i in range(len(tokens)) if i not in dest]:
            raise SpecRuntimeError(f"postprocess_encoder_output left items {missing} without output")
        return [dest[i] for i in range(len(tokens))]

    def _route_call(self, mm_kwargs: Mapping[str, Any], tokens: list[int]) -> tuple[Route, list[int]]:
        """Where one call's items go, and the items with non-finite inputs (each run eagerly, alone)."""
        frames = self.extension.item_frames(mm_kwargs) if self.extension.item_frames else None
        routed, poisoned = self.route(tokens, frames), []
        if routed.packs and self.options.isolate_nonfinite:  # only a replay packs items together: checked then
            poisoned = nonfinite_items(mm_kwargs, len(tokens), lambda indices: self._select(mm_kwargs, indices)[0])
            routed = self.route(tokens, frames, poisoned) if poisoned else routed
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call of %d items, %d tokens: %d replays, %d items eager (%s)", len(tokens), sum(tokens),
                      len(routed.packs), len(routed.eager), routed.why)
        return routed, poisoned

    def _execute_apart(self, mm_kwargs: Mapping[str, Any], groups: list[list[int]]) -> list[torch.Tensor]:
        """Each group of items encoded by a call of its own, results in the caller's order: a model whose
        modalities must not share an encoder call (a spec's ``separate``)."""
        results: dict[int, torch.Tensor] = {}
        for group in groups:
            results.update(zip(group, self._execute(self._select(mm_kwargs, group)[0])))
        return [results[i] for i in range(len(results))]

    def _replay_pack(self, mm_kwargs: Mapping[str, Any], pack: PackPlan, tokens: list[int], dest: dict,
                     mixed: bool) -> None:
        # mixed calls select images before videos (vitcg extension): ascending canonical order
        indices = sorted(pack.indices) if mixed or self.boundary.canonical_order else list(pack.indices)
        selected, axis_keys = self._select(mm_kwargs, indices)
        key = self.graphs.key(pack.budget, axis_keys)
        output = self.boundary.encode(self.model, self.plan, selected, lambda values: self._replay(key, values, pack.budget))
        self._postprocess(output, indices, tokens, dest, selected, exact=self.boundary.exact,
                          source=f"budget {pack.budget} graph")
        self.stats.replays += 1
        self.stats.replays_per_budget[pack.budget] += 1
        self.stats.hits += len(pack.indices)
        self.stats.used_tokens += pack.tokens
        self.stats.padded_tokens += pack.budget - pack.tokens

    def _replay(self, key: Any, values: Mapping[str, Any], budget: int) -> tuple[Any, Mapping]:
        """One replay, timed while the budget's first real replays are observed (a scoped spec's included)."""
        if not self.costs.times_replay(budget):
            return self.graphs.run(key, values)
        result, ms = self._synced_ms(lambda: self.graphs.run(key, values))
        self.costs.observe_replay(budget, ms)
        return result

    def _run_eager(self, mm_kwargs: Mapping[str, Any], indices: list[int], tokens: list[int], dest: dict) -> None:
        """One eager forward of the items at ``indices`` (selected in ascending canonical order: a call holding
        images and videos lists its images first), timed while eager calls of its size are observed."""
        indices = sorted(indices)
        selected, _ = self._select(mm_kwargs, indices)
        count = sum(tokens[i] for i in indices)

        def forward() -> torch.Tensor:
            with torch.inference_mode():
                return self.model.encoder_eager_forward(selected, path=DEFAULT_PATH)
        tic = time.perf_counter()
        if self.costs.times_eager(count):
            output, ms = self._synced_ms(forward)
            self.costs.observe_eager(count, ms)
        else:
            output = forward()
        self.graphs.forward_seconds += time.perf_counter() - tic
        self._postprocess(output, indices, tokens, dest, selected, exact=True, source="eager forward")
        self.stats.eager_calls += 1
        self.stats.misses += len(indices)

    def _synced_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """``fn()`` and its wall time in ms with the device synchronized on both sides (a one-off timing)."""
        torch.cuda.synchronize(self.device)
        tic = time.perf_counter()
        result = fn()
        torch.cuda.synchronize(self.device)
        return result, (time.perf_counter() - tic) * 1e3

    def _select(self, mm_kwargs: Mapping[str, Any], indices: list[int]) -> tuple[dict[str, Any], tuple]:
        selected = dict(self.model.select_encoder_cudagraph_items(mm_kwargs, indices))
        axis_keys = tuple(selected.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, ()))
        if len(axis_keys) != len(self.axes):
            raise SpecRuntimeError(f"select_encoder_cudagraph_items returned {len(axis_keys)} capture axis keys; "
                                   f"the config declares {len(self.axes)} capture axes")
        return selected, axis_keys

    def _postprocess(self, output: torch.Tensor, indices: list[int], tokens: list[int], dest: dict,
                     selected: Mapping[str, Any], *, exact: bool, source: str) -> None:
        wanted, rows = sum(tokens[i] for i in indices), output.shape[0]
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
