"""Fixed budget ladders against the default, under `vitcg plan`'s cost model (no GPU): expected ms per request
and graph memory for each ladder, on the bench workloads plus generate_ttft.py's four calls.

Usage: python benchmarks/fixed_ladders.py [SPEC...]

A ladder here doubles from the default's smallest budget up to a threshold and then grows by a fixed factor
up to 8192 (rounded to multiples of 64). benchmarks/RESULTS.md quotes the output; it is why the default ladder stays vLLM's.
"""

from __future__ import annotations

import argparse

from vitcg.lang import SpecSource
from vitcg.tools.plan import planner as planning

TTFT_CALLS = ["224x224", "448x448", "448x448,448x448,448x448,448x448", "476x644,336x336,784x1036"]
LADDERS = {"x1.5 from 1024": (1.5, 1024), "x1.25 from 1024": (1.25, 1024),
           "x1.5 from 512": (1.5, 512), "x1.25 from 512": (1.25, 512)}


def ladder(step: float, fine_from: int, low: int = 64, high: int = 8192) -> tuple[int, ...]:
    budgets, value = [], low
    while value < high:
        budgets.append(value)
        value = value * 2 if value < fine_from else int(round(value * step / 64)) * 64
    return tuple(sorted({*budgets, high}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=["qwen2_vl", "qwen3_vl", "internvl"])
    args = parser.parse_args()
    registry = SpecSource()
    for name in args.specs:
        spec = registry[name]
        geometry = planning.spec_geometry(spec)
        target = planning.target_of(spec, geometry, 8192, 32768)
        sample = planning.default_requests(spec) + [planning.parse_request(t) for t in TTFT_CALLS]
        grouped = planning.group(lambda r, spec=spec, geometry=geometry: planning.request_items(spec, geometry, r),
                                 sample)
        planner = planning.Planner(target, grouped, planning.default_costs())
        default = planner.default_config()
        names = [request.name or ",".join(f"{h}x{w}" for h, w in request.images) for request, _, _ in grouped]
        print(f"{name}: " + "  ".join(names))
        rows = [("default", default.budgets)] + [(label, ladder(*shape, low=default.budgets[0]))
                                                 for label, shape in LADDERS.items()]
        for label, budgets in rows:
            result = planner.evaluate(planning.Config(budgets, default.max_items, default.max_frames))
            cells = " ".join(f"{ms:7.2f}" for ms in result.per_request)
            print(f"  {label:16s} {len(budgets):2d} budgets {result.memory_mib:6.0f} MiB  {cells}  "
                  f"mean {result.expected_ms:6.2f} ms")


if __name__ == "__main__":
    main()
