"""The vLLM plugin's encoder path against the stock Transformers backend's (issue 38 item 4, issue 41 item 3).

vLLM cannot be installed on the GPU machine, so the engine side is the protocol consumer the tests use
(tests/engine/vllm_consumer.py: capture per budget, pack, select, replay, as vLLM 0.33.0's manager calls the
model) and the backend is its stand-in (tests/engine/backend_standin.py), around a whole VLM built from each spec
with seeded random weights: with ``--size real`` the tower has a checkpoint's dimensions (``tests.real_config``)
and the language model stays tiny (it takes no part in encoding). The batches are the VLM's own image
processor's outputs for the bench workloads (vitcg/tools/sizes.py, plus 8x448), laid out as the backend hands
them to ``embed_multimodal``; a workload of images and a video is two calls, one per modality, as vLLM's runner
makes them (videos are composed from frames through the image processor, vitcg.tools.check.vlm.compose_videos).

One process (default): per model and workload, the stock backend's ``embed_multimodal(**batch)`` against the
plugin's path (its protocol members driven by the consumer; under real CUDA graph capture on CUDA), timed in
turn: wall time of the workload's calls, CUDA-synchronized, median of ``--iters`` after warm-up. Each item of the
plugin's path is compared with the stock item. The plugin's path is its default: on CUDA its graphs hold the
tower's repeated blocks compiled by inductor (``VITCG_COMPILE_BLOCKS``), loaded from the persistent compile cache
when an earlier run stored them, and its router sends a call to the eager forward where that is measured cheaper
than the replays (``vitcg.vllm_plugin.routing``; a row's misses are its items run eagerly); its capture time,
compilation included, is in ``capture_s``, and what the router measured in ``plugin_router``. ``--plain`` adds the
plugin's path with the tower's own blocks (``VITCG_COMPILE_BLOCKS=0``), capture time in ``plain_capture_s``.

``--ranks 2``: two processes, one GPU each (NCCL; gloo on the CPU), the plugin's path on each rank.
"replicated": every rank encodes the whole batch (vLLM's backend under tensor parallelism, where every rank runs
the whole tower); "data-parallel": the items are load-balanced over the ranks by input size (the consumer's
reading of vLLM's ``--mm-encoder-tp-mode data``), each rank encodes its share, the rows are all-gathered (padded
to the largest share) and put back in item order. Time per batch: the slowest rank's, median of ``--iters``.
Every gathered item is compared with the replicated one on rank 0. The plugin's data-parallel bookkeeping (one
check of the gather width per modality, at its first batch) is not per batch and is left out.

Equality. float32 (TF32 off): each item's relative error ``||got - want|| / ||want||`` <= 1e-5 against the
baseline (the stock item; with ``--ranks``, the replicated item). bfloat16: both sides are judged against a
float32 reference (the stock backend on the float32 model, before the cast): an item is equal when its error is
at most BF16_FACTOR (2) times the baseline's own error (and at most 1e-5 where that is smaller). Exit status 1 on
any inequality, else 0: a model that cannot be built or a workload it has no modality for prints one line why and
is skipped; a model the plugin declines (a graph-scoped spec: hunyuan_vl, pixtral) prints the plugin's reason and
is timed on the stock backend alone; a path whose graphs turned off (the plugin's fail-safe: the stock path then
answers, so its rows measure nothing of the plugin) is marked GRAPHS OFF.

Usage (GPU machine, repository root):
  python benchmarks/plugin_encode.py qwen2_vl qwen3_vl glm4v hunyuan_vl pixtral --iters 10 --json OUT.json
  python benchmarks/plugin_encode.py qwen2_vl qwen3_vl --ranks 2 --workload 8x448 --workload mixed --json OUT.json
On a CPU, end to end with tiny towers: add ``--device cpu --size tiny --dtype float32 --iters 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "engine")]  # this checkout's vitcg; the tests' consumer and stand-in

from backend_standin import BackendStandIn, plugged  # noqa: E402
from vllm_consumer import ProtocolConsumer  # noqa: E402

from vitcg.lang import SpecSource  # noqa: E402
from vitcg.runtime.engine import engine_config  # noqa: E402
from vitcg.tools.check.vlm import backend_batches, build_vlm, no_tf32  # noqa: E402
from vitcg.tools.sizes import WORKLOADS as BENCH_WORKLOADS  # noqa: E402
from vitcg.tools.sizes import Workload  # noqa: E402
from vitcg.tools.workloads import relative_error  # noqa: E402

MODELS = ["qwen2_vl", "qwen3_vl", "glm4v", "hunyuan_vl", "pixtral"]
WORKLOADS = {**BENCH_WORKLOADS, "8x448": Workload("8x448", "eight 448x448 images", images=((448, 448),) * 8)}
DP_WORKLOADS = ["8x448", "mixed"]

REAL_PROCESSOR = {
    "hunyuan_vl": {},  # the tests' settings make 64-128 px images; the class defaults are HunyuanOCR's
    "pixtral": {"patch_size": {"height": 28, "width": 28}, "size": {"longest_edge": 1540}},  # Mistral Small 3.1:
    # 14 px patches merged 2x2 (the processor rounds to patch x merge), 1540 px
}
"""Image processor settings at real size where the spec's ``tests.vlm.processor`` holds tiny ones; every other
model keeps the tests' settings (none, or Qwen3-VL's 16 px patches), which are its checkpoint's."""

TOLERANCE = 1e-5
BF16_FACTOR = 2.0
"""bfloat16: how much larger than the baseline's own error (against the float32 reference) an item's may be."""
WARMUP = 5
"""Untimed rounds first: the first pack of the plugin's path runs the tower once more to learn its output layout,
and on CUDA its router learns (two timed replays per budget, then two eager calls of each size it explores, the
first of which compiles the eager forward's blocks): the rounds timed are the steady state."""


class Skip(Exception):
    """This model (or workload) cannot be measured here; the message says why."""


@dataclass
class Subject:
    """One model ready to measure: the VLM, the stock backend on it, and its batches per workload."""

    name: str
    spec: Any
    vlm: torch.nn.Module
    stock: BackendStandIn
    batches: dict[str, dict[str, dict[str, Any]]]
    """Workload -> modality -> the backend's batch, pixels on the device in the run's dtype."""
    reference: dict[str, dict[str, list[torch.Tensor]]] = field(default_factory=dict)
    """bfloat16 runs: workload -> modality -> the stock items of the float32 model."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Workload -> why it has no batch."""


@functools.cache
def spec_source() -> Any:
    return SpecSource([REPO / "vitcg" / "specs"], bindings=False)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def vitcg_log() -> Iterator[list[str]]:
    """The vitcg logger's messages (INFO and above) inside the block: why the plugin declined a model."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger, handler = logging.getLogger("vitcg"), Keep(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def on_device(batch: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The backend's batch as its runner passes it: pixels on the device in the model's dtype, the grid and the
    per-item counts kept on the host (the backend moves what the feature call needs)."""
    return {k: v.to(device, dtype if v.is_floating_point() else v.dtype) if k.startswith("pixel_values") else v
            for k, v in batch.items()}


def prepare(name: str, workloads: Sequence[str], args: argparse.Namespace, device: torch.device,
            reference: bool) -> Subject:
    """The model's VLM, float32 references where the run is bfloat16 (``reference``: on this process), then cast.
    Raises Skip when the model cannot be built here."""
    spec = spec_source()[name]
    if spec.unavailable:
        raise Skip(spec.unavailable)
    try:
        vlm = build_vlm(spec, device=str(device), seed=0, size=args.size)
    except Exception as exc:  # noqa: BLE001  (whatever stops the build is the line printed)
        raise Skip(f"the VLM cannot be built: {type(exc).__name__}: {exc}") from None
    dtype = getattr(torch, args.dtype)
    processor = REAL_PROCESSOR.get(name) if args.size == "real" else None
    subject = Subject(name, spec, vlm, BackendStandIn(vllm_config=SimpleNamespace(vlm=vlm)), {})
    host: dict[str, dict[str, dict[str, Any]]] = {}
    for w in workloads:
        workload = WORKLOADS[w]
        try:
            host[w] = backend_batches(spec, vlm, images=workload.images, videos=workload.videos, processor=processor)
        except Exception as exc:  # noqa: BLE001  (a modality the model lacks, a processor it cannot build here)
            subject.skipped[w] = f"no backend batch: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    if reference and dtype != torch.float32:
        with torch.inference_mode(), no_tf32():
            subject.reference = {w: {m: subject.stock.embed_multimodal(**on_device(b, device, torch.float32))
                                     for m, b in batches.items()} for w, batches in host.items()}
    vlm.to(dtype)
    subject.batches = {w: {m: on_device(b, device, dtype) for m, b in batches.items()} for w, batches in host.items()}
    return subject


def plugin_path(subject: Subject, args: argparse.Namespace, device: torch.device,
                plain: bool = False) -> tuple[ProtocolConsumer, Any, float]:
    """The plugin's members on the stand-in, their profiling call (vLLM's runner makes one before capture, which
    is where the plugin checks that its spec reads the backend's batches) and the consumer's capture: ``(consumer,
    model, capture seconds)``. Raises Skip with the plugin's own line when it declines the model."""
    with vitcg_log() as lines:
        model = plugged(subject.vlm)
        if plain and getattr(type(model), "supports_encoder_cudagraph", False):
            model._vitcg.compile_forward = False  # before its first use builds the adapter
        first = next((b for batches in subject.batches.values() for b in batches.values()), None)
        if first is not None and getattr(type(model), "supports_encoder_cudagraph", False):
            with torch.inference_mode():
                model.embed_multimodal(**first)
    if not getattr(type(model), "supports_encoder_cudagraph", False):
        raise Skip(f"the plugin declines: {lines[-1] if lines else 'no reason logged'}")
    dtype = getattr(torch, args.dtype)
    consumer = ProtocolConsumer(engine_limits(subject.spec, args.size, args.plan), device, dtype, model,
                                cuda_graphs=device.type == "cuda")
    start = time.perf_counter()
    consumer.capture()
    synchronize(device)
    return consumer, model, time.perf_counter() - start


def engine_limits(spec: Any, size: str, plan: bool = False) -> Any:
    """The engine's settings: at real size vLLM's defaults (8192 batched tokens, the auto ladder and item cap, as
    ``vitcg bench``), or with ``plan`` the budgets, items and frames per batch that ``vitcg plan NAME --manager
    vllm`` prints for the bench workloads (what the README tells a vLLM user to pass); tiny, the spec's test
    budgets and 8 items a pack (as tests/engine)."""
    if size != "real":
        return engine_config(1 << 14, 1 << 14, token_budgets=list(spec.tests.budgets), max_items_per_batch=8)
    if not plan:
        return engine_config(8192, 32768)
    config = planned_config(spec.name)
    return engine_config(8192, 32768, token_budgets=config["encoder_cudagraph_token_budgets"],
                         max_items_per_batch=config["encoder_cudagraph_max_vision_items_per_batch"],
                         max_frames_per_batch=config.get("encoder_cudagraph_max_frames_per_batch"))


@functools.cache
def planned_config(name: str) -> dict[str, Any]:
    """The ``compilation_config`` that ``vitcg plan NAME --manager vllm`` prints (planned once per model: the plain
    and the compiled path of a model share it)."""
    done = subprocess.run([sys.executable, "-m", "vitcg", "plan", name, "--manager", "vllm", "--json"],
                          capture_output=True, text=True, check=True)
    config = json.loads(done.stdout)["compilation_config"]
    print(f"{name}: planned {json.dumps(config)}", flush=True)
    return config


def judge(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
          reference: Sequence[torch.Tensor] | None) -> tuple[bool, float, float | None]:
    """``(equal, largest error of got, largest error of want)``, item by item: float32, got against want (want's
    error None); bfloat16 (a float32 ``reference``), each against the reference, got's error at most BF16_FACTOR
    times want's (and at most TOLERANCE where that is larger)."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        return False, float("inf"), None
    finite = all(bool(torch.isfinite(g).all()) for g in got)
    if reference is None:
        errors = [relative_error(g, w) for g, w in zip(got, want)]
        return finite and max(errors, default=0.0) <= TOLERANCE, max(errors, default=0.0), None
    mine = [relative_error(g, r) for g, r in zip(got, reference)]
    theirs = [relative_error(w, r) for w, r in zip(want, reference)]
    equal = finite and all(m <= max(BF16_FACTOR * t, TOLERANCE) for m, t in zip(mine, theirs))
    return equal, max(mine, default=0.0), max(theirs, default=0.0)


def flat(per_modality: Mapping[str, Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    return [item for items in per_modality.values() for item in items]


def medians(calls: Mapping[str, Callable[[], Any]], iters: int, timer: Callable[[Callable[[], Any]], float]
            ) -> dict[str, float]:
    """Median ms of each call, measured in turn round by round (drift hits all alike), after WARMUP rounds."""
    times: dict[str, list[float]] = {key: [] for key in calls}
    for round_ in range(WARMUP + iters):
        for key, call in calls.items():
            ms = timer(call)
            if round_ >= WARMUP:
                times[key].append(ms)
    return {key: statistics.median(values) for key, values in times.items()}


def wall_ms(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    def timer(call: Callable[[], Any]) -> float:
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        return (time.perf_counter() - start) * 1e3
    return timer


# one process: the stock backend against the plugin's path

def measure_gain(subject: Subject, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The model's rows: per workload the stock and plugin times, hits, errors and equality."""
    consumer, model, capture_s = plugin_path(subject, args, device)
    result: dict[str, Any] = {"budgets": consumer.budgets, "max_items": consumer.max_batch_size,
                              "capture_s": round(capture_s, 2), "workloads": {}}
    paths = {"plugin": consumer}
    result["compiled_blocks"] = model._vitcg.adapter.compiles
    if args.plain:
        try:
            plain, _, result["plain_capture_s"] = plugin_path(subject, args, device, plain=True)
            paths["plain"] = plain
        except Exception as exc:  # noqa: BLE001  (a failure is a result)
            result["plain_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"{subject.name}: plain blocks failed: {result['plain_error']}", flush=True)
    for w, batches in subject.batches.items():
        calls: dict[str, Callable[[], Any]] = {
            "stock": lambda batches=batches: {m: subject.stock.embed_multimodal(**b) for m, b in batches.items()},
            **{key: lambda path=path, batches=batches: {m: path.execute(b) for m, b in batches.items()}
               for key, path in paths.items()}}
        with torch.inference_mode():
            ms = medians(calls, args.iters, wall_ms(device))
            want = flat(calls["stock"]())
            row: dict[str, Any] = {"items": len(want), "stock_ms": ms["stock"]}
            for key, path in paths.items():
                hits, misses = path.hits, path.misses
                got = flat(calls[key]())
                equal, error, stock_error = judge(got, want, flat(subject.reference[w]) if subject.reference else None)
                row.update({f"{key}_ms": ms[key], f"{key}_gain": ms["stock"] / ms[key], f"{key}_hits": path.hits - hits,
                            f"{key}_misses": path.misses - misses, f"{key}_max_rel_err": error, f"{key}_equal": equal})
                if stock_error is not None:
                    row["stock_max_rel_err"] = stock_error
                off = path.model._vitcg.off
                if off is not None:
                    row[f"{key}_off"] = off
        result["workloads"][w] = row
        print(gain_line(subject.name, w, row, list(paths)), flush=True)
    for key, path in paths.items():
        result[f"{key}_router"] = path.model._vitcg.router.describe()
    return result


def gain_line(name: str, workload: str, row: Mapping[str, Any], paths: Sequence[str]) -> str:
    text = f"{name:11s} {workload:11s} {row['items']:2d} items  stock {row['stock_ms']:8.2f} ms"
    for key in paths:
        text += (f"  {key} {row[f'{key}_ms']:8.2f} ms {row[f'{key}_gain']:5.2f}x"
                 f" (hits {row[f'{key}_hits']} misses {row[f'{key}_misses']},"
                 f" max rel err {row[f'{key}_max_rel_err']:.1e}, equal {'yes' if row[f'{key}_equal'] else 'NO'})")
        if f"{key}_off" in row:
            text += f"  GRAPHS OFF: {row[f'{key}_off']}"
    if "stock_max_rel_err" in row:
        text += f"  stock's own bf16 err {row['stock_max_rel_err']:.1e}"
    return text


def run_gain(args: argparse.Namespace, results: dict[str, Any]) -> bool:
    """Mode A over every model; whether every item was equal."""
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    equal = True
    workloads = args.workload or list(WORKLOADS)
    for name in args.models:
        subject = None
        try:
            with no_tf32() if args.dtype == "float32" else contextlib.nullcontext():
                subject = prepare(name, workloads, args, device, reference=True)
                for w, why in subject.skipped.items():
                    print(f"{name:11s} {w:11s} skipped: {why}", flush=True)
                try:
                    results["models"][name] = measure_gain(subject, args, device)
                except Skip as exc:
                    results["models"][name] = stock_only(subject, args, device, str(exc))
        except Skip as exc:
            results["models"][name] = {"skipped": str(exc)}
            print(f"{name}: skipped: {exc}", flush=True)
        except Exception as exc:  # noqa: BLE001  (one model's failure is a result; the others still run)
            results["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
        rows = results["models"][name].get("workloads", {}).values()
        equal &= all(v for row in rows for k, v in row.items() if k.endswith("_equal"))
        del subject
        release(device)
        write(args.json, results)
    return equal


def stock_only(subject: Subject, args: argparse.Namespace, device: torch.device, why: str) -> dict[str, Any]:
    """A model the plugin declines: its line, and the stock backend's times alone."""
    print(f"{subject.name}: {why}; stock backend only", flush=True)
    rows = {}
    with torch.inference_mode():
        for w, batches in subject.batches.items():
            ms = medians({"stock": lambda batches=batches: [subject.stock.embed_multimodal(**b) for b in batches.values()]},
                         args.iters, wall_ms(device))
            rows[w] = {"stock_ms": ms["stock"]}
            print(f"{subject.name:11s} {w:11s} stock {ms['stock']:8.2f} ms  (plugin declined)", flush=True)
    return {"declined": why, "workloads": rows}


# two ranks: replicated against data-parallel encoding, each through the plugin's path

def gather_rows(consumer: ProtocolConsumer, batch: Mapping[str, Any], rank: int, world: int, width: int,
                dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Data-parallel encoding of one batch: this rank's share of the items (load balance by input size) through
    the plugin's path, every rank's rows all-gathered (each share padded to the largest) and cut by the items'
    output tokens, as vLLM's manager gathers them. Returns every item of the batch in item order."""
    specs = consumer.model.get_encoder_cudagraph_item_specs(batch)
    shares = ProtocolConsumer.shares([s.input_size for s in specs], world)
    rows = [sum(specs[i].output_tokens for i in share) for share in shares]
    block = torch.zeros(max(rows), width, dtype=dtype, device=device)
    if shares[rank]:
        local = consumer.execute(consumer.select(batch, shares[rank])[0])
        block[:rows[rank]] = torch.cat([item.reshape(-1, width) for item in local])
    gathered = [torch.empty_like(block) for _ in range(world)]
    dist.all_gather(gathered, block)
    items: dict[int, torch.Tensor] = {}
    for share, part, count in zip(shares, gathered, rows):
        items.update(zip(share, torch.split(part[:count], [specs[i].output_tokens for i in share])))
    return [items[i] for i in range(len(specs))]


def gatherable(consumer: ProtocolConsumer, batch: Mapping[str, Any], items: Sequence[torch.Tensor]) -> str | None:
    """Why vLLM could not gather these items by the spec's output tokens (each item must be that many rows of one
    width), or None. Every rank decides alike: the items are the replicated ones, equal on every rank."""
    specs = consumer.model.get_encoder_cudagraph_item_specs(batch)
    width = items[0].shape[-1]
    for index, (spec, item) in enumerate(zip(specs, items)):
        if item.numel() != spec.output_tokens * width:
            return f"item {index} is {tuple(item.shape)}, not {spec.output_tokens} rows of {width}"
    return None


def rank_ms(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """Wall time of a call on every rank, started together (a barrier), the slowest rank's."""
    def timer(call: Callable[[], Any]) -> float:
        dist.barrier()
        ms = wall_ms(device)(call)
        slowest = torch.tensor([ms], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest.item())
    return timer


def measure_dp(subject: Subject, args: argparse.Namespace, device: torch.device, rank: int, world: int
               ) -> dict[str, Any]:
    """The model's rows on this rank (filled on rank 0): per workload the replicated and data-parallel times,
    errors and equality, and each rank's share of the items."""
    consumer, model, capture_s = plugin_path(subject, args, device)
    result: dict[str, Any] = {"budgets": consumer.budgets, "max_items": consumer.max_batch_size,
                              "capture_s": round(capture_s, 2), "workloads": {}}
    for w, batches in subject.batches.items():
        with torch.inference_mode():
            replicated = {m: consumer.execute(b) for m, b in batches.items()}
            why = next((f"{m}: {r}" for m, b in batches.items() if (r := gatherable(consumer, b, replicated[m]))), None)
            if why is not None:
                result["workloads"][w] = {"skipped": f"the rows cannot be gathered by output tokens ({why})"}
                if rank == 0:
                    print(f"{subject.name:11s} {w:11s} skipped: {result['workloads'][w]['skipped']}", flush=True)
                continue
            rows = {m: (items[0].shape[-1], items[0].dtype) for m, items in replicated.items()}  # width, dtype

            def data_parallel(batches=batches, rows=rows) -> dict[str, list[torch.Tensor]]:
                return {m: gather_rows(consumer, b, rank, world, *rows[m], device) for m, b in batches.items()}
            ms = medians({"replicated": lambda batches=batches: {m: consumer.execute(b) for m, b in batches.items()},
                          "dp": data_parallel}, args.iters, rank_ms(device))
            shared = data_parallel()
        if rank != 0:
            continue
        reference = flat(subject.reference[w]) if subject.reference else None
        equal, error, replicated_error = judge(flat(shared), flat(replicated), reference)
        sizes = {m: [s.input_size for s in consumer.model.get_encoder_cudagraph_item_specs(b)]
                 for m, b in batches.items()}
        row = {"items": len(flat(replicated)), "replicated_ms": ms["replicated"], "dp_ms": ms["dp"],
               "gain": ms["replicated"] / ms["dp"], "max_rel_err": error, "equal": equal,
               "shares": {m: ProtocolConsumer.shares(s, world) for m, s in sizes.items()}}
        if replicated_error is not None:
            row["replicated_max_rel_err"] = replicated_error
        if model._vitcg.off is not None:
            row["off"] = model._vitcg.off
        result["workloads"][w] = row
        print(f"{subject.name:11s} {w:11s} {row['items']:2d} items  replicated {row['replicated_ms']:8.2f} ms  "
              f"data-parallel {row['dp_ms']:8.2f} ms  {row['gain']:5.2f}x  max rel err {error:.1e}"
              + (f" (replicated's own {replicated_error:.1e})" if replicated_error is not None else "")
              + f"  equal {'yes' if equal else 'NO'}" + (f"  GRAPHS OFF: {row['off']}" if "off" in row else ""),
              flush=True)
    return result


def dp_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One rank of ``--ranks``: every model through both encodings; rank 0 writes its results to ``out``."""
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=device if cuda else None)
    models: dict[str, Any] = {}
    if rank == 0:
        write(out, {"models": models})
    try:
        for name in args.models:
            subject = None
            try:  # a model that cannot be built, or that the plugin declines, does so on every rank alike
                with no_tf32() if args.dtype == "float32" else contextlib.nullcontext():
                    subject = prepare(name, args.workload or DP_WORKLOADS, args, device, reference=rank == 0)
                    if rank == 0:
                        for w, why in subject.skipped.items():
                            print(f"{name:11s} {w:11s} skipped: {why}", flush=True)
                    models[name] = measure_dp(subject, args, device, rank, world)
            except Skip as exc:
                models[name] = {"skipped": str(exc)}
                if rank == 0:
                    print(f"{name}: skipped: {exc}", flush=True)
            del subject
            release(device)
            if rank == 0:
                write(out, {"models": models})
    finally:
        dist.destroy_process_group()


def run_dp(args: argparse.Namespace, results: dict[str, Any]) -> bool:
    """Mode B: ``args.ranks`` processes; whether every item was equal."""
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        raise SystemExit(f"--ranks {args.ranks} needs {args.ranks} GPUs, this machine has {torch.cuda.device_count()}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (the GPU machine's rule), also in the ranks
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        mp.spawn(dp_rank, args=(args.ranks, port, args, out), nprocs=args.ranks, join=True)
        with open(out) as f:
            results["models"].update(json.load(f)["models"])
    write(args.json, results)
    rows = [row for model in results["models"].values() for row in model.get("workloads", {}).values()]
    return all(row.get("equal", True) for row in rows)


def write(path: str | None, results: Mapping[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=None, help=f"spec names (default: {' '.join(MODELS)}; with --ranks, "
                                                           "qwen2_vl qwen3_vl)")
    p.add_argument("--workload", action="append", choices=list(WORKLOADS),
                   help="repeatable (default: every bench workload and 8x448; with --ranks, 8x448 and mixed)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--size", choices=["real", "tiny"], default="real")
    p.add_argument("--iters", type=int, default=10, help="timed rounds per workload (default 10)")
    p.add_argument("--ranks", type=int, default=1, help="2: replicated against data-parallel encoding, one process "
                                                        "(and GPU) a rank")
    p.add_argument("--plain", action="store_true",
                   help="also the plugin's path with the tower's own blocks (VITCG_COMPILE_BLOCKS=0)")
    p.add_argument("--plan", action="store_true",
                   help="at real size, each model's budgets, items and frames per batch from `vitcg plan NAME --manager "
                        "vllm` (the bench workloads) instead of vLLM's default ladder")
    p.add_argument("--json", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.models is None or not args.models:
        args.models = ["qwen2_vl", "qwen3_vl"] if args.ranks > 1 else MODELS
    import transformers

    results = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if args.device == "cuda"
               else "cpu", "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
               "size": args.size, "iters": args.iters, "ranks": args.ranks, "planned": args.plan,
               "equality": (f"float32: relative error <= {TOLERANCE:g}" if args.dtype == "float32" else
                            f"bfloat16: error against the float32 reference <= {BF16_FACTOR:g}x the baseline's"),
               "models": {}}
    equal = run_dp(args, results) if args.ranks > 1 else run_gain(args, results)
    off = [f"{name} {w}" for name, model in results["models"].items() for w, row in model.get("workloads", {}).items()
           if any(key == "off" or key.endswith("_off") for key in row)]
    if off:
        print(f"GRAPHS OFF (the stock path answered; these rows measure nothing of the plugin): {', '.join(off)}",
              flush=True)
    print("every item equal" if equal else "INEQUALITY: some items differ (see the lines marked NO)", flush=True)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
