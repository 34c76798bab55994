"""Packed (varlen) attention on the GPU: torch's varlen_attn (FlashAttention-2) against cuDNN's ragged
attention, each at the workload's real max_seqlen and at a budget-sized one, eager and replayed in a CUDA graph
with new segment boundaries. Usage: python benchmarks/attention_backends.py [--json OUT]"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.varlen import varlen_attn

from vitcg.runtime.timing import timed


def cudnn(q, k, v, cu, max_len, scale):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_len, max_len, False, 0.0, False, False,
                                                   scale=scale)[0]


def flash(q, k, v, cu, max_len, scale):
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale)


def per_segment(q, k, v, cu, max_len, scale, bounds=None):
    """What HF's sdpa path runs: one dense SDPA call per segment (host-known bounds; not capturable)."""
    bounds = bounds or cu.tolist()
    return torch.cat([F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)),
                                                     scale=scale)[0].transpose(0, 1)
                      for a, b in zip(bounds[:-1], bounds[1:]) if b > a])


def reference(q, k, v, cu, scale):
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            out[a:b] = F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1)[None].float() for t in (q, k, v)),
                                                      scale=scale)[0].transpose(0, 1).to(q.dtype)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    dev = torch.device("cuda")
    heads, dim = 16, 80
    results = {}
    # qwen2_vl's mixed workload: 8 images of 17252 patches in a 17408-row budget, 49 segment slots
    for label, lengths, slots in (("mixed", [1024, 1428, 2160, 2484, 1716, 3312, 2352, 2776], 50),
                                  ("1x448", [1024], 50), ("8x224", [256] * 8, 50)):
        rows = -(-sum(lengths) // 256) * 256
        seg = lengths + [rows - sum(lengths)]
        cu = torch.zeros(slots, dtype=torch.int32, device=dev)
        cu[1:len(seg) + 1] = torch.tensor(seg, device=dev).cumsum(0)
        cu[len(seg) + 1:] = rows
        q, k, v = (torch.randn(rows, heads, dim, device=dev, dtype=torch.bfloat16) for _ in range(3))
        scale = dim ** -0.5
        ref = reference(q, k, v, cu, scale)
        row = {"rows": rows, "real_max": max(seg)}
        for name, fn in (("flash", flash), ("cudnn", cudnn), ("sdpa_per_segment", per_segment)):
            for max_kind, max_len in (("real_max", max(seg)), ("budget_max", rows)):
                try:
                    out = fn(q, k, v, cu, max_len, scale)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    ms = timed(lambda f=fn, n=max_len, a=(q, k, v, cu), s=scale: f(*a, n, s), 20, 3, dev)
                    row[f"{name}_{max_kind}"] = {"ms_per_layer": round(ms, 4), "rel_err": round(err, 5)}
                except Exception as exc:  # a backend this torch lacks is a result
                    row[f"{name}_{max_kind}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(label, name, max_kind, row[f"{name}_{max_kind}"], flush=True)
        results[label] = row
    # capture last (a failed capture can leave the device unusable): replay on other boundaries, which the
    # graph must read from its buffer
    for name, fn in (("flash", flash), ("cudnn", cudnn)):
        rows, dev_cu = 4096, torch.tensor([0, 1024, 2048, 4096] + [4096] * 46, dtype=torch.int32, device=dev)
        q, k, v = (torch.randn(rows, heads, dim, device=dev, dtype=torch.bfloat16) for _ in range(3))
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(q, k, v, dev_cu, rows, scale)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                gout = fn(q, k, v, dev_cu, rows, scale)
            other = torch.tensor([0, 512, 3000, 4096] + [4096] * 46, dtype=torch.int32, device=dev)
            dev_cu.copy_(other)
            graph.replay()
            ref = reference(q, k, v, other, scale)
            results[f"{name}_graph"] = {"rel_err_new_bounds": round(((gout.float() - ref.float()).norm()
                                                                     / ref.float().norm()).item(), 5)}
        except Exception as exc:
            results[f"{name}_graph"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(name, "graph", results[f"{name}_graph"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
