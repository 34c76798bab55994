"""Where a call that the manager serves eagerly spends its time, against the bare eager forward.

For each workload, medians over ``--iters`` synchronized runs of: the adapter's eager forward (what bench calls
"eager"), the manager's whole ``execute`` (after its exploration calls), and the manager's selection of every
item alone; plus how the manager served the call (replays, eager calls). Written for the InternVL image+video
row that ran wholly eagerly yet at 0.85x of eager (benchmarks/RESULTS.md).

Usage: python benchmarks/eager_path.py SPEC [WORKLOAD...] [--iters N] [--json PATH]   (CUDA: real size, bf16)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device


def median_ms(fn, iters: int, cuda: bool) -> float:
    samples = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        tic = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - tic) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("workloads", nargs="*", default=["image+video", "mixed", "1x448"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype, size = ("cuda", torch.bfloat16, "real") if cuda else ("cpu", torch.float32, "tiny")
    spec = SpecSource()[args.spec]
    adapter = adapter_for(spec, build_encoder(spec, size, device=device, dtype=dtype))
    manager = EncoderCudaGraphManager(adapter, device=device, dtype=dtype)
    manager.capture()
    rows = []
    for name in args.workloads:
        cpu_inputs = make_inputs(adapter, WORKLOADS[name], torch.Generator())
        if cpu_inputs is None:  # a modality the spec lacks
            continue
        inputs = on_device(adapter, cpu_inputs, dtype)
        count = len(adapter.get_encoder_cudagraph_item_specs(inputs))
        every = list(range(count))
        for _ in range(5):  # warm-up, and the manager's exploration calls
            manager.execute(inputs)
            with torch.inference_mode():
                adapter.encoder_eager_forward(inputs)
        before = (manager.stats.replays, manager.stats.eager_calls)
        def eager(inputs=inputs):
            return adapter.encoder_eager_forward(inputs)

        row = {"workload": name, "items": count,
               "eager_ms": median_ms(eager, args.iters, cuda),
               "execute_ms": median_ms(lambda inputs=inputs: manager.execute(inputs), args.iters, cuda),
               "select_all_ms": median_ms(lambda inputs=inputs, every=every:
                                          adapter.select_encoder_cudagraph_items(inputs, every), args.iters, cuda)}
        with torch.inference_mode():
            row["eager_inference_mode_ms"] = median_ms(eager, args.iters, cuda)
        row["replays_per_call"] = (manager.stats.replays - before[0]) / args.iters
        row["eager_calls_per_call"] = (manager.stats.eager_calls - before[1]) / args.iters
        row["ratio_eager_over_execute"] = row["eager_ms"] / row["execute_ms"]
        rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"spec": args.spec, "device": torch.cuda.get_device_name() if cuda else "cpu",
                       "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
