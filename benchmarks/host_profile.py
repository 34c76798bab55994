"""Where the host time of one ``manager.execute`` goes, on the real encoder (cProfile, top entries).

Usage: python benchmarks/host_profile.py [--compile] [--graphs-only] [SPEC] [WORKLOAD...]   (CUDA if available, else
CPU tiny). ``--compile``: the graphs hold inductor-compiled blocks (fewer kernel nodes per graph to launch).
``--graphs-only``: routing off, so every item is replayed (the router may send a compute-bound call eagerly).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.compile_cache import capture_compiled
from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in ("--compile", "--graphs-only")]
    compile_forward = "--compile" in sys.argv[1:]
    options = ManagerOptions(route_eager="--graphs-only" not in sys.argv[1:])
    name = args[0] if args else "qwen2_vl"
    workloads = args[1:] or ["1x224", "8x224"]
    cuda = torch.cuda.is_available()
    device, dtype, size = ("cuda", torch.bfloat16, "real") if cuda else ("cpu", torch.float32, "tiny")
    spec = SpecSource()[name]
    adapter = adapter_for(spec, build_encoder(spec, size, device=device, dtype=dtype), compile_forward=compile_forward)
    manager = EncoderCudaGraphManager(adapter, device=device, dtype=dtype, options=options)
    if compile_forward:
        capture_compiled(manager, spec)
    else:
        manager.capture()
    for workload in workloads:
        inputs = on_device(adapter, make_inputs(adapter, WORKLOADS[workload], torch.Generator()), dtype)
        for _ in range(5):
            manager.execute(inputs)
        samples = []
        for _ in range(50):
            if cuda:
                torch.cuda.synchronize()
            tic = time.perf_counter()
            manager.execute(inputs)
            samples.append((time.perf_counter() - tic) * 1e3)
        samples.sort()
        label = f"{name} (compiled blocks)" if compile_forward else name
        print(f"{label} {workload}: host ms per execute: median {samples[25]:.3f}, min {samples[0]:.3f}")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(50):
            manager.execute(inputs)
            if cuda:
                torch.cuda.synchronize()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)
        if cuda:  # the CUDA runtime calls one execute makes, and their host time
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    manager.execute(inputs)
                    torch.cuda.synchronize()
            print(f"{name} {workload}: CUDA runtime calls per execute (count, host us)")
            for event in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total):
                if event.key.startswith("cuda") and event.count:
                    print(f"    {event.key:<32} {event.count / 20:6.1f}  {event.cpu_time_total / 20:8.1f}")


if __name__ == "__main__":
    main()
