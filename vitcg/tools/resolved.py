"""``vitcg validate --resolved``: each spec file as the checks see it, flattened."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from ..errors import Diagnostic, UsageError
from ..lang import Bindings, discover, resolver, schema, spec_folders
from ..lang.checks import check


def _in_order(data: dict) -> dict:
    """``data`` with its top-level keys in the schema's order (the order a spec is written in), unknown ones last."""
    order = {key: i for i, key in enumerate(schema()["properties"])}
    return dict(sorted(data.items(), key=lambda item: order.get(item[0], len(order))))


def resolved_report(paths: Sequence[str | Path], as_json: bool, bindings: Bindings | None = None) -> tuple[str, bool]:
    """The resolved spec of each file under ``paths`` (default: the spec folders), checked as ``vitcg validate``
    checks it (``bindings`` too, when given): as YAML documents (``---`` between them) where a comment names what
    the file extends (its parents, then its style base and the bases under it) and its diagnostics, hint lines
    included, are comments above the spec, so that the text stays YAML; or one JSON object by file (the spec, or
    ``{"diagnostics": [...], "resolved": spec}`` for a file that does not validate, without ``resolved`` when it
    does not even resolve). Returns the text and whether every file validated. Raises UsageError when no spec file
    is found."""
    files = discover(paths or spec_folders())
    if not files:
        raise UsageError(f"no spec files (*.yaml) under {', '.join(map(str, paths or spec_folders()))}")
    resolving = resolver()
    out: dict[str, object] = {}
    texts: list[str] = []
    ok = True
    for path in files:
        loaded, problems = resolving.resolve_file(path)
        if loaded is not None:
            problems = check(loaded, bindings)[1]
        ok = ok and not problems
        out[str(path)], text = _file_report(path, loaded, problems, resolving.ancestry(path))
        texts.append(text)
    if bindings is not None:
        bindings.save()
    if as_json:
        return json.dumps(out, indent=1) + "\n", ok
    return "---\n".join(texts), ok


def _extends(ancestry: Sequence[tuple[str, str]]) -> str:
    """What the file extends, nearest first, as one YAML comment: its parents, then its style base and the bases
    under it (files a user can open)."""
    return "# extends: " + " -> ".join(f"{name} ({file})" for name, file in ancestry) + "\n" if ancestry else ""


def _file_report(path: Path, loaded, problems: Sequence[Diagnostic],
                 ancestry: Sequence[tuple[str, str]]) -> tuple[object, str]:
    """One file's JSON value and YAML text: its resolved spec (None: it does not resolve) with its diagnostics and,
    as a comment, what it extends."""
    if loaded is None:
        return {"diagnostics": [d.to_json() for d in problems]}, f"# {path}: does not resolve\n" + _comments(problems)
    data = _in_order(loaded.data)
    value = {"diagnostics": [d.to_json() for d in problems], "resolved": data} if problems else data
    title = f"# {path}, resolved" + (f" (does not validate: {len(problems)} error{'s' * (len(problems) != 1)})"
                                     if problems else "")
    return value, title + "\n" + _extends(ancestry) + _comments(problems) + yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)


def _comments(problems: Sequence[Diagnostic]) -> str:
    """Each line of each diagnostic as a YAML comment."""
    return "".join(f"# {line}\n" for d in problems for line in d.format().splitlines())
