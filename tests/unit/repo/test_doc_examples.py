"""What the reference pages of docs/ show or promise stays true after they moved out of the README (issue 40):
the planning page's example is the command's output, and the rules issue 37 asked the cache trust model and the
spec language's reference to state are still stated there."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from support import REPO

DOCS = REPO / "docs"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_planning_pages_example_prints_what_it_shows(tmp_path):
    """`vitcg plan qwen2_vl --manager vllm` as docs/planning.md shows it, but the search's own time."""
    block = re.search(r"^\$ (vitcg plan [^\n]+)\n(.*?)\n```", (DOCS / "planning.md").read_text(), re.M | re.S)
    assert block is not None
    command, shown = block.groups()
    run = subprocess.run([sys.executable, "-m", "vitcg", *shlex.split(command)[1:]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    timing = re.compile(r"(configurations in) [0-9.]+ s")
    assert timing.sub(r"\1 T s", run.stdout.rstrip("\n")) == timing.sub(r"\1 T s", shown)


def test_the_cache_trust_model_states_its_link_and_regular_file_rules():
    text = _flat((DOCS / "cache.md").read_text())
    assert "**Never through a link it did not make.**" in text
    assert "**Never over a file it did not write.** vitcg writes only regular files, each under a cap" in text
    assert "A `compile/` that is a symbolic link" in text and "is neither read from nor written into" in text


def test_the_spec_reference_states_its_link_and_regular_file_rules():
    text = _flat((DOCS / "writing-specs.md").read_text())
    assert "**Spec, parent and harness files are regular files**, read only inside the spec's folder" in text
    assert "A symbolic link is followed only when its target stays inside the folder that holds the link" in text
