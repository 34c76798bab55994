"""What the first eager call of a process costs with the eager side compiled (``compile_eager``), cold and from the
compile cache: run it twice with one ``$VITCG_CACHE_DIR``; the second process loads the functions the first stored.

Per spec (real dimensions, bf16, CUDA): the manager's compile and capture (``capture_compiled``, seconds), then
calls of each workload routed wholly to the eager side (an eager price of zero): the first call of each workload
(seconds, compilation included) and the median of ``--iters`` more (ms); and whether the call's rows equal the
model's own eager forward's within bf16 noise (relative error).

Usage (GPU): python benchmarks/eager_first_call.py SPEC... [--workload W]... [--iters N] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch

from vitcg.lang import SpecSource
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.compile_cache import capture_compiled
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.encoders import build_encoder
from vitcg.tools.workloads import WORKLOADS, make_inputs, on_device, relative_error


def synced_s(fn):
    torch.cuda.synchronize()
    tic = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - tic


def run_spec(name: str, workloads: list[str], iters: int) -> dict:
    spec = SpecSource()[name]
    module = build_encoder(spec, "real", device="cuda", dtype=torch.bfloat16)
    adapter = adapter_for(spec, module, compile_forward=True, compile_eager=True)
    manager = EncoderCudaGraphManager(adapter, device="cuda", dtype=torch.bfloat16)
    (_, use), capture_s = synced_s(lambda: capture_compiled(manager, spec))
    manager.costs.eager = lambda tokens: 0.0  # every call to the eager side
    plain = adapter_for(spec, module)
    result = {"capture_s": round(capture_s, 2), "graphs_cache_loaded": use.loaded,
              "eager_functions_loaded": len(adapter.eager_ahead.blobs), "workloads": {}}
    print(f"{name}: compile and capture {capture_s:.1f} s (cache loaded: {use.loaded}), eager functions loaded "
          f"at capture: {len(adapter.eager_ahead.blobs)}", flush=True)
    for workload in workloads:
        inputs = on_device(adapter, make_inputs(adapter, WORKLOADS[workload], torch.Generator().manual_seed(0)),
                           torch.bfloat16)
        call = functools.partial(manager.execute, inputs)
        compiled, loads = adapter.eager_ahead.compiled, len(adapter.eager_ahead.load_seconds)
        got, first_s = synced_s(call)
        loaded_s = adapter.eager_ahead.load_seconds[loads:]
        got = torch.cat(got)
        times = [synced_s(call)[1] * 1e3 for _ in range(iters)]
        error = relative_error(got, plain.encoder_eager_forward(inputs))
        row = {"first_s": round(first_s, 3), "ms": statistics.median(times), "vs_own_eager": error,
               "compiled": adapter.eager_ahead.compiled, "compiled_at_first_call": adapter.eager_ahead.compiled - compiled,
               "loaded_at_first_call_s": [round(t, 3) for t in loaded_s], "eager_compiled": adapter.eager_compiled,
               "ahead_of_time_off": adapter.eager_ahead.disabled}
        result["workloads"][workload] = row
        print(f"  {workload:12s} first call {first_s:6.2f} s  then {row['ms']:8.2f} ms  functions compiled here "
              f"{row['compiled']} (at its first call {row['compiled_at_first_call']}, loaded there "
              f"{row['loaded_at_first_call_s']} s)  vs own eager {error:.2e}", flush=True)
        if adapter.eager_ahead.disabled:
            print(f"    not compiled ahead of time: {adapter.eager_ahead.disabled}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS))
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "specs": {}}
    for name in args.specs:
        results["specs"][name] = run_spec(name, args.workload or ["mixed", "8x224", "1x448"], args.iters)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
