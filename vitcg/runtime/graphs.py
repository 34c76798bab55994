"""Budget graphs: one CUDA graph per token budget (and capture-axis keys), captured into one pool, refilled in
place and replayed; without CUDA the same buffers feed the fixed-shape forward directly (the static path that
CPU tests compare against eager, where host syncs raise as a capture would). Shaped like vLLM's
``EncoderCudaGraphManager`` mechanism; it knows the protocol's capture and forward members, nothing of packing.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import SpecRuntimeError
from .budgets import BudgetPlan
from .padding import pad_zeros
from .protocol import DEFAULT_PATH, EncoderCudaGraphCaptureInputs, SupportsEncoderCudaGraph
from .syncs import no_host_syncs
from .timing import timed

log = logging.getLogger("vitcg.runtime")

COST_RUNS = 1
"""Timed replays per budget graph when replay costs are measured at capture (after one untimed replay): a first
price only, replaced by the budget's real replays (:mod:`vitcg.runtime.costs`); each extra run costs a start-up
the sum of all replays (about 0.36 s for the Qwen2-VL-7B tower's 8 budgets on the H100)."""


def capture_graph(fn: Callable[[], Any], device: torch.device, pool: Any = None) -> tuple[Any, Any]:
    """``(graph, output)``: ``fn`` run once on a side stream, then captured into a ``torch.cuda.CUDAGraph``
    (in ``pool`` when given) under inference mode; replaying the graph rewrites ``output`` in place."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.inference_mode():
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
        output = fn()
    return graph, output


_GC_LOCK = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside: a collection during a capture can destroy an unreachable earlier
    graph, whose teardown the capturing stream forbids; that invalidates the capture and leaves the CUDA RNG in
    capture state for the rest of the process. torch no longer collects before each capture
    (``torch.compiler.config.force_cudagraph_gc`` is off by default; pytorch/pytorch PR 161037 shows the failure).
    Unreachable graphs are collected after the capture instead. The switch is the process's: pauses that overlap
    (two threads capturing two encoders) turn collection back on only when the last one ends, and only if it was
    on before the first."""
    global _gc_pauses, _gc_was_enabled
    with _GC_LOCK:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


@dataclass
class BudgetGraph:
    budget: int
    inputs: EncoderCudaGraphCaptureInputs
    pointers: dict[str, int]
    """Storage address of each tensor buffer at capture (buffer identity)."""
    graph: Any = None
    """``torch.cuda.CUDAGraph``, or None on the static (CPU) path."""
    output: Any = None


@dataclass(frozen=True)
class CaptureReport:
    seconds: float
    per_budget: dict[int, float]
    """Capture seconds by budget (summed over axis keys): where start-up goes, as benchmarks/compile_start.py
    reports it."""
    pool_bytes: int
    """GPU memory held after capture beyond what was held before (graph pool plus buffers)."""
    replay_ms: dict[int, float] = field(default_factory=dict)
    """Measured GPU time of one replay per budget (CUDA graphs only; empty otherwise)."""


class BudgetGraphs(Mapping):
    """The graphs of one model at ``plan``'s budgets, by budget or by ``(budget, axis keys)`` with capture axes
    (a read-only mapping of the captured ones)."""

    def __init__(self, model: SupportsEncoderCudaGraph, plan: BudgetPlan, axes: tuple, device: torch.device,
                 dtype: torch.dtype, cuda: bool, padding_logics: Mapping[str, Callable]):
        self.model, self.plan, self.axes, self.device, self.dtype = model, plan, axes, device, dtype
        self.cuda = cuda
        self.padding_logics = padding_logics
        self.entries: dict[Any, BudgetGraph] = {}
        self.forward_seconds = 0.0
        """Time spent in replays and static forwards since the caller last reset it."""

    def __getitem__(self, key: Any) -> BudgetGraph:
        return self.entries[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def planned(self) -> list[Any]:
        """Graph keys, largest budget first: budgets, or (budget, axis keys) per combination."""
        budgets = sorted(self.plan.budgets, reverse=True)
        return budgets if not self.axes else [(b, k) for b in budgets for k in itertools.product(*self.axes)]

    def key(self, budget: int, axis_keys: tuple) -> Any:
        return (budget, axis_keys) if self.axes else budget

    def capture(self, advance: Callable[[int], None] = lambda budget: None) -> CaptureReport:
        """Allocate every budget's buffers and capture its graph, largest budget first, into one shared pool; on
        CUDA, measure each replay (a replay costs milliseconds of launches whatever its size)."""
        if self.entries:
            return CaptureReport(0.0, {}, 0)
        before, pool = 0, None
        if self.cuda:
            torch.cuda.synchronize(self.device)
            before, pool = torch.cuda.memory_allocated(self.device), torch.cuda.graph_pool_handle()
        per_budget: dict[int, float] = {}
        start = time.perf_counter()
        for key in self.planned():
            budget, axis_keys = key if self.axes else (key, ())
            tic = time.perf_counter()
            self.entries[key] = self._capture_one(budget, axis_keys, pool)
            per_budget[budget] = per_budget.get(budget, 0.0) + time.perf_counter() - tic
            advance(budget)
        pool_bytes, replay_ms = 0, {}
        if self.cuda:
            torch.cuda.synchronize(self.device)
            pool_bytes = torch.cuda.memory_allocated(self.device) - before
            for entry in self.entries.values():
                ms = timed(entry.graph.replay, COST_RUNS, 1, self.device)
                replay_ms[entry.budget] = max(ms, replay_ms.get(entry.budget, ms))
        report = CaptureReport(time.perf_counter() - start, per_budget, pool_bytes, replay_ms)
        log.info("%s %d graphs at budgets %s in %.2f s%s", "captured" if self.cuda else "allocated",
                 len(self.entries), ",".join(map(str, self.plan.budgets)), report.seconds,
                 f", pool {pool_bytes / 2**20:.0f} MiB" if self.cuda else "")
        return report

    def _capture_one(self, budget: int, axis_keys: tuple, pool: Any) -> BudgetGraph:
        inputs = self.model.prepare_encoder_cudagraph_capture_inputs(
            budget, self.plan.max_items, self.plan.max_frames, self.device, self.dtype, DEFAULT_PATH,
            axis_keys if self.axes else None)
        tensors = {k: v for k, v in inputs.values.items() if isinstance(v, torch.Tensor)}
        entry = BudgetGraph(budget, inputs, {k: v.data_ptr() for k, v in tensors.items()})
        if self.cuda:
            entry.graph, entry.output = capture_graph(
                lambda: self.model.encoder_cudagraph_forward({**inputs.values}, path=DEFAULT_PATH), self.device, pool)
        return entry

    def run(self, key: Any, values: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        """Refill the graph's buffers in place from ``values`` (None: leave as captured; a 0-d tensor: copied
        whole; else the key's padding logic, or zero + copy), then replay it (or run the static forward).
        Returns the output and the capture values it ran on."""
        entry = self.entries[key]
        for name, value in values.items():
            if value is not None:
                self._refill(entry, name, value)
        tic = time.perf_counter()
        if entry.graph is not None:
            entry.graph.replay()
            output = entry.output
        else:
            host = tuple(entry.inputs.values[name] for name in getattr(self.model, "host_buffers", ()))
            with no_host_syncs(host), torch.no_grad():  # what a capture would reject must fail here too
                output = self.model.encoder_cudagraph_forward({**entry.inputs.values}, path=DEFAULT_PATH)
        self.forward_seconds += time.perf_counter() - tic
        return output, entry.inputs.values

    def _refill(self, entry: BudgetGraph, name: str, value: Any) -> None:
        dest = entry.inputs.values.get(name)
        if not isinstance(dest, torch.Tensor):
            raise SpecRuntimeError(f"replay value for {name!r}, which is no tensor buffer of the capture inputs")
        if dest.data_ptr() != entry.pointers[name]:
            raise SpecRuntimeError(f"buffer identity broken: capture buffer {name!r} of budget {entry.budget} "
                                   "was replaced after capture")
        logic = self.padding_logics.get(name)
        if isinstance(value, torch.Tensor) and value.ndim == 0:
            dest.copy_(value)
        elif logic is not None:
            logic(dest, value)
        else:  # the protocol's default: the new rows first, zeros after them
            pad_zeros(dest, value, dest.shape[0], name)


class WholeReplay:
    """The graphs hold the whole encoder call: a pack's buffers come from the protocol, its output is the
    graph's own buffer (rows are cloned)."""

    exact = False
    canonical_order = False

    def encode(self, model: Any, plan: BudgetPlan, selected: Mapping[str, Any], replay: Callable) -> Any:
        fresh = model.prepare_encoder_cudagraph_replay_buffers(selected, plan.max_items, plan.max_frames,
                                                               DEFAULT_PATH)
        return replay(fresh.values)[0]


class ScopedReplay:
    """The graphs hold one submodule call inside the model's eager forward (vitcg extension): the forward runs
    with that call answered by a replay, on items in canonical order, and returns a fresh tensor."""

    exact = True
    canonical_order = True

    def encode(self, model: Any, plan: BudgetPlan, selected: Mapping[str, Any], replay: Callable) -> Any:
        return model.encoder_scoped_forward(selected, replay)


class progress_bar:
    """A rich progress bar over the budgets, or nothing."""

    def __init__(self, enabled: bool, total: int, verb: str):
        self.enabled, self.total, self.verb = enabled, total, verb

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda budget: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), transient=True)
        self._bar.start()
        task = self._bar.add_task(f"{self.verb} {self.total} budgets", total=self.total)
        return lambda budget: self._bar.update(task, advance=1, description=f"{self.verb} budget {budget}")

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._bar.stop()
