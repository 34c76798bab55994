"""Every repository path that README.md and docs/ name exists, and every relative link they make resolves: docs
that cite paths drift after a move."""

from __future__ import annotations

import pathlib
import re

import pytest

from support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])(?:vitcg|tests|benchmarks|docs|registry)/[\w/.-]*\w\.(?:py|yaml|json|j2|md|sh|png)\b")
"""A path inside the repository with a file suffix, not the tail of a longer path (``my_specs/x.yaml``)."""
EXAMPLES = {"vitcg/specs/cohere_compass.yaml"}
"""Paths named as what a reader would create (the README's walk-through), not as what exists."""
LINK = re.compile(r"\]\(([^)\s]+)\)")
"""The target of a Markdown link: ``[text](target)``."""


def _ids(path: pathlib.Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_named_path_exists(doc: pathlib.Path):
    named = {m.group() for m in PATH.finditer(doc.read_text())}
    missing = sorted(p for p in named - EXAMPLES if "NAME" not in p and not (REPO / p).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def relative_links(doc: pathlib.Path) -> list[str]:
    """The targets of the Markdown links of ``doc`` that point into the repository (not a URL, not an anchor of
    the page itself), without their ``#anchor``."""
    targets = [m.group(1) for m in LINK.finditer(doc.read_text())]
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_relative_link_resolves(doc: pathlib.Path):
    """A link is read relative to the page that makes it, as GitHub reads it: ``docs/cli.md`` from the README,
    ``cli.md`` from a page in docs/."""
    broken = sorted({t for t in relative_links(doc) if not (doc.parent / t).exists()})
    assert not broken, f"{doc.name} links to paths that do not exist: {broken}"


def test_a_broken_link_is_found(tmp_path: pathlib.Path):
    """The link check can fail: a page linking a file that is not there, beside one that is."""
    (tmp_path / "there.md").write_text("")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [gone](docs/gone.md#part) [web](https://example.com) [self](#top)\n")
    assert relative_links(page) == ["there.md", "docs/gone.md"]
    assert [t for t in relative_links(page) if not (page.parent / t).exists()] == ["docs/gone.md"]
