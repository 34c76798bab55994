"""Model types transformers has that no spec covers yet, each with what the spec language lacks for it.

The one source of these reasons: ``vitcg generate`` renders them into registry/SUPPORTED_MODELS.md ("Not
expressible yet"), docs/writing-specs.md points there, and tests/unit/test_gaps.py keeps them honest (no spec
covers a listed model type; every listed model type exists in the newest supported transformers).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    model_types: tuple[str, ...]
    reason: str


GAPS: tuple[Gap, ...] = (
    Gap(("pixtral", "mistral3"),
        "whole images padded to the batch's largest come as one (batch, C, H, W) tensor and are cut to "
        "image_sizes inside the forward (a Python loop over host sizes, and cu_seqlens copied to the device on "
        "every call): no attention style takes variable-size images in one tensor; needs a packed-pixels input "
        "layout, or a graph scope over the transformer layers (not attempted)."),
    Gap(("minicpmv4_6", "minicpmv4_7", "minicpm_ocr"),
        "(one tower code in all three) a check in the merger formats the target_sizes tensor into its "
        "message (a host sync inside the "
        "captured part); needs a graph scope that leaves the check outside, or the use_vit_merger=False mode "
        "(grid_columns: [h, w] already covers its tgt_sizes)."),
    Gap(("video_llama_3",),
        "the merge splits rows by grid_thw.prod(dim=1).tolist() and loops over items (pixel_unshuffle, "
        "interpolate), which is no row selection, so epilogue: masked_rows does not fit; a layer-stack "
        "graph_scope would leave the loop to the model, but the tower also takes merge_sizes, one value per item, "
        "and extra input roles are aligned with pixel rows: needs an item-aligned input role."),
    Gap(("perception_lm", "fast_vlm"),
        "timm towers (TimmWrapper); timm needs torchvision, which does not load beside the CPU build of torch "
        "that CI uses, so they cannot be built or checked here."),
)
"""Gemma 4's video modality is a partial gap, noted in specs/gemma4.yaml: frames come padded to 70 soft tokens,
not the 280 of the image tile the spec fixes."""
