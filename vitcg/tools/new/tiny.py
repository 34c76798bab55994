"""The tiny config of a draft (``tests.tiny_config``): small widths, two layers, the indexed layers kept, and the
same for the sub-configs that build the tower (a ``backbone_config``).

A tiny config that shrinks nothing leaves ``vitcg check`` a full-size tower on a CPU: the sweep of 2026-11-29 timed
out on eight raw drafts and ran one out of memory (21 GiB), every one a config whose depth has another name
(Inkling's ``n_layers``, Florence-2's per-stage ``depths``) or lies in a sub-config (ZoeDepth's, SAM 3's and
DepthAnything-like heads' ``backbone_config``). Each value is kept only where the config still builds with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

TINY = {"depth": 2, "num_hidden_layers": 2, "hidden_size": 64, "embed_dim": 64, "num_heads": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96, "out_hidden_size": 48,
        "num_position_embeddings": 64}
"""Small values for the vision config fields a tiny CPU check shrinks, when the config has them."""
TINY_DEPTH = TINY["num_hidden_layers"]
WIDTHS = ("hidden_size", "embed_dim", "num_heads", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "out_hidden_size")
""":data:`TINY`'s widths (the rest are depths and position tables)."""
DEPTH_ALIASES = re.compile(r"(n|num)_(\w+_)?layers|(encoder|vision)_layers")
"""Other names of a layer count (``n_layers``, ``num_spatial_layers``, ``encoder_layers``): shrunk to
:data:`TINY_DEPTH` where larger."""
STAGE_DEPTHS = ("depths", "depth")
"""Lists of layers per stage (Swin, ConvNeXt, Florence-2's DaViT, CvT): one layer a stage."""
NOT_TOWER = re.compile(r".*(text|audio|decoder).*")
"""Sub-configs that build no part of the vision tower (a language model, a detection decoder)."""
LAYER_INDEXES = ("deepstack_visual_indexes", "fullatt_block_indexes", "global_attn_indexes",
                 "intermediate_layers_indices", "out_indices")
"""Fields of layer indexes a tiny config moves with its depth (kept with the :data:`TINY` fields they follow)."""
IGNORED = frozenset({"transformers_version", "_name_or_path", "architectures"})
"""Keys of a sub-config's ``to_dict()`` that say nothing about the model built from it."""


def positive_int(value: Any) -> bool:
    """Whether ``value`` is an integer above 0 (a bool is none)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _builds(config: type, values: dict[str, Any], key: str | None = None) -> bool:
    """Whether ``config(**values)`` builds (and, given ``key``, keeps the value passed for it: a field the config
    derives from others, as Swin's layer count from its ``depths``, is no field to shrink)."""
    try:
        built = config(**values)
    except Exception:  # noqa: BLE001 - config code of any release: any failure means it does not build so
        return False
    return key is None or getattr(built, key, None) == values[key]


def positive_ints(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of integers above 0."""
    return isinstance(value, list) and bool(value) and all(positive_int(v) for v in value)


def _stages(defaults: dict[str, Any]) -> dict[str, list[int]]:
    """The per-stage layer counts of ``defaults`` (:data:`STAGE_DEPTHS`)."""
    return {key: defaults[key] for key in STAGE_DEPTHS if positive_ints(defaults.get(key))}


def _with_aliases(config: type, defaults: dict[str, Any], stage_count: int) -> dict[str, Any]:
    """``defaults`` with each layer count the config class stores under another name (Inkling's
    ``num_hidden_layers`` in ``n_layers``: its ``attribute_map``) readable under the mapped name too; a count of
    stages is none (Swin's ``num_layers``)."""
    mapped = getattr(config, "attribute_map", None)
    aliases = mapped.items() if isinstance(mapped, dict) else ()
    return {**defaults, **{alias: defaults[name] for alias, name in aliases
                           if name in defaults and name not in TINY and DEPTH_ALIASES.fullmatch(name)
                           and defaults[name] != stage_count}}


def _deeper(key: str, value: Any, stage_count: int) -> bool:
    """Whether field ``key`` is a layer count (:data:`DEPTH_ALIASES`) past the tiny depth, not a stage count."""
    return bool(DEPTH_ALIASES.fullmatch(key)) and positive_int(value) and value > TINY_DEPTH and value != stage_count


def _candidates(config: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The small values to try for the fields of ``defaults``, in order: :data:`TINY`'s, the other layer counts,
    one layer per stage."""
    stages = _stages(defaults)
    stage_count = len(next(iter(stages.values()), ()))
    defaults = _with_aliases(config, defaults, stage_count)
    found = {key: value for key, value in TINY.items() if positive_int(defaults.get(key)) and key not in stages}
    found |= {key: TINY_DEPTH for key, value in defaults.items() if key not in found and _deeper(key, value, stage_count)}
    found |= {key: [1] * len(value) for key, value in stages.items() if max(value) > 1}
    return found


def tiny_fields(config: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The small values of :func:`_candidates` that ``config`` accepts: each one kept only if the config still
    builds with it (a field may be derived, or tied to others: per-layer settings indexed by layer), then the
    layer indexes moved inside the tiny depth (:func:`tiny_layer_indexes`)."""
    from ...lang.bindings import unknown_config_keys

    tiny: dict[str, Any] = {}
    for key, value in _candidates(config, defaults).items():
        if not unknown_config_keys(config, {key: value}) and _builds(config, {**tiny, key: value}, key):
            tiny[key] = value
    return tiny_layer_indexes(config, defaults, _tiny_outputs(config, defaults, tiny))


def _tiny_outputs(config: type, defaults: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    """``tiny`` where a backbone returns the feature maps of ``out_indices`` layers: one tiny layer per feature
    map, each returned (ZoeDepth's BEiT returns layers 6, 12, 18 and 24 of 24 to a neck that expects four maps;
    the tiny one returns layers 1 to 4 of 4). Unchanged where the defaults name no layer past the tiny depth, or
    the config derives the same from the tiny depth already (DINOv2's last layer)."""
    from ...lang.rules.bindings import TOWER_DEPTH_FIELDS

    indexes = defaults.get("out_indices")
    field = next((k for k in TOWER_DEPTH_FIELDS if positive_int(tiny.get(k))), None)
    if field is None or not positive_ints(indexes) or max(indexes) <= tiny[field]:
        return tiny
    depth = max(tiny[field], len(indexes))
    changed = {**tiny, field: depth, "out_indices": list(range(depth - len(indexes) + 1, depth + 1))}
    if not _builds(config, changed, "out_indices") or _derived(config, tiny, changed["out_indices"]):
        return tiny
    return changed


def _derived(config: type, tiny: dict[str, Any], indexes: list[int]) -> bool:
    """Whether ``config(**tiny)`` has these ``out_indices`` without being told."""
    try:
        return list(getattr(config(**tiny), "out_indices", None) or ()) == indexes
    except Exception:  # noqa: BLE001
        return False


def tiny_layer_indexes(config: type, defaults: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    """``tiny`` with each layer-index list of the defaults that names a layer past the tiny depth (deepstack,
    full-attention, global-attention, intermediate layers) set to the tiny tower's last layer: the tiny checks
    then run both the plain layers and the indexed path (``vitcg validate`` refuses a tiny config that skips it)."""
    from ...lang.rules.bindings import LAYER_INDEX_FIELDS, TOWER_DEPTH_FIELDS

    depth = next((v for k in TOWER_DEPTH_FIELDS if positive_int(v := tiny.get(k, defaults.get(k)))), None)
    for key in LAYER_INDEX_FIELDS:
        indexes = defaults.get(key)
        if depth is None or not isinstance(indexes, list) or all(isinstance(i, int) and i < depth for i in indexes):
            continue
        if _builds(config, {**tiny, key: [depth - 1]}):  # else leave it: validate names the field to fix
            tiny[key] = [depth - 1]
    return tiny


def tiny_config(config: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """``tests.tiny_config`` of a draft whose vision config is ``config`` (``defaults``: its ``to_dict()``): the
    config's own small fields (:func:`tiny_fields`), and a mapping of small fields for each sub-config that builds
    part of the tower (:func:`_tiny_sub_config`)."""
    tiny = tiny_fields(config, defaults)
    for key, value in defaults.items():
        if isinstance(value, dict) and "model_type" in value and not NOT_TOWER.fullmatch(key):
            nested = _tiny_sub_config(config, tiny, key)
            if nested:
                tiny[key] = nested
    return tiny


def _tiny_sub_config(config: type, tiny: dict[str, Any], key: str) -> dict[str, Any] | None:
    """What ``tests.tiny_config.KEY`` writes to shrink the sub-config ``key`` of ``config``: its model type, the
    fields the parent's default sets beyond the sub-config class's own defaults (ZoeDepth's BEiT:
    ``image_size: 384``), and its small fields; None where it shrinks nothing or the parent does not build with
    it (the sub-config then keeps its default)."""
    try:
        sub = getattr(config(**tiny), key)
        small = tiny_fields(type(sub), sub.to_dict())
        nested = _nested(type(sub), sub.to_dict(), small) if small else None
        built = getattr(config(**tiny, **{key: nested}), key).to_dict() if nested else {}
    except Exception:  # noqa: BLE001 - config code of any release: the sub-config keeps its default
        return None
    return nested if nested and all(built.get(k) == v for k, v in small.items()) else None


def _nested(sub: type, defaults: dict[str, Any], small: dict[str, Any]) -> dict[str, Any]:
    """The mapping that builds the sub-config class ``sub`` as ``defaults`` with ``small`` over it: the model type,
    the fields that differ from the class's own defaults, except those derived from the small ones (a backbone's
    ``stage_names``: the parent's values would contradict them), then ``small``. Raises what the class raises."""
    plain = sub().to_dict()
    derived = {k for k, v in sub(**small).to_dict().items() if plain.get(k) != v}
    own = {k: v for k, v in defaults.items()
           if k not in IGNORED and k not in small and k not in derived and plain.get(k, v) != v}
    return {**({"model_type": defaults["model_type"]} if "model_type" in defaults else {}), **own, **small}


def fitting(config: type, defaults: dict[str, Any], runs: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """:func:`tiny_config`, unless the tower it builds does not run (``runs``: a call on the meta device) where the
    default one does; then the first that runs of: the sub-configs' depths alone (:func:`_shallow`), no sub-config,
    the depths alone, the :data:`TINY` fields alone, nothing. Shrinking parts apart can break what joins them:
    DPT's neck takes the backbone's default width (DepthAnything), CvT indexes a per-stage list past a stage of one
    layer, SAM 2's Hiera keeps per-stage widths beside its hidden_size, Swin's head counts do not divide 64."""
    whole = tiny_config(config, defaults)
    if runs(whole) or not runs({}):
        return whole
    return next((t for t in _fallbacks(whole) if t and t != whole and runs(t)), {})


def _fallbacks(whole: dict[str, Any]) -> list[dict[str, Any]]:
    """The smaller tiny configs :func:`fitting` tries after ``whole``, in order."""
    own = {k: v for k, v in whole.items() if not isinstance(v, dict)}
    deep = {k: v for k, v in own.items() if k not in WIDTHS}  # Swin: embed_dim 64 fits no head count of 3
    plain = {k: v for k, v in own.items() if k in TINY or k in LAYER_INDEXES}
    return [_shallow(whole), own, deep, plain]


def _shallow(tiny: dict[str, Any]) -> dict[str, Any]:
    """``tiny`` with each sub-config's widths left at its default (its depths still small); a sub-config left with
    no small field is left out."""
    shallow = {}
    for key, value in tiny.items():
        if isinstance(value, dict):
            value = {f: x for f, x in value.items() if f not in WIDTHS}
            if not any(_small_field(f) for f in value):
                continue
        shallow[key] = value
    return shallow


def _small_field(name: str) -> bool:
    return name in TINY or name in STAGE_DEPTHS or name in LAYER_INDEXES or bool(DEPTH_ALIASES.fullmatch(name))
