"""Rules on the ``tests`` section: example inputs for ``vitcg check``, placeholders, prompt, shaping of items."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ...errors import Diagnostic, FormulaError, suggest
from .. import catalogue as cat
from ..formulas import Formula, parse
from ..loader import LoadedYaml
from ..model import Modality
from .common import error, parse_at


def example_roles(modalities: Sequence[Modality]) -> list[str]:
    """The input roles ``tests.inputs`` may describe: pixels and the extra roles aligned with the pixel rows (not
    grid or tiles, nor ``per_item`` roles: check feeds their ``per_item`` values)."""
    return sorted({role for m in modalities for role in m.inputs
                   if role not in cat.STANDARD_ROLES[1:] and role not in m.per_item})


def example_roles_exist(loaded: LoadedYaml, tests: Mapping[str, Any],
                        modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """Each role ``tests.inputs`` describes is pixels or an extra input role of the modalities."""
    roles = example_roles(modalities)
    for role in tests.get("inputs", {}):
        if any(role in m.per_item for m in modalities):
            yield error(loaded, ("tests", "inputs", role), f"{role!r} is a per_item role; vitcg check feeds each "
                        "item its per_item value", key=True, hint=f"remove tests.inputs.{role}")
        elif role not in roles:
            yield error(loaded, ("tests", "inputs", role), f"{role!r} is not an input role of the modalities",
                        key=True, hint=suggest(role, roles) or f"roles: {', '.join(roles)}")


def examples_cover_roles(loaded: LoadedYaml, tests: Mapping[str, Any], modalities: Sequence[Modality],
                         scoped: bool) -> Iterator[Diagnostic]:
    """``tests.inputs`` describes every extra input role, and pixels too with graph_scope."""
    given = tests.get("inputs", {})
    for role in example_roles(modalities):
        if (role != "pixels" or scoped) and role not in given:
            yield error(loaded, ("tests",), f"tests.inputs must say how to build input role {role!r} for vitcg check",
                        hint="e.g. inputs: {" + role + ": {shape: [max_patches], fill: ones, dtype: bool}}")


def vlm_videos_need_video(loaded: LoadedYaml, tests: Mapping[str, Any],
                          modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """The end-to-end stage feeds videos (``tests.vlm.video_placeholder``) only to a spec with a packed video
    modality: its videos are frames of the image processor, packed on a (t, h, w) grid."""
    vlm = tests.get("vlm") or {}
    if "video_placeholder" not in vlm:
        return
    video = next((m for m in modalities if m.name == "video"), None)
    if video is None:
        yield error(loaded, ("tests", "vlm", "video_placeholder"), "the spec has no video modality", key=True)
    elif "grid" not in video.inputs or "t" not in video.grid_columns:
        yield error(loaded, ("tests", "vlm", "video_placeholder"),
                    "the end-to-end stage composes videos on a (t, h, w) grid; this video modality has none",
                    key=True)


def video_placeholder_matches(loaded: LoadedYaml, tests: Mapping[str, Any],
                              modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """``tests.video_placeholder`` is given exactly when the spec has a video modality."""
    has_video = any(m.name == "video" for m in modalities)
    if has_video and "video_placeholder" not in tests:
        yield error(loaded, ("tests",), "a spec with video needs 'video_placeholder'")
    if not has_video and "video_placeholder" in tests:
        yield error(loaded, ("tests", "video_placeholder"), "the spec has no video modality", key=True)


def prompt_has_question(loaded: LoadedYaml, tests: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """``tests.prompt_template`` has a ``{question}`` field."""
    if "{question}" not in tests["prompt_template"]:
        yield error(loaded, ("tests", "prompt_template"), "prompt_template needs a {question} field")


def shaping_modalities_exist(loaded: LoadedYaml, shaping: Mapping[str, Any],
                             modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """Each modality ``tests.shaping`` names is a modality of the spec."""
    present = {m.name for m in modalities}
    for name in shaping:
        if name not in present:
            yield error(loaded, ("tests", "shaping", name), f"the spec has no {name} modality", key=True)


def shaping_item_names(loaded: LoadedYaml, shaping: Mapping[str, Any], style: cat.AttentionStyle,
                       modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """Each key of a modality's ``tests.shaping`` is an item name of the attention style."""
    for m in modalities:
        for key in shaping.get(m.name, {}):
            if key not in style.item_names:
                yield error(loaded, ("tests", "shaping", m.name, key),
                            f"a {style.name} item is {', '.join(style.item_names)}, not {key!r}",
                            key=True, hint=suggest(key, style.item_names))


def shaping_formulas(loaded: LoadedYaml, style: cat.AttentionStyle, modalities: Sequence[Modality],
                     geometry: Sequence[str]) -> tuple[MappingProxyType, list[Diagnostic]]:
    """Each item formula of tests.shaping, else the style's default, parses over the item's size and geometry names."""
    given = loaded.data["tests"].get("shaping", {})
    problems: list[Diagnostic] = []
    out = {}
    for m in modalities:
        vocab = [*cat.SHAPING_NAMES[m.name], *geometry]
        formulas: dict[str, Formula | None] = {}
        for key in style.item_names:
            if key in given.get(m.name, {}):
                formulas[key], found = parse_at(loaded, ("tests", "shaping", m.name, key), vocab)
                problems.extend(found)
                continue
            source = style.shaping[m.name][key]
            try:
                formulas[key] = parse(source, vocab)
            except FormulaError as exc:
                problems.append(error(loaded, ("tests",), f"the {style.name} style's default shaping of a {m.name} "
                                      f"({key}: {source}) fails: {exc.message}",
                                      hint=f"define it in geometry, or give tests.shaping.{m.name}.{key}"))
        out[m.name] = MappingProxyType(formulas)
    return MappingProxyType(out), problems
