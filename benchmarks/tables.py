"""Markdown tables from ``vitcg bench --json`` files (what benchmarks/RESULTS.md quotes).

Usage: python benchmarks/tables.py RESULTS.json [MORE.json ...] [--merged OUT.json] [--summary-only]

Several files (runs of one session split across device calls) are merged in order: a spec measured twice
keeps its last run, and specs are listed by name. ``--merged`` writes the merged document (with every
run's command under ``commands``). Failed specs (``error``) are listed, never tabulated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

METHODS = (("eager", "HF eager"), ("compile", "torch.compile"), ("vitcg_tight", "vitcg"),
           ("vitcg_greedy", "vitcg greedy"), ("vitcg_inductor", "vitcg+inductor"), ("exact", "exact graph"))


def merge(documents: list[dict]) -> dict:
    """One document from several runs: environment and workloads of the first, specs of all."""
    specs: dict[str, dict] = {}
    commands: list[str] = []
    for document in documents:
        commands += document.get("commands", [document["command"]] if "command" in document else [])
        for spec in document["specs"]:
            specs.pop(spec["spec"], None)
            specs[spec["spec"]] = spec
    first = documents[0]
    return {"date": first["date"], "commands": commands, "environment": first["environment"],
            "workloads": first["workloads"], "specs": [specs[name] for name in sorted(specs)]}


def spec_table(spec: dict) -> str:
    methods = [(k, label) for k, label in METHODS if any(k in w["ms"] for w in spec["workloads"])]
    roofline = any(w.get("floor_ms") for w in spec["workloads"])
    head = ["workload", "tokens"] + (["floor (ms)"] if roofline else []) + [f"{label} (ms)" for _, label in methods] + [
        "vitcg / exact", "eager / vitcg"] + (["vitcg / floor", "best / floor"] if roofline else []) + [
        "budgets (vitcg)", "padding", "host ms / replay"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in spec["workloads"]:
        tight = w["packing"]["tight"]
        floor = w.get("floor_ms")
        cells = [w["workload"], str(w["tokens"])] + ([f"{floor:.2f}" if floor else "-"] if roofline else [])
        cells += [f"{w['ms'][k]:.2f}" if k in w["ms"] else "-" for k, _ in methods]
        cells += [f"{w['ms']['vitcg_tight'] / w['ms']['exact']:.2f}x" if "exact" in w["ms"] else "-",
                  f"{w['ms']['eager'] / w['ms']['vitcg_tight']:.1f}x"]
        if roofline:
            best = min(w["ms"].get(k, float("inf")) for k in ("vitcg_tight", "vitcg_inductor"))
            cells += [f"{w['ms']['vitcg_tight'] / floor:.1f}x" if floor else "-", f"{best / floor:.1f}x" if floor else "-"]
        cells += ["+".join(map(str, tight["budgets"])) or "eager", f"{tight['padding_waste']:.0%}",
                  f"{tight['host_ms_per_replay']:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def capture_table(specs: list[dict]) -> str:
    rows = ["| spec | parameters (M) | budgets | capture (s) | graph pool + buffers (MiB) |", "|---|---|---|---|---|"]
    for s in specs:
        budgets = s["budgets"]
        shown = "/".join(map(str, budgets)) if len(budgets) <= 8 else f"{len(budgets)}: {budgets[0]}..{budgets[-1]}"
        rows.append(f"| {s['spec']} | {s['parameters_m']:.0f} | {shown} | {s['capture_s']:.1f} | {s['pool_mib']:.0f} |")
    return "\n".join(rows)


def summary_table(specs: list[dict], workloads: list[str]) -> str:
    """One row per spec: per workload ``eager -> vitcg ms (speedup)``, and the worst vitcg / exact ratio."""
    head = ["spec"] + [f"{w}: eager -> vitcg ms" for w in workloads] + ["vitcg / exact (worst)", "max rel. error"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in specs:
        by_name = {w["workload"]: w for w in s["workloads"]}
        cells = [s["spec"]]
        for name in workloads:
            w = by_name.get(name)
            cells.append("-" if w is None else
                         f"{w['ms']['eager']:.1f} -> {w['ms']['vitcg_tight']:.1f} "
                         f"({w['ms']['eager'] / w['ms']['vitcg_tight']:.1f}x)")
        ratios = [w["ms"]["vitcg_tight"] / w["ms"]["exact"] for w in s["workloads"] if "exact" in w["ms"]]
        cells.append(f"{max(ratios):.2f}x" if ratios else "-")
        cells.append(f"{max((w['max_rel_error'] for w in s['workloads']), default=0.0):.1e}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--merged", help="write the merged JSON document here")
    parser.add_argument("--summary-only", action="store_true", help="no per-spec tables")
    args = parser.parse_args()
    document = merge([json.loads(Path(path).read_text()) for path in args.files])
    if args.merged:
        with open(args.merged, "w") as out:
            out.write(json.dumps(document, indent=2) + "\n")
    measured = [s for s in document["specs"] if "error" not in s]
    failed = [s for s in document["specs"] if "error" in s]
    workloads = [w for w in document["workloads"] if any(w == r["workload"] for s in measured for r in s["workloads"])]
    print(capture_table(measured))
    print()
    print(summary_table(measured, workloads))
    for s in failed:
        print(f"\n- {s['spec']} failed: {s['error']}")
    if not args.summary_only:
        for s in measured:
            print(f"\n### {s['spec']} ({s['size']} dimensions, {s['dtype']})\n")
            print(spec_table(s))


if __name__ == "__main__":
    main()
