"""Model types transformers has that no spec covers yet, each with what the spec language lacks for it.

The one source of these reasons: ``vitcg generate`` renders them into registry/SUPPORTED_MODELS.md ("Not
expressible yet"); the README and docs/writing-specs.md name the model types and point there. Listed today: timm
towers (Perception-LM, FastVLM). LFM3-VL's per-item grids left the list when ``replace`` and the
``grid_neighbours`` provider reached them (vitcg/specs/lfm3_vl.yaml). tests/unit/lang/test_uncovered_model_types.py keeps
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
)
"""Gemma 4's video modality is a partial gap, noted in vitcg/specs/gemma4.yaml: frames come padded to 70 soft tokens,
not the 280 of the image tile the spec fixes."""
