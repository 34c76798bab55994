"""Model types transformers has that no spec covers yet, each with what the spec language lacks for it.

The one source of these reasons: ``vitcg generate`` renders them into registry/SUPPORTED_MODELS.md ("Not
expressible yet"); the README and docs/writing-specs.md name the model types and point there. Listed today: timm
towers (Perception-LM, FastVLM) and LFM3-VL's per-item grids. tests/unit/lang/test_uncovered_model_types.py keeps
the list honest: no spec covers a listed model type, every one exists in the newest transformers CI runs
(.ci/setup's default), and the README and the guide name each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    model_types: tuple[str, ...]
    reason: str


GAPS: tuple[Gap, ...] = (
    Gap(("perception_lm", "fast_vlm"),
        "timm towers (TimmWrapper); timm needs torchvision, which does not load beside the CPU build of torch "
        "that CI uses, so they cannot be built or checked here."),
    Gap(("lfm3_vl",),
        "Every conv layer of the tower reshapes each item's rows to its (t, h, w) grid in a Python loop over "
        "grid_thw.tolist(), passed to all layers: a graph of the model's own code bakes that list in. Measured on "
        "the CPU (benchmarks/per_item_grids.py, random weights): a graph per distinct grid set needed 950 captures "
        "for 1000 calls of 1-4 photos; the conv modules took 31-53% of the eager time and interleave with the "
        "attention layers, so a stack graph that leaves them eager keeps most launches. A sync-free form exists "
        "(the depthwise convolution as a gather over each row's grid neighbours, filled outside the graph), but "
        "it replaces the model's code, which a spec cannot do."),
)
"""Gemma 4's video modality is a partial gap, noted in vitcg/specs/gemma4.yaml: frames come padded to 70 soft tokens,
not the 280 of the image tile the spec fixes."""
