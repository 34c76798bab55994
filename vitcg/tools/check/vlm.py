"""The end-to-end stage of ``vitcg check``: a spec proved against the real VLM, not only against itself.

The tiny full VLM (the spec's first architecture that the installed transformers has; the tiny vision config
plus ``tests.vlm.config``) is built with random weights; its own image processor class, constructed from its
defaults and ``tests.vlm.processor``, makes the inputs from random images of several sizes and aspect ratios
(and, where ``tests.vlm.video_placeholder`` says how a prompt holds a video, random videos composed from its
frames); :func:`vitcg.accelerate` routes its encoder call. Per image (video), the VLM's ``get_image_features``
(``get_video_features``) must give the same rows with vitcg as without it (float32, relative error <= 1e-5),
and greedy ``generate`` on a prompt of the images (videos) the same 8 tokens. A wrong output field, width,
feature layer or pixel layout fails here even when the spec agrees with itself. Where the feature call's output
cannot be compared item by item, ``tests.vlm.features.out_of_reach`` says why and the tokens are still compared.
``generate`` also gets the processor's other inputs that the VLM's forward names, and the prompt-shaped masks it
takes (:data:`PROMPT_MASKS`), as the model's own processor makes them.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import UsageError, VitcgError, suggest
from ...lang.bindings import MISSING, import_object, release, transformers_version
from ...lang.harness import Placeholder
from ...lang.model import Spec, thaw
from ...runtime.accelerate import accelerate
from ...runtime.adapter import adapter_for
from ...runtime.hf import encoder_of
from ..workloads import relative_error
from .failures import describe, step, where

IMAGE_SIZES = ((56, 84), (112, 56), (84, 84))
"""(height, width) of the random images: landscape, portrait, square; small, so CPU runs stay fast."""
VIDEO_SIZES = ((3, 56, 84), (2, 84, 56))
"""(frames, height, width) of the random videos fed where the spec says how ``input_ids`` hold one."""
NEW_TOKENS = 8
TOLERANCE = 1e-5


class Unavailable(VitcgError):
    """The installed transformers (or the environment) cannot build this VLM or its processor: not a spec
    error, reported as a skipped stage."""


def _merge(base: dict, overrides: Mapping) -> dict:
    for key, value in overrides.items():
        base[key] = _merge(dict(base.get(key) or {}), value) if isinstance(value, Mapping) else thaw(value)
    return base


FEATURES_OUT_OF_REACH = "per-item features out of reach"
"""How the stage's route says that it compared greedy tokens only (``tests.vlm.features.out_of_reach``)."""
TINY_TEXT_LIMITS = {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 4096}
"""Largest language-model dimensions the stage builds: a config left at its checkpoint size (Llama's 4096-wide 32
layers) would take tens of GB before anything runs."""


def _refuse_large(config: Any) -> None:
    """Raises VitcgError when the VLM's language model is not tiny, naming the field and the section to set."""
    text = getattr(config, "text_config", None) or config
    for name, limit in TINY_TEXT_LIMITS.items():
        value = getattr(text, name, None)
        if isinstance(value, int) and value > limit:
            raise VitcgError(f"the end-to-end stage's language model is not tiny: text_config.{name} is {value} "
                             f"(at most {limit}); set it in tests.vlm.config.text_config")


def build_vlm(spec: Spec, device: str = "cpu", seed: int = 0, size: str = "tiny") -> torch.nn.Module:
    """The spec's tiny full VLM with seeded random weights, float32, eval mode: ``tests.vlm.architecture`` (or
    the first of the spec's architectures transformers has), built from its own config class with the tiny
    vision config and ``tests.vlm.config``. ``size="real"`` takes the real vision config (``tests.real_config``,
    a checkpoint's tower) instead, the language model still the tiny one (benchmarks of the encoder).
    Raises Unavailable when transformers has no such class."""
    cls = _vlm_class(spec)
    config_cls = cls.config_class
    if size not in ("tiny", "real"):
        raise ValueError(f"size must be 'tiny' or 'real', got {size!r}")
    vision = thaw(spec.tests.tiny_config if size == "tiny" else spec.tests.real_config)
    overrides = vision if issubclass(import_object(spec.encoder.config_class), config_cls) else {"vision_config": vision}
    config = config_cls(**_merge(overrides, spec.tests.vlm.config))
    _refuse_large(config)
    # sdpa where the class supports it (the usual serving choice), else its own eager attention
    config._attn_implementation = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    if torch.device(device).type == "cuda":
        # MoE experts (dots3_note's tower): transformers' default grouped_mm runs float32 as a host loop over
        # offs.tolist(), which no capture holds; batched_mm computes the same rows on the device
        config._experts_implementation = "batched_mm"
    torch.manual_seed(seed)
    return cls(config).eval().to(device)


def _vlm_class(spec: Spec) -> type:
    """The transformers class of the spec's VLM: ``tests.vlm.architecture``, else the first of its architectures
    that transformers has. A misspelt or missing class is the spec's error (VitcgError), not a reason to skip the
    stage."""
    import transformers

    names = [spec.tests.vlm.architecture] if spec.tests.vlm.architecture else list(spec.architectures)
    cls = next((getattr(transformers, a) for a in names if hasattr(transformers, a)), None)
    if cls is None:
        hint = suggest(names[0], [n for n in dir(transformers) if n.endswith(("ForConditionalGeneration", "Model"))])
        raise VitcgError(f"transformers {transformers.__version__} has none of {', '.join(names)} "
                         f"({'tests.vlm.architecture' if spec.tests.vlm.architecture else 'architectures'})"
                         + (f"; {hint}" if hint else ""))
    return cls


def build_processor(spec: Spec, vlm: torch.nn.Module, kwargs: Mapping[str, Any] | None = None):
    """The model's image processor from its defaults and ``tests.vlm.processor`` (or ``kwargs`` instead, such as
    a real checkpoint's settings): ``tests.vlm.processor_class``, or the one transformers maps to the spec's
    model types or the VLM's (PIL backend first). Raises Unavailable when there is none."""
    import transformers

    name = spec.tests.vlm.processor_class or _mapped_processor(spec, vlm)
    if not name or not hasattr(transformers, name):  # the spec's to fix: name the class the VLM's processor uses
        hint = suggest(name, [n for n in dir(transformers) if n.endswith(("ImageProcessor", "ImageProcessorPil"))]) \
            if name else None
        raise VitcgError(f"transformers {transformers.__version__} has no image processor "
                         f"{name or 'mapped to ' + ', '.join(spec.model_types)}: set tests.vlm.processor_class to "
                         "the image processor class of the checkpoint's processor_config.json"
                         + (f"; {hint}" if hint else ""))
    try:
        return getattr(transformers, name)(**thaw(spec.tests.vlm.processor if kwargs is None else kwargs))
    except ImportError as exc:  # some releases need torchvision even for the PIL backend
        raise Unavailable(f"{name} cannot be built here: {str(exc).strip().splitlines()[0]}") from None


def _mapped_processor(spec: Spec, vlm: torch.nn.Module) -> str | None:
    """The first image processor class transformers has that it maps to the spec's model types or the VLM's
    (PIL backend first); None when there is none."""
    for model_type in (*spec.model_types, vlm.config.model_type):
        name = next(iter(_processor_names(model_type)), None)
        if name:
            return name
    return None


def _processor_names(model_type: str) -> list[str]:
    """The image processor classes transformers maps ``model_type`` to and has, the PIL backend first."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if isinstance(names, Mapping):
        names = [names.get("pil"), *names.values()]
    elif isinstance(names, str):
        names = [names]
    return [n for n in names or () if n and hasattr(transformers, n)]


def _feature_method(vlm: torch.nn.Module, modality: str = "image"):
    """The ``get_image_features`` (or ``get_video_features``) that the VLM's forward calls: its base model's
    (where the VLM class only forwards to it, with None for the arguments it was not given), else the
    class's own."""
    name = f"get_{modality}_features"
    method = getattr(vlm.base_model, name, None) or getattr(vlm, name, None)
    if method is None:
        raise VitcgError(f"{type(vlm).__name__} has no {name}, which the stage compares: set tests.vlm.architecture "
                         "to the VLM class that has it, or tests.vlm.skip with the reason")
    return method


def _features(vlm: torch.nn.Module, inputs: Mapping[str, Any], modality: str = "image") -> list[torch.Tensor]:
    """The base model's ``get_{modality}_features`` rows, one tensor per item where the model splits them."""
    with torch.no_grad():
        out = _feature_method(vlm, modality)(**inputs)
    value = out.pooler_output if hasattr(out, "pooler_output") else out
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        raise _not_features(vlm, out, value, modality)
    return values


def _not_features(vlm: torch.nn.Module, out: Any, value: Any, modality: str) -> VitcgError:
    """The error for a feature call whose output ``out`` (its rows: ``value``) holds no feature tensors."""
    fields = [k for k, v in out.items() if v is not None] if isinstance(out, Mapping) else []
    held = type(value).__name__ if not isinstance(value, (list, tuple)) else \
        f"{type(value).__name__} of {sorted({type(v).__name__ for v in value})}"
    return VitcgError(f"{type(vlm).__name__}.get_{modality}_features returned {type(out).__name__} whose "
                      f"{'pooler_output' if hasattr(out, 'pooler_output') else 'value'} holds {held}, not "
                      f"feature tensors{' (it has ' + ', '.join(fields) + ')' if fields else ''}: the end-to-end stage "
                      "compares these rows; set tests.vlm.architecture to a VLM class whose feature call returns "
                      "them, or tests.vlm.skip with the reason")


def _feature_inputs(vlm: torch.nn.Module, made: Mapping[str, Any], modality: str = "image") -> dict[str, Any]:
    """The processor outputs that ``get_{modality}_features`` takes, by parameter name."""
    parameters = inspect.signature(_feature_method(vlm, modality)).parameters
    return {k: v for k, v in made.items() if k in parameters and isinstance(v, torch.Tensor)}


def compose_videos(spec: Spec, processor: Any, videos: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Video inputs of the spec's video modality made by the model's image processor: each video's frames
    (``(frames, height, width, 3)``) become image rows of one size, concatenated frame after frame on a
    ``(frames, h, w)`` grid row. That is the packed, t-major layout a video processor gives a video whose
    frames each repeat ``temporal_patch_size`` times (video processors need torchvision). The frames are made
    with ``tests.vlm.video_processor`` as call arguments; an item-aligned role (``per_item``) of the video takes
    the value its frames share under the image modality's key. Raises Unavailable when the image processor
    does not give one ``(1, h, w)`` row per frame under the image modality's keys."""
    image, video = spec.modality("image"), spec.modality("video")
    if image is None or "grid" not in image.inputs:
        raise Unavailable("videos are composed through the image modality's grid, and the spec has none")
    pixels, grids = [], []
    per_item: dict[str, list[int]] = {role: [] for role in video.item_roles}
    for frames in videos:
        made = processor(images=list(frames), return_tensors="pt", **thaw(spec.tests.vlm.video_processor))
        rows, full = _frame_rows(image, made)
        pixels.append(rows)
        grids.append(video.encoder_grid([len(full), *full[0][1:]]))
        for role, values in per_item.items():
            values.append(_shared_value(image, made, role))
    return {video.pixels_key: torch.cat(pixels), video.inputs["grid"]: torch.tensor(grids, dtype=torch.int64),
            **{video.inputs[role]: torch.tensor(values, dtype=torch.int64) for role, values in per_item.items()}}


def _frame_rows(image: Any, made: Mapping[str, Any]) -> tuple[torch.Tensor, list[list[int]]]:
    """The pixel rows and the full grid rows the image processor made of a video's frames; raises Unavailable
    unless each frame is one ``(1, h, w)`` row of one size under the image modality's keys."""
    rows, grid = made.get(image.pixels_key), made.get(image.inputs["grid"])
    if not isinstance(rows, torch.Tensor) or not isinstance(grid, torch.Tensor) or grid.ndim != 2:
        raise Unavailable(f"the image processor gives no {image.pixels_key!r} and {image.inputs['grid']!r}")
    full = [image.item_row(row) for row in grid.tolist()]
    if any(row != [1, *full[0][1:]] for row in full):
        raise Unavailable(f"the image processor gives grid rows {full} for frames of one size, not one "
                          "(1, h, w) row each")
    return rows, full


def _shared_value(image: Any, made: Mapping[str, Any], role: str) -> int:
    """The one value of an item-aligned ``role`` that a video's frames share under the image modality's key;
    raises Unavailable when they do not share one."""
    given = made.get(image.inputs.get(role, ""))
    shared = set(given.tolist()) if isinstance(given, torch.Tensor) and given.ndim == 1 else set()
    if len(shared) != 1:
        raise Unavailable(f"the image processor gives no single {role!r} value for the frames of a video")
    return shared.pop()


def _prompt(vlm: torch.nn.Module,
            groups: list[tuple[Placeholder, int, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids as the processor's tokenizer would expand them, their token types, and where the tokens around
    each group lie: per group (an image, a video, or a video's frame) of ``(placeholder, rows, token type)`` its
    ``before`` tokens, one placeholder token per output row (of that token type; 0 elsewhere), its ``after``
    tokens (1 in the third tensor; 0 elsewhere)."""
    config = vlm.config

    def token(field: str) -> int:
        value = getattr(config, field, None)
        if not isinstance(value, int):
            raise VitcgError(f"tests.vlm: the VLM config has no integer {field!r} (placeholder token)")
        return value

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocabulary = getattr(text, "vocab_size", None)

    def in_vocabulary(field: str) -> int:
        value = token(field)
        if isinstance(vocabulary, int) and not 0 <= value < vocabulary:
            # the embedding lookup would fail deep in the model with "IndexError: index out of range in self"
            raise VitcgError(f"tests.vlm.placeholder: the prompt's token {field} = {value} (around each image) is "
                             f"outside the tiny "
                             f"language model's vocabulary (text_config.vocab_size {vocabulary}): set "
                             f"tests.vlm.config.text_config.vocab_size above {value}, or the token fields in "
                             "tests.vlm.config")
        return value

    ids, types, around = [1, 2, 3], [0, 0, 0], [0, 0, 0]
    for placeholder, rows, kind in groups:
        opening = [in_vocabulary(f) for f in placeholder.before]
        closing = [in_vocabulary(f) for f in placeholder.after]
        # the placeholder itself may lie past the text vocabulary: VLMs swap it out before the embedding lookup
        ids += opening + [token(placeholder.token)] * rows + closing
        types += [0] * len(opening) + [kind] * rows + [0] * len(closing)
        around += [1] * len(opening) + [0] * rows + [1] * len(closing)
    return torch.tensor([[*ids, 4, 5]]), torch.tensor([[*types, 0, 0]]), torch.tensor([[*around, 0, 0]])


PROMPT_MASKS = {
    # models that place rows by token type (as their processors mark them): 1 on image placeholders, 2 on video
    # placeholders
    "mm_token_type_ids": lambda types, around: types,
    # Kosmos-2.5 has no placeholder token id: its processor marks the image rows of the prompt with 1 and the
    # tokens around them with -1 (both get the image's segment embedding; only the rows take image features)
    "image_embeds_position_mask": lambda types, around: (types > 0).long() - around,
}
"""Prompt-shaped inputs a VLM's forward takes that its processor derives from the prompt it expands: name -> the
input made from the prompt's token types (0 on text, 1 on image rows, 2 on video rows) and the tokens around each
item (1 on the ``before`` and ``after`` tokens). The stage builds its own prompt, so it builds these too."""


def extra_inputs(vlm: torch.nn.Module, made: Mapping[str, Any], taken: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The processor's tensors (``made``) besides the feature call's (``taken``) that the VLM's forward names, such
    as an image's size (Kosmos-2.5's ``width`` and ``height``): ``generate`` passes them to forward, as a serving
    engine does. The prompt's own keys (:data:`TEXT_KEYS`) are the stage's to make."""
    parameters = inspect.signature(vlm.forward).parameters
    return {k: v for k, v in made.items() if k in parameters and k not in taken and k not in TEXT_KEYS
            and k not in PROMPT_MASKS and isinstance(v, torch.Tensor)}


def _generate_kwargs(vlm: torch.nn.Module, groups: list[tuple[Placeholder, int, int]],
                     inputs: Mapping[str, torch.Tensor], device: str,
                     extra: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """``generate``'s arguments for a prompt holding ``groups``, the feature ``inputs`` of one modality and the
    processor's ``extra`` inputs (:func:`extra_inputs`); the prompt-shaped inputs forward names
    (:data:`PROMPT_MASKS`) built from the prompt."""
    ids, types, around = _prompt(vlm, groups)
    ids = ids.to(device)
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS,
              "do_sample": False, "min_new_tokens": NEW_TOKENS, **inputs,
              **{k: v.to(device) for k, v in (extra or {}).items()}}
    parameters = inspect.signature(vlm.forward).parameters
    for name, make in PROMPT_MASKS.items():
        if name in parameters:
            kwargs[name] = make(types, around).to(device)
    return kwargs


def _groups(vlm_test: Any, rows: list[int], items: int, frames: list[int] | None) -> list[tuple[Placeholder, int, int]]:
    """The placeholder groups of the images (``frames`` None) or videos whose features have ``rows`` rows per
    tensor (one tensor per item, or one for all ``items`` where the model does not split them)."""
    if frames is None:
        return [(vlm_test.image, r, 1) for r in (rows if len(rows) == items else [sum(rows)])]
    placeholder = vlm_test.video
    if len(rows) != items:
        return [(placeholder, sum(rows), 2)]
    if not placeholder.per_frame:
        return [(placeholder, r, 2) for r in rows]
    return [(placeholder, r // t, 2) for r, t in zip(rows, frames) for _ in range(t)]


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
    """Run the end-to-end stage: ``(items, largest per-item relative error, route)``. Raises VitcgError
    naming what differs, Unavailable when this transformers cannot build the VLM or its processor."""
    if spec.tests.vlm is None:
        # unproven is not passed: a spec consistent with itself but not with the model passes every other case
        raise VitcgError("the spec has no tests.vlm, so nothing proves it against the real VLM: add tests.vlm "
                         "(the VLM's tiny text config and placeholder token; see docs/writing-specs.md), or "
                         "tests.vlm.skip with the reason the stage cannot run")
    if spec.tests.vlm.skip:
        raise Unavailable(spec.tests.vlm.skip)
    needed = spec.tests.vlm.transformers
    installed = transformers_version()
    if needed and installed != MISSING and release(installed) < release(needed):
        raise Unavailable(f"the stage's VLM config needs transformers >= {needed} (installed: {installed})")
    with no_tf32():
        return _check(spec, device, seed)


def _engine_tokens(spec: Spec, vlm: torch.nn.Module, total: int, device: str) -> int:
    """The stage's ``max_num_batched_tokens``: four times its items' rows, and at least 8192 (a resampler after
    the encoder makes far fewer output rows than the encoder's own min budget). On CUDA the floor is the
    spec's min budget instead: this float32 stage would otherwise capture towers whose attention materializes
    its scores at up to 8192 tokens of rows (64 GiB for Kimi-K2.5's and MiniCPM-V's tiny towers)."""
    wanted = max(4 * total, 8192)
    if torch.device(device).type != "cuda":
        return wanted
    adapter = adapter_for(spec, encoder_of(vlm, spec)[1])
    least, _ = adapter.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 1 << 30,
                                                           "max_model_len": 1 << 30})
    smaller = max(4 * total, least)
    _, top = adapter.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": smaller, "max_model_len": smaller})
    return smaller if top >= least else wanted


@contextlib.contextmanager
def _recording(encoder: torch.nn.Module, method: str) -> Iterator[list[Any]]:
    """The outputs of every call of ``encoder.method`` inside the block, in call order (shallow copies: a VLM may
    replace a field of the output object it got, as Qwen2-VL splits ``pooler_output`` per image)."""
    calls: list[Any] = []
    original = getattr(encoder, method)

    def record(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        calls.append(copy.copy(output))
        return output
    setattr(encoder, method, record)
    try:
        yield calls
    finally:
        delattr(encoder, method)


def _served_by_keys(spec: Spec, handle: Any, processed: Mapping[str, Mapping[str, Any]],
                    own: Mapping[str, torch.Tensor], device: str) -> None:
    """The processor's outputs under the spec's input keys, as an engine passes them, through the graphs: their
    rows must be the VLM's own encoder rows. Raises VitcgError naming the keys when they are not (a spec whose
    keys are swapped or misnamed is routed by the encoder call's arguments above, and would pass without this)."""
    for modality, made in processed.items():
        keys = sorted(set(spec.modality(modality).inputs.values()))
        where = f"modalities.{modality}.inputs ({', '.join(keys)})"
        missing = [k for k in keys if k not in made]
        if missing:
            raise VitcgError(f"the processor makes no {', '.join(map(repr, missing))} for {modality}s (it makes "
                             f"{', '.join(sorted(made))}): check {where}")
        batch = {k: made[k].to(device) for k in keys}
        try:
            served = torch.cat(handle.manager.execute(batch))
        except VitcgError as exc:
            raise VitcgError(f"the processor's {modality} outputs under the spec's input keys fail: {exc}; "
                             f"check {where}") from None
        if served.shape != own[modality].shape or relative_error(served, own[modality]) > TOLERANCE:
            detail = (f"rows {tuple(served.shape)} against {tuple(own[modality].shape)}"
                      if served.shape != own[modality].shape else
                      f"relative error {relative_error(served, own[modality]):.1e} > {TOLERANCE:.0e}")
            raise VitcgError(f"fed the processor's {modality} outputs under the spec's input keys, the graphs differ "
                             f"from the VLM's own encoder call ({detail}): check {where}")


def _check(spec: Spec, device: str, seed: int) -> tuple[int, float, str]:
    """The end-to-end stage: each of :data:`STAGES` in order over one :class:`_Run`; ``(items, worst relative
    error, route)``."""
    run = _Run(spec, device, seed)
    for stage in STAGES:
        stage(run)
    keys = "; input keys not fed from the processor (tests.vlm.engine_keys)" if spec.tests.vlm.engine_keys else ""
    if spec.tests.vlm.features_out_of_reach is not None:
        keys += f"; {FEATURES_OUT_OF_REACH} (tests.vlm.features)"
    return sum(run.counts.values()), run.worst, run.route + keys


@dataclass
class _Run:
    """One end-to-end check in flight: what each stage made, by modality where it is per modality."""

    spec: Spec
    device: str
    seed: int
    vlm: Any = None
    processor: Any = None
    processed: dict[str, Any] = field(default_factory=dict)
    """The processor's output per modality (videos composed frame by frame)."""
    counts: dict[str, int] = field(default_factory=dict)
    frames: list[int] = field(default_factory=list)
    made: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """The feature call's inputs per modality, on the host."""
    inputs: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    own_calls: dict[str, list[Any]] = field(default_factory=dict)
    """The encoder's own outputs per modality, recorded during the reference feature call."""
    want: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: int = 0
    """The rows of every reference feature, for the engine's token limit."""
    got: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    accelerated: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: Any = None
    route: str = ""
    worst: float = 0.0


def _build(run: _Run) -> None:
    with step("building the tiny VLM", "tests.vlm.config (its text_config: fields the config class derives from "
              "num_hidden_layers, such as layer_types and rope_parameters) and the spec's tiny vision config"):
        run.vlm = build_vlm(run.spec, run.device, run.seed)


def _process(run: _Run) -> None:
    """Random images (and videos) through the VLM's own image processor."""
    spec, vlm = run.spec, run.vlm
    with step(f"running {type(vlm).__name__}'s image processor", "tests.vlm.processor and tests.vlm.processor_class"):
        run.processor = build_processor(spec, vlm)
        rng = np.random.default_rng(run.seed)
        images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]
        run.processed = {"image": dict(run.processor(images=images, return_tensors="pt"))}
    run.counts = {"image": len(images)}
    if spec.tests.vlm.video is not None:
        videos = [rng.integers(0, 255, (f, h, w, 3), dtype=np.uint8) for f, h, w in VIDEO_SIZES]
        run.frames = [f for f, _, _ in VIDEO_SIZES]  # a grid t per frame: compose_videos makes one row per frame
        run.processed["video"] = compose_videos(spec, run.processor, videos)
        run.counts["video"] = len(videos)
    run.made = {m: _feature_inputs(vlm, found, m) for m, found in run.processed.items()}
    run.inputs = {m: {k: v.to(run.device) for k, v in found.items()} for m, found in run.made.items()}


def _reference_features(run: _Run) -> None:
    """The VLM's own features per modality, the encoder's own outputs recorded on the way."""
    encoder = encoder_of(run.vlm, run.spec)[1]
    for modality, given in run.inputs.items():
        try:
            with _recording(encoder, run.spec.encoder.method) as run.own_calls[modality]:
                run.want[modality] = _features(run.vlm, given, modality)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            # the spec's tiny config does not describe what the processor makes (patch, frames, channels...)
            raise VitcgError(f"the VLM built from the spec's tiny config fails on its own processor's inputs "
                             f"({modality}: {', '.join(f'{k} {tuple(v.shape)}' for k, v in given.items())}): "
                             f"{describe(exc)}{where(exc)}; check the tiny vision config against "
                             "tests.vlm.processor (patch size, merge size, frames, channels)") from None


def _reference_generate(run: _Run) -> None:
    """One prompt per modality and the VLM's own greedy tokens for it. (Some VLMs, GLM-4.1V, mark image and video
    rows with the same token, so a prompt holding both cannot tell them apart.)"""
    spec, vlm = run.spec, run.vlm
    rows = {m: [t.numel() // t.shape[-1] for t in found] for m, found in run.want.items()}
    run.prompts = {m: _generate_kwargs(vlm, _groups(spec.tests.vlm, rows[m], run.counts[m],
                                                    run.frames if m == "video" else None), run.inputs[m],
                                       run.device, extra_inputs(vlm, run.processed[m], run.made[m]))
                   for m in run.inputs}
    with torch.no_grad(), step(f"greedy generate on the tiny {type(vlm).__name__}",
                               "tests.vlm.placeholder and tests.vlm.config.text_config", config=vlm.config,
                               vocabulary=_vocabulary(spec)):
        run.tokens = {m: vlm.generate(**kwargs) for m, kwargs in run.prompts.items()}
    run.rows = sum(sum(r) for r in rows.values())


def _accelerated(run: _Run) -> None:
    """The same feature calls and prompts with the VLM accelerated: what they return, and how they were served."""
    spec, vlm = run.spec, run.vlm
    try:
        handle = accelerate(vlm, spec=spec, progress=False,
                            max_num_batched_tokens=_engine_tokens(spec, vlm, run.rows, run.device))
    except UsageError as exc:
        raise VitcgError(f"accelerate refused the VLM: {exc}") from None
    with handle:
        _features(vlm, run.inputs["image"])  # the first call runs the original and learns the output layout
        with step(f"{type(vlm).__name__}'s feature call on the graphs' outputs", _uncaptured(spec, run.own_calls)):
            if spec.tests.vlm.features_out_of_reach is None:
                run.got = {m: _features(vlm, given, m) for m, given in run.inputs.items()}
        with torch.no_grad():
            run.accelerated = {m: vlm.generate(**kwargs) for m, kwargs in run.prompts.items()}
        run.stats = stats = handle.stats
        run.route = f"{stats.manager.replays} replays, {stats.manager.misses} eager"  # generate's, before the feed
        if not spec.tests.vlm.engine_keys:
            own = {m: torch.cat([handle.adapter.combine_output(out) for out in calls])
                   for m, calls in run.own_calls.items()}
            _served_by_keys(spec, handle, run.processed, own, run.device)


def _routed(run: _Run) -> None:
    reasons = {r: n for r, n in run.stats.reasons.items() if not r.startswith("first call")}
    if reasons or not run.stats.routed:
        raise VitcgError(not_routed(run.spec, run.stats, reasons))


def _compare_features(run: _Run) -> None:
    """Each item's features under the graphs against the VLM's own (where they are in reach)."""
    for modality in run.got:
        mine, theirs = run.got[modality], run.want[modality]
        if [g.shape for g in mine] != [w.shape for w in theirs]:
            raise VitcgError(f"{modality} features of shapes {[tuple(g.shape) for g in mine]}, the VLM's own give "
                             f"{[tuple(w.shape) for w in theirs]}")
        errors = [relative_error(g, w) for g, w in zip(mine, theirs, strict=True)]
        if max(errors) > TOLERANCE:
            raise VitcgError(f"{modality} features differ from the VLM's own: relative error {max(errors):.1e} > "
                             f"{TOLERANCE:.0e} ({modality} {errors.index(max(errors))})")
        run.worst = max(run.worst, *errors)


def _compare_tokens(run: _Run) -> None:
    for modality, want_tokens in run.tokens.items():
        if not torch.equal(run.accelerated[modality], want_tokens):
            raise VitcgError(f"greedy generate on {modality}s differs: "
                             f"{run.accelerated[modality][0, -NEW_TOKENS:].tolist()} vs the VLM's "
                             f"{want_tokens[0, -NEW_TOKENS:].tolist()}")


STAGES: tuple[Callable[[_Run], None], ...] = (_build, _process, _reference_features, _reference_generate,
                                             _accelerated, _routed, _compare_features, _compare_tokens)
"""The end-to-end stage's steps, in order: each reads what the ones before it left in the run."""


def _vocabulary(spec: Spec) -> str:
    """The spec fields behind a prompt token past the tiny vocabulary: the placeholder fields that put the ids in
    the prompt, the config that sets them and the vocabulary size."""
    test = spec.tests.vlm
    fields = [test.token, *test.before, *test.after]
    if test.video is not None:
        fields += [test.video.token, *test.video.before, *test.video.after]
    return (f"tests.vlm.placeholder (it puts {', '.join(dict.fromkeys(fields))} in the prompt) against "
            "tests.vlm.config: set text_config.vocab_size above the largest id, or those token fields below it")


def _uncaptured(spec: Spec, own_calls: Mapping[str, list[Any]]) -> str:
    """What to check when the VLM's feature call fails on the graphs' outputs: ``encoder.outputs``, naming the
    fields the encoder's own output set that the spec leaves out (under the graphs they are None, and the VLM code
    reading one fails with a bare ``TypeError`` or ``AttributeError`` on None)."""
    captured = {entry.split("[", 1)[0] for entry in spec.encoder.outputs}
    own = [field for calls in own_calls.values() for out in calls[:1] if hasattr(out, "items")
           for field, value in out.items() if value is not None and field not in captured]
    if not own:
        return f"encoder.outputs ({', '.join(spec.encoder.outputs)}) against the fields the VLM reads"
    left = ", ".join(dict.fromkeys(own))
    return (f"encoder.outputs: the encoder's own output also sets {left}, which the spec's "
            f"[{', '.join(spec.encoder.outputs)}] leaves out (None under the graphs); capture each field the VLM "
            "reads, and out_hidden_size with it")


def not_routed(spec: Spec, stats: Any, reasons: Mapping[str, int]) -> str:
    """Why no call (or not every call) of the VLM reached the graphs, from the handle's :class:`AccelerateStats`
    and its reasons other than the first call's."""
    where = f"{spec.encoder.vlm_attribute}.{spec.encoder.method}"
    if reasons:
        return ("the VLM's calls ran the original encoder call: "
                + "; ".join(f"{r} ({n}x)" for r, n in reasons.items()))
    if not stats.calls:
        return (f"the VLM's feature calls never called {where}, so nothing reached the graphs: set "
                "encoder.vlm_attribute and encoder.method to the module and method get_image_features runs")
    return (f"{where} was called {stats.calls} time{'s' if stats.calls != 1 else ''}, and only the first one "
            "(which runs the original to learn the output layout) ran: the VLM calls the tower once per call of its "
            "own, so check that get_image_features reaches encoder.vlm_attribute on every call")


TEXT_KEYS = {"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"}
"""Processor outputs that describe the prompt, not an image or video: never part of an encoder batch."""


def _backend_batch(processed: Mapping[str, Any], modality: str, items: int) -> dict[str, torch.Tensor]:
    """A batch laid out as vLLM's Transformers backend hands it to ``embed_multimodal``: the processor's tensors,
    plus the per-item row counts that split them (``num_image_patches``; the backend takes them from the grid
    where there is one, else from the processor's own per-item count, else one row per item). Raises Unavailable
    where those counts do not split the pixel rows, which the backend's processor refuses too."""
    batch = {k: v for k, v in processed.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}
    pixels = batch["pixel_values" if modality == "image" else "pixel_values_videos"]
    grid = batch.get(f"{modality}_grid_thw")
    if grid is not None:
        counts = grid.prod(-1)
    else:
        counts = next((v for v in batch.values() if v.dim() == 1 and len(v) == items and not v.is_floating_point()
                       and int(v.sum()) == pixels.shape[0]), torch.ones(items, dtype=torch.int64))
    if int(counts.sum()) not in tuple(pixels.shape[:2]):
        raise Unavailable(f"vLLM's Transformers backend cannot split {tuple(pixels.shape)} pixel rows into "
                          f"{items} {modality}s (per-item counts {counts.tolist()})")
    batch[f"num_{modality}_patches"] = counts.to(torch.int64)
    return batch


def backend_batches(spec: Spec, vlm: torch.nn.Module, seed: int = 5, *,
                    images: Sequence[tuple[int, int]] | None = None,
                    videos: Sequence[tuple[int, int, int]] | None = None,
                    processor: Mapping[str, Any] | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Per modality the spec proves end to end: images (videos) of several sizes made by the VLM's own image
    processor (videos composed from frames, :func:`compose_videos`), laid out as vLLM's Transformers backend
    passes them to ``embed_multimodal`` (the engine's inputs for the vLLM plugin's tests). Given ``images``
    ((height, width) in pixels) and ``videos`` ((frames, height, width)), exactly those, and videos wherever the
    spec has a video modality; ``processor``: the image processor's settings instead of ``tests.vlm.processor``.
    Raises Unavailable when the processor cannot be built here or its outputs cannot be split into items."""
    made_by = build_processor(spec, vlm, processor)
    rng = np.random.default_rng(seed)
    given = images is not None or videos is not None
    image_sizes = images if given else (*IMAGE_SIZES, (140, 84), (56, 56))
    made = {}
    if image_sizes:
        pictures = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in image_sizes]
        made["image"] = _backend_batch(dict(made_by(images=pictures, return_tensors="pt")), "image", len(pictures))
    video = spec.modality("video")
    video_sizes = videos if given else VIDEO_SIZES if spec.tests.vlm.video is not None else ()
    if video_sizes and video is not None:
        clips = [rng.integers(0, 255, (f, h, w, 3), dtype=np.uint8) for f, h, w in video_sizes]
        composed = compose_videos(spec, made_by, clips)
        composed["pixel_values_videos"] = composed.pop(video.pixels_key)  # the backend's key for video pixels
        made["video"] = _backend_batch(composed, "video", len(clips))
    elif video_sizes and given:
        raise Unavailable(f"spec {spec.name} has no video modality")
    return made
