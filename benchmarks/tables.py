"""Markdown tables from a ``vitcg bench --json`` file (what benchmarks/RESULTS.md quotes).

Usage: python benchmarks/tables.py benchmarks/results-2026-11-22-h100.json
"""

from __future__ import annotations

import json
import sys

METHODS = (("eager", "HF eager"), ("compile", "torch.compile"), ("vitcg_tight", "vitcg"),
           ("vitcg_greedy", "vitcg greedy"), ("vitcg_inductor", "vitcg+inductor"), ("exact", "exact graph"))


def spec_table(spec: dict) -> str:
    methods = [(k, label) for k, label in METHODS if any(k in w["ms"] for w in spec["workloads"])]
    head = ["workload", "tokens"] + [f"{label} (ms)" for _, label in methods] + [
        "vitcg / exact", "eager / vitcg", "budgets (vitcg)", "padding", "host ms / replay"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in spec["workloads"]:
        tight = w["packing"]["tight"]
        cells = [w["workload"], str(w["tokens"])] + [f"{w['ms'][k]:.2f}" if k in w["ms"] else "-" for k, _ in methods]
        cells += [f"{w['ms']['vitcg_tight'] / w['ms']['exact']:.2f}x" if "exact" in w["ms"] else "-",
                  f"{w['ms']['eager'] / w['ms']['vitcg_tight']:.1f}x",
                  "+".join(map(str, tight["budgets"])), f"{tight['padding_waste']:.0%}",
                  f"{tight['host_ms_per_replay']:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    document = json.loads(open(sys.argv[1]).read())
    print("| spec | parameters (M) | budgets | capture (s) | graph pool + buffers (MiB) |")
    print("|---|---|---|---|---|")
    for s in document["specs"]:
        print(f"| {s['spec']} | {s['parameters_m']:.0f} | {'/'.join(map(str, s['budgets']))} | {s['capture_s']:.1f} | "
              f"{s['pool_mib']:.0f} |")
    for s in document["specs"]:
        print(f"\n### {s['spec']} ({s['size']} dimensions, {s['dtype']})\n")
        print(spec_table(s))


if __name__ == "__main__":
    main()
