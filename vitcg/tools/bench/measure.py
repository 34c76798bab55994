"""``vitcg bench``: latency of HF eager, torch.compile, vitcg budget graphs and an exact-shape graph.

Each workload (:mod:`.workloads`) is a list of images (height, width in pixels) and videos (frames, height,
width), turned into encoder inputs the way the spec's ``tests.shaping`` says the processor would. Latency is
the median of ``iters`` runs timed with CUDA events, after ``warmup`` runs.
The exact-shape graph is captured for the very input of the workload (no padding, no host work): the
lower bound a budget graph can approach. Results also hold capture time, graph pool memory, padding
waste and the host time per replay.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError, VitcgError
from ...lang.catalogue import buffer_names
from ...lang.model import Spec
from ...runtime.adapter import SpecAdapter, adapter_for
from ...runtime.compile_cache import capture_compiled
from ...runtime.graphs import capture_graph
from ...runtime.manager import EncoderCudaGraphManager
from ...runtime.timing import timed
from ..encoders import build_encoder, release
from ..files import write_bytes_atomic, write_text_atomic
from ..workloads import WORKLOADS, make_inputs, on_device, relative_error
from .roofline import Ceilings, forward_flops, measure_ceilings, weight_bytes


class ExactGraph:
    """A CUDA graph captured for one exact input: unpadded buffers, host values for that input."""

    def __init__(self, adapter: SpecAdapter, kwargs: Mapping[str, torch.Tensor]):
        items = adapter.get_encoder_cudagraph_item_specs(kwargs)
        frames = sum(adapter.get_encoder_cudagraph_item_frames(kwargs))
        fresh = adapter.prepare_encoder_cudagraph_replay_buffers(kwargs, len(items), frames)
        names = {**buffer_names(sum(i.output_tokens for i in items), len(items), frames), **adapter.geometry}
        self.values: dict[str, Any] = {}
        for buffer in adapter.spec.buffers:
            value = fresh.values[buffer.name]
            if buffer.is_host:
                self.values[buffer.name] = buffer.value.evaluate(names)
            elif value is None:  # kept on the host (on_host): the graph reads none of its values
                self.values[buffer.name] = torch.zeros([f.evaluate(names) for f in buffer.shape], dtype=torch.int64)
            else:
                self.values[buffer.name] = value.to(adapter.device).clone()
        self.adapter = adapter
        self.graph = None
        self.output = None
        self.rows = sum(i.output_tokens for i in items) if adapter.spec.epilogue else None
        """With an epilogue the forward returns its kept rows first, then the rest: the output is that many rows."""

    def capture(self) -> None:
        self.graph, self.output = capture_graph(lambda: self.adapter.encoder_cudagraph_forward(self.values),
                                                self.adapter.device)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output if self.rows is None else self.output[:self.rows]


def exact_scope_manager(adapter: SpecAdapter, items: list, frames: int, device: str, dtype: torch.dtype
                        ) -> EncoderCudaGraphManager:
    """For a graph-scoped spec, the exact-shape bound: one graph of exactly this input's tokens, items and
    frames (captured), served through the scope. The eager prologue and epilogue still run around it."""
    tokens = sum(i.output_tokens for i in items)
    min_budget, _ = adapter.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 1 << 30,
                                                                "max_model_len": 1 << 30})
    limit = max(tokens, min_budget)
    manager = EncoderCudaGraphManager(adapter, token_budgets=[tokens], max_items_per_batch=len(items),
                                      max_frames_per_batch=frames,
                                      max_num_batched_tokens=limit, max_model_len=limit, device=device, dtype=dtype)
    manager.capture()
    return manager


@dataclass
class WorkloadResult:
    workload: str
    description: str
    items: int
    tokens: int
    ms: dict[str, float] = field(default_factory=dict)
    """Method -> median latency in ms: eager, compile, vitcg, exact."""
    compile_first_call_s: float | None = None
    compile_error: str | None = None
    packing: dict[str, dict] = field(default_factory=dict)
    """Packing policy -> replays, budgets, eager items, padding waste, host ms per replay."""
    max_rel_error: float = 0.0
    floor_ms: float | None = None
    """The roofline floor of this workload's forward (``--roofline``): its weights read once or its FLOPs at the
    measured matmul rate, whichever takes longer."""
    gflops: float | None = None
    """FLOPs of the eager forward (``--roofline``), in GFLOP."""


@dataclass
class SpecBench:
    spec: str
    size: str
    dtype: str
    budgets: list[int]
    max_items: int
    capture_s: float
    pool_mib: float
    parameters_m: float
    replay_ms: dict[int, float] = field(default_factory=dict)
    """Measured GPU time of one replay per budget (what tight packing minimizes)."""
    inductor_capture_s: float | None = None
    """Compile plus capture time of the inductor-compiled variant (``vitcg_inductor``), when measured."""
    inductor_error: str | None = None
    inductor_cache_hit: bool | None = None
    """Whether the inductor variant's kernels came from vitcg's persistent compile cache."""
    workloads: list[WorkloadResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _inductor_manager(spec: Spec, module: torch.nn.Module, limits: Mapping[str, Any], device: str, dtype: torch.dtype,
                      result: SpecBench, log: Callable[[str], None]) -> EncoderCudaGraphManager | None:
    """The vitcg+inductor variant's manager, its budgets compiled and captured (from the persistent compile cache
    when it holds them); None when compilation fails, which ``result`` records."""
    tic = time.perf_counter()
    try:
        inductor = EncoderCudaGraphManager(adapter_for(spec, module, compile_forward=True, compile_eager=True), **limits,
                                           device=device, dtype=dtype)
        _, cache = capture_compiled(inductor, spec)
    except Exception as exc:  # a compiler failure is a result to report, not a reason to stop
        result.inductor_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        log(f"  inductor-compiled forward failed: {result.inductor_error}")
        return None
    result.inductor_capture_s = round(time.perf_counter() - tic, 1)
    result.inductor_cache_hit = cache.loaded
    log(f"  inductor-compiled forward: {len(inductor.budgets)} budgets compiled and captured in "
        f"{result.inductor_capture_s:.0f} s ({'from' if cache.loaded else 'stored in'} {cache.path})")
    return inductor


def bench_spec(spec: Spec, *, workloads: list[str], device: str = "cuda", size: str = "real",
               dtype: torch.dtype = torch.bfloat16, iters: int = 20, warmup: int = 3,
               compile_eager: bool = True, max_num_batched_tokens: int = 8192, max_model_len: int = 32768,
               token_budgets: Sequence[int] | None = None, ceilings: Ceilings | None = None,
               log: Callable[[str], None] = print) -> SpecBench:
    """Measure every method on every workload for one spec. Raises on a correctness failure. ``token_budgets``:
    the ladder of the vitcg managers (default: the manager's own). With ``ceilings``, each workload also gets its
    roofline floor. Each workload runs :data:`STAGES` in order."""
    module = build_encoder(spec, size, device=device, dtype=dtype)
    adapter = adapter_for(spec, module)
    limits = {"max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
              "token_budgets": list(token_budgets) if token_budgets else None}
    manager = EncoderCudaGraphManager(adapter, **limits, device=device, dtype=dtype)
    report = manager.capture()
    result = SpecBench(spec.name, size, str(dtype).removeprefix("torch."), list(manager.budgets),
                       manager.plan.max_items, round(report.seconds, 3), round(report.pool_bytes / 2**20, 1),
                       round(sum(p.numel() for p in module.parameters()) / 1e6, 1),
                       {b: round(ms, 3) for b, ms in report.replay_ms.items()})
    log(f"{spec.name}: {len(manager.budgets)} budgets captured in {report.seconds:.1f} s, "
        f"pool {result.pool_mib:.0f} MiB")
    run = _Run(spec, module, adapter, manager, torch.device(device), dtype, iters, warmup, ceilings, log)
    if compile_eager and run.cuda:
        run.compiled = torch.compile(getattr(module, spec.encoder.method), mode="reduce-overhead")
        run.inductor = _inductor_manager(spec, module, limits, device, dtype, result, log)
    generator = torch.Generator().manual_seed(0)
    for name in workloads:
        w = _start(run, name, make_inputs(adapter, WORKLOADS[name], generator))
        if w is None:
            result.skipped.append(name)
            continue
        for stage in STAGES:
            stage(run, w)
        _log_row(run, w.row)
        result.workloads.append(w.row)
    return result


@dataclass
class _Run:
    """One spec's bench: what every stage of a workload reads."""

    spec: Spec
    module: torch.nn.Module
    adapter: SpecAdapter
    manager: EncoderCudaGraphManager
    device: torch.device
    dtype: torch.dtype
    iters: int
    warmup: int
    ceilings: Ceilings | None
    log: Callable[[str], None]
    compiled: Callable | None = None
    """The encoder method under ``torch.compile`` (the baseline), on CUDA with ``compile_eager``."""
    inductor: EncoderCudaGraphManager | None = None
    """The vitcg+inductor variant's manager, on CUDA with ``compile_eager``."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def timed(self, fn: Callable[[], Any], iters: int | None = None) -> float:
        return timed(fn, iters or self.iters, self.warmup, self.device)


@dataclass
class _Workload:
    """One workload in flight: its inputs, the eager output each method is compared with, and its row."""

    name: str
    inputs: Mapping[str, torch.Tensor]
    items: list
    eager_out: torch.Tensor
    row: WorkloadResult


def _start(run: _Run, name: str, cpu_inputs: Mapping[str, torch.Tensor] | None) -> _Workload | None:
    """The workload on the device with its eager output; None (logged) where the spec lacks its modality."""
    workload = WORKLOADS[name]
    if cpu_inputs is None:
        missing = [m for m, entries in (("image", workload.images), ("video", workload.videos))
                   if entries and run.spec.modality(m) is None]
        run.log(f"  {name:<12} skipped: {run.spec.name} has no {' or '.join(missing)} modality")
        return None
    inputs = on_device(run.adapter, cpu_inputs, run.dtype)
    items = run.adapter.get_encoder_cudagraph_item_specs(inputs)
    row = WorkloadResult(name, workload.description, len(items), sum(i.output_tokens for i in items))
    return _Workload(name, inputs, items, run.adapter.encoder_eager_forward(inputs), row)


def _roofline(run: _Run, w: _Workload) -> None:
    """With ceilings: the forward's FLOPs and its floor."""
    if run.ceilings is None:
        return
    flops = forward_flops(lambda: run.adapter.encoder_eager_forward(w.inputs))
    w.row.gflops = round(flops / 1e9, 2)
    w.row.floor_ms = round(run.ceilings.floor_ms(flops, weight_bytes(run.module)), 3)


def _compare(run: _Run, w: _Workload) -> None:
    """The manager's output against eager: its shape (an error naming the spec's likely culprit) and its error."""
    got = torch.cat(run.manager.execute(w.inputs))
    if got.shape != w.eager_out.shape:
        raise InputError(f"{run.spec.name}, workload {w.name}: manager output {tuple(got.shape)} but eager output "
                         f"{tuple(w.eager_out.shape)}; check the spec's items.output_tokens formula and its "
                         f"merge geometry (vitcg check {run.spec.name} names the item)")
    w.row.max_rel_error = relative_error(got, w.eager_out)


def _eager(run: _Run, w: _Workload) -> None:
    # eager is host-bound and noisy on a shared VM: three times the runs for a stable median
    w.row.ms["eager"] = run.timed(lambda: run.adapter.encoder_eager_forward(w.inputs), 3 * run.iters)


def _packings(run: _Run, w: _Workload) -> None:
    """The manager under each packing policy, then with routing off (the router's other side: every fitting
    pack replays); its options are restored."""
    default = run.manager.options
    try:
        for packing in PACKINGS:
            run.manager.options = replace(default, packing=packing)
            w.row.packing[packing] = _measure(run.manager, w.inputs, run.iters, run.warmup, run.device)
            w.row.ms[f"vitcg_{packing}"] = w.row.packing[packing].pop("ms")
        run.manager.options = replace(default, route_eager=False)
        w.row.ms["vitcg_graphs"] = run.timed(lambda: run.manager.execute(w.inputs))
    finally:
        run.manager.options = default


def _inductor(run: _Run, w: _Workload) -> None:
    if run.inductor is None:
        return
    got = run.inductor.execute(w.inputs)
    w.row.max_rel_error = max(w.row.max_rel_error, relative_error(torch.cat(got), w.eager_out))
    w.row.ms["vitcg_inductor"] = run.timed(lambda: run.inductor.execute(w.inputs))


def _exact(run: _Run, w: _Workload) -> None:
    """On CUDA: a graph captured for this very input (the floor a budget graph can approach)."""
    if not run.cuda:
        return
    if run.spec.graph_scope:
        frames = sum(run.adapter.get_encoder_cudagraph_item_frames(w.inputs))
        exact = exact_scope_manager(run.adapter, w.items, frames, str(run.device), run.dtype)
        replay = lambda: torch.cat(exact.execute(w.inputs))  # noqa: E731
    else:
        exact = ExactGraph(run.adapter, w.inputs)
        exact.capture()
        replay = exact.replay
    w.row.ms["exact"] = run.timed(replay)
    w.row.max_rel_error = max(w.row.max_rel_error, relative_error(replay(), w.eager_out))


def _torch_compile(run: _Run, w: _Workload) -> None:
    """``torch.compile`` of the encoder method: its first call's time and its latency, or its error."""
    if run.compiled is None:
        return
    call = _eager_call(run.adapter, w.inputs, run.compiled)
    try:
        tic = time.perf_counter()
        call()
        torch.cuda.synchronize(run.device)
        w.row.compile_first_call_s = round(time.perf_counter() - tic, 2)
        w.row.ms["compile"] = run.timed(call)
    except Exception as exc:  # a compiler failure is a result to report, not a reason to stop
        w.row.compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        run.log(f"  {w.name}: torch.compile failed: {w.row.compile_error}")


STAGES: tuple[Callable[[_Run, _Workload], None], ...] = (_roofline, _compare, _eager, _packings, _inductor, _exact,
                                                         _torch_compile)
"""What each workload measures, in order (the eager output every stage compares with is taken first)."""


def _log_row(run: _Run, row: WorkloadResult) -> None:
    run.log(f"  {row.workload:<12} {row.tokens:>6} tokens  " + "  ".join(f"{k} {v:.2f}" for k, v in row.ms.items())
            + " ms  " + "  ".join(f"{p}: {d['budgets']} waste {d['padding_waste']:.0%} host/replay "
                                  f"{d['host_ms_per_replay']:.3f} ms" for p, d in row.packing.items())
            + f"  err {row.max_rel_error:.1e}" + (f"  floor {row.floor_ms:.2f} ms" if row.floor_ms else ""))


PACKINGS = ("tight", "greedy")  # the default first


def _measure(manager: EncoderCudaGraphManager, inputs, iters: int, warmup: int, device: torch.device) -> dict:
    """Latency of ``manager.execute`` plus what it did per call: replays, budgets, padding, host time."""
    before = manager.stats.as_dict()
    ms = timed(lambda: manager.execute(inputs), iters, warmup, device)
    after = manager.stats.as_dict()
    calls = iters + warmup
    padded = after["padded_tokens"] - before["padded_tokens"]
    used = after["used_tokens"] - before["used_tokens"]
    replays = (after["replays"] - before["replays"]) // calls
    return {
        "ms": ms,
        "replays": replays,
        "budgets": sorted(b for b, n in after["replays_per_budget"].items()
                          if n > before["replays_per_budget"].get(b, 0)),
        "eager_items": (after["misses"] - before["misses"]) // calls,
        "padding_waste": round(padded / (padded + used), 4) if padded + used else 0.0,
        "host_ms_per_replay": round((after["host_seconds"] - before["host_seconds"]) * 1e3 / calls / max(replays, 1), 4),
        "wall_ms_per_replay": _host_ms(manager, inputs, iters, device, replays),
    }


def _eager_call(adapter: SpecAdapter, inputs: Mapping[str, torch.Tensor], fn: Callable) -> Callable[[], Any]:
    """``fn`` (the encoder method, maybe compiled) called exactly as the eager path calls it."""
    calls = adapter.eager_calls(inputs)

    def run():
        with torch.no_grad():
            return [fn(**kwargs) for kwargs in calls]
    return run


def _host_ms(manager: EncoderCudaGraphManager, inputs, iters: int, device: torch.device, replays: int) -> float:
    """Host wall time of the whole ``execute`` per replay (graph launches included), GPU idle at each start."""
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tic = time.perf_counter()
        manager.execute(inputs)
        samples.append((time.perf_counter() - tic) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round(statistics.median(samples) / max(replays, 1), 4)


def environment(device: str) -> dict[str, str]:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "device": "cpu (" + (platform.processor() or platform.machine()) + ")"}
    if device.startswith("cuda"):
        info["device"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda or ""
    return info


@dataclass
class BenchRun:
    document: dict[str, Any]
    """The results document: date, command, environment, workloads, and one entry per spec (its results, or
    ``{"spec", "error"}`` when it failed)."""
    failed: list[str] = field(default_factory=list)


def run_bench(specs: Sequence[Spec], *, workloads: Sequence[str], device: str, command: str,
              json_out: Path | None = None, log: Callable[[str], None] = print,
              warn: Callable[[str], None] = print, **options: Any) -> BenchRun:
    """:func:`bench_spec` for every spec (``options`` are its keyword arguments). One spec's failure is a
    result: the others still run and the document says what broke. With ``json_out`` the document is
    written after every spec, so a run cut short keeps what it measured."""
    results: list[dict] = []
    if options.pop("roofline", False):
        options["ceilings"] = measure_ceilings(device)
        log(f"ceilings: matmul {options['ceilings'].matmul_tflops:.1f} TFLOP/s, copy {options['ceilings'].copy_tb_s:.2f} TB/s")
    run = BenchRun({"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "command": command,
                    "environment": environment(device),
                    "workloads": {k: dataclasses.asdict(v) for k, v in WORKLOADS.items()}, "specs": results})
    if options.get("ceilings") is not None:
        run.document["ceilings"] = dataclasses.asdict(options["ceilings"])
    for number, spec in enumerate(specs, 1):
        log(f"[{number}/{len(specs)}] {spec.name}")
        try:
            results.append(dataclasses.asdict(bench_spec(spec, workloads=workloads, device=device, log=log,
                                                         **options)))
        except (VitcgError, RuntimeError, ValueError, TypeError, ImportError) as exc:
            run.failed.append(spec.name)
            results.append({"spec": spec.name, "error": f"{type(exc).__name__}: {exc}"})
            warn(f"  {spec.name} failed: {results[-1]['error']}")
        finally:
            release(device)
        if json_out is not None:
            # Atomic: a run killed while writing keeps the previous spec's complete document.
            write_text_atomic(json_out, json.dumps(run.document, indent=2) + "\n")
    return run


PLOT_STYLES = {"eager": ("o-", "tab:blue"), "compile": ("s--", "tab:orange"), "vitcg_greedy": ("^-", "tab:olive"),
               "vitcg_tight": ("v-", "tab:green"), "vitcg_inductor": ("d-", "tab:purple"),
               "exact": ("x:", "tab:red")}
"""The line style and colour of each method in :func:`plot`."""


def _plot_spec(ax: Any, spec: dict) -> None:
    """One spec's panel: a line per method measured, and the roofline floor where it was measured."""
    rows = sorted(spec["workloads"], key=lambda r: r["tokens"])
    for method, (style, color) in PLOT_STYLES.items():
        points = [(r["tokens"], r["ms"][method]) for r in rows if method in r["ms"]]
        if points:
            ax.plot(*zip(*points), style, color=color, label=method)
    floors = [(r["tokens"], r["floor_ms"]) for r in rows if r.get("floor_ms")]
    if floors:
        ax.plot(*zip(*floors), "k--", label="roofline floor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"{spec['spec']} ({spec['size']}, {spec['dtype']})")
    ax.set_xlabel("output tokens in the batch")
    ax.set_ylabel("median latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def plot(results: list[dict], path: str) -> None:
    """Latency against input tokens per spec, one line per method (log-log); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in results if r.get("workloads")]  # failed specs carry only an error
    if not results:
        raise ValueError("no measured workloads to plot")
    count = len(results)
    cols = min(count, 3)
    fig, axes = plt.subplots(math.ceil(count / cols), cols, figsize=(5 * cols, 4 * math.ceil(count / cols)),
                             squeeze=False)
    for ax, spec in zip(axes.flat, results):
        _plot_spec(ax, spec)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    write_bytes_atomic(path, png.getvalue())
