"""Where vitcg+inductor and torch.compile spend a workload's device time (GPU): median latency and kernel time
by kind (GEMM, attention, Triton, copies, other) for each variant, from torch.profiler.

Usage (GPU machine, repository root): python benchmarks/mixed_profile.py [SPEC] [--workload W] [--budget B] [--json OUT]
[--static-only]

Variants, all on SPEC's real encoder (random bf16 weights) and one budget B (default:
the workload's output tokens rounded up to 64: one pack, the same padding for every graph variant):
- ``eager``: the HF forward, called as the eager path calls it;
- ``compile``: ``torch.compile(mode="reduce-overhead")`` of the HF forward, as ``vitcg bench`` runs it;
- ``graph``: vitcg's plain budget graph;
- ``inductor_dynamic``: the repeated blocks compiled once for every budget (what ``compile_forward`` does);
- ``inductor_static``: the same blocks compiled for this budget's shapes only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from vitcg.lang import SpecSource
from vitcg.runtime import regions
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
from vitcg.runtime.timing import timed
from vitcg.tools.bench.measure import _eager_call
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error

KINDS = (("attention", ("flash", "fmha", "attention", "attn", "varlen", "_segment_fwd", "_spanning_fwd")),
         ("gemm", ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "wgmma")),
         ("copy", ("memcpy", "memset", "copy")), ("triton", ("triton",)))


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, marks in KINDS if any(m in low for m in marks)), "other")


def kernel_ms(fn, device) -> tuple[dict[str, float], list[tuple[str, float, int]]]:
    """Device ms per kind over one call of ``fn`` (after a warm-up), and the top kernels."""
    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    by_kind: dict[str, float] = defaultdict(float)
    top = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total <= 0 or event.key.startswith("cuda") or event.key.startswith("Activity"):
            continue
        by_kind[kind(event.key)] += total / 1e3
        top.append((event.key[:90], round(total / 1e3, 3), event.count))
    top.sort(key=lambda x: -x[1])
    return {k: round(v, 3) for k, v in sorted(by_kind.items())}, top[:12]


def exact_budget_graphs(adapter, budget: int, device, dtype) -> EncoderCudaGraphManager:
    """A manager that captures ``budget`` alone and always replays it (no routing to eager): one pack, the same
    padding for every variant compared. The engine limit is raised past 8,192 tokens for larger budgets
    (InternVL's mixed batch is 8,704)."""
    manager = EncoderCudaGraphManager(adapter, device=device, dtype=dtype, token_budgets=[budget],
                                      max_num_batched_tokens=max(8192, budget), options=ManagerOptions(route_eager=False))
    manager.capture()
    return manager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="qwen2_vl")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--budget", type=int)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--static-only", action="store_true", help="leave out the inductor_dynamic variant")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    spec = SpecSource()[args.spec]
    module = build_encoder(spec, "real", device="cuda", dtype=dtype)
    plain = adapter_for(spec, module)
    inputs = on_device(plain, make_inputs(plain, WORKLOADS[args.workload], torch.Generator().manual_seed(0)), dtype)
    tokens = sum(i.output_tokens for i in plain.get_encoder_cudagraph_item_specs(inputs))
    budget = args.budget or -(-tokens // 64) * 64
    reference = plain.encoder_eager_forward(inputs)
    results = {"spec": spec.name, "workload": args.workload, "tokens": tokens, "budget": budget,
               "variants": {}}

    def report(name: str, fn, setup_s: float, check: bool = True) -> None:
        error = relative_error(fn(), reference) if check else float("nan")  # compile: HF's output structure
        ms = timed(fn, args.iters, 3, device)
        kinds, top = kernel_ms(fn, device)
        results["variants"][name] = {"ms": round(ms, 3), "setup_s": round(setup_s, 1), "rel_error": round(error, 5),
                                     "kernel_ms": kinds, "kernel_total_ms": round(sum(kinds.values()), 3),
                                     "top_kernels": top}
        print(f"{name:<17} {ms:8.2f} ms  setup {setup_s:6.1f} s  err {error:.4f}  kernels "
              f"{sum(kinds.values()):.2f} ms {kinds}", flush=True)
        for key, total, count in top[:6]:
            print(f"    {total:8.3f} ms  x{count:<4} {key}")

    report("eager", _eager_call(plain, inputs, getattr(module, spec.encoder.method)), 0.0, check=False)
    compiled = torch.compile(getattr(module, spec.encoder.method), mode="reduce-overhead")
    call = _eager_call(plain, inputs, compiled)
    tic = time.perf_counter()
    call()
    torch.cuda.synchronize(device)
    report("compile", call, time.perf_counter() - tic, check=False)

    for name, blocks in (("graph", None), ("inductor_dynamic", True), ("inductor_static", False)):
        if args.static_only and name == "inductor_dynamic":
            continue
        torch._dynamo.reset()
        adapter = adapter_for(spec, module)
        if blocks is not None:  # what compile_forward=True sets up, with the dynamic flag chosen here
            adapter._blocks = regions.compile_blocks(regions.repeated_blocks(module), dynamic=blocks)
        tic = time.perf_counter()
        manager = exact_budget_graphs(adapter, budget, device, dtype)
        report(name, lambda manager=manager: torch.cat(manager.execute(inputs)), time.perf_counter() - tic)
        del manager
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
