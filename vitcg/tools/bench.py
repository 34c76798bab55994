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

from ..errors import InputError, VitcgError
from ..lang.catalogue import buffer_names
from ..lang.model import Spec
from ..runtime.adapter import SpecAdapter, adapter_for
from ..runtime.compile_cache import capture_compiled
from ..runtime.graphs import capture_graph
from ..runtime.manager import EncoderCudaGraphManager
from ..runtime.timing import timed
from .encoders import build_encoder, release
from .files import write_bytes_atomic, write_text_atomic
from .roofline import Ceilings, forward_flops, measure_ceilings, weight_bytes
from .workloads import WORKLOADS, make_inputs, on_device, relative_error


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
            self.values[buffer.name] = (buffer.value.evaluate(names) if value is None
                                        else value.to(adapter.device).clone())
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
        inductor = EncoderCudaGraphManager(adapter_for(spec, module, compile_forward=True), **limits,
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
    roofline floor."""
    torch_device = torch.device(device)
    cuda = torch_device.type == "cuda"
    module = build_encoder(spec, size, device=device, dtype=dtype)
    adapter = adapter_for(spec, module)
    limits = {"max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
              "token_budgets": list(token_budgets) if token_budgets else None}
    manager = EncoderCudaGraphManager(adapter, **limits, device=device, dtype=dtype)
    report = manager.capture()
    default = manager.options
    result = SpecBench(spec.name, size, str(dtype).removeprefix("torch."), list(manager.budgets),
                       manager.plan.max_items, round(report.seconds, 3), round(report.pool_bytes / 2**20, 1),
                       round(sum(p.numel() for p in module.parameters()) / 1e6, 1),
                       {b: round(ms, 3) for b, ms in report.replay_ms.items()})
    log(f"{spec.name}: {len(manager.budgets)} budgets captured in {report.seconds:.1f} s, "
        f"pool {result.pool_mib:.0f} MiB")
    compiled = inductor = None
    if compile_eager and cuda:
        compiled = torch.compile(getattr(module, spec.encoder.method), mode="reduce-overhead")
        inductor = _inductor_manager(spec, module, limits, device, dtype, result, log)
    generator = torch.Generator().manual_seed(0)
    for name in workloads:
        workload = WORKLOADS[name]
        cpu_inputs = make_inputs(adapter, workload, generator)
        if cpu_inputs is None:
            result.skipped.append(name)
            missing = [m for m, entries in (("image", workload.images), ("video", workload.videos))
                       if entries and spec.modality(m) is None]
            log(f"  {name:<12} skipped: {spec.name} has no {' or '.join(missing)} modality")
            continue
        inputs = on_device(adapter, cpu_inputs, dtype)
        items = adapter.get_encoder_cudagraph_item_specs(inputs)
        row = WorkloadResult(name, workload.description, len(items), sum(i.output_tokens for i in items))
        eager_out = adapter.encoder_eager_forward(inputs)
        if ceilings is not None:
            flops = forward_flops(lambda inputs=inputs: adapter.encoder_eager_forward(inputs))
            row.gflops = round(flops / 1e9, 2)
            row.floor_ms = round(ceilings.floor_ms(flops, weight_bytes(module)), 3)
        got = torch.cat(manager.execute(inputs))
        if got.shape != eager_out.shape:
            raise InputError(f"{spec.name}, workload {name}: manager output {tuple(got.shape)} but eager output "
                             f"{tuple(eager_out.shape)}; check the spec's items.output_tokens formula and its "
                             f"merge geometry (vitcg check {spec.name} names the item)")
        row.max_rel_error = relative_error(got, eager_out)
        # eager is host-bound and noisy on a shared VM: three times the runs for a stable median
        row.ms["eager"] = timed(lambda inputs=inputs: adapter.encoder_eager_forward(inputs), 3 * iters, warmup, torch_device)
        for packing in PACKINGS:
            manager.options = replace(default, packing=packing)
            row.packing[packing] = _measure(manager, inputs, iters, warmup, torch_device)
            row.ms[f"vitcg_{packing}"] = row.packing[packing].pop("ms")
        manager.options = replace(default, route_eager=False)  # the router's other side: every fitting pack replays
        row.ms["vitcg_graphs"] = timed(lambda inputs=inputs: manager.execute(inputs), iters, warmup, torch_device)
        manager.options = default
        if inductor is not None:
            got = inductor.execute(inputs)
            row.max_rel_error = max(row.max_rel_error, relative_error(torch.cat(got), eager_out))
            row.ms["vitcg_inductor"] = timed(lambda inputs=inputs: inductor.execute(inputs), iters, warmup, torch_device)
        if cuda:
            if spec.graph_scope:
                exact = exact_scope_manager(adapter, items, sum(adapter.get_encoder_cudagraph_item_frames(inputs)),
                                            device, dtype)
                run_exact = lambda exact=exact, inputs=inputs: torch.cat(exact.execute(inputs))  # noqa: E731
            else:
                exact = ExactGraph(adapter, inputs)
                exact.capture()
                run_exact = exact.replay
            row.ms["exact"] = timed(run_exact, iters, warmup, torch_device)
            row.max_rel_error = max(row.max_rel_error, relative_error(run_exact(), eager_out))
            del exact, run_exact
        if compiled is not None:
            call = _eager_call(adapter, inputs, compiled)
            try:
                tic = time.perf_counter()
                call()
                torch.cuda.synchronize(torch_device)
                row.compile_first_call_s = round(time.perf_counter() - tic, 2)
                row.ms["compile"] = timed(call, iters, warmup, torch_device)
            except Exception as exc:  # a compiler failure is a result to report, not a reason to stop
                row.compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                log(f"  {name}: torch.compile failed: {row.compile_error}")
        log(f"  {name:<12} {row.tokens:>6} tokens  " + "  ".join(f"{k} {v:.2f}" for k, v in row.ms.items())
            + " ms  " + "  ".join(f"{p}: {d['budgets']} waste {d['padding_waste']:.0%} host/replay "
                                  f"{d['host_ms_per_replay']:.3f} ms" for p, d in row.packing.items())
            + f"  err {row.max_rel_error:.1e}" + (f"  floor {row.floor_ms:.2f} ms" if row.floor_ms else ""))
        result.workloads.append(row)
    return result


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
    styles = {"eager": ("o-", "tab:blue"), "compile": ("s--", "tab:orange"), "vitcg_greedy": ("^-", "tab:olive"),
              "vitcg_tight": ("v-", "tab:green"), "vitcg_inductor": ("d-", "tab:purple"), "exact": ("x:", "tab:red")}
    for ax, spec in zip(axes.flat, results):
        rows = sorted(spec["workloads"], key=lambda r: r["tokens"])
        for method, (style, color) in styles.items():
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
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    write_bytes_atomic(path, png.getvalue())
