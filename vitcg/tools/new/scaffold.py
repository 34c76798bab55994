"""``vitcg new MODEL_TYPE``: a draft spec read off a transformers model type, with every guess marked.

It finds the VLM config and its vision config, the encoder class built from that vision config, the
attribute holding the encoder in the VLM, the geometry fields and their defaults, and guesses the
attention style from the precompute helpers the encoder's code calls (``get_vision_window_index``:
windowed; ``get_vision_attention_seqlens``: packed; neither: tiles). Every line that is a guess ends
with a ``# GUESS:`` comment naming what to verify. The draft validates (``vitcg new`` checks it before
writing); ``vitcg check`` then says whether the guesses hold.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.resources
import inspect
import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UsageError, VitcgError, suggest
from ...lang.catalogue import PROVIDERS, STANDARD_ROLES, STYLE_DEFAULTS, STYLES, style_of
from ..guesses import MARK, placeholder_checkpoint
from .tiny import fitting, positive_int, positive_ints, tiny_config
from .tokens import Prepended, meta_call, prepended_tokens

log = logging.getLogger(__name__)

GEOMETRY = {
    "patch_size": ("patch_size",),
    "temporal_patch_size": ("temporal_patch_size",),
    "spatial_merge_size": ("spatial_merge_size", "merge_kernel_size", "merge_size"),
    "in_channels": ("in_channels", "num_channels"),
    "image_size": ("image_size",),
    "window_size": ("window_size",),
}
"""Geometry names and the config fields (first found wins) a draft reads them from."""
FALLBACK = {"patch_size": 14, "temporal_patch_size": 1, "spatial_merge_size": 1, "in_channels": 3,
            "image_size": 448, "window_size": 112}
"""Literal geometry for a name the draft needs and the config does not have (marked as a guess)."""
SUB_CONFIGS = ("vision_config", "video_config")
"""Sub-config keys that name a vision encoder's config, in order of preference."""
PIXEL_ARGS = re.compile(r"pixel\w*|flattened_patches|patch_embeds|images?")
"""First forward arguments that say a model without a vision sub-config takes images itself."""


@dataclass
class Draft:
    model_type: str
    vlm_config: type
    vision_config: type
    encoder: type
    vlm_attribute: str | None
    """``model.<attribute>`` read off the VLM's ``__init__``, or None when none was found."""
    style: str
    modalities: tuple[str, ...]
    defaults: dict[str, Any]
    helpers: set[str] = field(default_factory=set)
    """vision_utils helpers the encoder's forward calls."""
    alternatives: list[str] = field(default_factory=list)
    """Other classes built from the vision config: candidates for the encoder boundary."""

    @property
    def name(self) -> str:
        """The spec name: the model type in snake case (``kosmos-2.5`` -> ``kosmos_2_5``)."""
        return spec_name(self.model_type)


@dataclass(frozen=True)
class Required:
    """A parameter of the encoder's ``forward`` without a default, beyond the pixels and grid a draft passes: drafted
    as an extra input role (``encoder.args``, each modality's ``inputs``, ``tests.inputs``) and an ``aligned``
    buffer, every line a guess. Without it the draft would not validate: ``vitcg validate`` refuses a spec whose
    calls leave out a required argument, since every case of ``vitcg check`` would fail on it."""

    arg: str
    """The parameter's name (``aspect_ratio_ids``)."""
    role: str
    """The input role that holds it: the parameter's name, unless that is a standard role."""
    buffer: str
    """The name of the buffer passed as it: the parameter's name, unless a drafted buffer has that name."""

    def key(self, modality: str) -> str:
        """The processor output key guessed for ``modality``: the parameter's name for images, ``video_...`` (an
        ``image_`` prefix swapped) for videos, as transformers' processors name them; keys differ per modality."""
        if modality == "image":
            return self.arg
        return "video_" + self.arg.removeprefix("image_")


def required_arguments(d: Draft, passed: tuple[str, ...], taken: tuple[str, ...] = ()) -> list[Required]:
    """The parameters of ``d.encoder.forward`` without a default that ``passed`` leaves out, in call order; the
    buffer of each avoids the names in ``taken``. Read by :func:`vitcg.lang.bindings.method_signature`, as the
    validate rule reads them."""
    from ...lang.bindings import method_signature

    signature = method_signature(_path(d.encoder), "forward")
    required = signature["required"] if signature["ok"] else []
    return [Required(arg=name, role=name if name not in STANDARD_ROLES else f"{name}_input",
                     buffer=name if name not in taken else f"{name}_input")
            for name in required if name not in passed]


def spec_name(model_type: str) -> str:
    """``model_type`` as a spec name (``^[a-z][a-z0-9_]*$``)."""
    name = re.sub(r"[^a-z0-9_]+", "_", model_type.lower()).strip("_")
    return name if name[:1].isalpha() else f"m_{name}"


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _vision_config(vlm_config: type, model_type: str) -> type:
    subs = getattr(vlm_config, "sub_configs", {})
    key = next((k for k in SUB_CONFIGS if subs.get(k) is not None), None)
    if key is None:
        return vlm_config
    sub = subs[key]
    if sub.__name__ == "AutoConfig":
        instance = getattr(_default(vlm_config, model_type), key, None)
        if instance is None:
            raise UsageError(f"{model_type!r}: {vlm_config.__name__}.{key} is empty by default (a checkpoint "
                             "sets it), so there is no encoder class to read; write the spec by hand "
                             "(docs/writing-specs.md)")
        return type(instance)
    return sub


def _default(config: type, model_type: str):
    """``config()``: the config with its defaults. Raises UsageError when it cannot be built without a
    checkpoint (``vision-encoder-decoder`` needs its parts; some defaults need timm or the Hub)."""
    try:
        return config()
    except Exception as exc:  # noqa: BLE001 - config code of any transformers release
        message = " ".join(str(exc).split())
        raise UsageError(f"{model_type!r}: {config.__name__}() cannot be built from its defaults "
                         f"({type(exc).__name__}: {message[:200]}); write the spec by hand "
                         "(docs/writing-specs.md)") from None


def _encoder_candidates(modeling, vision_config: type) -> list[type]:
    """Model classes of ``modeling`` built from ``vision_config`` that implement ``forward``, best first."""
    from torch import nn
    from transformers import PreTrainedModel

    candidates = [obj for _, obj in inspect.getmembers(modeling, inspect.isclass)
                  if issubclass(obj, PreTrainedModel) and obj.__module__ == modeling.__name__
                  and getattr(obj, "config_class", None) is vision_config and obj.forward is not nn.Module.forward]
    # the encoder proper: "Vision" in the name, the fewest wrappers (shortest name wins ties)
    return sorted(candidates, key=lambda c: ("Vision" not in c.__name__, "ForConditional" in c.__name__,
                                             len(c.__name__), c.__name__))


def _vlm_attribute(modeling, vlm_config: type, encoder: type) -> str | None:
    """``model.<attribute>`` that the VLM's base model sets to the encoder in its ``__init__``, read off the VLM's
    own modeling module (where the encoder comes from another model's, as PaliGemma's SigLIP), else the
    encoder's; None when neither assigns it."""
    own = vlm_config.__module__.replace(".configuration_", ".modeling_")
    if own != modeling.__name__:
        found = _vlm_attribute_in(own, vlm_config, encoder)
        if found:
            return found
    from transformers import PreTrainedModel

    for _, cls in inspect.getmembers(modeling, inspect.isclass):
        if (cls.__module__ != modeling.__name__ or not issubclass(cls, PreTrainedModel)
                or getattr(cls, "config_class", None) is not vlm_config or "ForConditional" in cls.__name__):
            continue
        name = _encoder_assigned(cls, encoder)
        if name:
            return f"model.{name}"
    return None


def _vlm_attribute_in(module: str, vlm_config: type, encoder: type) -> str | None:
    """:func:`_vlm_attribute` read off the modeling module named ``module``; None when it does not import."""
    try:
        return _vlm_attribute(importlib.import_module(module), vlm_config, encoder)
    except ImportError:
        return None


def _encoder_assigned(cls: type, encoder: type) -> str | None:
    """The attribute that ``cls.__init__`` sets to the encoder (or to something built from the vision config);
    None when its source cannot be read or it sets none."""
    try:
        source = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return None
    for name, rhs in re.findall(r"self\.(\w+)\s*=\s*([^\n]+)", source):
        if encoder.__name__ in rhs or "vision_config" in rhs:
            return name
    return None


def _input_modalities(encoder: type) -> tuple[str, ...]:
    # transformers declares a tuple, or one string ("text" is PreTrainedModel's default).
    declared = getattr(encoder, "input_modalities", ())
    return (declared,) if isinstance(declared, str) else tuple(declared)


def _first_argument(encoder: type) -> str:
    return next(iter(list(inspect.signature(encoder.forward).parameters)[1:2]), "")


def _refuse_non_vision(model_type: str, vlm_config: type, encoder: type) -> None:
    """Raise UsageError unless the model class found for a config without a vision sub-config takes images.

    Such a config is either a vision tower's own (siglip_vision_model, vit, qwen2_vl_vision) or a text or
    audio model's (llama, whisper). A vision tower's forward takes pixels first, or patch rows as
    ``hidden_states`` (the packed towers); the family-wide ``input_modalities`` cannot tell them apart.
    """
    first = _first_argument(encoder)
    if PIXEL_ARGS.fullmatch(first):
        return
    vision_name = "Vision" in encoder.__name__ or "Visual" in encoder.__name__
    if first == "hidden_states" and vision_name:
        return
    raise UsageError(f"{model_type!r} is not a vision model vitcg can draft: {vlm_config.__name__} has no "
                     f"{' or '.join(SUB_CONFIGS)}, and its model class {encoder.__name__} takes {first!r} first, "
                     f"not pixel values; vitcg drafts specs for vision encoders{_sub_model_types(vlm_config, model_type)}")


def _sub_model_types(vlm_config: type, model_type: str) -> str:
    """A hint naming the sub-configs of ``vlm_config`` that are model types of their own (Qwen2.5-Omni's
    thinker holds its vision tower), or ``""``."""
    from transformers import CONFIG_MAPPING

    subs = [getattr(sub, "model_type", "") for sub in getattr(vlm_config, "sub_configs", {}).values()]
    subs = [sub for sub in dict.fromkeys(subs) if sub in CONFIG_MAPPING and sub != model_type]
    return f"; its sub-configs are model types of their own, try: {', '.join(subs)}" if subs else ""


def draft(model_type: str) -> Draft:
    """Read everything the spec needs off ``model_type``.

    Raises UsageError for an unknown model type, one without modeling code, or one that is not a vision model.
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
    candidates = _encoder_candidates(modeling, vision_config)
    if not candidates:
        raise UsageError(f"{model_type!r}: no model class in {modeling.__name__} is built from "
                         f"{vision_config.__name__} (its vision tower may be a plain module or another library's); "
                         f"write the spec by hand (docs/writing-specs.md){_sub_model_types(vlm_config, model_type)}")
    encoder = candidates[0]
    if vision_config is vlm_config:
        _refuse_non_vision(model_type, vlm_config, encoder)
    source = inspect.getsource(encoder)
    helpers = set(re.findall(r"(get_vision_\w+)\(", source))
    style = style_of(helpers).name
    modalities = tuple(m for m in _input_modalities(encoder) if m in ("image", "video"))
    defaults = _default(vision_config, model_type).to_dict()
    return Draft(model_type, vlm_config, vision_config, encoder, _vlm_attribute(modeling, vlm_config, encoder),
                 style, modalities or ("image",), defaults, helpers, [c.__name__ for c in candidates[1:4]])


def _read(defaults: dict[str, Any], name: str) -> tuple[str, str | None, int] | None:
    """``(formula, guess, value)`` reading geometry ``name`` off the config defaults, or None when no field has it.

    ``guess`` is set when the read is uncertain: another field's name, or the first entry of a list whose
    entries differ."""
    for field_name in GEOMETRY[name]:
        value = defaults.get(field_name)
        other = None if field_name == name else f"read from config.{field_name}"
        if positive_int(value):
            return f"config.{field_name}", other, value
        if positive_ints(value):
            same = all(v == value[0] for v in value)
            return f"config.{field_name}[0]", (other if same else f"config.{field_name} is {value} (per stage?)"), value[0]
    return None


def _out_hidden_size(defaults: dict[str, Any]) -> tuple[str, str, int]:
    """``(formula, guess, value)`` for the width of one output row."""
    for field_name in ("out_hidden_size", "hidden_size", "embed_dim", "projection_dim"):
        if positive_int(defaults.get(field_name)):
            return (f"config.{field_name}", "the width of one output row (the merger's or projector's output?)",
                    defaults[field_name])
    for field_name in ("hidden_sizes", "embed_dim", "embed_dims", "dims"):
        value = defaults.get(field_name)
        if isinstance(value, list) and 0 < len(value) <= 16 and all(positive_int(v) for v in value):
            return (f"config.{field_name}[{len(value) - 1}]",
                    f"the width of one output row (here the last stage's {field_name})", value[-1])
    return "64", "the width of one output row: no hidden size field found in the config", 64


def _tile_budget_max(values: dict[str, int], tokens_per_tile: int) -> tuple[str, str | None]:
    """``(formula, guess)`` for ``budget.max`` of a tiles draft: the engine limits, unless they hold no whole
    tile, or more tiles than a spec may capture (then a literal number of tiles, marked)."""
    from ...lang.catalogue import DEFAULT_LIMITS, MAX_BUFFER_ELEMENTS

    fit = min(DEFAULT_LIMITS.values()) // tokens_per_tile
    # half the capture bound for the pixels: the rest is for the other buffers
    room = MAX_BUFFER_ELEMENTS // 2 // (values["in_channels"] * values["image_size"] ** 2)
    if 1 <= fit <= room:
        return "min(max_num_batched_tokens, max_model_len)", None
    tiles = max(1, min(fit, room))
    formula = "tokens_per_tile" if tiles == 1 else f"{tiles} * tokens_per_tile"
    why = "one tile exceeds the engine limits" if fit < 1 else "the engine limits hold more tiles than fit a capture"
    return formula, f"the largest budget: {why}"


class _Lines:
    """The draft's lines, and a count of the guesses marked in them."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.guesses = 0

    def add(self, text: str, guess: str | None = None) -> None:
        if guess:
            text = f"{text}   {MARK}{guess}"
            self.guesses += 1
        self.lines.append(text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _geometry(d: Draft, style) -> dict[str, tuple[str, str | None, int]]:
    """``name -> (formula, guess, value)``: what the style, its providers and the draft's own formulas read (a
    literal guess where the config is silent)."""
    packed = style.segmented
    provided = {g for p in style.required_providers for g in PROVIDERS[p].geometry}
    needed = {"patch_size", "in_channels", "spatial_merge_size" if packed else "image_size", *style.geometry, *provided}
    needed |= {"temporal_patch_size"} if packed and "video" in d.modalities else set()
    geometry: dict[str, tuple[str, str | None, int]] = {}
    for name in GEOMETRY:
        found = _read(d.defaults, name)
        if found is not None:
            geometry[name] = found
        elif name in needed:
            geometry[name] = (str(FALLBACK[name]), "the config has no such field; the value is a guess", FALLBACK[name])
    if packed and "get_vision_interpolation_indices_and_weights" in d.helpers and "num_position_embeddings" in d.defaults:
        geometry["num_grid_per_side"] = ("isqrt(config.num_position_embeddings)", None, 0)
    geometry["out_hidden_size"] = _out_hidden_size(d.defaults)
    return geometry


def _items_and_budget(out: _Lines, style: str, packed: bool, geometry: dict, m: str | None, prepended: int = 0) -> None:
    """``items`` and ``budget``: what differs from the style's defaults (``prepended``: the tokens a tile yields
    beyond its patch grid)."""
    merged = f"(h // {m}) * (w // {m})" if m else "h * w"
    if packed:
        items = {"input_size": ("t * h * w", None),
                 "output_tokens": (f"t * {merged}", "output rows of one item, against the encoder's output")}
        budget = {"min": ("64", "smallest useful budget"), "max": ("min(max_num_batched_tokens, max_model_len)", None)}
    else:
        values = {name: value for name, (_, _, value) in geometry.items()}
        items = {"input_size": ("n", None), "output_tokens": ("n * tokens_per_tile", None)}
        budget = {"min": ("tokens_per_tile", "smallest useful budget"),
                  "max": _tile_budget_max(values, max(1, values["image_size"] // values["patch_size"]) ** 2 + prepended)}
    _section(out, style, "items", items)
    _section(out, style, "budget", budget)


def _runs_on_meta(w: _Whole, image: dict[str, int] | None = None) -> Callable[[dict[str, Any]], bool]:
    """Whether the draft's tiles tower, built from its config with these overrides (and ``image``: a tiny
    ``image_size``), runs one tile on the meta device."""
    image = image or {}
    size, channels = image.get("image_size", w.geometry["image_size"][2]), w.geometry["in_channels"][2]

    def runs(overrides: dict[str, Any]) -> bool:
        try:
            config = w.d.vision_config(**overrides, **image)
        except Exception:  # noqa: BLE001 - config code of any release
            return False
        return meta_call(w.d.encoder, config, size, channels) is not None

    return runs


def _prepended(d: Draft, geometry: dict[str, tuple[str, str | None, int]]) -> Prepended | None:
    """:func:`prepended_tokens` of the draft's tower at its default size (None where the config does not build)."""
    try:
        config = d.vision_config()
    except Exception:  # noqa: BLE001 - config code of any release: nothing measured
        return None
    return prepended_tokens(d.encoder, config, geometry["image_size"][2], geometry["patch_size"][2],
                            geometry["in_channels"][2])


def _tiny_image_size(defaults: dict[str, Any]) -> dict[str, int]:
    """A tiles draft's tiny ``image_size``: four patches a side, when the config has both fields."""
    patch = defaults.get("patch_size")
    patch = patch[0] if isinstance(patch, list) and patch else patch
    return {"image_size": 4 * patch} if positive_int(patch) and isinstance(defaults.get("image_size"), int) else {}


@dataclass(frozen=True)
class Candidate:
    """A spec whose encoder is the draft's tower, and how well it fits as the draft's parent."""

    spec: Any
    rank: int
    """3: the spec already lists the model type; 2: the model's own code derives from one of the spec's model
    types; 1: the spec of the tower's own model type; 0: the same tower in another family; -1: the spec's notes
    say it does not cover this model."""
    why: str


def family_parent(d: Draft) -> Any:
    """The spec the draft extends: the best of :func:`parent_candidates`, unless its notes exclude the model;
    None when no spec has the draft's tower."""
    ranked = parent_candidates(d)
    return ranked[0].spec if ranked and ranked[0].rank >= 0 else None


def parent_candidates(d: Draft) -> list[Candidate]:
    """The specs (packaged and ``$VITCG_SPECS_DIR``'s) whose encoder is this draft's tower, the same module class
    built from the same config class, best first: a spec that already lists the model type, the model's family
    (its model code derives from the spec's model type, :func:`lineage`), the spec of the tower's own model type,
    then the rest by name; a spec whose notes say it does not cover the model comes last."""
    from ...lang import spec_folders

    tower = (_path(d.encoder), _path(d.vision_config))
    family, home = lineage(d), _model_type_of(d.encoder)
    names = _names_of(d)
    ranked = []
    for spec in _towers(tuple(map(str, spec_folders()))).get(tower, ()):
        if spec.name == d.name:
            continue
        types = {spec_name(t) for t in spec.model_types}
        excluded = _excluding_sentence(spec.docs.notes, names)
        if excluded:
            ranked.append(Candidate(spec, -1, f"its notes exclude it: \"{excluded}\""))
        elif d.name in types:
            ranked.append(Candidate(spec, 3, f"which already lists {d.model_type} in its model_types"))
        elif types & family:
            ranked.append(Candidate(spec, 2, f"{d.model_type}'s model code derives from "
                                             f"{', '.join(sorted(types & family))}"))
        elif home in types:
            ranked.append(Candidate(spec, 1, f"the spec of the tower's own model type ({home})"))
        else:
            ranked.append(Candidate(spec, 0, "the same tower in another family"))
    return sorted(ranked, key=lambda c: (-c.rank, c.spec.name))


def lineage(d: Draft) -> frozenset[str]:
    """The model types (in snake case) the model's own code derives from: those whose modules its modular file
    (``modular_NAME.py``, the source transformers generates the model from) imports (``from ..X.modeling_X`` or
    ``from transformers.models.X...``), or where it has none, its modeling and configuration files."""
    package = d.vlm_config.__module__.rpartition(".")[0]
    own = package.rpartition(".")[2]
    try:
        files = [f for f in importlib.resources.files(package).iterdir() if f.name.endswith(".py")]
    except (ModuleNotFoundError, OSError, TypeError):
        return frozenset()
    sources = ([f for f in files if f.name.startswith("modular_")]
               or [f for f in files if f.name.startswith(("modeling_", "configuration_"))])
    found = set().union(*(_imported_models(source) for source in sources))
    return frozenset(spec_name(name) for name in found - {"auto", own})


def _imported_models(source: Any) -> set[str]:
    """The ``transformers.models`` folders a model source file imports from (none where it cannot be read)."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    found = set()
    for node in ast.walk(tree):
        parts = node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else []
        if parts and node.level == 2:  # from ..X.modeling_X import ...
            found.add(parts[0])
        elif parts[:2] == ["transformers", "models"] and len(parts) > 2 and node.level == 0:
            found.add(parts[2])
    return found


def _model_type_of(cls: type) -> str:
    """The model type whose folder of ``transformers.models`` defines ``cls`` (snake case), or ''."""
    parts = cls.__module__.split(".")
    return spec_name(parts[2]) if len(parts) > 3 and parts[:2] == ["transformers", "models"] else ""


def _names_of(d: Draft) -> set[str]:
    """How a spec's notes may name the draft's model: its model type, and its architecture's prefix (``Aria`` of
    ``AriaForConditionalGeneration``)."""
    prefix = re.split(r"For[A-Z]|Model\b", _architecture(d))[0]
    return {n for n in (d.model_type, d.name, prefix) if len(n) > 2}


def _excluding_sentence(notes: str, names: set[str]) -> str:
    """The sentence of ``notes`` that names one of ``names`` and says it is not covered (or ''), shortened."""
    for sentence in re.split(r"(?<=[.;])\s+", " ".join(notes.split())):
        named = any(re.search(rf"\b{re.escape(n)}\b", sentence, re.IGNORECASE) for n in names)
        if named and re.search(r"\bnot\b", sentence):
            return sentence if len(sentence) <= 160 else sentence[:157] + "..."
    return ""


def notices(d: Draft) -> list[str]:
    """What vitcg already knows about the model type: the specs that already cover it (``model_types``) and the
    known gap of the spec language that names it (:data:`vitcg.lang.gaps.GAPS`)."""
    from ...lang import spec_folders
    from ...lang.gaps import GAPS

    said = [f"{spec.name} ({_from_here(spec.file)}) already covers {d.model_type}: use it (`vitcg check "
            f"{spec.name}`), or keep this draft only for a variant of your own"
            for spec in _specs(tuple(map(str, spec_folders())))
            if d.name in {spec_name(t) for t in spec.model_types}]
    said += [f"{d.model_type} is a known gap of the spec language: {gap.reason}"
             for gap in GAPS if d.name in {spec_name(t) for t in gap.model_types}]
    return said


@functools.lru_cache(maxsize=4)
def _specs(folders: tuple[str, ...]) -> tuple:
    """The valid specs of ``folders`` (one registry load for every draft of a process; a broken file of the
    user's hides only its own spec)."""
    from ...lang import SpecSource

    try:
        return tuple(SpecSource(list(folders)).specs)
    except VitcgError:
        return ()


def _towers(folders: tuple[str, ...]) -> dict[tuple[str, str], list]:
    """The specs of ``folders`` by ``(encoder class, config class)``, in name order."""
    towers: dict[tuple[str, str], list] = {}
    for spec in _specs(folders):
        towers.setdefault((spec.encoder.class_path, spec.encoder.config_class), []).append(spec)
    return towers


def _header_notes(out: _Lines, d: Draft, ranked: list[Candidate] | None = None,
                  parent: Any = None) -> None:
    """Comment lines under a draft's header: :func:`notices`, and the tower's specs not taken as the parent, one
    line each on why not."""
    for notice in notices(d):
        out.add(f"# NOTE: {notice}")
    others = [c for c in ranked or () if c.spec is not parent]
    if others:
        out.add(f"# Other specs of this tower ({d.encoder.__name__}), not extended:")
        for c in others:
            out.add(f"#   {c.spec.name}: {c.why}")


def _identity(out: _Lines, d: Draft, extends: tuple[str, str] | None = None) -> None:
    """The draft's names (and ``extends``: the parent's name and why), then a blank line."""
    out.add(f"name: {d.name}")
    if extends is not None:
        out.add(f"extends: {extends[0]}", extends[1])
    out.add(f"display_name: {d.name}", "the model's display name")
    out.add(f"architectures: [{_architecture(d)}]", "the architecture class name of the checkpoints")
    out.add(f"model_types: [{_quoted(d.model_type)}]")
    named = checkpoints_named(d.vlm_config)
    if named:
        out.add(f"checkpoints: [{', '.join(named)}]", f"named by {d.vlm_config.__name__}'s documentation; add the "
                                                       "others this spec serves")
    else:
        out.add(f"checkpoints: [{placeholder_checkpoint(d.name)}]", "real checkpoint names")
    out.add("")


def _child_text_config(out: _Lines, d: Draft, parent: Any) -> None:
    """An extends draft's ``tests.vlm.config``: empty where the model's text config class is the parent's (the
    parent's tiny language model fits), else a tiny one of the model's own."""
    from transformers import CONFIG_MAPPING

    mine = type(_text_config(d.vlm_config))
    theirs = {type(_text_config(CONFIG_MAPPING[t])) for t in parent.model_types if t in CONFIG_MAPPING}
    fields = _tiny_text_fields(d.vlm_config) if mine not in theirs and mine is not type(None) else ""
    if not fields:
        out.add("    config: {}", f"the text config and token ids {_architecture(d)} needs, where {parent.name}'s "
                                  "differ")
        return
    out.add("    config:")
    out.add(f"      text_config: {{{fields}}}", f"a tiny language model from {d.vlm_config.__name__}'s text config "
            f"({mine.__name__}), which is not {parent.name}'s; and the token ids it needs")


def checkpoints_named(config: type) -> list[str]:
    """The Hub checkpoints (``org/name``) a config class's documentation links to, in order, without repeats."""
    found = re.findall(r"huggingface\.co/([\w.-]+/[\w.-]+)", config.__doc__ or "")
    return list(dict.fromkeys(name.rstrip(".") for name in found if not name.startswith(("docs/", "papers/"))))


def _render_extends(d: Draft, ranked: list[Candidate], path: str, schema: str) -> _Lines:
    """A family member's draft: its own names, ``extends`` the best spec of its tower (``ranked[0]``), and
    guesses where the parent's values may not fit (the harness's VLM config, the notes)."""
    parent = ranked[0].spec
    out = _Lines()
    out.add("# yaml-language-server: $schema=" + schema)
    out.add(f"# Draft written by `vitcg new {d.model_type}`. Every line ending in \"{MARK.strip()}\" is a guess:")
    out.add(f"# confirm it, then run `vitcg validate --resolved {path}` (the whole spec it means),")
    out.add(f"# `vitcg validate {path}` and `vitcg check {path}`.")
    _header_notes(out, d, ranked, parent)
    tower = f"{d.encoder.__name__} from {d.vision_config.__name__}"
    _identity(out, d, (parent.name, f"{_from_here(parent.file)} describes the same tower ({tower}), "
                                    f"{ranked[0].why}; check its geometry, buffers and outputs hold here"))
    tower_alone = d.vision_config is d.vlm_config  # clip_vision_model: the end-to-end stage runs the parent's VLM
    if d.vlm_attribute and d.vlm_attribute != parent.encoder.vlm_attribute and not tower_alone:
        out.add("encoder:")
        out.add(f"  vlm_attribute: {d.vlm_attribute}", f"where the VLM holds this encoder (read off "
                f"{d.vlm_config.__name__}'s model; {parent.name} says {parent.encoder.vlm_attribute})")
        out.add("")
    out.add("docs:")
    out.add(f"  notes: \"Drafted by vitcg new: the {parent.display_name} tower ({parent.name}).\"",
            "describe the model for the supported-models page")
    out.add("")
    out.add("tests:", f"the harness merges over {parent.name}'s: its tiny VLM config was written for "
                      f"{parent.architectures[0] if parent.architectures else parent.name}")
    out.add("  vlm:")
    if tower_alone and parent.tests.vlm is not None and not parent.tests.vlm.architecture and parent.architectures:
        out.add(f"    architecture: {parent.architectures[0]}", f"the VLM whose feature call proves this tower end to "
                f"end, {parent.name}'s: {d.encoder.__name__} alone has no get_image_features")
    _child_text_config(out, d, parent)
    _omits_line(out, _left_out(d, parent.modality_names))
    return out


def _from_here(file: str) -> str:
    """``file`` relative to the working folder when it lies under it (``vitcg/specs/clip.yaml`` in a checkout),
    else as given: the path a user can open from where they ran ``vitcg new``."""
    where, here = Path(file).resolve(), Path.cwd().resolve()
    return where.relative_to(here).as_posix() if where.is_relative_to(here) else file


def render(d: Draft, path: str | None = None, schema: str | None = None, *, family: bool = True) -> _Lines:
    """The draft spec's lines (``.text()``), every guessed line ending with ``# GUESS: what to verify``.

    ``path`` is where it will be written (for the next-step commands in its header; default ``NAME.yaml``, as
    ``vitcg new`` writes it); ``schema`` the path of ``vitcg/lang/schema.json`` for editors (default
    :func:`schema_reference` of ``path``). ``family``: a model type whose tower a spec already describes is
    drafted as ``extends:`` of that spec (:func:`family_parent`); False drafts the whole spec anyway, section by
    section (:data:`SECTIONS`)."""
    path = path or f"{d.name}.yaml"
    schema = schema or schema_reference(path)
    ranked = parent_candidates(d) if family else []
    if ranked and ranked[0].rank >= 0:
        return _render_extends(d, ranked, path, schema)
    whole = _Whole.of(d, path, schema, ranked)
    out = _Lines()
    for section in SECTIONS:
        section(out, whole)
    return out


@dataclass
class _Whole:
    """What every section of a whole draft reads: the draft, its style and geometry, the encoder call's
    arguments, and the required arguments beyond pixels and grid (``extras``)."""

    d: Draft
    path: str
    schema: str
    ranked: list[Candidate]
    style: Any
    geometry: dict[str, tuple[str, str | None, int]]
    m: str | None
    """``spatial_merge_size`` where the geometry has it."""
    signature: list[str]
    pixels_arg: str
    grid_arg: str
    extras: Sequence[Any]
    prepended: Prepended | None = None
    """Tokens a tiles tower puts before its patch rows (a CLS token), measured on the meta device."""

    @classmethod
    def of(cls, d: Draft, path: str, schema: str, ranked: list[Candidate]) -> _Whole:
        style = STYLES[d.style]
        geometry = _geometry(d, style)
        m = "spatial_merge_size" if "spatial_merge_size" in geometry else None
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        signature = [p.name for p in list(inspect.signature(d.encoder.forward).parameters.values())[1:]
                     if p.kind in named]
        pixels_arg = signature[0] if signature else "pixel_values"
        grid_arg = next((p for p in signature if "grid" in p), "grid_thw")
        passed = (pixels_arg, grid_arg) if style.segmented else (pixels_arg,)
        drafted = [e["name"] for e, _ in _buffer_entries(d, style, geometry, pixels_arg, grid_arg, m)]
        extras = required_arguments(d, passed, (*drafted, *(b["name"] for b in STYLE_DEFAULTS[d.style]["buffers"])))
        prepended = None if style.segmented or extras else _prepended(d, geometry)
        return cls(d, path, schema, ranked, style, geometry, m, signature, pixels_arg, grid_arg, extras, prepended)

    @property
    def packed(self) -> bool:
        return self.style.segmented


def _header(out: _Lines, w: _Whole) -> None:
    out.add("# yaml-language-server: $schema=" + w.schema)
    out.add(f"# Draft written by `vitcg new {w.d.model_type}`. Every line ending in \"{MARK.strip()}\" is a guess:")
    out.add("# confirm what it names (docs/writing-specs.md), then run")
    out.add(f"# `vitcg validate {w.path}` and `vitcg check {w.path}`.")
    _header_notes(out, w.d, w.ranked)
    _identity(out, w.d)


def _encoder(out: _Lines, w: _Whole) -> None:
    d = w.d
    out.add("encoder:")
    others = f"; other classes built from {d.vision_config.__name__}: {', '.join(d.alternatives)}" if d.alternatives else ""
    out.add(f"  class: {_path(d.encoder)}",
            f"the encoder boundary: the smallest module whose output is the tokens the language model "
            f"consumes{others}")
    out.add(f"  config_class: {_path(d.vision_config)}")
    if d.vlm_attribute:
        out.add(f"  vlm_attribute: {d.vlm_attribute}",
                f"where the VLM holds this encoder (read off {d.vlm_config.__name__.removesuffix('Config')}Model)")
    else:
        out.add("  vlm_attribute: model.visual",
                "where the VLM holds this encoder: not found in the modeling code, model.visual is a placeholder")
    call = f"{d.encoder.__name__}.forward({', '.join(w.signature[:4])}{', ...' if len(w.signature) > 4 else ''})"
    roles = "".join(f", {e.arg}: {e.role}" for e in w.extras)
    required = (f"; {', '.join(e.arg for e in w.extras)}: required by forward, each passed as an extra input role "
                "(what does the processor give for it?)") if w.extras else ""
    grid = f", {w.grid_arg}: grid" if w.packed else ""
    out.add(f"  args: {{{w.pixels_arg}: pixels{grid}{roles}}}",
            f"the eager call's arguments and the input role of each: {call}{required}")
    if w.packed:
        out.add("  outputs: [pooler_output]", "the output field holding the merged tokens")
    else:
        out.add("  outputs: [last_hidden_state]",
                "the output field holding the tokens (or call the VLM's get_image_features: encoder.method)")
    out.add("")


def _geometry_and_attention(out: _Lines, w: _Whole) -> None:
    out.add("geometry:")
    for name, (formula, guess, _) in w.geometry.items():
        out.add(f"  {name}: {formula}", guess)
    if not w.packed and w.prepended is None:
        out.add("  tokens_per_tile: (image_size // patch_size) ** 2",
                "tokens one tile yields (a CLS token? pooling? a projector that merges patches?)")
    elif not w.packed:
        count, held = w.prepended.count, ", ".join(w.prepended.parameters)
        out.add(f"  tokens_per_tile: (image_size // patch_size) ** 2 + {count}",
                f"the patch rows and {count} token{'s' * (count != 1)} before them ({held}), as "
                f"{w.d.encoder.__name__} returns one tile on the meta device; pooling? a projector that merges patches?")
    out.add("")
    out.add("attention:")
    calls = ", ".join(sorted(w.d.helpers)) or "no vision_utils helper"
    out.add(f"  style: {w.d.style}", f"read off the helpers {w.d.encoder.__name__} calls ({calls})")
    if w.packed:
        out.add("  segments: frame", "frame (one attention segment per frame) or clip (one per item)")
    out.add("")


def _modalities(out: _Lines, w: _Whole) -> None:
    out.add("modalities:")
    for modality in w.d.modalities:
        out.add(f"  {modality}:")
        keys = "".join(f", {e.role}: {e.key(modality)}" for e in w.extras)
        if w.packed:
            pixels_key = "pixel_values" if modality == "image" else "pixel_values_videos"
            out.add(f"    inputs: {{pixels: {pixels_key}, grid: {modality}_grid_thw{keys}}}",
                    "the processor's output keys for this modality")
        else:
            out.add(f"    inputs: {{pixels: pixel_values{'' if modality == 'image' else '_videos'}{keys}}}",
                    "the processor's output keys; add `tiles: <key>` if an image carries a tile count")
        if modality == "video":
            out.add("    max_frames_per_video: 32", "largest grid t of one video")
    _items_and_budget(out, w.d.style, w.packed, w.geometry, w.m, w.prepended.count if w.prepended else 0)
    out.add("")


def _buffers_and_docs(out: _Lines, w: _Whole) -> None:
    _buffers(out, w.d, w.style, w.geometry, w.pixels_arg, w.grid_arg, w.m, w.extras)
    out.add("")
    out.add("docs:")
    out.add(f"  notes: \"Drafted by vitcg new from {w.d.encoder.__name__} ({w.d.style} attention).\"",
            "describe the model for the supported-models page")
    out.add("")


def _tests(out: _Lines, w: _Whole) -> None:
    image = {}
    if "image_size" in w.geometry and not w.packed and w.geometry["image_size"][0].startswith("config.image_size"):
        image = _tiny_image_size(w.d.defaults)
    if image and not _runs_on_meta(w, image)({}) and _runs_on_meta(w)({}):
        image = {}  # the tower does not run a tile of four patches a side (Swin's windows): its own size
    tiny = tiny_config(w.d.vision_config, w.d.defaults) if w.packed else fitting(w.d.vision_config, w.d.defaults,
                                                                                   _runs_on_meta(w, image))
    tiny.update(image)
    out.add("tests:", "the harness: how vitcg check builds and feeds the model (or NAME.tests.yaml beside the spec)")
    out.add(f"  tiny_config: {_flow(tiny, _plain_scalar)}", "small dimensions for CPU checks: 2 layers (one a stage), hidden "
            "<= 64, the same in the sub-configs that build the tower")
    out.add("  real_config: {}", "overrides for a real checkpoint's dimensions, where the defaults differ")
    if w.extras:
        described = ", ".join(f"{e.role}: {{shape: [], fill: ones, dtype: int64}}" for e in w.extras)
        out.add(f"  inputs: {{{described}}}", "how vitcg check builds each required argument for one pixel row (or "
                "tile): its shape past dim 0, its values and dtype, as the processor gives them")
    out.add('  prompt_template: "USER: {placeholders}{question} ASSISTANT:"', "the chat template")
    out.add('  image_placeholder: "<image>"', "the image placeholder token")
    if "video" in w.d.modalities:
        out.add('  video_placeholder: "<video>"', "the video placeholder token")
    _vlm_lines(out, w.d)


SECTIONS: tuple[Callable[[_Lines, _Whole], None], ...] = (_header, _encoder, _geometry_and_attention, _modalities,
                                                          _buffers_and_docs, _tests)
"""A whole draft's sections, in the order the file holds them."""


TEXT_TINY = {"hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 64}
"""Small values for the language model of the end-to-end stage's tiny VLM, when its text config has them."""
PLACEHOLDER_FIELDS = {"token": ("image_token_id", "image_token_index"),
                      "before": ("vision_start_token_id", "image_start_token_id", "boi_token_id"),
                      "after": ("vision_end_token_id", "image_end_token_id", "eoi_token_id")}
"""VLM config fields of the image placeholder token and of the tokens around each image, in order of preference."""


def _mrope(rope: Any, head_dim: int) -> list[int] | None:
    """A rope's ``mrope_section`` scaled to ``head_dim`` (sections sum to half of it), or None without one."""
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if not positive_ints(section):
        return None
    half, total = head_dim // 2, sum(section)
    scaled = [max(1, s * half // total) for s in section]
    scaled[0] += half - sum(scaled)
    return scaled if scaled[0] > 0 else None


def _source(config: type) -> str:
    """The source of the modeling module beside ``config``'s module ('' when it cannot be read)."""
    try:
        return inspect.getsource(importlib.import_module(config.__module__.replace(".configuration_", ".modeling_")))
    except (ImportError, OSError, TypeError):
        return ""


def _text_config(vlm_config: type) -> Any:
    """The VLM config's own default text config (None where it has none or cannot build with its defaults; a
    sub-config class may be AutoConfig, which builds nothing)."""
    try:
        return getattr(vlm_config(), "text_config", None)
    except Exception:  # noqa: BLE001 - a config that cannot build with its defaults: nothing to read
        return None


def _tiny_text_fields(vlm_config: type) -> str:
    """The flow mapping's fields of a tiny language model from the VLM config's own text config (rope sections
    scaled to its head size)."""
    text = _text_config(vlm_config)
    defaults = text.to_dict() if hasattr(text, "to_dict") else {}
    tiny = {k: v for k, v in TEXT_TINY.items() if positive_int(defaults.get(k))}
    if "head_dim" in defaults and tiny:
        tiny["head_dim"] = TEXT_TINY["hidden_size"] // TEXT_TINY["num_attention_heads"]
    section = _tiny_mrope(defaults.get("rope_parameters"), bool(tiny), vlm_config)
    fields = ", ".join(f"{k}: {v}" for k, v in tiny.items())
    if section:
        fields += f", rope_parameters: {{rope_type: default, mrope_section: {section}}}"
    return fields


def _tiny_mrope(rope: Any, shrunk: bool, vlm_config: type) -> Any:
    """The mrope section of the tiny language model's head size, from the text config's ``rope`` parameters, else
    (``shrunk``: the draft makes a tiny language model) the modeling code's own default when it reads one; None
    without one flat rope (not one per layer type)."""
    head_dim = TEXT_TINY["hidden_size"] // TEXT_TINY["num_attention_heads"]
    if not (isinstance(rope, dict) and "rope_type" in rope):
        return None
    section = _mrope(rope, head_dim)
    if section is None and shrunk and "mrope_section" in _source(vlm_config):
        section = _mrope({"mrope_section": [1, 1, 1]}, head_dim)  # the modeling code's own default, shrunk
    return section


def _vlm_lines(out: _Lines, d: Draft) -> None:
    """``tests.vlm``: the tiny full VLM of the end-to-end stage, so a fresh draft is checked against the real
    model from its first run (a tiny language model from the VLM's own text config, the placeholder tokens
    its config names)."""
    fields = _tiny_text_fields(d.vlm_config)
    try:
        config = d.vlm_config().to_dict()
    except Exception:  # noqa: BLE001
        config = {}
    found = {role: [f for f in names if f in config] for role, names in PLACEHOLDER_FIELDS.items()}
    out.add("  vlm:", "the end-to-end stage: the tiny full VLM (vitcg check proves the spec against it)")
    out.add("    config:")
    out.add(f"      text_config: {{{fields}}}", "a tiny language model from the VLM's text config (rope sections "
            "scaled to its head size)")
    token = found["token"][0] if found["token"] else "image_token_id"
    placeholder = f"{{token: {token}"
    for role in ("before", "after"):
        if found[role]:
            placeholder += f", {role}: [{found[role][0]}]"
    out.add(f"    placeholder: {placeholder}}}", "the VLM config fields of the image token and the tokens "
            "around each image (check the processor's prompt)")
    _omits_line(out, _left_out(d))


def _left_out(d: Draft, have: tuple[str, ...] | None = None) -> list[str]:
    """The modalities the VLM has (its ``get_image_features`` / ``get_video_features``) that the draft (or, given,
    ``have``) does not."""
    import transformers

    vlm = getattr(transformers, _architecture(d), None)
    if vlm is None or vlm is d.encoder:
        return []
    have = d.modalities if have is None else have
    return [m for m in ("image", "video") if m not in have and callable(getattr(vlm, f"get_{m}_features", None))]


def _omits_line(out: _Lines, left_out: list[str]) -> None:
    """``tests.vlm.omits`` for modalities the VLM has and the spec leaves out, marked as a guess."""
    if left_out:
        reasons = ", ".join(f'{m}: "the VLM runs its {m}s through the same tower call"' for m in left_out)
        out.add(f"    omits: {{{reasons}}}", f"read the VLM's get_{left_out[0]}_features: say why the spec needs "
                f"no {left_out[0]} modality, or add modalities.{left_out[0]} (vitcg validate asks for one or the other)")


AUTO_TABLES = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
               "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")
"""transformers' auto-class tables that map a model type to its VLM class, most specific first."""


def _architecture(d: Draft) -> str:
    """The VLM class transformers maps to the model type (the class the end-to-end stage builds), else the
    ``...ForConditionalGeneration`` or ``...Model`` of the config's name, else the encoder itself."""
    import transformers
    from transformers.models.auto import modeling_auto

    for table in AUTO_TABLES:
        name = getattr(modeling_auto, table, {}).get(d.model_type)
        name = name[0] if isinstance(name, (list, tuple)) and name else name
        if isinstance(name, str) and hasattr(transformers, name):
            return name
    prefix = d.vlm_config.__name__.removesuffix("Config")
    return next((prefix + s for s in ("ForConditionalGeneration", "Model") if hasattr(transformers, prefix + s)),
                d.encoder.__name__)  # a standalone vision model: the encoder is the model


def _quoted(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_]+", text) else f'"{text}"'


def _section(out: _Lines, style: str, key: str, values: dict[str, tuple[str, str | None]]) -> None:
    """Section ``key`` of the draft: only the values that differ from the style's defaults; a comment naming the
    defaults (and what to verify in them) when none does."""
    defaults = STYLE_DEFAULTS[style][key]
    differ = {k: v for k, v in values.items() if str(defaults.get(k)) != v[0]}
    out.add("")
    if not differ:
        guesses = "; ".join(f"{k}: {g}" for k, (_, g) in values.items() if g)
        out.add(f"# {key}: the {style} style's defaults ({', '.join(f'{k}: {f}' for k, (f, _) in values.items())})",
                guesses or None)
        return
    out.add(f"{key}:")
    for k, (formula, guess) in differ.items():
        out.add(f"  {k}: {formula}", guess)


def _buffer_entries(d: Draft, style, geometry: dict, pixels_arg: str, grid_arg: str, m: str | None,
                    extras: Sequence[Required] = ()) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """The buffers the draft's style needs, then one ``aligned`` buffer per required argument beyond them:
    ``(entry, guess per key)``, in the order they are written."""
    unit = f" * {m} ** 2" if m else ""
    rows = f"budget{unit}" if style.segmented else "budget // tokens_per_tile"
    required = [({"name": e.buffer, "arg": e.arg, "provider": "aligned", "shape": [rows], "padding": "zeros",
                  "params": {"role": e.role, "dtype": "int64"}},
                 {"shape": f"{e.arg}, a required argument of {d.encoder.__name__}.forward: a row per pixel row (or "
                           "tile)? its other dims?", "params": "the dtype the encoder reads"}) for e in extras]
    if not style.segmented:
        return [({"name": "pixel_values", "arg": pixels_arg, "provider": "pixels",
                  "shape": ["budget // tokens_per_tile", "in_channels", "image_size", "image_size"],
                  "padding": "zeros"}, {}), *required]
    row = "in_channels" + (" * temporal_patch_size" if "temporal_patch_size" in geometry else "") + " * patch_size ** 2"
    entries = [
        ({"name": "pixel_values", "arg": pixels_arg, "provider": "pixels", "shape": [f"budget{unit}", row],
          "padding": "zeros"}, {"shape": "one row of pixel values per patch"}),
        ({"name": "grid_thw", "arg": grid_arg, "provider": "grid", "shape": ["max_items + 1", 3], "padding": "zeros"}, {}),
        ({"name": "cu_seqlens", "provider": "cu_seqlens", "shape": ["max_segments + 2"],
          "padding": "trailing_segment"}, {}),
        ({"name": "max_seqlen", "provider": "max_seqlen", "value": f"budget{unit}", "padding": "fixed"}, {}),
    ]
    return entries + _helper_entries(d, style, geometry, m) + required


def _helper_entries(d: Draft, style, geometry: dict, m: str | None) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """The buffers of the metadata the encoder computes with transformers' vision helpers (positions, windows,
    interpolation) beyond a segmented style's basic ones."""
    unit = f" * {m} ** 2" if m else ""
    entries = []
    if "get_vision_position_ids" in d.helpers and m:
        entries.append(({"name": "position_ids", "provider": "position_ids", "shape": [f"budget{unit}", 2],
                         "padding": "zeros"}, {"shape": "2 (h, w) or 3 (t, h, w: params include_temporal) columns"}))
    if "window_index" in style.required_providers:
        entries += [
            ({"name": "window_index", "provider": "window_index", "shape": ["budget"], "padding": "identity"}, {}),
            ({"name": "cu_window_seqlens", "provider": "cu_window_seqlens", "shape": ["budget + 2"],
              "padding": "trailing_segment"}, {}),
            ({"name": "max_window_seqlen", "provider": "max_window_seqlen", "value": "(window_size // patch_size) ** 2",
              "padding": "fixed"}, {"value": "the largest window in patch rows"}),
        ]
    if "get_vision_interpolation_indices_and_weights" in d.helpers and "num_grid_per_side" in geometry and m:
        for name in ("interp_indices", "interp_weights"):
            entries.append(({"name": name, "provider": name, "shape": [f"budget{unit}", 4], "padding": "zeros",
                             "params": {"mode": "bilinear", "align_corners": True}},
                            {"params": "as the encoder calls the helper"}))
    return entries


def _buffer_changes(entries: list[tuple[dict[str, Any], dict[str, str]]],
                    defaults: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """What a root spec writes to get ``entries`` over its style's default buffers (merged by name): a default it
    does not need removed, only the keys that differ from a default of the same name, every other entry whole.
    ``arg`` equal to the name is left out (it is the default)."""
    by_name = {b["name"]: b for b in defaults}
    wanted = {e["name"] for e, _ in entries}
    changes = [({"name": name, "remove": True}, {}) for name in by_name if name not in wanted]
    for entry, guesses in entries:
        entry = {k: v for k, v in entry.items() if not (k == "arg" and v == entry["name"])}
        change = _buffer_change(entry, guesses, by_name.get(entry["name"]))
        if change is not None:
            changes.append(change)
    return changes


def _buffer_change(entry: dict[str, Any], guesses: dict[str, str],
                   base: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The entry a draft writes for ``entry`` over the default ``base`` of its name: the whole entry when there
    is none, only the keys that differ (with their guesses) when there is, None when nothing differs."""
    if base is None:
        return entry, guesses
    differ = {k: v for k, v in entry.items() if k != "name" and base.get(k) != v}
    if not differ:
        return None
    return {"name": entry["name"], **differ}, {k: g for k, g in guesses.items() if k in differ}


def _kept_guesses(entries: list[tuple[dict[str, Any], dict[str, str]]], changes: list) -> list[str]:
    """``name.key: guess`` of the guesses on default values the draft keeps (not written, still to verify)."""
    written = {(e["name"], k) for e, _ in changes for k in e}
    return [f"{e['name']}.{k}: {g}" for e, guesses in entries for k, g in guesses.items()
            if (e["name"], k) not in written]


YAML_WORDS = frozenset({"null", "true", "false", "yes", "no", "on", "off", "y", "n", "nan", "inf"})
"""Plain words YAML reads as something other than a string."""


def _plain_scalar(value: Any) -> str:
    """A config value (a number, string, boolean or None) for :func:`_flow`: a string quoted unless it reads back
    as itself."""
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_][\w.-]*", value) and value.lower() not in YAML_WORDS
        return value if plain else json.dumps(value)
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)  # YAML 1.1 reads 1e-06 as a string: a float needs its dot (1.0e-06)
        return text if "." in text else text.replace("e", ".0e")
    return json.dumps(value) if value is None or isinstance(value, (bool, float)) else str(value)


def _formula_scalar(value: Any) -> str:
    """A formula, number or boolean for :func:`_flow`, as the spec writes it (formulas unquoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flow(value: Any, scalar: Callable[[Any], str] = _formula_scalar) -> str:
    """``value`` in YAML flow style: mappings and lists of scalars, each written by ``scalar`` (formulas as they
    are by default; :func:`_plain_scalar` for config values)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v, scalar)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v, scalar) for v in value) + "]"
    return scalar(value)


def _buffers(out: _Lines, d: Draft, style, geometry: dict, pixels_arg: str, grid_arg: str, m: str | None,
             extras: Sequence[Required] = ()) -> None:
    """``buffers``: only what differs from the style's default buffers (``vitcg validate --resolved`` shows all)."""
    call = f"{d.encoder.__name__}.forward"
    entries = _buffer_entries(d, style, geometry, pixels_arg, grid_arg, m, extras)
    changes = _buffer_changes(entries, STYLE_DEFAULTS[d.style]["buffers"])
    for kept in _kept_guesses(entries, changes):
        out.add(f"# buffers: {kept.split(':', 1)[0]} is the {d.style} style's default", kept.split(": ", 1)[1])
    if not changes:
        out.add(f"# buffers: the {d.style} style's defaults", f"the graph inputs {d.style} attention needs; check "
                f"them against {call} (vitcg validate --resolved FILE shows them)")
        return
    out.add("buffers:", f"the graph inputs {d.style} attention needs beyond or instead of the style's defaults "
            f"(vitcg validate --resolved FILE shows all); shapes, padding and params against {call}")
    for entry, guesses in changes:
        keys = list(entry)
        if len(keys) <= 3 and not guesses:
            out.add(f"  - {_flow(entry)}")
            continue
        for i, key in enumerate(keys):
            out.add(f"  {'- ' if i == 0 else '  '}{key}: {_flow(entry[key])}", guesses.get(key))


def schema_reference(path: str | os.PathLike | None) -> str:
    """The ``$schema`` path a draft written to ``path`` gives editors: vitcg's schema.json, relative to the
    draft inside the project that holds the vitcg package (a checkout: ``../lang/schema.json`` from
    ``vitcg/specs/``), absolute elsewhere (an installed vitcg's schema lies in site-packages); for stdout
    (None) as for ``vitcg new``'s default output, a file in the working folder."""
    schema = Path(__file__).resolve().parents[2] / "lang" / "schema.json"
    folder = Path(path).resolve().parent if path is not None else Path.cwd().resolve()
    project = schema.parents[2]
    if folder.is_relative_to(project):
        return Path(os.path.relpath(schema, folder)).as_posix()
    return schema.as_posix()


def checked_draft(model_type: str, path: str | os.PathLike | None = None) -> tuple[str, int]:
    """The draft of ``model_type`` to be written to ``path`` (None: stdout), and how many guesses it marks.

    The draft is validated before it is returned, so ``vitcg new`` never writes a spec ``vitcg validate``
    refuses. Raises UsageError when the model type cannot be drafted, SpecError (naming the model type, with
    every diagnostic) if the draft does not validate: a bug of this module for that model type. What transformers
    and torch warn meanwhile (config defaults, model code) goes to this module's log at debug level, not stderr.
    """
    from ..quiet import kept_warnings

    shown = str(path) if path is not None else None
    with kept_warnings() as kept:  # config defaults and model code warn as they are read: not the user's concern
        lines = _rendered(model_type, shown, path)
        problem = _invalid(lines, model_type, shown, path)
        if problem is not None and "\nextends: " in lines.text():  # the family's spec does not fit: draft it whole
            lines = _rendered(model_type, shown, path, family=False)
            problem = _invalid(lines, model_type, shown, path)
    for line in kept.lines():
        log.debug("while drafting %s: %s", model_type, line)
    if problem is not None:
        raise VitcgError(f"the draft of {model_type!r} does not validate, so nothing was written (a bug of "
                         f"vitcg new: please report it, and write the spec by hand meanwhile):\n{problem}")
    return lines.text(), lines.guesses


def _rendered(model_type: str, shown: str | None, path: str | os.PathLike | None, family: bool = True) -> _Lines:
    """The draft's lines; model code that fails while drafting is a VitcgError naming the model type."""
    try:
        return render(draft(model_type), shown, schema_reference(path), family=family)
    except VitcgError:
        raise
    except Exception as exc:  # noqa: BLE001 - model code of any transformers release; say so, never a traceback
        raise VitcgError(f"cannot draft {model_type!r}: {type(exc).__name__}: {exc}; write the spec by hand "
                         "(docs/writing-specs.md)") from None


def _invalid(lines: _Lines, model_type: str, shown: str | None, path: str | os.PathLike | None = None) -> Exception | None:
    """The SpecError the draft gets from validation as the file at ``path`` (its parent looked up beside it first,
    as it will be: a spec beside it that extends it back is a cycle), or None when it validates."""
    from ...errors import SpecError
    from ...lang import Bindings, spec_from_text

    try:
        spec_from_text(lines.text(), shown or f"<draft of {model_type}>", Bindings(), at=path)
    except SpecError as exc:
        return exc
    return None
