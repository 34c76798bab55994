"""The eager side compiled (issue 38 item 2): the adapter's eager forward with the model's own blocks, against
the same forward with the blocks compiled with dynamic shapes (``compile_eager``), and against ``torch.compile``
of the whole encoder method (dynamic shapes), per workload; plus what the first compiled call cost.

For each spec (real dimensions, bf16, random weights) and workload, medians of ``--iters`` synchronized calls of
each forward; "first call s" is the first compiled eager call of the process (its compilation included), "new
size s" the first call of each later workload (a recompilation shows there). Relative errors are against a
float32 copy of the model's own eager forward, the reference of every check, beside the bf16 eager one's.

Usage (GPU): python benchmarks/eager_compiled.py SPEC... [--workload W]... [--iters N] [--whole] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error


def timed_ms(fn, iters: int) -> float:
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        tic = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - tic) * 1e3)
    return statistics.median(samples)


def once_s(fn) -> tuple[object, float]:
    torch.cuda.synchronize()
    tic = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - tic


def measure(plain, compiled, whole, inputs, iters: int, first: bool) -> dict:
    """One workload's row: first calls, then medians of each forward (``whole``: None when not measured)."""
    want, eager_first_s = once_s(lambda: plain.encoder_eager_forward(inputs))
    got, compiled_first_s = once_s(lambda: compiled.encoder_eager_forward(inputs))
    row = {"tokens": int(want.shape[0]), "eager_first_s": round(eager_first_s, 3),
           ("first_call_s" if first else "new_size_s"): round(compiled_first_s, 3),
           "eager_compiled": compiled.eager_compiled,
           "eager_ms": timed_ms(lambda: plain.encoder_eager_forward(inputs), iters),
           "compiled_eager_ms": timed_ms(lambda: compiled.encoder_eager_forward(inputs), iters)}
    if whole is not None:
        calls = plain.eager_calls(inputs)
        try:
            _, row["whole_first_s"] = once_s(lambda: [whole(**kwargs) for kwargs in calls])
            row["torch_compile_ms"] = timed_ms(lambda: [whole(**kwargs) for kwargs in calls], iters)
        except Exception as exc:  # a compiler failure is a result
            row["torch_compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return row, want, got


def run_spec(name: str, workloads: list[str], iters: int, with_whole: bool) -> dict:
    spec = SpecSource()[name]
    module = build_encoder(spec, "real", device="cuda", dtype=torch.bfloat16)
    plain, compiled = adapter_for(spec, module), adapter_for(spec, module, compile_eager=True)
    whole = torch.compile(getattr(module, spec.encoder.method), dynamic=True) if with_whole else None
    rows = {}
    for workload in workloads:
        cpu = make_inputs(plain, WORKLOADS[workload], torch.Generator().manual_seed(0))
        if cpu is None:
            continue
        row, want, got = measure(plain, compiled, whole, on_device(plain, cpu, torch.bfloat16), iters, not rows)
        reference = adapter_for(spec, module.float())
        exact = reference.encoder_eager_forward(on_device(reference, cpu, torch.float32))
        module.to(torch.bfloat16)
        row["eager_vs_fp32"] = relative_error(want, exact)
        row["compiled_vs_fp32"] = relative_error(got, exact)
        row["speedup"] = row["eager_ms"] / row["compiled_eager_ms"]
        rows[workload] = row
        print(f"{name:11s} {workload:12s} {row['tokens']:6d} tok  eager {row['eager_ms']:8.2f} ms  compiled eager "
              f"{row['compiled_eager_ms']:8.2f} ms ({row['speedup']:.2f}x)  torch.compile "
              f"{row.get('torch_compile_ms', float('nan')):8.2f} ms  first "
              f"{row.get('first_call_s', row.get('new_size_s')):6.2f} s  err {row['compiled_vs_fp32']:.2e} "
              f"(eager {row['eager_vs_fp32']:.2e})  on={compiled.eager_compiled}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--whole", action="store_true", help="also time torch.compile of the whole encoder method "
                        "(dynamic shapes; its first call compiles every block, a minute or more)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "specs": {}}
    for name in args.specs:
        try:
            results["specs"][name] = run_spec(name, args.workload or list(WORKLOADS), args.iters, args.whole)
        except Exception as exc:
            results["specs"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
