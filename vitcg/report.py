"""Reporters: a :class:`~vitcg.spec.LoadResult` as text for people or JSON for machines."""

from __future__ import annotations

import json

from .spec import LoadResult


def summary_line(result: LoadResult) -> str:
    invalid = len(result.invalid_files)
    valid = len(result.files) - invalid
    errors = len(result.diagnostics)
    noun = "file" if len(result.files) == 1 else "files"
    if not errors:
        return f"{len(result.files)} spec {noun} checked: all valid"
    return (f"{len(result.files)} spec {noun} checked: {valid} valid, {invalid} invalid "
            f"({errors} error{'s' if errors != 1 else ''})")


def text_report(result: LoadResult) -> str:
    """One ``file:line:col: path: message`` block per diagnostic, then the summary line."""
    lines = [d.format() for d in result.diagnostics]
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def json_report(result: LoadResult) -> str:
    """The same facts as :func:`text_report`, as one JSON document."""
    invalid = set(result.invalid_files)
    document = {
        "ok": result.ok,
        "files": [{"file": f, "valid": f not in invalid} for f in result.files],
        "specs": [s.name for s in result.specs],
        "diagnostics": [d.to_json() for d in result.diagnostics],
        "summary": summary_line(result),
    }
    return json.dumps(document, indent=2) + "\n"
