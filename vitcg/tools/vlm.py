"""The end-to-end stage of ``vitcg check``: the spec proved against the real VLM, not only against itself.

The tiny full VLM (the spec's first architecture; its tiny vision config plus ``tests.vlm.config``) is
built with random weights, its own image processor class makes the inputs from random images of several
sizes and aspect ratios, and :func:`vitcg.accelerate` routes its encoder call. Per image, the VLM's
``get_image_features`` must give the same rows as without vitcg (float32, relative error <= 1e-5), and
greedy ``generate`` the same 8 tokens. A wrong output field, width, feature layer or pixel layout fails
here even when the spec agrees with itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import UsageError, VitcgError
from ..lang.bindings import import_object
from ..lang.model import Spec, thaw
from ..runtime.accelerate import accelerate
from .workloads import relative_error

IMAGE_SIZES = ((56, 84), (112, 56), (84, 84))
"""(height, width) of the random images: landscape, portrait, square; tiny, so CPU runs stay fast."""
NEW_TOKENS = 8


class Unavailable(VitcgError):
    """The installed transformers cannot build this VLM or its processor (not a spec error)."""


def _merge(base: dict, overrides: Mapping) -> dict:
    for key, value in overrides.items():
        base[key] = _merge(dict(base.get(key) or {}), value) if isinstance(value, Mapping) else thaw(value)
    return base


def build_vlm(spec: Spec, seed: int = 0) -> torch.nn.Module:
    """The spec's tiny full VLM with seeded random weights, float32, in eval mode. Raises Unavailable when
    the installed transformers lacks its class."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = next((getattr(transformers, a, None) for a in spec.architectures if hasattr(transformers, a)), None)
    if cls is None:
        raise Unavailable(f"transformers {transformers.__version__} has none of {', '.join(spec.architectures)}")
    config_cls = CONFIG_MAPPING[spec.model_types[0]]
    tiny = thaw(spec.encoder.tiny_config)
    encoder_config = import_object(spec.encoder.config_class)
    overrides = tiny if encoder_config is config_cls else {"vision_config": tiny}
    config = config_cls(**_merge(overrides, spec.tests.vlm.config))
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return cls(config).eval()


def build_processor(spec: Spec):
    """The model's image processor (PIL backend) from its defaults and ``tests.vlm.processor``."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(spec.model_types[0]) or {}
    name = names.get("pil") if isinstance(names, Mapping) else None
    if name is None:
        raise Unavailable(f"no PIL image processor for {spec.model_types[0]} in this transformers")
    try:
        importlib.import_module("PIL")
    except ImportError:
        raise Unavailable("the end-to-end stage needs pillow (pip install pillow)") from None
    import transformers

    return getattr(transformers, name)(**thaw(spec.tests.vlm.processor))


def _features(vlm: torch.nn.Module, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The base model's ``get_image_features`` rows, one tensor per image when the model splits them."""
    with torch.no_grad():
        out = vlm.base_model.get_image_features(**inputs)
    value = out.pooler_output if hasattr(out, "pooler_output") else out
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _prompt(vlm: torch.nn.Module, spec: Spec, per_image: list[int]) -> torch.Tensor:
    """input_ids as the processor's tokenizer would expand them: per image its ``before`` tokens, one
    placeholder per output row, its ``after`` tokens (config fields named by ``tests.vlm.placeholder``)."""
    config, marks = vlm.config, spec.tests.vlm.placeholder
    token = getattr(config, marks["token"])
    ids = [1, 2, 3]
    for rows in per_image:
        ids += [getattr(config, f) for f in marks.get("before", ())] + [token] * rows
        ids += [getattr(config, f) for f in marks.get("after", ())]
    return torch.tensor([[*ids, 4, 5]])


def check_vlm(spec: Spec, seed: int = 0) -> tuple[float, str]:
    """Run the end-to-end stage; ``(largest per-image relative error, route)``. Raises VitcgError naming
    what differs, Unavailable when this transformers cannot build the VLM or its processor."""
    vlm = build_vlm(spec, seed)
    processor = build_processor(spec)
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]
    made = processor(images=images, return_tensors="pt")
    inputs = {k: made[k] for k in spec.tests.vlm.inputs}
    want = _features(vlm, inputs)
    rows = [t.numel() // t.shape[-1] for t in want]
    ids = _prompt(vlm, spec, rows if len(rows) == len(images) else [sum(rows)])
    generate = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS,
                "do_sample": False, **inputs}
    with torch.no_grad():
        tokens = vlm.generate(**generate)
    try:
        handle = accelerate(vlm, spec=spec, progress=False, max_num_batched_tokens=4 * max(64, sum(rows)))
    except UsageError as exc:
        raise VitcgError(f"accelerate refused the VLM: {exc}") from None
    with handle:
        _features(vlm, inputs)  # learns the output layout
        got = _features(vlm, inputs)
        with torch.no_grad():
            accelerated = vlm.generate(**generate)
        stats = handle.stats
    reasons = {r: n for r, n in stats.reasons.items() if not r.startswith("first call")}
    if reasons or not stats.routed:
        raise VitcgError("the VLM's calls ran the original encoder call: "
                         + "; ".join(f"{r} ({n}x)" for r, n in reasons.items()))
    if [g.shape for g in got] != [w.shape for w in want]:
        raise VitcgError(f"features of shapes {[tuple(g.shape) for g in got]}, the VLM's own give "
                         f"{[tuple(w.shape) for w in want]}")
    error = max(relative_error(g, w) for g, w in zip(got, want, strict=True))
    if not torch.equal(accelerated, tokens):
        raise VitcgError(f"greedy generate differs: {accelerated[0, -NEW_TOKENS:].tolist()} vs the VLM's "
                         f"{tokens[0, -NEW_TOKENS:].tolist()} (feature error {error:.1e})")
    manager = stats.manager
    return error, f"graph {manager.replays} replays, eager {manager.misses}"
