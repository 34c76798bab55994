"""The end-to-end stage of ``vitcg check``: a spec proved against the real VLM, not only against itself.

The tiny full VLM (the spec's first architecture that the installed transformers has; the tiny vision config
plus ``tests.vlm.config``) is built with random weights; its own image processor class, constructed from its
defaults and ``tests.vlm.processor``, makes the inputs from random images of several sizes and aspect ratios;
:func:`vitcg.accelerate` routes its encoder call. Per image, the VLM's ``get_image_features`` must give the
same rows with vitcg as without it (float32, relative error <= 1e-5), and greedy ``generate`` the same 8
tokens. A wrong output field, width, feature layer or pixel layout fails here even when the spec agrees with
itself.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import UsageError, VitcgError
from ..lang.bindings import MISSING, import_object, release, transformers_version
from ..lang.model import Spec, thaw
from ..runtime.accelerate import accelerate
from .workloads import relative_error

IMAGE_SIZES = ((56, 84), (112, 56), (84, 84))
"""(height, width) of the random images: landscape, portrait, square; small, so CPU runs stay fast."""
NEW_TOKENS = 8
TOLERANCE = 1e-5


class Unavailable(VitcgError):
    """The installed transformers (or the environment) cannot build this VLM or its processor: not a spec
    error, reported as a skipped stage."""


def _merge(base: dict, overrides: Mapping) -> dict:
    for key, value in overrides.items():
        base[key] = _merge(dict(base.get(key) or {}), value) if isinstance(value, Mapping) else thaw(value)
    return base


def build_vlm(spec: Spec, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """The spec's tiny full VLM with seeded random weights, float32, eval mode: ``tests.vlm.architecture`` (or
    the first of the spec's architectures transformers has), built from its own config class with the tiny
    vision config and ``tests.vlm.config``. Raises Unavailable when transformers has no such class."""
    import transformers

    names = [spec.tests.vlm.architecture] if spec.tests.vlm.architecture else list(spec.architectures)
    cls = next((getattr(transformers, a) for a in names if hasattr(transformers, a)), None)
    if cls is None:
        raise Unavailable(f"transformers {transformers.__version__} has none of {', '.join(names)}")
    config_cls = cls.config_class
    tiny = thaw(spec.encoder.tiny_config)
    overrides = tiny if issubclass(import_object(spec.encoder.config_class), config_cls) else {"vision_config": tiny}
    config = config_cls(**_merge(overrides, spec.tests.vlm.config))
    # sdpa where the class supports it (the usual serving choice), else its own eager attention
    config._attn_implementation = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    if torch.device(device).type == "cuda":
        # MoE experts (dots3_note's tower): transformers' default grouped_mm runs float32 as a host loop over
        # offs.tolist(), which no capture holds; batched_mm computes the same rows on the device
        config._experts_implementation = "batched_mm"
    torch.manual_seed(seed)
    return cls(config).eval().to(device)


def build_processor(spec: Spec, vlm: torch.nn.Module):
    """The model's image processor from its defaults and ``tests.vlm.processor``: ``tests.vlm.processor_class``,
    or the one transformers maps to the spec's model types or the VLM's (PIL backend first). Raises
    Unavailable when there is none."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    name = spec.tests.vlm.processor_class
    for model_type in () if name else (*spec.model_types, vlm.config.model_type):
        names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
        if isinstance(names, Mapping):
            names = [names.get("pil"), *names.values()]
        elif isinstance(names, str):
            names = [names]
        name = next((n for n in names or () if n and hasattr(transformers, n)), None)
        if name:
            break
    if not name or not hasattr(transformers, name):
        raise Unavailable(f"transformers {transformers.__version__} has no image processor "
                          f"{name or 'mapped to ' + ', '.join(spec.model_types)} (tests.vlm.processor_class)")
    try:
        return getattr(transformers, name)(**thaw(spec.tests.vlm.processor))
    except ImportError as exc:  # some releases need torchvision even for the PIL backend
        raise Unavailable(f"{name} cannot be built here: {str(exc).strip().splitlines()[0]}") from None


def _image_features(vlm: torch.nn.Module):
    """The ``get_image_features`` that the VLM's forward calls: its base model's (where the VLM class only
    forwards to it, with None for the arguments it was not given), else the class's own."""
    method = getattr(vlm.base_model, "get_image_features", None) or getattr(vlm, "get_image_features", None)
    if method is None:
        raise Unavailable(f"{type(vlm).__name__} has no get_image_features")
    return method


def _features(vlm: torch.nn.Module, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The base model's ``get_image_features`` rows, one tensor per image where the model splits them."""
    with torch.no_grad():
        out = _image_features(vlm)(**inputs)
    value = out.pooler_output if hasattr(out, "pooler_output") else out
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _feature_inputs(vlm: torch.nn.Module, made: Mapping[str, Any]) -> dict[str, Any]:
    """The processor outputs that ``get_image_features`` takes, by parameter name."""
    parameters = inspect.signature(_image_features(vlm)).parameters
    return {k: v for k, v in made.items() if k in parameters and isinstance(v, torch.Tensor)}


def _prompt(vlm: torch.nn.Module, spec: Spec, per_image: list[int]) -> torch.Tensor:
    """input_ids as the processor's tokenizer would expand them: per image its ``before`` tokens, one
    placeholder per output row, its ``after`` tokens."""
    vlm_test, config = spec.tests.vlm, vlm.config

    def token(field: str) -> int:
        value = getattr(config, field, None)
        if not isinstance(value, int):
            raise VitcgError(f"tests.vlm.placeholder: the VLM config has no integer {field!r}")
        return value

    ids = [1, 2, 3]
    for rows in per_image:
        ids += [token(f) for f in vlm_test.before] + [token(vlm_test.token)] * rows
        ids += [token(f) for f in vlm_test.after]
    return torch.tensor([[*ids, 4, 5]])


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """float32 kernels without TF32 on CUDA, so 1e-5 is a fair bound there too."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def check_vlm(spec: Spec, device: str = "cpu", seed: int = 0) -> tuple[int, float, str]:
    """Run the end-to-end stage: ``(images, largest per-image relative error, route)``. Raises VitcgError
    naming what differs, Unavailable when this transformers cannot build the VLM or its processor."""
    if spec.tests.vlm is None:
        raise Unavailable("the spec has no tests.vlm")
    if spec.tests.vlm.skip:
        raise Unavailable(spec.tests.vlm.skip)
    needed = spec.tests.vlm.transformers
    installed = transformers_version()
    if needed and installed != MISSING and release(installed) < release(needed):
        raise Unavailable(f"the stage's VLM config needs transformers >= {needed} (installed: {installed})")
    with no_tf32():
        return _check(spec, device, seed)


def _check(spec: Spec, device: str, seed: int) -> tuple[int, float, str]:
    vlm = build_vlm(spec, device, seed)
    processor = build_processor(spec, vlm)
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]
    inputs = {k: v.to(device) for k, v in _feature_inputs(vlm, processor(images=images, return_tensors="pt")).items()}
    try:
        want = _features(vlm, inputs)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        # the spec's tiny config does not describe what the processor makes (patch, frames, channels...)
        raise VitcgError(f"the VLM built from the spec's tiny config fails on its own processor's inputs "
                         f"({', '.join(f'{k} {tuple(v.shape)}' for k, v in inputs.items())}): "
                         f"{type(exc).__name__}: {exc}") from None
    rows = [t.numel() // t.shape[-1] for t in want]
    ids = _prompt(vlm, spec, rows if len(rows) == len(images) else [sum(rows)]).to(device)
    generate = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS,
                "do_sample": False, "min_new_tokens": NEW_TOKENS, **inputs}
    if "mm_token_type_ids" in inspect.signature(vlm.forward).parameters:
        # models that place image rows by token type (as their processors mark them): 1 on image placeholders
        generate["mm_token_type_ids"] = (ids == getattr(vlm.config, spec.tests.vlm.token)).long()
    with torch.no_grad():
        tokens = vlm.generate(**generate)
    try:
        # at least 8192 tokens: a resampler after the encoder makes far fewer output rows than the encoder's
        # own min budget
        handle = accelerate(vlm, spec=spec, progress=False, max_num_batched_tokens=max(4 * sum(rows), 8192))
    except UsageError as exc:
        raise VitcgError(f"accelerate refused the VLM: {exc}") from None
    with handle:
        _features(vlm, inputs)  # the first call runs the original and learns the output layout
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
    errors = [relative_error(g, w) for g, w in zip(got, want, strict=True)]
    worst = max(errors)
    if worst > TOLERANCE:
        raise VitcgError(f"features differ from the VLM's own: relative error {worst:.1e} > {TOLERANCE:.0e} "
                         f"(image {errors.index(worst)})")
    if not torch.equal(accelerated, tokens):
        raise VitcgError(f"greedy generate differs: {accelerated[0, -NEW_TOKENS:].tolist()} vs the VLM's "
                         f"{tokens[0, -NEW_TOKENS:].tolist()}")
    manager = stats.manager
    return len(images), worst, f"{manager.replays} replays, {manager.misses} eager"
