"""``vitcg validate --resolved``: each spec file as the checks see it, flattened."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from ..lang import discover, resolve_file, schema, spec_folders


def _in_order(data: dict) -> dict:
    """``data`` with its top-level keys in the schema's order (the order a spec is written in), unknown ones last."""
    order = {key: i for i, key in enumerate(schema()["properties"])}
    return dict(sorted(data.items(), key=lambda item: order.get(item[0], len(order))))


def resolved_report(paths: Sequence[str | Path], as_json: bool) -> tuple[str, bool]:
    """The resolved spec of each file under ``paths`` (default: the spec folders), as YAML documents (``---``
    between them) or one JSON object by file; the diagnostics of a file that does not resolve instead of its
    spec. Returns the text and whether every file resolved."""
    files = discover(paths or spec_folders())
    out: dict[str, object] = {}
    texts: list[str] = []
    ok = True
    for path in files:
        loaded, problems = resolve_file(path)
        if loaded is None:
            ok = False
            out[str(path)] = {"diagnostics": [d.to_json() for d in problems]}
            texts.append(f"# {path}: does not resolve\n" + "".join(f"# {d.format()}\n" for d in problems))
            continue
        data = out[str(path)] = _in_order(loaded.data)
        texts.append(f"# {path}, resolved\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120,
                                                              default_flow_style=None))
    if as_json:
        return json.dumps(out, indent=1) + "\n", ok
    return "---\n".join(texts), ok
