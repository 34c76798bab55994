"""Reporters: a :class:`~vitcg.lang.LoadResult` as text for people or JSON for machines."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..lang import LoadResult

if TYPE_CHECKING:
    from .cases import SpecReport


def summary_line(result: LoadResult) -> str:
    invalid = len(result.invalid_files)
    valid = len(result.files) - invalid
    errors = len(result.diagnostics)
    noun = "file" if len(result.files) == 1 else "files"
    unavailable = len(result.unavailable)
    aside = f" ({unavailable} unavailable in this transformers)" if unavailable else ""
    if not errors:
        return f"{len(result.files)} spec {noun} checked: all valid{aside}"
    return (f"{len(result.files)} spec {noun} checked: {valid} valid, {invalid} invalid "
            f"({errors} error{'s' if errors != 1 else ''}){aside}")


def text_report(result: LoadResult) -> str:
    """One ``file:line:col: path: message`` block per diagnostic, then the summary line."""
    lines = [d.format() for d in result.diagnostics]
    lines += [f"{s.file}: note: {s.unavailable}" for s in result.unavailable]
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def json_report(result: LoadResult) -> str:
    """The same facts as :func:`text_report`, as one JSON document."""
    invalid = set(result.invalid_files)
    document = {
        "ok": result.ok,
        "files": [{"file": f, "valid": f not in invalid} for f in result.files],
        "specs": [s.name for s in result.specs],
        "unavailable": {s.name: s.unavailable for s in result.unavailable},
        "diagnostics": [d.to_json() for d in result.diagnostics],
        "summary": summary_line(result),
    }
    return json.dumps(document, indent=2) + "\n"


def check_text(reports: list[SpecReport], *, summary: bool = True, details: bool = True) -> str:
    """A table of cases per spec (``details``), then one summary line (``summary``)."""
    lines = []
    for r in reports if details else ():
        head = f"{r.spec} ({r.device}, {r.dtype}"
        if r.budgets:
            head += f"; budgets {'/'.join(map(str, r.budgets))}, up to {r.max_items} items"
        lines.append(head + ")")
        if r.unavailable:
            lines.append(f"  skipped: {r.unavailable}")
            continue
        if r.error:
            lines.append("  FAILED before any case: " + r.error.replace("\n", "\n    "))
            continue
        half = any(c.graph_vs_fp32 is not None for c in r.cases)
        extra = f"  {'vs fp32 graph/eager':>19}" if half else ""
        lines.append(f"  {'stage':<5} {'case':<38} {'items':>5}  {'route':<22} {'max rel err':>11}{extra}  "
                     f"{'finite':<6}  result")
        for c in r.cases:
            if c.skipped:
                lines.append(f"  {c.stage:<5} {c.name:<38} {'':>5}  {'-':<22} {'':>11}  {'':<6}  skipped ({c.skipped})")
                continue
            result = "ok" if c.ok else ("FAILED: " + c.error if c.error else
                                        f"FAILED (tolerance {c.tolerance:.0e})" if c.finite else "FAILED: not finite")
            noise = (f"  {c.graph_vs_fp32:>9.2e}/{c.eager_vs_fp32:.2e}" if c.graph_vs_fp32 is not None
                     else f"  {'':>19}" if half else "")
            if c.ok and c.max_error > c.tolerance:
                result = "ok (as accurate as eager vs fp32)"
            lines.append(f"  {c.stage:<5} {c.name:<38} {c.items:>5}  {c.route:<22} {c.max_error:>11.2e}{noise}  "
                         f"{'yes' if c.finite else 'NO':<6}  {result}")
    if summary:
        failed = [r.spec for r in reports if not r.ok]
        unavailable = [r.spec for r in reports if r.unavailable]
        passed = len(reports) - len(failed) - len(unavailable)
        line = f"{len(reports)} spec{'s' if len(reports) != 1 else ''} checked: {passed} passed"
        line += f", {len(failed)} failed ({', '.join(failed)})" if failed else ""
        line += f", {len(unavailable)} unavailable in this transformers ({', '.join(unavailable)})" if unavailable else ""
        lines.append(line)
    return "\n".join(lines) + "\n"


def check_json(reports: list[SpecReport]) -> str:
    document = {
        "ok": all(r.ok for r in reports),
        "specs": [
            {"spec": r.spec, "device": r.device, "dtype": r.dtype, "budgets": list(r.budgets),
             "max_items": r.max_items, "ok": r.ok, "error": r.error, "unavailable": r.unavailable,
             "cases": [{"name": c.name, "stage": c.stage, "items": c.items, "route": c.route, "max_error": c.max_error,
                        "graph_vs_fp32": c.graph_vs_fp32, "eager_vs_fp32": c.eager_vs_fp32,
                        "finite": c.finite, "tolerance": c.tolerance, "ok": c.ok, "error": c.error,
                        "skipped": c.skipped} for c in r.cases]}
            for r in reports
        ],
    }
    return json.dumps(document, indent=2) + "\n"
