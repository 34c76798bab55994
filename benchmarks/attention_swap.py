"""The encoder with the runtime's packed attention kernel against the candidate's
(``benchmarks/candidates/varlen_segments.py``), in one process (GPU): vitcg's plain budget graph of each bench
workload at one exact budget (its output tokens rounded up to 64, as ``mixed_profile.py`` takes it), median ms,
the attention kernels' device ms from torch.profiler, and each graph's relative error against the HF eager forward
(bf16, real dimensions, random weights).

Usage (GPU machine, repository root): python benchmarks/attention_swap.py [SPEC...] [--workload W ...] [--json OUT]
(``--device cpu --size tiny``: a dry run of the script's plumbing, where no Triton kernel runs)
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch
from mixed_profile import exact_budget_graphs, kernel_ms
from with_candidate import candidate_in_place

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.timing import timed
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error


def graph_row(spec, module, inputs, budget: int, reference, iters: int, device) -> dict:
    manager = exact_budget_graphs(adapter_for(spec, module), budget, device, torch.bfloat16)

    def call():
        return torch.cat(manager.execute(inputs))
    error = relative_error(call(), reference)
    ms = timed(call, iters, 3, device)
    kinds = kernel_ms(call, device)[0] if device.type == "cuda" else {}
    return {"ms": round(ms, 3), "attention_ms": kinds.get("attention", 0.0) + kinds.get("triton", 0.0),
            "kernel_ms": kinds, "rel_error": round(error, 5)}


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
            row["runtime"] = graph_row(spec, module, inputs, budget, reference, args.iters, device)
            with candidate_in_place():
                row["candidate"] = graph_row(spec, module, inputs, budget, reference, args.iters, device)
            row["ratio"] = round(row["runtime"]["ms"] / row["candidate"]["ms"], 3)
            print(name, workload, json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
