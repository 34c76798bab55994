"""Modality and eager-call rules: the input roles each modality names, their keys, frames, and the encoder args."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...errors import Diagnostic, suggest
from .. import catalogue as cat
from ..loader import LoadedYaml
from ..model import Modality
from .common import error


def _roles(style: cat.AttentionStyle) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard roles a modality of ``style`` must name, and those it may name."""
    if style.count_required:
        return style.roles, ()
    return ("pixels",), (style.count_role,)


def modality_roles_present(loaded: LoadedYaml, name: str, entry: Mapping[str, Any],
                           style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """The modality names every input role its style requires."""
    required, optional = _roles(style)
    for role in required:
        if role not in entry["inputs"]:
            yield error(loaded, ("modalities", name, "inputs"), f"{style.name} style needs input role {role!r}",
                        hint=f"a {style.name} modality names: {', '.join([*required, *optional])}")


def modality_roles_apply(loaded: LoadedYaml, name: str, entry: Mapping[str, Any],
                         style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """Each standard input role the modality names is one its style uses."""
    required, optional = _roles(style)
    allowed = [*required, *optional]
    for role in entry["inputs"]:
        if role in cat.STANDARD_ROLES and role not in allowed:
            yield error(loaded, ("modalities", name, "inputs", role),
                        f"input role {role!r} does not apply to {style.name} style",
                        hint=f"a {style.name} modality names: {', '.join(allowed)}", key=True)


def input_keys_unique(loaded: LoadedYaml, modalities: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """No two input roles, in one modality or across them, read the same key of the multimodal kwargs."""
    seen: dict[str, str] = {}
    for name, entry in modalities.items():
        for role, key in entry["inputs"].items():
            if key in seen:
                yield error(loaded, ("modalities", name, "inputs", role),
                            f"input key {key!r} is already used by {seen[key]}")
            seen[key] = f"{name}.{role}"


def frames_per_video(loaded: LoadedYaml, name: str, entry: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """Video gives ``max_frames_per_video``; an image, which has one frame, does not."""
    frames = entry.get("max_frames_per_video")
    if name == "image" and frames is not None:
        yield error(loaded, ("modalities", name, "max_frames_per_video"),
                    "images have one frame; max_frames_per_video applies to video only", key=True)
    if name == "video" and frames is None:
        yield error(loaded, ("modalities", name), "video needs 'max_frames_per_video'",
                    hint="the largest frame count of one video item (grid t, or tiles)")


def grid_options_apply(loaded: LoadedYaml, name: str, entry: Mapping[str, Any],
                       style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """``grid_columns`` and ``split`` shape a grid: only a modality whose style reads one uses them."""
    for key in ("grid_columns", "split"):
        if key in entry and not style.segmented:
            yield error(loaded, ("modalities", name, key), f"{key!r} shapes a grid, and {style.name} style has "
                        f"none", hint="packed and windowed modalities name a grid input", key=True)


def split_needs_frames(loaded: LoadedYaml, name: str, entry: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """``split: frames`` cuts a row into its frames, so the grid must have a t column."""
    columns = entry.get("grid_columns", cat.GRID_COLUMNS)
    if entry.get("split") == "frames" and "t" not in columns:
        yield error(loaded, ("modalities", name, "split"),
                    f"split: frames cuts each row into its t frames, but grid_columns {list(columns)} has no t",
                    hint="drop split (an (h, w) grid has one frame per row) or declare grid_columns [t, h, w]")


def separate_needs_another(loaded: LoadedYaml, modalities: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """``separate`` keeps a modality's items apart from another modality's: the spec must have another."""
    for name, entry in modalities.items():
        if entry.get("separate") and len(modalities) < 2:
            yield error(loaded, ("modalities", name, "separate"),
                        f"separate keeps {name} items apart from another modality's, but the spec has no other "
                        "modality", hint="remove separate", key=True)


def grid_columns_agree(loaded: LoadedYaml, modalities: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Every modality gives its grid in the same columns: one grid buffer feeds the encoder for all of them."""
    columns = {name: list(entry.get("grid_columns", cat.GRID_COLUMNS)) for name, entry in modalities.items()
               if "grid" in entry["inputs"]}
    if len({tuple(v) for v in columns.values()}) > 1:
        last = list(columns)[-1]
        yield error(loaded, ("modalities", last, "grid_columns") if "grid_columns" in modalities[last]
                    else ("modalities", last),
                    "every modality must give its grid in the same columns (one grid buffer feeds the encoder), "
                    "got " + "; ".join(f"{k}: {v}" for k, v in columns.items()))


def extra_roles_agree(loaded: LoadedYaml, modalities: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Every modality names the same extra (non-standard) input roles."""
    extras = {name: sorted(r for r in entry["inputs"] if r not in cat.STANDARD_ROLES)
              for name, entry in modalities.items()}
    if len({tuple(v) for v in extras.values()}) > 1:
        yield error(loaded, ("modalities",), "every modality must name the same extra input roles, got "
                    + "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in extras.items()))


def encoder_args_are_roles(loaded: LoadedYaml, args: Mapping[str, str],
                           modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """Each argument of the eager call passes an input role some modality names."""
    roles = sorted({role for m in modalities for role in m.inputs})
    for arg, role in args.items():
        if role not in roles:
            yield error(loaded, ("encoder", "args", arg), f"input role {role!r} is not an input of the modalities",
                        hint=suggest(role, roles) or f"roles: {', '.join(roles)}")


def eager_call_passes_pixels(loaded: LoadedYaml, args: Mapping[str, str]) -> Iterator[Diagnostic]:
    """The eager call passes the ``pixels`` role."""
    if "pixels" not in args.values():
        yield error(loaded, ("encoder", "args"), "the eager call must pass the 'pixels' role",
                    hint="e.g. args: {hidden_states: pixels, grid_thw: grid}")


def valid_role_is_extra(loaded: LoadedYaml, valid: Mapping[str, Any],
                        modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """``items.valid.role`` is an extra input role every modality names (counting needs its data)."""
    role = valid["role"]
    if role in cat.STANDARD_ROLES:
        yield error(loaded, ("items", "valid", "role"),
                    f"{role!r} is a standard input role; items.valid reads an extra role that marks padding",
                    hint="e.g. the role of a patch mask or of patch positions")
        return
    if any(role in m.per_item for m in modalities):
        yield error(loaded, ("items", "valid", "role"),
                    f"{role!r} is a per_item role (one value per item); items.valid counts the padding patches of "
                    "a role aligned with the pixel rows")
        return
    lacking = [m.name for m in modalities if role not in m.inputs]
    if lacking:
        extras = sorted({r for m in modalities for r in m.extra_roles})
        yield error(loaded, ("items", "valid", "role"),
                    f"items.valid reads input role {role!r}, which modality {lacking[0]} does not name",
                    hint=suggest(role, extras) or (f"extra roles: {', '.join(extras)}" if extras
                                                   else f"add it to modalities.{lacking[0]}.inputs"))


def per_item_roles_apply(loaded: LoadedYaml, name: str, entry: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """Each ``per_item`` role is an extra input role of the modality, and a modality that splits its rows by
    frames has none (the encoder would see more grid rows than item values)."""
    extras = [r for r in entry["inputs"] if r not in cat.STANDARD_ROLES]
    for role in entry.get("per_item", {}):
        if role in cat.STANDARD_ROLES:
            yield error(loaded, ("modalities", name, "per_item", role),
                        f"{role!r} is a standard input role; per_item names extra roles aligned with the items",
                        key=True)
        elif role not in extras:
            yield error(loaded, ("modalities", name, "per_item", role),
                        f"per_item role {role!r} is not an input of modality {name}", key=True,
                        hint=suggest(role, extras) or f"add it to modalities.{name}.inputs")
    if entry.get("per_item") and entry.get("split"):
        yield error(loaded, ("modalities", name, "split"),
                    "split: frames gives the encoder one grid row per frame, but per_item inputs hold one value "
                    "per item", hint="drop split, or pass the role aligned with the pixel rows")


def per_item_roles_agree(loaded: LoadedYaml, modalities: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Every modality names the same ``per_item`` roles: items formulas, shared by all, read them."""
    roles = {name: sorted(entry.get("per_item", {})) for name, entry in modalities.items()}
    if len({tuple(v) for v in roles.values()}) > 1:
        last = list(roles)[-1]
        yield error(loaded, ("modalities", last, "per_item") if "per_item" in modalities[last]
                    else ("modalities", last),
                    "every modality must name the same per_item roles, got "
                    + "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in roles.items()))
