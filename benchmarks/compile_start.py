"""Start-up time of inductor-compiled budget graphs, cold and with vitcg's persistent compile cache (GPU).

Usage (GPU machine, repository root): python benchmarks/compile_start.py [SPEC] [--json OUT]
Runs three fresh Python processes one after the other, each building SPEC's encoder at real dimensions (random
bf16 weights), compiling its fixed-shape forward with inductor and capturing the default budgets
(``capture_compiled``), then checking one workload against eager:

1. cold: empty vitcg cache, empty inductor and triton caches;
2. vitcg cache only: the file run 1 stored, but fresh inductor and triton caches (a new machine or container
   that carries only vitcg's cache folder);
3. warm: vitcg's and inductor's caches as run 2 left them (a later start on the same machine).

Each reports the process's wall time from interpreter start to graphs ready, split into imports, building the
encoder, and compile plus capture. Each then captures the same encoder a second time, with a new adapter and
manager (what a second ``vitcg.accelerate`` of the process does): ``later_capture_s`` against the first's
``compile_capture_s`` says how much slower a process's first capture is than a later one, and ``first_load_s`` /
``later_load_s`` how much of each was loading stored block functions (issue 38 item 5).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402


def child(spec_name: str, device: str, size: str) -> dict:
    import torch

    from vitcg.lang import SpecSource
    from vitcg.runtime.adapter import adapter_for
    from vitcg.runtime.compile_cache import capture_compiled
    from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
    from vitcg.tools.encoders import build_encoder
    from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error

    imported = time.perf_counter()
    spec = SpecSource().get(spec_name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    module = build_encoder(spec, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    built = time.perf_counter()
    adapter = adapter_for(spec, module, compile_forward=True)
    adapted = time.perf_counter()
    # routing off: the check below must replay graphs, not explore its first call eagerly
    manager = EncoderCudaGraphManager(adapter, device=device, dtype=dtype, options=ManagerOptions(route_eager=False))
    profiler = None
    if os.environ.get("VITCG_START_PROFILE"):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    report, cache = capture_compiled(manager, spec)
    sync()
    if profiler is not None:
        import io
        import pstats
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(70)
        stats.sort_stats("tottime").print_stats(40)
        with open(os.environ["VITCG_START_PROFILE"], "w") as f:
            f.write(text.getvalue())
    ready = time.perf_counter()
    again = EncoderCudaGraphManager(adapter_for(spec, module, compile_forward=True), device=device, dtype=dtype,
                                    options=ManagerOptions(route_eager=False))
    capture_compiled(again, spec)
    sync()
    later = time.perf_counter()
    inputs = on_device(adapter, make_inputs(adapter, WORKLOADS["mixed"], torch.Generator().manual_seed(0)),
                       dtype)
    error = relative_error(torch.cat(manager.execute(inputs)), adapter.encoder_eager_forward(inputs))
    from torch._dynamo.utils import counters
    return {"imports_s": round(imported - START, 2), "build_s": round(built - imported, 2),
            "compile_capture_s": round(ready - built, 2), "process_to_ready_s": round(ready - START, 2),
            "adapter_s": round(adapted - built, 2), "capture_s": round(report.seconds, 2),
            "budgets": list(manager.budgets), "cache_loaded": cache.loaded, "cache_bytes": cache.saved_bytes,
            "cache_file": str(cache.path), "dynamo_unique_graphs": counters["stats"]["unique_graphs"],
            "ahead_of_time": None if adapter.ahead is None else {
                "functions": len(adapter.ahead.blobs), "compiled_here": adapter.ahead.compiled,
                "load_s": [round(t, 3) for t in adapter.ahead.load_seconds],
                "disabled": adapter.ahead.disabled},
            "per_budget_s": {b: round(t, 2) for b, t in report.per_budget.items()},
            "replay_ms": {b: round(t, 3) for b, t in report.replay_ms.items()},
            "later_capture_s": round(later - ready, 2),
            "first_load_s": _load_seconds(adapter), "later_load_s": _load_seconds(again.model),
            "mixed_rel_error_vs_eager": round(error, 5)}


def _load_seconds(adapter) -> float | None:
    """Seconds an adapter spent deserializing stored block functions (None without functions ahead of time)."""
    return None if adapter.ahead is None else round(sum(adapter.ahead.load_seconds), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="qwen2_vl")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="real", help="real (default) or tiny (a quick CPU smoke run)")
    parser.add_argument("--cache-dir", help="vitcg's cache folder for the runs (default: a fresh one); later "
                        "commands in the same folder then start warm")
    parser.add_argument("--pycache", help="a bytecode cache folder for every run (PYTHONPYCACHEPREFIX): an install "
                        "whose modules have bytecode, where the image's do not")
    parser.add_argument("--profile", help="also run a fourth, warm process with its capture under cProfile, and "
                        "write the profile's text here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.spec, args.device, args.size)), flush=True)
        return
    root = tempfile.mkdtemp(prefix="vitcg-compile-start-")
    vitcg_cache = args.cache_dir or os.path.join(root, "vitcg")
    runs = [("cold", "a"), ("vitcg cache only", "b"), ("warm", "b")]
    if args.profile:
        runs.append(("warm, profiled", "b"))
    results = []
    for label, kernels in runs:
        env = {**os.environ, "VITCG_CACHE_DIR": vitcg_cache,
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, f"inductor-{kernels}"),
               "TRITON_CACHE_DIR": os.path.join(root, f"triton-{kernels}")}
        if args.pycache:
            env["PYTHONPYCACHEPREFIX"] = args.pycache
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        if label == "warm, profiled":
            env["VITCG_START_PROFILE"] = args.profile
        tic = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, args.spec, "--child", "--device", args.device,
                               "--size", args.size], env=env, capture_output=True,
                              text=True)
        wall = time.perf_counter() - tic
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{label}: failed (exit {done.returncode})\n{done.stderr[-3000:]}")
            results.append({"run": label, "error": done.stderr[-2000:]})
            continue
        result = {"run": label, "wall_s": round(wall, 2), **json.loads(line[7:])}
        results.append(result)
        print(f"{label:<17} process {result['process_to_ready_s']:7.1f} s (imports {result['imports_s']:.1f}, "
              f"build {result['build_s']:.1f}, compile+capture {result['compile_capture_s']:.1f}); cache "
              f"{'loaded' if result['cache_loaded'] else 'stored ' + str(result['cache_bytes']) + ' bytes'}; "
              f"{result['dynamo_unique_graphs']} dynamo graphs; ahead of time {result['ahead_of_time']}; "
              f"mixed vs eager {result['mixed_rel_error_vs_eager']}; later capture {result['later_capture_s']} s "
              f"(loads: first {result['first_load_s']} s, later {result['later_load_s']} s); "
              f"seconds per budget {result['per_budget_s']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": args.spec, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
