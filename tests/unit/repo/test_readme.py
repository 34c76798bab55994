"""The README stays a five-minute read (issue 40): the two commands first, a short page with its sections in
order, every reference page of docs/ linked from it, and its example command's output as the command prints it.
The counts it states are tests/unit/repo/test_spec_counts.py's; its walk-through is run by tests/acceptance/test_cli_new.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from support import REPO

README = (REPO / "README.md").read_text()
MAX_LINES = 220
SECTIONS = ["What vitcg is", "Quick start", "Serving with vLLM", "Adding a model", "Headline results",
            "Support matrix", "Documentation"]
"""The README's second-level headings, in this order (each heading starts with its entry)."""


def test_the_readme_opens_with_the_two_commands():
    """A fresh machine needs only these: the main job, and the tests as CI runs them."""
    lines = README.splitlines()
    assert lines[:3] == ["# vitcg", "", "```bash"]
    assert lines[3].startswith(".ci/setup && .venv/bin/vitcg demo && ") and lines[3].endswith("# main job")
    assert lines[4].startswith(".ci/run ") and "# tests:" in lines[4]
    assert lines[5] == "```"


def test_the_readme_is_short():
    assert len(README.splitlines()) <= MAX_LINES, f"README.md has {len(README.splitlines())} lines"


def test_the_readme_has_its_sections_in_order():
    headings = re.findall(r"^## (.+)$", README, re.M)
    found = [next((s for s in SECTIONS if h.startswith(s)), None) for h in headings]
    assert [s for s in found if s is not None] == SECTIONS, headings


def test_the_readme_links_every_reference_page():
    """Each page of docs/ is reachable from the README, so a page moved out of the README is not lost."""
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert len(pages) >= 7
    missing = [p for p in pages if f"](docs/{p})" not in README]
    assert not missing, f"README.md links no docs/{missing}"


def test_the_readmes_compile_config_example_prints_what_it_shows():
    """The `$ vitcg compile-config ...` block: the command's output, as printed under it."""
    block = re.search(r"^\$ (vitcg compile-config .+)\n(.+)\n```", README, re.M)
    assert block is not None
    command, shown = block.groups()
    run = subprocess.run([sys.executable, "-m", "vitcg", *shlex.split(command)[1:]], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == shown
