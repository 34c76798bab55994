"""Reporters: a :class:`~vitcg.lang.SpecSource` (``validate``) and the spec reports of ``check``, as text for
people or JSON for machines."""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING

from ...lang import SpecSource

if TYPE_CHECKING:
    from .cases import SpecReport


def summary_line(result: SpecSource) -> str:
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


def text_report(result: SpecSource) -> str:
    """One ``file:line:col: path: message`` block per diagnostic, then the summary line."""
    lines = [d.format() for d in result.diagnostics]
    lines += [f"{s.file}: note: {s.unavailable}" for s in result.unavailable]
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def json_report(result: SpecSource) -> str:
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


class Verdict(enum.Enum):
    """What ``vitcg check`` proved about one spec; the value is the word its line starts with."""

    PROVEN = "proven"
    """Every spec-stage case and the end-to-end VLM stage passed."""
    SPEC_ONLY = "spec stage only"
    """Every spec-stage case passed; the end-to-end stage did not run (the reason says why)."""
    FAILED = "FAILED"
    """A case failed, or the spec failed before any case."""
    UNAVAILABLE = "skipped"
    """The installed transformers cannot run the spec: not checked, not failed."""

    @property
    def passed(self) -> bool:
        return self in (Verdict.PROVEN, Verdict.SPEC_ONLY)


def verdict(report: SpecReport) -> tuple[Verdict, str]:
    """The spec's verdict and its reason in one line: what ran, why the end-to-end stage did not, or what
    failed first."""
    if report.unavailable:
        return Verdict.UNAVAILABLE, report.unavailable
    if report.error:
        return Verdict.FAILED, "before any case: " + _first_line(report.error)
    failed = next((c for c in report.cases if not c.ok), None)
    if failed is not None:
        return Verdict.FAILED, _failure(failed)
    return _passed(report)


def _failure(failed) -> str:
    """Where a failed case failed and why, in one line."""
    why = (failed.error if failed.error else f"max rel err {failed.max_error:.2e} > tolerance "
           f"{failed.tolerance:.0e}" if failed.finite else "output not finite")
    where = "end-to-end stage" if failed.stage == "vlm" else failed.name
    return f"{where}: {_first_line(why)}"


def _passed(report: SpecReport) -> tuple[Verdict, str]:
    """The verdict of a spec whose cases all passed: proven when the end-to-end stage ran, else spec stage only."""
    ran = [c for c in report.cases if c.stage == "spec" and not c.skipped]
    cases = f"{len(ran)} case{'s' if len(ran) != 1 else ''}"
    end_to_end = next((c for c in report.cases if c.stage == "vlm"), None)
    if end_to_end is None:
        return Verdict.SPEC_ONLY, f"{cases}; no end-to-end stage: it runs at --size tiny only"
    if end_to_end.skipped:
        return Verdict.SPEC_ONLY, f"{cases}; no end-to-end stage: {_first_line(end_to_end.skipped)}"
    return Verdict.PROVEN, (f"{cases}, and the VLM end to end on {end_to_end.items} items"
                            f"{_route_notes(end_to_end.route or '')}")


def _route_notes(route: str) -> str:
    """What the end-to-end stage's route leaves out of its proof, in parentheses (or nothing)."""
    keys = " (inputs as the VLM passes them: tests.vlm.engine_keys)" if "engine_keys" in route else ""
    if "tests.vlm.features" in route:
        keys += " (greedy tokens only: per-item features out of reach, tests.vlm.features)"
    return keys


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


LINE_WIDTH = 120
"""A spec's line is cut at a word to at most this many characters (ending in ``...``), so that it never wraps in
a terminal of that width: some reasons for a skipped end-to-end stage run to 300 characters. ``--verbose`` and
``--json`` keep the whole reason, and a failed spec's table below its line says it in full."""


def _guesses_left(count: int) -> str:
    return f"{count} guess{'es' if count != 1 else ''} left"


def check_line(report: SpecReport, width: int = 0) -> str:
    """``NAME  verdict: reason``, the name padded to ``width``, at most :data:`LINE_WIDTH` characters. A passed
    spec whose files still hold guesses (a draft's ``# GUESS:`` lines, placeholder checkpoints) reads ``proven,
    with N guesses left: reason``: what the check cannot see is not confirmed yet."""
    kind, reason = verdict(report)
    left = f", with {_guesses_left(len(report.guesses))}" if kind.passed and report.guesses else ""
    line = f"{report.spec:<{width}}  {kind.value}{left}: {reason}"
    return line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH - 2].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def check_details(report: SpecReport) -> list[str]:
    """The spec's table of cases (device, dtype and budgets above it), then the lines of its files that are still
    guesses and the warnings kept while it ran; every line indented."""
    head = f"  {report.device}, {report.dtype}"
    if report.budgets:
        head += f"; budgets {'/'.join(map(str, report.budgets))}, up to {report.max_items} items"
    lines = [head]
    if report.unavailable:
        lines.append(f"  skipped: {report.unavailable}")
    elif report.error:
        lines.append("  FAILED before any case: " + report.error.replace("\n", "\n    "))
    else:
        lines += _table(report)
    if report.guesses:
        lines.append(f"  guesses left ({len(report.guesses)}):")
        lines += ["    " + g.format() for g in report.guesses]
    if report.warnings:
        lines.append(f"  warnings ({len(report.warnings)}):")
        lines += ["    " + w.replace("\n", "\n      ") for w in report.warnings]
    return lines


def _table(r: SpecReport) -> list[str]:
    half = any(c.graph_vs_fp32 is not None for c in r.cases)
    extra = f"  {'vs fp32 graph/eager':>19}" if half else ""
    lines = [f"  {'stage':<5} {'case':<38} {'items':>5}  {'route':<22} {'max rel err':>11}{extra}  "
             f"{'finite':<6}  result"]
    return lines + [_row(c, half) for c in r.cases]


def _row(c, half: bool) -> str:
    """One case's row of the table; ``half``: the table has the column of errors against fp32."""
    if c.skipped:
        return f"  {c.stage:<5} {c.name:<38} {'':>5}  {'-':<22} {'':>11}  {'':<6}  skipped ({c.skipped})"
    result = "ok" if c.ok else ("FAILED: " + c.error if c.error else
                                f"FAILED (tolerance {c.tolerance:.0e})" if c.finite else "FAILED: not finite")
    noise = (f"  {c.graph_vs_fp32:>9.2e}/{c.eager_vs_fp32:.2e}" if c.graph_vs_fp32 is not None
             else f"  {'':>19}" if half else "")
    if c.ok and c.max_error > c.tolerance:
        result = "ok (as accurate as eager vs fp32)"
    return (f"  {c.stage:<5} {c.name:<38} {c.items:>5}  {c.route:<22} {c.max_error:>11.2e}{noise}  "
            f"{'yes' if c.finite else 'NO':<6}  {result}")


def check_summary(reports: list[SpecReport]) -> str:
    """``N specs checked: P passed (X proven, Y spec stage only), F failed (names), U unavailable ..., G guesses
    left (name count, ...)``."""
    kinds = [verdict(r)[0] for r in reports]
    passed = sum(k.passed for k in kinds)
    line = f"{len(reports)} spec{'s' if len(reports) != 1 else ''} checked: {passed} passed"
    if passed:
        parts = [f"{kinds.count(k)} {k.value}" for k in (Verdict.PROVEN, Verdict.SPEC_ONLY) if kinds.count(k)]
        line += f" ({', '.join(parts)})"
    line += _named(reports, kinds, Verdict.FAILED, "failed")
    line += _named(reports, kinds, Verdict.UNAVAILABLE, "unavailable in this transformers")
    guessing = [r for r in reports if r.guesses]
    if guessing:
        line += (f", {_guesses_left(sum(len(r.guesses) for r in guessing))} "
                 f"({', '.join(f'{r.spec} {len(r.guesses)}' for r in guessing)})")
    return line


def _named(reports: list[SpecReport], kinds: list[Verdict], kind: Verdict, label: str) -> str:
    """``, N label (names)`` for the specs of verdict ``kind``, or nothing when there are none."""
    names = [r.spec for r, k in zip(reports, kinds) if k is kind]
    return f", {len(names)} {label} ({', '.join(names)})" if names else ""


def check_text(reports: list[SpecReport], *, verbose: bool = False, summary: bool = True, width: int = 0) -> str:
    """One line per spec (:func:`check_line`, names padded to ``width`` or the longest here), its details
    below it when it failed or with ``verbose``, then the summary line (``summary``)."""
    width = max(width, *(len(r.spec) for r in reports), 0)
    lines = []
    for r in reports:
        lines.append(check_line(r, width))
        if verbose or not r.ok:
            lines += check_details(r)
    if summary:
        lines.append(check_summary(reports))
    return "\n".join(lines) + "\n"


def check_json(reports: list[SpecReport]) -> str:
    """Every spec's report with all its cases, its verdict, the lines of its files that are still guesses
    (``guesses``: file, line, text) and the warnings kept while it ran."""
    document = {
        "ok": all(r.ok for r in reports),
        "specs": [
            {"spec": r.spec, "device": r.device, "dtype": r.dtype, "budgets": list(r.budgets),
             "max_items": r.max_items, "ok": r.ok, "error": r.error, "unavailable": r.unavailable,
             "verdict": verdict(r)[0].name.lower(), "reason": verdict(r)[1],
             "guesses": [g.to_json() for g in r.guesses], "warnings": list(r.warnings),
             "cases": [{"name": c.name, "stage": c.stage, "items": c.items, "route": c.route, "max_error": c.max_error,
                        "graph_vs_fp32": c.graph_vs_fp32, "eager_vs_fp32": c.eager_vs_fp32,
                        "finite": c.finite, "tolerance": c.tolerance, "ok": c.ok, "error": c.error,
                        "skipped": c.skipped} for c in r.cases]}
            for r in reports
        ],
    }
    return json.dumps(document, indent=2) + "\n"
