"""Every count of the packaged specs the README states follows the registry: how many specs, how many the
end-to-end stage proves and how many say in tests.vlm.skip why it cannot run, and the main job's line count.

The README said 64 specs after radio_packed and hy_v4_vl made 66. Which specs pass is `vitcg check --all`'s to
prove (the README's block is its output); the counts it must show follow from the registry alone.
"""

from __future__ import annotations

import re

import pytest

from support import REPO
from support.specs import packaged

README = (REPO / "README.md").read_text()
REGISTRY = packaged()
SPECS = len(REGISTRY.names)
SKIPPED = sum(1 for n in REGISTRY.names if REGISTRY.get(n).tests.vlm is not None and REGISTRY.get(n).tests.vlm.skip)
PROVEN = SPECS - SKIPPED
MAIN_JOB = README[README.index("```text\n", README.index("A passing main job")):]
MAIN_JOB = MAIN_JOB[len("```text\n"):MAIN_JOB.index("\n```")].splitlines()


def _one(pattern: str) -> tuple[int, ...]:
    """The numbers of the one README passage that ``pattern`` matches (spaces and line breaks alike)."""
    found = re.findall(pattern, " ".join(README.split()))
    assert len(found) == 1, f"{pattern!r}: {len(found)} passages"
    return tuple(int(n) for n in (found[0] if isinstance(found[0], tuple) else (found[0],)))


@pytest.mark.parametrize(("pattern", "expected"), [
    (r"(\d+) spec files checked: all valid", (SPECS,)),
    (r"registry/ is up to date \(\d+ files from (\d+) specs\)", (SPECS,)),
    (r"(\d+) specs checked: (\d+) passed \((\d+) proven, (\d+) spec stage only\)", (SPECS, SPECS, PROVEN, SKIPPED)),
    (r"covers (\d+) encoder families", (SPECS,)),
    (r"passes for all (\d+) on the CPU", (SPECS,)),
    (r"proves (\d+) of them against the real tiny VLM and says why not for the other (\d+)\.", (PROVEN, SKIPPED)),
])
def test_the_readme_counts_the_packaged_specs(pattern, expected):
    assert _one(pattern) == expected


def test_the_readme_counts_the_main_jobs_lines():
    """The demo's three lines, validate's and generate's, one per spec and check's summary; the block shows some
    spec lines and says how many it leaves out."""
    shown = [line for line in MAIN_JOB if re.match(r"^[a-z0-9_]+ +(proven|spec stage only|failed)", line)]
    assert _one(r"A passing main job prints (\d+) lines after setup") == (3 + 1 + 1 + SPECS + 1,)
    assert _one(r"here with (\d+) of its (\d+) spec lines left out") == (SPECS - len(shown), SPECS)
    assert len(MAIN_JOB) - MAIN_JOB.count("...") == 3 + 2 + len(shown) + 1  # "..." marks the lines left out
