"""Every repository path that README.md and docs/ name exists: docs that cite paths drift after a move."""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])(?:vitcg|tests|benchmarks|docs|registry)/[\w/.-]*\w\.(?:py|yaml|json|j2|md|sh|png)\b")
"""A path inside the repository with a file suffix, not the tail of a longer path (``my_specs/x.yaml``)."""
EXAMPLES = {"vitcg/specs/cohere_compass.yaml"}
"""Paths named as what a reader would create (the README's walk-through), not as what exists."""


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_named_path_exists(doc: pathlib.Path):
    named = {m.group() for m in PATH.finditer(doc.read_text())}
    missing = sorted(p for p in named - EXAMPLES if "NAME" not in p and not (REPO / p).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"
