"""``vitcg new MODEL_TYPE``: a draft spec read off a transformers model type, with what to confirm marked.

It finds the VLM config and its vision config, the encoder class built from that vision config, the
attribute holding the encoder in the VLM, the geometry fields and their defaults, and guesses the
attention style from the precompute helpers the encoder's code calls (``get_vision_window_index``:
windowed; ``get_vision_attention_seqlens``: packed; neither: tiles). Every guess carries a
``# TODO(vitcg new)`` comment. The draft validates; ``vitcg check`` then says whether the guesses hold.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError, suggest
from ..lang.catalogue import STYLES, style_of

TODO = "# TODO(vitcg new): "
TINY = {"depth": 2, "num_hidden_layers": 2, "hidden_size": 64, "embed_dim": 64, "num_heads": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96, "out_hidden_size": 48,
        "num_position_embeddings": 64}
"""Small values for the vision config fields a tiny CPU check shrinks, when the config has them."""
GEOMETRY = (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
            ("spatial_merge_size", "spatial_merge_size"), ("in_channels", "in_channels"),
            ("in_channels", "num_channels"), ("image_size", "image_size"), ("window_size", "window_size"))


@dataclass
class Draft:
    model_type: str
    vlm_config: type
    vision_config: type
    encoder: type
    vlm_attribute: str
    style: str
    modalities: tuple[str, ...]
    defaults: dict[str, Any]
    helpers: set[str] = field(default_factory=set)
    """vision_utils helpers the encoder's forward calls."""
    notes: list[str] = field(default_factory=list)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _vision_config(vlm_config: type, model_type: str) -> type:
    sub = getattr(vlm_config, "sub_configs", {}).get("vision_config")
    if sub is None:
        return vlm_config
    if sub.__name__ == "AutoConfig":
        return type(vlm_config().vision_config)
    return sub


def _encoder_class(modeling, vision_config: type, model_type: str) -> type:
    from transformers import PreTrainedModel

    candidates = [obj for _, obj in inspect.getmembers(modeling, inspect.isclass)
                  if issubclass(obj, PreTrainedModel) and obj.__module__ == modeling.__name__
                  and getattr(obj, "config_class", None) is vision_config]
    if not candidates:
        raise UsageError(f"no encoder class built from {vision_config.__name__} in {modeling.__name__}; "
                         "write the spec by hand (docs/writing-specs.md)")
    # the encoder proper: "Vision" in the name, the fewest wrappers (shortest name wins ties)
    return min(candidates, key=lambda c: ("Vision" not in c.__name__, "ForConditional" in c.__name__, len(c.__name__)))


def _vlm_attribute(modeling, vlm_config: type, encoder: type) -> str:
    from transformers import PreTrainedModel

    for _, cls in inspect.getmembers(modeling, inspect.isclass):
        if (cls.__module__ != modeling.__name__ or not issubclass(cls, PreTrainedModel)
                or getattr(cls, "config_class", None) is not vlm_config or "ForConditional" in cls.__name__):
            continue
        source = inspect.getsource(cls.__init__)
        for name, rhs in re.findall(r"self\.(\w+)\s*=\s*([^\n]+)", source):
            if encoder.__name__ in rhs or "vision_config" in rhs:
                return f"model.{name}"
    return "model.visual"


def _input_modalities(encoder: type) -> tuple[str, ...]:
    # transformers declares a tuple, or one string ("text" is PreTrainedModel's default).
    declared = getattr(encoder, "input_modalities", ())
    return (declared,) if isinstance(declared, str) else tuple(declared)


def _refuse_text_only(model_type: str, vlm_config: type, encoder: type) -> None:
    """Raise UsageError unless the encoder found for a config without a vision_config takes images or video.

    Such a config is either a vision tower's own (siglip_vision_model, vit) or a text model's (llama).
    """
    first = next(iter(list(inspect.signature(encoder.forward).parameters)[1:2]), "")
    modalities = _input_modalities(encoder)
    if "pixel" in first or {"image", "video"} & set(modalities):
        return
    raise UsageError(f"{model_type!r} is not a vision model: {vlm_config.__name__} has no vision_config, and "
                     f"its model class {encoder.__name__} takes {first!r} ({', '.join(modalities) or 'no'} "
                     "input), not images or video; vitcg drafts specs for vision encoders")


def draft(model_type: str) -> Draft:
    """Read everything the spec needs off ``model_type``.

    Raises UsageError for an unknown model type, one without modeling code, or a text-only one.
    """
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        hint = suggest(model_type, list(CONFIG_MAPPING.keys()))
        raise UsageError(f"transformers has no model type {model_type!r}" + (f"; {hint}" if hint else ""))
    vlm_config = CONFIG_MAPPING[model_type]
    vision_config = _vision_config(vlm_config, model_type)
    module = vision_config.__module__.replace(".configuration_", ".modeling_")
    try:
        modeling = importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"model type {model_type!r} has no importable modeling code ({exc}); "
                         "write the spec by hand (docs/writing-specs.md)") from None
    encoder = _encoder_class(modeling, vision_config, model_type)
    if vision_config is vlm_config:
        _refuse_text_only(model_type, vlm_config, encoder)
    source = inspect.getsource(encoder)
    helpers = set(re.findall(r"(get_vision_\w+)\(", source))
    style = style_of(helpers).name
    modalities = tuple(m for m in _input_modalities(encoder) if m in ("image", "video"))
    defaults = vision_config().to_dict()
    return Draft(model_type, vlm_config, vision_config, encoder, _vlm_attribute(modeling, vlm_config, encoder),
                 style, modalities or ("image",), defaults, helpers)


def render(d: Draft) -> str:
    """The draft spec as YAML text, every guess marked ``# TODO(vitcg new)``."""
    style = STYLES[d.style]
    packed = style.segmented
    geometry = {}
    for name, field_name in GEOMETRY:
        value = d.defaults.get(field_name)
        if name not in geometry and (isinstance(value, int) or (isinstance(value, list) and value)):
            geometry[name] = f"config.{field_name}" + ("[0]" if isinstance(value, list) else "")
    if "num_position_embeddings" in d.defaults:
        geometry["num_grid_per_side"] = "isqrt(config.num_position_embeddings)"
    out_field = "out_hidden_size" if "out_hidden_size" in d.defaults else "hidden_size"
    geometry["out_hidden_size"] = f"config.{out_field}"
    m = "spatial_merge_size" if "spatial_merge_size" in geometry else None
    signature = list(inspect.signature(d.encoder.forward).parameters)[1:]
    pixels_arg = signature[0] if signature else "pixel_values"
    lines = [
        "# yaml-language-server: $schema=../vitcg/lang/schema.json",
        f"# Draft written by `vitcg new {d.model_type}`: confirm every TODO, then run",
        f"# `vitcg validate specs/{d.model_type}.yaml` and `vitcg check specs/{d.model_type}.yaml`.",
        f"name: {d.model_type}",
        f"display_name: {d.model_type}   {TODO}the model's display name",
        f"architectures: [{d.vlm_config.__name__.removesuffix('Config')}ForConditionalGeneration]   "
        f"{TODO}check the architecture name",
        f"model_types: [{d.model_type}]",
        f"checkpoints: [org/{d.model_type}]   {TODO}real checkpoint names",
        "",
        "encoder:",
        f"  class: {_path(d.encoder)}",
        f"  config_class: {_path(d.vision_config)}",
        f"  vlm_attribute: {d.vlm_attribute}",
    ]
    grid_arg = next((p for p in signature if "grid" in p), "grid_thw")
    if packed:
        lines.append(f"  args: {{{pixels_arg}: pixels, {grid_arg}: grid}}")
        lines.append(f"  outputs: [pooler_output]   {TODO}the output field holding the merged tokens")
    else:
        lines.append(f"  args: {{{pixels_arg}: pixels}}")
        lines.append(f"  outputs: [last_hidden_state]   {TODO}the field (or use the VLM's get_image_features)")
    tiny = {k: v for k, v in TINY.items() if k in d.defaults and isinstance(d.defaults[k], int)}
    if "image_size" in d.defaults and not packed:
        patch = d.defaults.get("patch_size", 14)
        patch = patch[0] if isinstance(patch, list) else patch
        tiny["image_size"] = 4 * patch
    lines.append("  tiny_config: {" + ", ".join(f"{k}: {v}" for k, v in tiny.items())
                 + f"}}   {TODO}keep it small: 2 layers, hidden <= 64")
    lines.append(f"  real_config: {{}}   {TODO}overrides for a real checkpoint's dimensions, if the defaults are not")
    lines.append("")
    lines.append("geometry:")
    for name, formula in geometry.items():
        lines.append(f"  {name}: {formula}")
    if not packed:
        if "image_size" not in geometry or "patch_size" not in geometry:
            lines.append(f"  image_size: 448   {TODO}tile size")
            lines.append(f"  patch_size: 14   {TODO}patch size")
        lines.append(f"  tokens_per_tile: (image_size // patch_size) ** 2   {TODO}tokens one tile yields (CLS? pooling?)")
    lines += ["", "attention:", f"  style: {d.style}"]
    if packed:
        lines.append(f"  segments: frame   {TODO}frame (one segment per frame) or clip")
    lines += ["", "modalities:"]
    for modality in d.modalities:
        lines.append(f"  {modality}:")
        if packed:
            pixels_key = "pixel_values" if modality == "image" else "pixel_values_videos"
            lines.append(f"    inputs: {{pixels: {pixels_key}, grid: {modality}_grid_thw}}")
        else:
            lines.append(f"    inputs: {{pixels: pixel_values{'' if modality == 'image' else '_videos'}}}   "
                         f"{TODO}add `tiles: <key>` if images carry a tile count")
        if modality == "video":
            lines.append(f"    max_frames_per_video: 32   {TODO}largest grid t of one video")
    merged = f"(h // {m}) * (w // {m})" if m else "h * w"
    lines += ["", "items:"]
    if packed:
        lines += ["  input_size: t * h * w", f"  output_tokens: t * {merged}   {TODO}confirm against the encoder output"]
    else:
        lines += ["  input_size: n", "  output_tokens: n * tokens_per_tile"]
    lines += ["", "budget:", f"  min: {64 if packed else 'tokens_per_tile'}   {TODO}smallest useful budget",
              "  max: min(max_num_batched_tokens, max_model_len)", "", "buffers:"]
    unit = f" * {m} ** 2" if m else ""
    if packed:
        row = "in_channels" + (" * temporal_patch_size" if "temporal_patch_size" in geometry else "") + " * patch_size ** 2"
        lines += ["  - name: pixel_values", f"    arg: {pixels_arg}", "    provider: pixels",
                  f"    shape: [budget{unit}, {row}]   {TODO}one row of pixel_values", "    padding: zeros",
                  "  - name: grid_thw", f"    arg: {grid_arg}", "    provider: grid", "    shape: [max_items + 1, 3]",
                  "    padding: zeros",
                  "  - name: cu_seqlens", "    provider: cu_seqlens", "    shape: [max_segments + 2]",
                  "    padding: trailing_segment",
                  "  - name: max_seqlen", "    provider: max_seqlen", f"    value: budget{unit}", "    padding: fixed"]
        if "get_vision_position_ids" in d.helpers:
            lines += ["  - name: position_ids", "    provider: position_ids", f"    shape: [budget{unit}, 2]",
                      "    padding: zeros"]
        if "window_index" in style.required_providers:
            lines += ["  - name: window_index", "    provider: window_index", "    shape: [budget]", "    padding: identity",
                      "  - name: cu_window_seqlens", "    provider: cu_window_seqlens", "    shape: [budget + 2]",
                      "    padding: trailing_segment",
                      "  - name: max_window_seqlen", "    provider: max_window_seqlen",
                      "    value: (window_size // patch_size) ** 2", "    padding: fixed"]
        if "get_vision_interpolation_indices_and_weights" in d.helpers:
            for name in ("interp_indices", "interp_weights"):
                lines += [f"  - name: {name}", f"    provider: {name}", f"    shape: [budget{unit}, 4]", "    padding: zeros",
                          f"    params: {{mode: bilinear, align_corners: true}}   {TODO}as the encoder calls the helper"]
    else:
        lines += ["  - name: pixel_values", f"    arg: {pixels_arg}", "    provider: pixels",
                  "    shape: [budget // tokens_per_tile, in_channels, image_size, image_size]", "    padding: zeros"]
    lines += ["", "docs:", "  notes: >-", f"    Drafted by vitcg new from {d.encoder.__name__}; {d.style} attention. "
              "TODO(vitcg new): describe it.", "", "tests:",
              f'  prompt_template: "USER: {{placeholders}}{{question}} ASSISTANT:"   {TODO}the chat template',
              f'  image_placeholder: "<image>"   {TODO}the image placeholder token']
    if "video" in d.modalities:
        lines.append(f'  video_placeholder: "<video>"   {TODO}the video placeholder token')
    lines += ["  max_model_len: 8192", "  budgets: [1024, 2048, 4096]", ""]
    return "\n".join(lines)
