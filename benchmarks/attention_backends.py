"""Packed (varlen) attention on the GPU: which kernel serves vitcg's budget graphs fastest.

Times one layer's attention (16 heads of 80, Qwen2-VL-7B's vision tower) over the packed rows of real workloads
(the qwen2_vl mixed batch's eight images, 8x224, a 4-frame 448x448 video, generate_ttft.py's mixed3), each padded
to its budget's rows as the adapter pads them. Every backend runs eagerly and, where it can, replayed in a CUDA
graph after the boundaries in ``cu_seqlens`` were changed in place (a budget graph's boundaries are replay inputs);
each output is compared with a float32 reference computed per segment. bf16 tolerance: relative Frobenius error
<= 1e-2 (bf16 kernels measured 2.3e-3 to 2.5e-3 on 2026-11-25).

Backends:
- ``flash_*``: torch's ``varlen_attn`` (FlashAttention-2) with ``max_seqlen`` at the budget's rows (what a graph
  fixes at capture), at the largest item qwen2_vl's released processors make (5120 patches), and at the
  workload's real maximum (a lower bound on what a tighter ``max_seqlen`` could give).
- ``flex_*``: compiled FlexAttention with a block mask built on the device from ``cu_seqlens`` (no host sync),
  in several kernel configurations.
- ``cudnn_segments`` / ``flash_segments``: one dense SDPA call per segment with the cuDNN or flash backend, bounds
  read on the host; a graph of it replays fixed bounds only, so its replay time is the kernel time of the
  per-image path torch.compile runs, not a path a budget graph can take.
- ``cudnn_buckets``: consecutive equal-length segments (frames, equal tiles) batched into one cuDNN call on a
  view of the packed rows; fixed composition, as above.
- ``triton_*``: ``vitcg/runtime/varlen_triton.py``'s packed kernel (head dim split 64 + 16 rather than padded
  to 128), boundaries read on the device, in several block configurations.
- ``cudnn_ragged``: cuDNN's ragged attention with sequence offsets (eager only: its capture was invalidated on
  2026-11-25).

Usage (GPU machine, repository root): python benchmarks/attention_backends.py [--json OUT] [--skip-flex]
[--only PREFIX,...]
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

HEADS, DIM = 16, 80
SLOTS = 34
"""qwen2_vl's cu_seqlens capacity: min(max_items + max_frames, 32) + 2 offsets."""
ITEM_CAP = 5120
"""Largest image qwen2_vl's released preprocessor configs make: max_pixels 1003520 / 14**2 patches."""
TOLERANCE = 1e-2


@dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]
    """Real segments (patch rows per image or frame), in pack order."""
    other: tuple[int, ...]
    """Segments a graph replays after capture (same real rows)."""
    rows: int
    """The budget's rows (output tokens * 4): the graph's static length."""


CASES = (
    Case("mixed", (1564, 3996, 2436, 936, 4784, 576, 1024, 1936), (1936, 1024, 576, 4784, 936, 2436, 3996, 1564),
         17408),
    Case("8x224", (256,) * 8, (1024, 512, 256, 256), 2048),
    Case("video4x448", (1024, 1024), (512, 1536), 2048),
    Case("mixed3", (1564, 576, 4144), (4144, 1564, 576), 8192),  # generate_ttft.py's mixed3 at budget 2048
)


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
    out = torch.empty_like(q, dtype=torch.float32)
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
        out = torch.empty_like(q)
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
                view = (t[a:a + n * c].view(c, n, HEADS, DIM).transpose(1, 2) for t in (q, k, v))
                out[a:a + n * c].view(c, n, HEADS, DIM).copy_(
                    F.scaled_dot_product_attention(*view, scale=scale).transpose(1, 2))
        return out
    return run


def cudnn_ragged(q, k, v, cu, bounds, scale):
    n = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, n, n, False, 0.0, False, False,
                                                   scale=scale)[0]


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
    "flex_eager_mask": {},
    "flex_m128_n64_w8": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8},
    "flex_m128_n128_w8": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 2, "num_warps": 8},
    "flex_m64_n128_w4": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 3, "num_warps": 4},
    "flex_m128_n64_w8_tma": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8, "USE_TMA": True},
}
"""Kernel options per variant. torch 2.11 has no tuned default for head dim 80 on sm90 and takes (64, 64, 3
stages, 4 warps); (128, 64, 3, 8) is its sm90 choice for head dim 128. ``ROWS_GUARANTEED_SAFE`` is left off: the
run of 2026-11-26 gave NaN on the mixed batch with it (a row can meet a kv block where all its keys are masked)."""


def flex(options: dict, compile_mask: bool = True):
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    build = torch.compile(mask_blocks, dynamic=False) if compile_mask else mask_blocks

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


def measure(name: str, fn, new_bounds: bool, case: Case, q, k, v, scale, iters: int) -> dict:
    cu = offsets(case.lengths, case.rows, q.device)
    bounds = cu.tolist()
    ref = reference(q, k, v, bounds, scale)
    row: dict = {}
    try:
        tic = time.perf_counter()
        out = fn(q, k, v, cu, bounds, scale)
        torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - tic, 2)
        row["rel_err"] = rel_err(out, ref)
        row["eager_ms"] = round(timed(lambda: fn(q, k, v, cu, bounds, scale), iters, 2, q.device), 4)
    except Exception as exc:  # a backend this torch lacks is a result
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return row
    if name != "cudnn_ragged":
        try:
            row.update(in_graph(fn, case, *(t.clone() for t in (q, k, v)), scale, new_bounds))
        except Exception as exc:
            row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["ok"] = bool(row["rel_err"] <= TOLERANCE and row.get("graph_rel_err", 0.0) <= TOLERANCE
                     and "graph_error" not in row)
    return row


TRITON_CONFIGS = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (64, 128, 4, 3))
"""(BLOCK_M, BLOCK_N, warps, stages) of ``vitcg.runtime.varlen_triton``'s kernel; each is timed with whole key
blocks unmasked inside one segment (the default) and with every key block masked (``_masked``)."""


def triton_varlen(block_m: int, block_n: int, warps: int, stages: int, split: bool = True):
    from vitcg.runtime.varlen_triton import varlen_attention

    def run(q, k, v, cu, bounds, scale):
        return varlen_attention(q, k, v, cu, scale, block_m, block_n, warps, stages, split=split)
    return run


def mask_build_ms(case: Case, device) -> float:
    """Replay time of the compiled block-mask build alone (a share of every ``flex`` row but ``flex_eager_mask``)."""
    build = torch.compile(mask_blocks, dynamic=False)
    cu = offsets(case.lengths, case.rows, device)
    build(cu, case.rows)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build(cu, case.rows)
    return round(replay_ms(graph), 4)


def backends(skip_flex: bool) -> list[tuple[str, Callable, bool]]:
    """(name, function, whether a captured graph follows new boundaries)."""
    found = [
        ("flash_budget_max", flash(lambda bounds, rows: rows), True),
        ("flash_item_cap", flash(lambda bounds, rows: min(rows, ITEM_CAP)), True),
        ("flash_real_max", flash(lambda bounds, rows: max(b - a for a, b in zip(bounds[:-1], bounds[1:]))), True),
        ("cudnn_segments", segments(SDPBackend.CUDNN_ATTENTION), False),
        ("flash_segments", segments(SDPBackend.FLASH_ATTENTION), False),
        ("cudnn_buckets", segments(SDPBackend.CUDNN_ATTENTION, buckets=True), False),
    ]
    found += [(f"triton_m{m}_n{n}_w{w}_s{s}{'' if split else '_masked'}", triton_varlen(m, n, w, s, split), True)
              for m, n, w, s in TRITON_CONFIGS for split in (True, False)]
    if not skip_flex:
        found += [(name, flex(options, compile_mask=name != "flex_eager_mask"), True)
                  for name, options in FLEX_VARIANTS.items()]
    return found + [("cudnn_ragged", cudnn_ragged, False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--skip-flex", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated backend name prefixes to time (default: all)")
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch._dynamo.config.recompile_limit = 64  # one compiled flex_attention per variant and shape
    results: dict = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(dev),
                     "torch": torch.__version__, "heads": HEADS, "dim": DIM, "tolerance": TOLERANCE, "cases": {}}
    scale = DIM ** -0.5
    for case in CASES:
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(case.rows, HEADS, DIM, device=dev, dtype=torch.bfloat16, generator=gen)
                   for _ in range(3))
        row = results["cases"][case.name] = {"rows": case.rows, "lengths": list(case.lengths),
                                             "replayed": list(case.other), "backends": {}}
        prefixes = tuple(p for p in args.only.split(",") if p)
        for name, fn, new_bounds in backends(args.skip_flex):
            if prefixes and not name.startswith(prefixes):
                continue
            iters = 3 if name == "cudnn_ragged" else args.iters
            row["backends"][name] = measure(name, fn, new_bounds, case, q, k, v, scale, iters)
            print(case.name, name, row["backends"][name], flush=True)
        if not args.skip_flex:
            row["mask_build_graph_ms"] = mask_build_ms(case, dev)
            print(case.name, "mask build", row["mask_build_graph_ms"], flush=True)
        if args.json:  # after every case: a later failure keeps what was measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
