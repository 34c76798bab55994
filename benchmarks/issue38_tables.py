"""Issue 38's tables in benchmarks/RESULTS.md, from the JSON files of one session's device calls.

Usage: python benchmarks/issue38_tables.py KIND FILE [FILE ...]

KIND is ``ttft`` (``generate_ttft.py --json``), ``bench`` (``vitcg bench --roofline --json``, several files in
order), ``plugin`` (``plugin_encode.py --json``) or ``attention`` (``attention_backends.py --json``). Ratios are
taken within one file, so within one process; a ratio past the issue's bound is printed in bold.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROUTER_SLACK = 1.03
"""Item 3: the default within 3% of the better of its two sides."""


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _bold(text: str, when: bool) -> str:
    return f"**{text}**" if when else text


def ttft(document: dict) -> str:
    """Per model and workload: stock, default, both sides, default / better side, the free-encoder bound."""
    rows = []
    for model, measured in document["models"].items():
        for workload, w in measured["workloads"].items():
            ratio = w["default_vs_best"]
            rows.append([model, workload, f"{w['eager_ms']:.2f}", f"{w['vitcg_ms']:.2f}", f"{w['gain']:.2f}x",
                         f"{w['graphs_only_ms']:.2f}", f"{w['eager_side_ms']:.2f}",
                         _bold(f"{ratio:.3f}", ratio > ROUTER_SLACK), f"{w['gain_bound']:.2f}x",
                         "yes" if w["same_first_token"] else "**no**"])
    return _table(["model", "workload", "stock ms", "default ms", "gain", "graphs only ms", "eager side ms",
                   "default / better side", "bound (free encoder)", "same first token"], rows)


def bench(documents: list[dict]) -> str:
    """Per spec and workload: the plain default against its better side, +inductor against torch.compile and
    against the roofline floor."""
    rows = []
    for document in documents:
        for spec in document["specs"]:
            for w in spec.get("workloads", []):
                ms = w["ms"]
                routed = ms["vitcg_tight"] / min(ms["vitcg_graphs"], ms["eager"])
                inductor, compiled, floor = ms["vitcg_inductor"], ms.get("compile"), w.get("floor_ms")
                budgets = w["packing"]["tight"]["budgets"]
                rows.append([
                    spec["spec"], w["workload"], str(w["tokens"]), f"{ms['eager']:.2f}", f"{ms['vitcg_graphs']:.2f}",
                    _bold(f"{routed:.3f}", routed > ROUTER_SLACK), f"{inductor:.2f}", f"{ms['exact']:.2f}",
                    f"{compiled:.2f}" if compiled else "fails",
                    _bold(f"{inductor / compiled:.2f}", inductor > compiled) if compiled else "-",
                    f"{floor:.2f}" if floor else "-", f"{inductor / floor:.2f}x" if floor else "-",
                    str(budgets) if budgets else "[] (eager)"])
    return _table(["spec", "workload", "tokens", "eager", "graphs", "default (plain) / better side", "+inductor",
                   "exact", "compile", "+inductor / compile", "floor", "+inductor / floor", "budgets (tight)"], rows)


def plugin(document: dict) -> str:
    """Per model and workload: the stock backend against the plugin's two paths. Files from before 2026-12-06's
    second session have ``plugin`` (plain blocks) and ``compiled``; later ones ``plugin`` (the default: compiled
    blocks on CUDA) and ``plain``."""
    later = any("compiled_blocks" in measured for measured in document["models"].values())
    paths = [("plugin", "plugin (default, compiled blocks)"), ("plain", "plugin (plain blocks)")] if later else \
        [("plugin", "plugin (plain blocks)"), ("compiled", "plugin (compiled blocks)")]
    rows = []
    for model, measured in document["models"].items():
        for workload, w in measured["workloads"].items():
            if "plugin_ms" not in w:  # declined by the plugin, or no batch of that kind: the log says which
                continue
            row = [model, workload, str(w["items"]), f"{w['stock_ms']:.2f}"]
            for key, _ in paths:
                if f"{key}_ms" in w:
                    row += [f"{w[f'{key}_ms']:.2f}", _bold(f"{w[f'{key}_gain']:.2f}x", w[f"{key}_gain"] < 1)]
                else:
                    row += ["-", "-"]
            equal = all(w.get(f"{key}_equal", True) for key, _ in paths)
            rows.append(row + ["yes" if equal else "**no**"])
    headers = [part for _, header in paths for part in (header, "gain")]
    return _table(["model", "workload", "items", "stock", *headers, "every item equal"], rows)


def attention(document: dict) -> str:
    """Per head dim and call: vitcg's runtime kernel / cuDNN per segment in TFLOP/s, and their ratio."""
    dims = document["dims"]
    workloads = list(next(iter(dims.values()))["cases"])
    rows = []
    for dim, measured in dims.items():
        row = [dim]
        for workload in workloads:
            backends = measured["cases"][workload]["backends"]
            ours, theirs = backends["triton_runtime"]["tflops"], backends["cudnn_segments"]["tflops"]
            row.append(_bold(f"{ours:.0f} / {theirs:.0f} ({ours / theirs:.2f})", ours < theirs))
        rows.append(row)
    return _table(["head dim"] + workloads, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("ttft", "bench", "plugin", "attention"))
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    documents = [json.loads(path.read_text()) for path in args.files]
    if args.kind == "bench":  # one table over every file: a session's bench runs are split across device calls
        print(bench(documents))
        return
    render = {"ttft": ttft, "plugin": plugin, "attention": attention}[args.kind]
    for document in documents:
        print(render(document))


if __name__ == "__main__":
    main()
