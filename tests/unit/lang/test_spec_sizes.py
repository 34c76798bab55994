"""Adding a model takes a dozen lines (issue 25): a family variant states only what differs from its parent, and a
tile-style spec whose graph sections the style's defaults supply stays short. Counted as the issue counts them:
non-blank, non-comment lines of ``NAME.yaml`` (the harness file beside it is not counted)."""

from __future__ import annotations

import statistics

import pytest
import yaml

from support.specs import SPECS, spec_path

VARIANT_MAX = 20
TILES_MAX = 35
MEDIAN_MAX = 45
TILES_DEFAULTED = ("aimv2", "aya_vision", "clip", "cohere2_vision", "deepseek_ocr2", "git", "got_ocr2",
                   "granite_docling", "janus", "llama4", "llava_next", "llava_onevision", "mlcd", "ovis2", "radio",
                   "siglip", "unlimited_ocr")
"""The tile-style specs that write no items, budget or buffers of their own (the issue's 17)."""

NAMES = sorted(p.name[:-5] for p in SPECS.glob("*.yaml") if not p.name.endswith(".tests.yaml"))


def lines(name: str) -> int:
    return sum(1 for line in spec_path(name).read_text().splitlines()
               if line.strip() and not line.strip().startswith("#"))


def parent(name: str) -> str | None:
    return yaml.safe_load(spec_path(name).read_text()).get("extends")


@pytest.mark.parametrize("name", [n for n in NAMES if parent(n)])
def test_a_family_variant_states_only_what_differs(name):
    assert lines(name) <= VARIANT_MAX, f"{name}.yaml (extends {parent(name)}): {lines(name)} lines"


@pytest.mark.parametrize("name", TILES_DEFAULTED)
def test_a_tile_style_spec_on_the_style_defaults_is_short(name):
    assert lines(name) <= TILES_MAX, f"{name}.yaml: {lines(name)} lines"


def test_the_median_spec_is_short():
    assert statistics.median(lines(n) for n in NAMES) <= MEDIAN_MAX
