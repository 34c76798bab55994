"""Packed (varlen) attention on the GPU: which kernel serves vitcg's budget graphs fastest, in TFLOP/s.

Times one layer's attention (16 heads; every head dim of the packaged specs at real size, 64 to 224) over the
packed rows of the bench workloads, with the segment lengths qwen2_vl's processor gives them (patch 14, merge 2:
1x224, 1x448, 8x224, the mixed batch's eight images, a 4-frame 448x448 video, image+video) and generate_ttft.py's
mixed3, each padded to its budget's rows as the adapter pads them. q and k are contiguous and v a strided view of
a fused projection, as the towers hand them over. Every backend runs eagerly and, where it can, replayed in a CUDA
graph after the boundaries in ``cu_seqlens`` were changed in place (a budget graph's boundaries are replay
inputs); each output is compared with a float32 reference computed per segment. bf16 tolerance: relative
Frobenius error <= 1e-2 (bf16 kernels measured 2.3e-3 to 2.5e-3 on 2026-11-25). TFLOP/s counts the real
segments' work only (4 * heads * dim * sum of squared lengths), over the graph replay's time (eager where a
backend has no graph).

Backends:
- ``flash_*``: torch's ``varlen_attn`` (FlashAttention-2) with ``max_seqlen`` at the budget's rows (what a graph
  fixes at capture), at the largest item qwen2_vl's released processors make (5120 patches), and at the
  workload's real maximum (a lower bound on what a tighter ``max_seqlen`` could give).
- ``flex_*``: compiled FlexAttention with a block mask built on the device from ``cu_seqlens`` (no host sync),
  in several kernel configurations (``--flex-dims`` only: each compiles per shape).
- ``cudnn_segments`` / ``flash_segments``: one dense SDPA call per segment with the cuDNN or flash backend, bounds
  read on the host; a graph of it replays fixed bounds only, so its replay time is the kernel time of the
  per-image path torch.compile runs, not a path a budget graph can take: the per-segment bar to reach.
- ``cudnn_buckets``: consecutive equal-length segments (frames, equal tiles) batched into one cuDNN call on a
  view of the packed rows; fixed composition, as above.
- ``triton_m*``: vitcg's segment-block kernel (``vitcg/runtime/varlen_triton.py``: head dim split 64 + 16 rather
  than padded to 128, boundaries read on the device, row blocks that never span segments) in several block
  configurations; the runtime runs it for calls of at most 64 segment slots.
- ``triton_runtime``: what the runtime runs at the head dim (its configuration).
- ``triton_spanning``: the spanning-block kernel (the runtime's only kernel until 2026-12-02, now for calls of more
  slots) at the configuration the runtime chooses for the head dim.
- ``cudnn_ragged``: cuDNN's ragged attention with sequence offsets, ``max_seqlen`` at the workload's real
  maximum (eager only: its capture was invalidated on 2026-11-25); ``cudnn_ragged_fixed``: the same with
  ``max_seqlen`` fixed at the budget's rows, as a graph would fix it (eager, then a capture attempted last of the
  run, ``--ragged-graph``, since an invalidated capture can spoil the process).

Usage (GPU machine, repository root): python benchmarks/attention_backends.py [--json OUT] [--skip-flex]
[--only PREFIX,...] [--dims 80,72,...] [--cases mixed,...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitcg.runtime.timing import timed

HEADS = 16
DIMS = (80, 72, 64, 128, 224, 88, 96, 104)
"""Every head dim of the packaged specs' towers at real size (tests/gpu/test_packed_attention_gpu.py lists them
from the specs), Qwen2-VL's 80 and Qwen3-VL's 72 first."""
SLOTS = 34
"""qwen2_vl's cu_seqlens capacity: min(max_items + max_frames, 32) + 2 offsets."""
ITEM_CAP = 5120
"""Largest image qwen2_vl's released preprocessor configs make: max_pixels 1003520 / 14**2 patches."""
TOLERANCE = 1e-2
FLEX_DIMS = (80, 72)
FLEX_CASES = ("mixed", "8x224", "image+video")


@dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]
    """Real segments (patch rows per image or frame pair), in pack order."""
    other: tuple[int, ...]
    """Segments a graph replays after capture (same real rows)."""
    rows: int
    """The budget's rows (output tokens * 4): the graph's static length."""


CASES = (
    Case("1x224", (256,), (128, 128), 256),
    Case("1x448", (1024,), (512, 512), 1024),
    Case("8x224", (256,) * 8, (1024, 512, 256, 256), 2048),
    Case("mixed", (1564, 3996, 2436, 936, 4784, 576, 1024, 1936), (1936, 1024, 576, 4784, 936, 2436, 3996, 1564),
         17408),
    Case("video4x448", (1024, 1024), (512, 1536), 2048),
    Case("image+video", (1564, 1024, 1024, 1024), (1024, 1024, 1024, 1564), 8192),
    Case("mixed3", (1564, 576, 4144), (4144, 1564, 576), 8192),  # generate_ttft.py's mixed3 at budget 2048
)
"""qwen2_vl's segment lengths for each bench workload (vitcg/tools/sizes.py; a video's frame pairs are one segment
each) and the rows of the budget the default ladder replays it at (mixed: the 4352 `vitcg plan` picks)."""


def tflops(case: Case, heads: int, dim: int, ms: float) -> float:
    """TFLOP/s of the real segments' two matrix products (4 * heads * dim * sum of squared lengths)."""
    return round(4 * heads * dim * sum(n * n for n in case.lengths) / (ms * 1e-3) / 1e12, 1)


def offsets(lengths: tuple[int, ...], rows: int, device) -> torch.Tensor:
    """``cu_seqlens`` as the adapter fills it: real segments, padding spread over the free slots (each padding
    segment at most ceil(P / free) rows), unused slots repeating the last offset."""
    pad = rows - sum(lengths)
    free = SLOTS - 1 - len(lengths)
    part = -(-pad // free) if pad else 0
    segs = list(lengths)
    while pad > 0:
        segs.append(min(part, pad))
        pad -= segs[-1]
    cu = [0]
    for s in segs:
        cu.append(cu[-1] + s)
    cu += [rows] * (SLOTS - len(cu))
    return torch.tensor(cu, dtype=torch.int32, device=device)


def reference(q, k, v, bounds: list[int], scale: float) -> torch.Tensor:
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            seg = (t[a:b].transpose(0, 1)[None].float() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                out[a:b] = F.scaled_dot_product_attention(*seg, scale=scale)[0].transpose(0, 1)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("nan")
    return round(((out - ref).norm() / ref.norm()).item(), 5)


def flash(max_len: Callable[[list[int], int], int]):
    from torch.nn.attention.varlen import varlen_attn

    def run(q, k, v, cu, bounds, scale):
        n = max_len(bounds, q.shape[0])
        return varlen_attn(q, k, v, cu, cu, n, n, scale=scale)
    return run


def segments(backend: SDPBackend, buckets: bool = False):
    """Dense SDPA per segment (or per run of equal consecutive segments) on views of the packed rows."""
    def run(q, k, v, cu, bounds, scale):
        heads, dim = q.shape[1:]
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        runs: list[tuple[int, int, int]] = []  # (start, length, count)
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b <= a:
                continue
            if buckets and runs and runs[-1][1] == b - a and runs[-1][0] + runs[-1][1] * runs[-1][2] == a:
                runs[-1] = (runs[-1][0], b - a, runs[-1][2] + 1)
            else:
                runs.append((a, b - a, 1))
        with sdpa_kernel(backend):
            for a, n, c in runs:
                view = (t[a:a + n * c].unflatten(0, (c, n)).transpose(1, 2) for t in (q, k, v))
                out[a:a + n * c].view(c, n, heads, dim).copy_(
                    F.scaled_dot_product_attention(*view, scale=scale).transpose(1, 2))
        return out
    return run


def cudnn_ragged(fixed: bool):
    def run(q, k, v, cu, bounds, scale):
        n = q.shape[0] if fixed else max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
        q, k, v = (t.contiguous() for t in (q, k, v))
        return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, n, n, False, 0.0, False, False,
                                                       scale=scale)[0]
    return run


def mask_blocks(cu: torch.Tensor, rows: int, block: int = 128):
    """Block tables of a FlexAttention mask over the packed segments in ``cu``, and each row's segment (sync-free:
    shapes depend on ``rows`` only). A (q block, kv block) pair is skipped when their segment ranges do not
    overlap, computed without the mask when both lie inside one segment, and masked per element otherwise."""
    positions = torch.arange(rows, device=cu.device, dtype=cu.dtype)
    doc = torch.searchsorted(cu[1:].contiguous(), positions, right=True)
    starts = torch.arange(-(-rows // block), device=cu.device) * block
    first, last = doc[starts], doc[(starts + block - 1).clamp(max=rows - 1)]
    overlap = (first[None, :] <= last[:, None]) & (last[None, :] >= first[:, None])
    single = first == last
    full = overlap & single[:, None] & single[None, :] & (first[:, None] == first[None, :])
    tables = []
    for sel in (overlap & ~full, full):
        tables.append(sel.sum(-1, dtype=torch.int32)[None, None])
        tables.append(torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None, None])
    return (*tables, doc)


def document_block_mask(cu: torch.Tensor, rows: int, build=mask_blocks, block: int = 128):
    from torch.nn.attention.flex_attention import BlockMask

    *tables, doc = build(cu, rows, block)

    def same_segment(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    return BlockMask.from_kv_blocks(*tables, BLOCK_SIZE=block, mask_mod=same_segment, seq_lengths=(rows, rows),
                                    compute_q_blocks=False)


FLEX_VARIANTS = {
    "flex": {},
    "flex_m128_n64_w8": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8},
}
"""Kernel options per variant. torch 2.11 has no tuned default for head dim 80 on sm90 and takes (64, 64, 3
stages, 4 warps); (128, 64, 3, 8) is its sm90 choice for head dim 128. ``ROWS_GUARANTEED_SAFE`` is left off: the
run of 2026-11-26 gave NaN on the mixed batch with it (a row can meet a kv block where all its keys are masked).
The variants with 128x128 or 64x128 blocks and TMA measured no faster on 2026-11-26 and are no longer timed."""


def flex(options: dict):
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    build = torch.compile(mask_blocks, dynamic=False)

    def run(q, k, v, cu, bounds, scale):
        mask = document_block_mask(cu, q.shape[0], build)
        qkv = (t.transpose(0, 1)[None] for t in (q, k, v))
        return compiled(*qkv, block_mask=mask, scale=scale, kernel_options=dict(options))[0].transpose(0, 1)
    return run


def replay_ms(graph: torch.cuda.CUDAGraph, iters: int = 30) -> float:
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def inputs(case: Case, heads: int, dim: int, device):
    """q and k contiguous, v a strided view of one (rows, 3, heads, dim) projection, as a tower's fused qkv
    gives it (q and k come out of the rotary embedding contiguous)."""
    gen = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(case.rows, 3, heads, dim, device=device, dtype=torch.bfloat16, generator=gen)
    return qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2]


def in_graph(fn, case: Case, q, k, v, scale, new_bounds: bool) -> dict:
    """Capture ``fn`` on the case's boundaries, switch ``cu_seqlens`` (or, for host-bound backends, only the
    data) in place, replay, check and time the replay."""
    cu = offsets(case.lengths, case.rows, q.device)
    bounds = cu.tolist()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(q, k, v, cu, bounds, scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, k, v, cu, bounds, scale)
    if new_bounds:
        cu.copy_(offsets(case.other, case.rows, q.device))
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    err = rel_err(out, reference(q, k, v, cu.tolist(), scale))
    return {"graph_ms": round(replay_ms(graph), 4), "graph_rel_err": err,
            "graph_bounds": "new" if new_bounds else "fixed at capture"}


def measure(name: str, fn, new_bounds: bool, case: Case, q, k, v, ref, scale, iters: int,
            graph: bool = True) -> dict:
    cu = offsets(case.lengths, case.rows, q.device)
    bounds = cu.tolist()
    row: dict = {}
    try:
        tic = time.perf_counter()
        out = fn(q, k, v, cu, bounds, scale)
        torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - tic, 2)
        row["rel_err"] = rel_err(out, ref)
        row["eager_ms"] = round(timed(lambda: fn(q, k, v, cu, bounds, scale), iters, 2, q.device), 4)
    except Exception as exc:  # a backend this torch or device lacks is a result
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return row
    if graph:
        try:
            row.update(in_graph(fn, case, *(t.clone() for t in (q, k, v)), scale, new_bounds))
        except Exception as exc:
            row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["ok"] = bool(row["rel_err"] <= TOLERANCE and row.get("graph_rel_err", 0.0) <= TOLERANCE
                     and "graph_error" not in row)
    row["tflops"] = tflops(case, q.shape[1], q.shape[2], row.get("graph_ms", row["eager_ms"]))
    return row


TRITON_CONFIGS = ((128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (64, 32, 4, 3))
"""(BLOCK_M, BLOCK_N, warps, stages) of the segment-block kernel. The first three are the runtime's choices
(:mod:`vitcg.runtime.packed_configs`: ``NARROW``, ``WIDE``, ``SMALL``); the other two were the fastest at some head dim
and small workload on 2026-12-01. Configurations whose shared memory the device cannot hold at a
head dim (:func:`vitcg.runtime.packed_configs.shared_memory_bytes`) are left out there."""


def triton_segments(block_m: int, block_n: int, warps: int, stages: int):
    from vitcg.runtime.varlen_triton import segment_blocks

    def run(q, k, v, cu, bounds, scale):
        return segment_blocks(q, k, v, cu, scale, block_m, block_n, warps, stages)
    return run


def triton_chosen(kernel: str, dim: int):
    """``vitcg.runtime.varlen_triton``'s function ``kernel`` at the configuration the runtime chooses for the head
    dim: ``varlen_attention`` (what the runtime runs) or ``spanning_blocks``."""
    from vitcg.runtime import varlen_triton
    from vitcg.runtime.attention import ELEMENT_BYTES
    from vitcg.runtime.packed_configs import choose_config

    config = choose_config(dim, ELEMENT_BYTES, torch.cuda.get_device_properties(0).shared_memory_per_block_optin)
    fn = getattr(varlen_triton, kernel)

    def run(q, k, v, cu, bounds, scale):
        return fn(q, k, v, cu, scale, *config)
    return run


def triton_backends(dim: int) -> list[tuple[str, Callable, bool]]:
    from vitcg.runtime.packed_configs import PackedConfig, head_split, shared_memory_bytes

    d0, d1 = head_split(dim)
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    found = []
    for m, n, w, s in TRITON_CONFIGS:
        if shared_memory_bytes(PackedConfig(m, n, w, s), d0 + d1, 2) <= limit:
            found.append((f"triton_m{m}_n{n}_w{w}_s{s}", triton_segments(m, n, w, s), True))
    return found


def backends(dim: int, case: Case, args) -> list[tuple[str, Callable, bool]]:
    """(name, function, whether a captured graph follows new boundaries) for one head dim and case."""
    found = [
        ("flash_budget_max", flash(lambda bounds, rows: rows), True),
        ("flash_item_cap", flash(lambda bounds, rows: min(rows, ITEM_CAP)), True),
        ("flash_real_max", flash(lambda bounds, rows: max(b - a for a, b in zip(bounds[:-1], bounds[1:]))), True),
        ("cudnn_segments", segments(SDPBackend.CUDNN_ATTENTION), False),
        ("flash_segments", segments(SDPBackend.FLASH_ATTENTION), False),
        ("cudnn_buckets", segments(SDPBackend.CUDNN_ATTENTION, buckets=True), False),
    ]
    found += [("triton_runtime", triton_chosen("varlen_attention", dim), True),
              ("triton_spanning", triton_chosen("spanning_blocks", dim), True)]
    found += triton_backends(dim)
    if not args.skip_flex and dim in args.flex_dims and case.name in FLEX_CASES:
        found += [(name, flex(options), True) for name, options in FLEX_VARIANTS.items()]
    return found + [("cudnn_ragged", cudnn_ragged(fixed=False), False),
                    ("cudnn_ragged_fixed", cudnn_ragged(fixed=True), True)]


def best(backends_row: dict) -> dict:
    """The fastest valid backend of a case, by graph time where it has one: overall, among those whose graph
    follows new boundaries (what a budget graph can run), and vitcg's Triton kernel."""
    valid = {n: r for n, r in backends_row.items() if r.get("ok")}
    time_of = {n: r.get("graph_ms", r.get("eager_ms")) for n, r in valid.items()}
    follows = [n for n, r in valid.items() if r.get("graph_bounds") == "new"]
    pick = {"any": min(time_of, key=time_of.get, default=None),
            "new_boundaries": min(follows, key=time_of.get, default=None),
            "triton": min((n for n in follows if n.startswith("triton_m")), key=time_of.get, default=None)}
    return {k: (n, time_of[n], valid[n]["tflops"]) if n else None for k, n in pick.items()}


def ragged_graphs(results: dict, args) -> None:
    """Capture cuDNN's ragged attention with a fixed maximum, last of the run (an invalidated capture can spoil
    the process): the graph columns of ``cudnn_ragged_fixed``."""
    dev = torch.device("cuda")
    for dim in args.dims:
        for case in args.cases:
            row = results["dims"][str(dim)]["cases"][case.name]["backends"].get("cudnn_ragged_fixed")
            if not row or "error" in row:
                continue
            q, k, v = inputs(case, HEADS, dim, dev)
            try:
                row.update(in_graph(cudnn_ragged(fixed=True), case, q, k, v, dim ** -0.5, True))
            except Exception as exc:
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(dim, case.name, "cudnn_ragged_fixed graph", row["graph_error"], flush=True)
                return
            row["ok"] = bool(row["rel_err"] <= TOLERANCE and row["graph_rel_err"] <= TOLERANCE)
            row["tflops"] = tflops(case, HEADS, dim, row["graph_ms"])
            print(dim, case.name, "cudnn_ragged_fixed graph", row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--skip-flex", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated backend name prefixes to time (default: all)")
    parser.add_argument("--dims", default=",".join(map(str, DIMS)), help="head dims (default: every packaged one)")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--flex-dims", default=",".join(map(str, FLEX_DIMS)))
    parser.add_argument("--ragged-graph", action="store_true", help="capture cudnn_ragged_fixed last of the run")
    args = parser.parse_args()
    args.dims = [int(d) for d in args.dims.split(",") if d]
    args.flex_dims = {int(d) for d in args.flex_dims.split(",") if d}
    wanted = set(args.cases.split(","))
    args.cases = [c for c in CASES if c.name in wanted]
    dev = torch.device("cuda")
    torch._dynamo.config.recompile_limit = 256  # one compiled flex_attention per variant and shape
    results: dict = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(dev),
                     "torch": torch.__version__, "heads": HEADS, "tolerance": TOLERANCE, "dims": {}}
    prefixes = tuple(p for p in args.only.split(",") if p)
    for dim in args.dims:
        scale = dim ** -0.5
        per_dim = results["dims"][str(dim)] = {"cases": {}}
        for case in args.cases:
            q, k, v = inputs(case, HEADS, dim, dev)
            ref = reference(q, k, v, offsets(case.lengths, case.rows, dev).tolist(), scale)
            row = per_dim["cases"][case.name] = {"rows": case.rows, "lengths": list(case.lengths),
                                                 "replayed": list(case.other), "backends": {}}
            for name, fn, new_bounds in backends(dim, case, args):
                if prefixes and not name.startswith(prefixes):
                    continue
                iters = 3 if name.startswith("cudnn_ragged") else args.iters
                row["backends"][name] = measure(name, fn, new_bounds, case, q, k, v, ref, scale, iters,
                                                graph=not name.startswith("cudnn_ragged"))
                print(dim, case.name, name, row["backends"][name], flush=True)
            row["best"] = best(row["backends"])
            print(dim, case.name, "best", row["best"], flush=True)
            del q, k, v, ref
            if args.json:  # after every case: a later failure keeps what was measured
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    if args.ragged_graph:
        ragged_graphs(results, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
