"""Where an accelerated encoder call spends its time in a full VLM (GPU): feature call eager vs routed, the
manager alone, and a cProfile of one routed call. Usage: python benchmarks/ttft_profile.py [MODEL] [WORKLOAD]"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

sys.path[:0] = ["benchmarks", "."]
import generate_ttft as g  # noqa: E402  (benchmarks/ on the path; run from the repository root)
import mixed_profile  # noqa: E402

import vitcg  # noqa: E402
from vitcg.errors import InputError  # noqa: E402


def timed(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def kernels(fn, label):
    """Device time of one call by kernel kind and its top kernels (mixed_profile.py's torch.profiler summary)."""
    by_kind, top = mixed_profile.kernel_ms(fn, torch.device("cuda"))
    print(f"{label}: kernels {sum(by_kind.values()):.2f} ms {by_kind}")
    for key, total, count in top:
        print(f"    {total:8.3f} ms  x{count:<4} {key}")


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2_vl"
    workload = sys.argv[2] if len(sys.argv) > 2 else "1x224"
    entry = g.MODELS[name]
    config = entry["config"]()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = entry["model"](config).to(torch.bfloat16).eval()
    inputs = g.inputs_for(entry, config, g.WORKLOADS[workload])
    feats = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}

    def features():
        with torch.no_grad():
            model.model.get_image_features(**feats)

    def generate():
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=1, do_sample=False)

    eager_feat, eager_gen = timed(features), timed(generate, 10)
    kernels(features, "eager get_image_features")
    handle = vitcg.accelerate(model, progress=False)
    features()
    graph_feat, graph_gen = timed(features), timed(generate, 10)
    mm = {k: v for k, v in feats.items()}
    try:  # the feature call's own keys, where the spec's input keys are the model's (InternVL's are not)
        manager = f"{timed(lambda: handle.manager.execute(mm)):.2f} ms"
    except InputError as exc:
        manager = f"n/a ({str(exc)[:80]})"
    print(f"{name} {workload}: features eager {eager_feat:.2f} ms, routed {graph_feat:.2f} ms; manager.execute "
          f"{manager}; generate(1 token) eager {eager_gen:.2f} ms, routed {graph_gen:.2f} ms")
    print("replay costs", {b: round(c, 2) for b, c in handle.manager.costs.replay.items()})
    print("eager timings", handle.manager.costs.eager_samples)
    print("stats", handle.manager.stats.as_dict())
    kernels(features, "routed get_image_features")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5):
        features()
    torch.cuda.synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(30)
    print(out.getvalue()[:6000])


if __name__ == "__main__":
    main()
