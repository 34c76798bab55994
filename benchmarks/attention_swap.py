"""The encoder with vitcg's packed attention as the runtime chooses it (the segment-block kernel for calls of at
most 64 segment slots) against the spanning-block kernel alone (the runtime's only kernel until 2026-12-02), in
one process (GPU): vitcg's plain budget graph of each bench workload at one exact budget (its output tokens rounded
up to 64, as ``mixed_profile.py`` takes it), median ms of the manager's call (host work included), the device ms
of its kernels by kind from torch.profiler (``device_ms``: their sum), and each graph's relative error against the
HF eager forward (bf16, real dimensions, random weights). The two sides alternate, spanning first, then runtime,
then spanning again (``spanning_again``), so a drift of the machine during a row shows.

Usage (GPU machine, repository root): python benchmarks/attention_swap.py [SPEC...] [--workload W ...] [--json OUT]
(``--device cpu --size tiny``: a dry run of the script's plumbing, where no Triton kernel runs)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
from collections.abc import Iterator

import torch
from mixed_profile import exact_budget_graphs, kernel_ms

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.timing import timed
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error


@contextlib.contextmanager
def spanning_in_place() -> Iterator[None]:
    """The spanning-block kernel for every call of the ``vitcg::packed_attention`` op in the block (it calls
    ``varlen_triton.varlen_attention`` by attribute); the runtime's choice is back when the block ends."""
    from vitcg.runtime import varlen_triton

    runtime = varlen_triton.varlen_attention
    varlen_triton.varlen_attention = varlen_triton.spanning_blocks
    try:
        yield
    finally:
        varlen_triton.varlen_attention = runtime


def graph_row(spec, module, inputs, budget: int, reference, iters: int, device) -> dict:
    manager = exact_budget_graphs(adapter_for(spec, module), budget, device, torch.bfloat16)

    def call():
        return torch.cat(manager.execute(inputs))
    error = relative_error(call(), reference)
    ms = timed(call, iters, 3, device)
    kinds = kernel_ms(call, device)[0] if device.type == "cuda" else {}
    return {"ms": round(ms, 3), "device_ms": round(sum(kinds.values()), 3),
            "attention_ms": kinds.get("attention", 0.0) + kinds.get("triton", 0.0), "kernel_ms": kinds,
            "rel_error": round(error, 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=["qwen2_vl", "qwen3_vl"])
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no Triton, nothing timed)")
    parser.add_argument("--size", default="real", choices=("real", "tiny"))
    args = parser.parse_args()
    device = torch.device(args.device)
    source = SpecSource()
    results = {"date": datetime.date.today().isoformat(),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "specs": {}}
    for name in args.specs:
        spec = source[name]
        module = build_encoder(spec, args.size, device=args.device, dtype=torch.bfloat16)
        plain = adapter_for(spec, module)
        rows = results["specs"][name] = {}
        for workload in args.workload or ["1x224", "1x448", "8x224", "mixed", "video4x448", "image+video"]:
            made = make_inputs(plain, WORKLOADS[workload], torch.Generator().manual_seed(0))
            if made is None:
                continue
            inputs = on_device(plain, made, torch.bfloat16)
            tokens = sum(i.output_tokens for i in plain.get_encoder_cudagraph_item_specs(inputs))
            budget = -(-tokens // 64) * 64
            reference = plain.encoder_eager_forward(inputs)
            row = rows[workload] = {"tokens": tokens, "budget": budget}
            for side in ("spanning", "runtime", "spanning_again"):
                with spanning_in_place() if side != "runtime" else contextlib.nullcontext():
                    row[side] = graph_row(spec, module, inputs, budget, reference, args.iters, device)
            for what in ("ms", "device_ms"):  # the runtime's gain: spanning over runtime, the mean of both spanning
                spanning = (row["spanning"][what] + row["spanning_again"][what]) / 2
                row[f"gain_{what}"] = round(spanning / row["runtime"][what], 3) if row["runtime"][what] else None
            print(name, workload, json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
