"""Schema and semantic checks: loaded YAML in, a typed :class:`Spec` or every diagnostic out.

Order: JSON Schema (structure) -> formulas parse against each field's vocabulary -> cross-field rules
(roles, providers, padding) -> bindings (import paths, config defaults, tiny and real configs).
A later stage runs only when the earlier ones found nothing, so each message is about a real cause.
The checks are the rule functions of :mod:`.rules`; this module runs them in order and builds the typed
objects from the entries they looked at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeVar

from ..errors import Diagnostic
from . import catalogue as cat
from .bindings import MISSING, Bindings, release, transformers_version
from .formulas import Formula, parse
from .harness import ExampleInput, Placeholder, TestMeta, VlmTest
from .loader import LoadedYaml, Path_
from .model import Buffer, Docs, Encoder, LayerArgs, Modality, Replace, Spec, ValidRows, freeze
from .rules import bindings as bind
from .rules import buffers as buf
from .rules import geometry as geo
from .rules import modalities as mod
from .rules import tests as tst
from .rules.common import parse_at
from .rules.schema import schema, schema_diagnostics

__all__ = ["check", "schema", "schema_diagnostics"]

T = TypeVar("T")


class _Found:
    """The diagnostics of one file so far, as the rules report them."""

    def __init__(self, loaded: LoadedYaml):
        self.loaded = loaded
        self.diagnostics: list[Diagnostic] = []

    def add(self, found: Iterable[Diagnostic]) -> None:
        self.diagnostics.extend(found)

    def take(self, result: tuple[T, list[Diagnostic]]) -> T:
        """The value of a rule that also builds something; its diagnostics are kept."""
        value, found = result
        self.diagnostics.extend(found)
        return value

    def formula(self, path: Path_, vocabulary: Iterable[str], *, allow_config: bool = False) -> Formula | None:
        return self.take(parse_at(self.loaded, path, vocabulary, allow_config=allow_config))


def check(loaded: LoadedYaml, bindings: Bindings | None) -> tuple[Spec | None, list[Diagnostic]]:
    """Check one loaded file: its :class:`Spec` when nothing is wrong, and every diagnostic in file order.

    ``bindings=None`` skips the checks that import transformers classes and build their configs.
    """
    problems = schema_diagnostics(loaded)
    if problems:
        return None, problems
    found = _Found(loaded)
    spec = _spec(loaded, found)
    if spec is not None and spec.transformers is not None:
        installed = transformers_version()
        if installed != MISSING and release(installed) < release(spec.transformers):
            # its classes may be missing here: the bindings are not checked, and check skips the spec
            spec = replace(spec, unavailable=f"unavailable in transformers {installed} (the spec needs "
                                             f">= {spec.transformers})")
    if spec is not None and spec.unavailable is None and bindings is not None:
        _bind(loaded, found, spec, bindings)
    return (None if found.diagnostics else spec), sorted(found.diagnostics, key=lambda d: (d.line, d.col, d.path))


def _spec(loaded: LoadedYaml, found: _Found) -> Spec | None:
    data = loaded.data
    style = cat.STYLES[data["attention"]["style"]]
    geometry = found.take(geo.parse_geometry(loaded))
    names = list(data["geometry"])  # every declared name, so one bad entry does not cascade
    found.add(geo.geometry_defines_required(loaded))
    found.add(geo.geometry_defines_style_names(loaded, style))
    found.add(geo.segments_apply(loaded, style))
    segments = data["attention"].get("segments")
    segments = segments if segments in style.segments else style.segments[0]
    modalities = _modalities(loaded, found, style, names)
    item_vocab = [*style.item_names, *names, *dict.fromkeys(r for m in modalities for r in m.item_roles)]
    valid = _valid(loaded, found, modalities, item_vocab)
    input_size = found.formula(("items", "input_size"), item_vocab)
    output_tokens = found.formula(("items", "output_tokens"), [*item_vocab, *(["valid"] if valid else [])])
    if output_tokens is None and valid is None and found.diagnostics[-1].message == "unknown name 'valid'":
        found.diagnostics[-1] = replace(found.diagnostics[-1], hint="declare items.valid: {role, padding, full}")
    frames = (found.formula(("items", "frames"), item_vocab) if "frames" in data["items"]
              else parse(style.item_names[0], item_vocab))
    budget_vocab = [*cat.LIMIT_NAMES, *names]
    budget_min = found.formula(("budget", "min"), budget_vocab)
    budget_max = found.formula(("budget", "max"), budget_vocab)
    encoder = _encoder(loaded, found, modalities)
    scope = data.get("graph_scope")
    found.add(buf.epilogue_whole_encoder(loaded, scope is not None))
    found.add(buf.replace_whole_encoder(loaded, scope is not None))
    buffers = _buffers(loaded, found, style, names, encoder, modalities, scope is not None)
    found.add(buf.layer_args_whole_encoder(loaded, scope is not None))
    found.add(buf.layer_args_name_host_buffers(loaded, buffers))
    tests = _tests(loaded, found, style, modalities, names, scope is not None)
    if found.diagnostics:
        return None
    return Spec(
        file=loaded.file,
        graph_scope=scope["module"] if scope else None,
        epilogue=data["epilogue"]["select"] if "epilogue" in data else None,
        replace=_replace(data, buffers),
        layer_args=_layer_args(data.get("layer_args")),
        valid=valid,
        transformers=data.get("transformers"),
        name=data["name"],
        display_name=data["display_name"],
        architectures=tuple(data["architectures"]),
        model_types=tuple(data["model_types"]),
        checkpoints=tuple(data["checkpoints"]),
        encoder=encoder,
        geometry=tuple(geometry),
        style=style.name,
        segments=segments,
        modalities=tuple(modalities),
        input_size=input_size,
        output_tokens=output_tokens,
        frames=frames,
        budget_min=budget_min,
        budget_max=budget_max,
        buffers=tuple(buffers),
        docs=Docs(data["docs"]["notes"], tuple(data["docs"].get("shared_by", ()))),
        tests=tests,
    )


def _replace(data: Mapping[str, Any], buffers: Sequence[Buffer]) -> tuple[Replace, ...]:
    """``replace``, each entry with the argument of the buffer its form reads (the rules made sure it exists)."""
    argument = {b.provider: b.arg for b in buffers}
    return tuple(Replace(item["module"], item["with"], argument[cat.REPLACEMENTS[item["with"]].provider])
                 for item in data.get("replace", ()))


def _layer_args(entry: dict | None) -> LayerArgs | None:
    if entry is None:
        return None
    return LayerArgs(entry["module"], entry["types"], freeze(entry["by_type"]))


def _valid(loaded: LoadedYaml, found: _Found, modalities: Sequence[Modality],
           item_vocab: Sequence[str]) -> ValidRows | None:
    """``items.valid``: its role must be an extra role of every modality; ``full`` reads item names and geometry."""
    entry = loaded.data["items"].get("valid")
    if entry is None:
        return None
    found.add(mod.valid_role_is_extra(loaded, entry, modalities))
    full = found.formula(("items", "valid", "full"), item_vocab)
    return ValidRows(entry["role"], entry["padding"], full) if full is not None else None


def _modalities(loaded: LoadedYaml, found: _Found, style: cat.AttentionStyle,
                geometry: list[str]) -> list[Modality]:
    entries = loaded.data["modalities"]
    out = []
    for name, entry in entries.items():
        found.add(mod.modality_roles_present(loaded, name, entry, style))
        found.add(mod.modality_roles_apply(loaded, name, entry, style))
        found.add(mod.frames_per_video(loaded, name, entry))
        found.add(mod.grid_options_apply(loaded, name, entry, style))
        found.add(mod.split_needs_frames(loaded, name, entry))
        found.add(mod.per_item_roles_apply(loaded, name, entry))
        per_item = {role: found.formula(("modalities", name, "per_item", role), geometry)
                    for role in entry.get("per_item", {})}
        out.append(Modality(name, freeze(entry["inputs"]), entry.get("max_frames_per_video") or 1,
                            tuple(entry.get("grid_columns", cat.GRID_COLUMNS)), entry.get("split"),
                            MappingProxyType(per_item),
                            bool(entry.get("separate", False))))
    found.add(mod.input_keys_unique(loaded, entries))
    found.add(mod.separate_needs_another(loaded, entries))
    found.add(mod.extra_roles_agree(loaded, entries))
    found.add(mod.per_item_roles_agree(loaded, entries))
    found.add(mod.grid_columns_agree(loaded, entries))
    return out


def _encoder(loaded: LoadedYaml, found: _Found, modalities: Sequence[Modality]) -> Encoder:
    enc = loaded.data["encoder"]
    found.add(mod.encoder_args_are_roles(loaded, enc["args"], modalities))
    found.add(mod.eager_call_passes_pixels(loaded, enc["args"]))
    return Encoder(
        class_path=enc["class"],
        config_class=enc["config_class"],
        vlm_attribute=enc["vlm_attribute"],
        method=enc.get("method", "forward"),
        args=freeze(enc["args"]),
        call_kwargs=freeze(enc.get("call_kwargs", {})),
        outputs=tuple(enc["outputs"]),
    )


def _buffers(loaded: LoadedYaml, found: _Found, style: cat.AttentionStyle, geometry: list[str], encoder: Encoder,
             modalities: Sequence[Modality], scoped: bool) -> list[Buffer]:
    """The buffers whose provider applies to the spec (the others are reported, and skip the later rules)."""
    entries = loaded.data["buffers"]
    vocab = [*cat.BUFFER_NAMES, *geometry]
    found.add(buf.unique_buffers(loaded, entries))
    out: list[Buffer] = []
    for i, entry in enumerate(entries):
        found.add(buf.tuple_args_scoped(loaded, i, entry))
        inapplicable = (list(buf.provider_serves_style(loaded, i, entry, style))
                        or list(buf.provider_matches_scope(loaded, i, entry, scoped)))
        if inapplicable:
            found.add(inapplicable)
            continue
        found.add(buf.padding_allowed(loaded, i, entry))
        found.add(buf.rows_dim_in_range(loaded, i, entry))
        found.add(buf.pixels_leading_dims(loaded, i, entry))
        found.add(buf.host_or_tensor(loaded, i, entry))
        found.add(buf.absent_allowed(loaded, i, entry))
        found.add(buf.aligned_role_exists(loaded, i, entry, modalities))
        found.add(buf.params_allowed(loaded, i, entry))
        found.add(buf.provider_geometry(loaded, i, entry, geometry))
        for param in ("row_width", "below"):
            if param in entry.get("params", {}):
                found.formula(("buffers", i, "params", param), geometry)
        found.add(buf.below_needs_indices(loaded, i, entry))
        shape = value = None
        if "shape" in entry:
            shape = tuple(found.formula(("buffers", i, "shape", j), vocab) for j in range(len(entry["shape"])))
            found.add(buf.shape_not_empty(loaded, i, entry))
        else:
            value = found.formula(("buffers", i, "value"), vocab)
        out.append(Buffer(entry["name"], buf.buffer_arg(entry), entry["provider"], shape, value, entry["padding"],
                          freeze(entry.get("params", {})), entry.get("absent")))
    found.add(buf.tuple_args_complete(loaded, out))
    found.add(buf.row_wise_buffer(loaded, out))
    found.add(buf.required_providers(loaded, entries, style, scoped))
    found.add(buf.replace_reads_buffer(loaded, entries))
    found.add(buf.buffers_need_replace(loaded, entries))
    found.add(buf.eager_args_agree(loaded, entries, out, encoder.args, style))
    found.add(buf.grid_buffer_width(loaded, entries, out, modalities))
    found.add(buf.square_masks(loaded, entries, out))
    return out


def _tests(loaded: LoadedYaml, found: _Found, style: cat.AttentionStyle, modalities: Sequence[Modality],
           geometry: list[str], scoped: bool) -> TestMeta:
    t = loaded.data["tests"]
    found.add(tst.example_roles_exist(loaded, t, modalities))
    roles = tst.example_roles(modalities)
    examples = {}
    for role, entry in t.get("inputs", {}).items():
        if role not in roles:
            continue
        base = ("tests", "inputs", role)
        shape = tuple(found.formula(base + ("shape", j), geometry) for j in range(len(entry["shape"])))
        fill = entry.get("fill", "randn")
        if not isinstance(fill, str):  # `i`: the index along the row's dimension before the last
            fill = tuple(found.formula(base + ("fill", j), [*geometry, "i"]) for j in range(len(fill)))
        examples[role] = ExampleInput(shape, fill, entry.get("dtype", "model"))
    found.add(tst.examples_cover_roles(loaded, t, modalities, scoped))
    found.add(tst.video_placeholder_matches(loaded, t, modalities))
    found.add(tst.vlm_videos_need_video(loaded, t, modalities))
    found.add(tst.prompt_has_question(loaded, t))
    shaping = t.get("shaping", {})
    found.add(tst.shaping_modalities_exist(loaded, shaping, modalities))
    found.add(tst.shaping_item_names(loaded, shaping, style, modalities))
    return TestMeta(
        prompt_template=t["prompt_template"],
        image_placeholder=t["image_placeholder"],
        video_placeholder=t.get("video_placeholder"),
        num_video_frames=t.get("num_video_frames", 16),
        max_model_len=t["max_model_len"],
        needs_video_metadata=t.get("needs_video_metadata", False),
        runner_kwargs=freeze(t.get("runner_kwargs", {})),
        marks=tuple(t.get("marks", ())),
        budgets=tuple(t["budgets"]),
        tiny_config=freeze(t["tiny_config"]),
        real_config=freeze(t.get("real_config", {})),
        inputs=MappingProxyType(examples),
        shaping=found.take(tst.shaping_formulas(loaded, style, modalities, geometry)),
        vlm=_vlm(t.get("vlm")),
    )


def _vlm(entry: dict | None) -> VlmTest | None:
    if entry is None:
        return None
    placeholder = entry.get("placeholder", {"token": "image_token_id"})
    return VlmTest(config=freeze(entry.get("config", {})), processor=freeze(entry.get("processor", {})),
                   token=placeholder["token"], before=tuple(placeholder.get("before", ())),
                   after=tuple(placeholder.get("after", ())), skip=entry.get("skip"),
                   features_out_of_reach=entry.get("features", {}).get("out_of_reach"),
                   engine_keys=entry.get("engine_keys"),
                   architecture=entry.get("architecture"), processor_class=entry.get("processor_class"),
                   transformers=entry.get("transformers"), video=_placeholder(entry.get("video_placeholder")),
                   video_processor=freeze(entry.get("video_processor", {})))


def _placeholder(entry: dict | None) -> Placeholder | None:
    if entry is None:
        return None
    return Placeholder(entry["token"], tuple(entry.get("before", ())), tuple(entry.get("after", ())),
                       entry.get("per_frame", False))


def _bind(loaded: LoadedYaml, found: _Found, spec: Spec, bindings: Bindings) -> None:
    """The binding rules. A rule is skipped only when what it reads failed (the configs need their classes, the
    tiny-config and formula rules the built configs), never for an unrelated finding: a missing modality and
    deepstack indexes past the tiny depth are both reported in one run."""
    classes = list(bind.classes_bind(loaded, spec.encoder, bindings))
    found.add(classes)
    found.add(bind.architectures_exist(loaded, spec, bindings))
    found.add(bind.vlm_modalities_covered(loaded, spec, bindings))
    if classes:
        return
    found.add(bind.calls_pass_required_arguments(loaded, spec, bindings))
    snapshots, problems = bind.config_snapshots(loaded, spec, bindings)
    found.add(problems)
    if problems:
        return
    found.add(bind.tiny_layers_present(loaded, snapshots))  # vacuous tiny configs: checks that skip the code
    found.add(bind.tiny_layer_indexes_in_depth(loaded, snapshots))
    found.add(bind.tiny_feature_layers_in_depth(loaded, spec, snapshots))
    found.add(bind.layer_types_covered(loaded, spec, snapshots))
    geometry = found.take(bind.evaluate_geometry(loaded, spec, snapshots))
    if geometry is None:
        return
    found.add(bind.literal_geometry_matches_config(loaded, spec, snapshots))
    for rule in (bind.budgets_positive, bind.budget_order, bind.items_positive, bind.buffer_sizes_positive):
        found.add(rule(loaded, spec, geometry["defaults"]))
    found.add(bind.resources_bounded(loaded, spec, geometry))
    found.add(buf.capacities_hold(loaded, spec, geometry))
