"""Binding rules: the encoder's classes import, its configs build, and the formulas evaluate sensibly under them."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import Diagnostic, FormulaError, suggest
from .. import catalogue as cat
from ..bindings import Bindings
from ..loader import LoadedYaml
from ..model import Encoder, Spec, thaw
from .common import error, formula_diagnostic

TORCH_MODULE = "torch.nn.modules.module.Module"
PRETRAINED_CONFIG = "transformers.configuration_utils.PreTrainedConfig"
_LIMITS_HINT = f"with {', '.join(f'{k}={v}' for k, v in cat.DEFAULT_LIMITS.items())}"


def classes_bind(loaded: LoadedYaml, encoder: Encoder, bindings: Bindings) -> Iterator[Diagnostic]:
    """The encoder class and config class import, subclass Module / PreTrainedConfig, the class has the method,
    and the config class is (a subclass of) the one the encoder class is built from, or one of its sub-configs."""
    problems = list(_classes_import(loaded, encoder, bindings))
    if problems:  # the relation below means nothing until both classes are what they should be
        yield from problems
        return
    model, config = bindings.check_class(encoder.class_path), bindings.check_class(encoder.config_class)
    expected = model.get("config_class")
    # transformers releases before 5.22 label some vision towers with their VLM's config class although they are
    # built from its vision sub-config: a sub-config of the labelled class is accepted (vitcg check proves it)
    if expected and expected not in config["bases"] and encoder.config_class not in model.get("sub_configs", ()):
        short = encoder.class_path.rsplit(".", 1)[1]
        yield error(loaded, ("encoder", "config_class"),
                    f"{short} is built from a {expected.rsplit('.', 1)[1]}, not a "
                    f"{encoder.config_class.rsplit('.', 1)[1]}", code="binding",
                    hint=f"set config_class to {expected}, or class to the encoder that this config builds")


def calls_pass_required_arguments(loaded: LoadedYaml, spec: Spec, bindings: Bindings) -> Iterator[Diagnostic]:
    """Each parameter of the encoder's method without a default is passed by both calls: the eager one
    (``encoder.args`` and ``call_kwargs``) and, for a spec without ``graph_scope``, the captured one (every buffer
    under its ``arg`` and ``call_kwargs``). Else every case of ``vitcg check`` fails with ``forward() missing 1
    required positional argument``. Reported at the line that left it out (:func:`_missing_at`). ``vitcg new``'s
    drafts pass every such parameter, as a guessed input role and buffer where the tower needs more than pixels
    and a grid."""
    signature = bindings.check_signature(spec.encoder.class_path, spec.encoder.method)
    if not signature["ok"]:
        return
    short = f"{spec.encoder.class_path.rsplit('.', 1)[1]}.{spec.encoder.method}()"
    constant = set(spec.encoder.call_kwargs)
    calls = [("the eager call", set(spec.encoder.args), ("encoder", "args"))]
    if spec.graph_scope is None:
        calls.append(("the captured call", {b.arg for b in spec.buffers}, ("buffers",)))
    for call, passed, path in calls:
        for name in signature["required"]:
            if name not in passed and name not in constant:
                yield _missing_at(loaded, path, name, f"{short} needs the argument {name!r}, which {call} does "
                                  "not pass")


def _missing_at(loaded: LoadedYaml, path: tuple[str, ...], name: str, message: str) -> Diagnostic:
    """The diagnostic for a required argument ``name`` that the call written at ``path`` (``encoder.args`` or
    ``buffers``) does not pass, at the line the user must change: the ``remove`` entry of an inheriting spec that
    took that argument away; else the spec's own ``encoder.args`` or ``buffers``; else (both inherited unchanged)
    a ``remove`` entry that took the whole mapping, or the spec's own ``encoder.class`` or ``method``, which asks
    for more than its parent passes."""
    eager = path == ("encoder", "args")
    exact = [("key", f"encoder.args.{name}")] if eager else [("buffer", name)]
    exact.append(("key", f"encoder.call_kwargs.{name}"))
    wholesale = [("key", "encoder.args"), ("key", "encoder")] if eager else [("key", "buffers")]
    wholesale.append(("key", "encoder.call_kwargs"))
    hint = (f"add {name}: ROLE to encoder.args (the input role that holds it), or a constant to encoder.call_kwargs"
            if eager else f"add a buffer passed as {name!r} (arg: {name}), or a constant to encoder.call_kwargs")
    found = _removal(loaded, exact)
    if found is None and loaded.file_of(path) != loaded.file:
        found = _removal(loaded, wholesale)
        if found is None:
            own = _own_call(loaded)
            if own:
                return error(loaded, own[0], message + f" (as inherited, for the {own[0][1]} written here)",
                             code="binding", hint=hint)
    if found is None:
        return error(loaded, path, message, code="binding", hint=hint)
    return loaded.at_removal(found, path, message, "keep it: every case would fail with a missing argument", "binding")


def _removal(loaded: LoadedYaml, keys: list[tuple[str, str]]) -> Any:
    """The ``remove`` entry that took the first of ``keys`` the spec removes; None when it removes none."""
    return next((loaded.removed[k] for k in keys if k in loaded.removed), None)


def _own_call(loaded: LoadedYaml) -> list[tuple[str, str]]:
    """``encoder.class`` and ``encoder.method`` where the spec's own file writes them."""
    return [p for p in (("encoder", "class"), ("encoder", "method"))
            if p in loaded.values and loaded.file_of(p) == loaded.file]


def architectures_exist(loaded: LoadedYaml, spec: Spec, bindings: Bindings) -> Iterator[Diagnostic]:
    """The VLM class the end-to-end stage builds is one of the installed transformers: ``tests.vlm.architecture``
    when given, else one of ``architectures`` (which name the checkpoints' config.json classes, as engines match
    them, and may differ from transformers' name). A misspelt name is an error with a did-you-mean, not a skipped
    end-to-end stage."""
    if spec.tests.vlm is not None and spec.tests.vlm.architecture:
        named = [(("tests", "vlm", "architecture"), spec.tests.vlm.architecture)]
    else:
        named = [(("architectures", i), name) for i, name in enumerate(spec.architectures)]
    encoder = spec.encoder.class_path.rsplit(".", 1)[1]  # a standalone vision model: the encoder is the model
    if named and not any(name == encoder or bindings.check_class(f"transformers.{name}")["ok"] for _, name in named):
        path, name = named[0]
        hint = suggest(name, _model_classes())
        listed = " or ".join(repr(n) for _, n in named)
        yield error(loaded, path, f"transformers {bindings.version} has no class {listed}", code="binding",
                    hint=hint or "name the VLM class transformers builds (tests.vlm.architecture when the "
                    "checkpoint's config.json names another)")


def _model_classes() -> list[str]:
    """The model class names transformers exports (imported only when a name is not found)."""
    import transformers

    return [n for n in dir(transformers) if n.endswith(("Model", "ForConditionalGeneration", "ForCausalLM"))]


def _classes_import(loaded: LoadedYaml, encoder: Encoder, bindings: Bindings) -> Iterator[Diagnostic]:
    for field_name, path, base in (("class", encoder.class_path, TORCH_MODULE),
                                   ("config_class", encoder.config_class, PRETRAINED_CONFIG)):
        result = bindings.check_class(path)
        if not result["ok"]:
            yield error(loaded, ("encoder", field_name), result["error"], code="binding",
                        hint="check the module path in the installed transformers " + bindings.version)
        elif base not in result["bases"]:
            yield error(loaded, ("encoder", field_name), f"{path} is not a {base.rsplit('.', 1)[1]} subclass",
                        code="binding")
        elif field_name == "class" and not bindings.check_method(path, encoder.method)["ok"]:
            yield error(loaded, ("encoder", "method" if "method" in loaded.data["encoder"] else "class"),
                        f"{path.rsplit('.', 1)[1]} has no method {encoder.method!r}", code="binding")


def config_snapshots(loaded: LoadedYaml, spec: Spec,
                     bindings: Bindings) -> tuple[dict[str, dict], list[Diagnostic]]:
    """The config builds with its defaults and the harness's tiny_config and real_config, naming only its fields;
    returns snapshots."""
    snapshots: dict[str, dict] = {}
    problems: list[Diagnostic] = []
    encoder = spec.encoder
    for label, overrides, where in (("defaults", {}, ("encoder", "config_class")),
                                    ("tiny_config", spec.tests.tiny_config, ("tests", "tiny_config")),
                                    ("real_config", spec.tests.real_config, ("tests", "real_config"))):
        if label == "real_config" and not overrides:
            continue  # the defaults, already checked
        result = bindings.check_config(encoder.config_class, thaw(overrides))
        if result["ok"]:
            snapshots[label] = result["snapshot"]
            continue
        for *key_path, known in result.get("unknown_keys", ()):
            problems.append(error(loaded, where + tuple(key_path),
                                  f"{encoder.config_class.rsplit('.', 1)[1]} has no field {key_path[-1]!r}",
                                  hint=suggest(key_path[-1], known), code="binding", key=True))
        if "error" in result:
            problems.append(error(loaded, where, result["error"], code="binding"))
    return snapshots, problems


def evaluate_geometry(loaded: LoadedYaml, spec: Spec,
                      snapshots: Mapping[str, dict]) -> tuple[dict[str, dict[str, int]] | None, list[Diagnostic]]:
    """The geometry evaluates under each config snapshot; returns values per snapshot, or None on failure."""
    geometry: dict[str, dict[str, int]] = {}
    for label, snapshot in snapshots.items():
        values: dict[str, int] = {}
        for name, formula in spec.geometry:
            try:
                values[name] = formula.evaluate(values, snapshot)
            except FormulaError as exc:  # later configs would repeat the same complaint
                return None, [formula_diagnostic(loaded, ("geometry", name), exc, f"with {label}")]
        geometry[label] = values
    return geometry, []


def _config_field(snapshot: dict, name: str) -> tuple[str, int] | None:
    """``(scope, value)`` of an integer config field called ``name`` (top level or vision_config), if any."""
    for scope, table in (("", snapshot), ("vision_config.", snapshot.get("vision_config"))):
        found = table.get(name) if isinstance(table, dict) else None
        if isinstance(found, list) and found and all(v == found[0] for v in found):
            found = found[0]  # (14, 14) patch sizes
        if isinstance(found, int) and not isinstance(found, bool):
            return scope, found
    return None


def literal_geometry_matches_config(loaded: LoadedYaml, spec: Spec,
                                    snapshots: Mapping[str, dict]) -> Iterator[Diagnostic]:
    """A literal geometry value whose name is also a config field agrees with that field."""
    for name, formula in spec.geometry:
        if formula.names or formula.config_paths:
            continue
        literal = formula.evaluate({})
        for label, snapshot in snapshots.items():
            found = _config_field(snapshot, name)
            if found is not None and found[1] != literal:
                scope, value = found
                yield error(loaded, ("geometry", name), f"geometry {name} is {literal}, but the {label} config has "
                            f"{scope}{name} = {value}", hint=f"read it from the config: config.{scope}{name}")
                break


def _budget_bounds(spec: Spec, geometry: Mapping[str, int]) -> dict[str, int | FormulaError]:
    """The min and max budget under the default limits, or the error evaluating each."""
    limits = {**cat.DEFAULT_LIMITS, **geometry}
    bounds: dict[str, int | FormulaError] = {}
    for key, formula in (("min", spec.budget_min), ("max", spec.budget_max)):
        try:
            bounds[key] = formula.evaluate(limits)
        except FormulaError as exc:
            bounds[key] = exc
    return bounds


def budgets_positive(loaded: LoadedYaml, spec: Spec, geometry: Mapping[str, int]) -> Iterator[Diagnostic]:
    """The min and max budget evaluate to positive values under the default limits."""
    for key, bound in _budget_bounds(spec, geometry).items():
        if isinstance(bound, FormulaError):
            yield formula_diagnostic(loaded, ("budget", key), bound)
        elif bound <= 0:
            yield error(loaded, ("budget", key), f"{key} budget evaluates to {bound}; budgets must be > 0",
                        hint=_LIMITS_HINT)


def budget_order(loaded: LoadedYaml, spec: Spec, geometry: Mapping[str, int]) -> Iterator[Diagnostic]:
    """The min budget is not larger than a positive max budget."""
    bounds = _budget_bounds(spec, geometry)
    low, high = bounds["min"], bounds["max"]
    if not isinstance(low, FormulaError) and not isinstance(high, FormulaError) and 0 < high < low:
        yield error(loaded, ("budget", "min"), f"min budget {low} is larger than max budget {high}", hint=_LIMITS_HINT)


def items_positive(loaded: LoadedYaml, spec: Spec, geometry: Mapping[str, int]) -> Iterator[Diagnostic]:
    """input_size, output_tokens and frames evaluate to positive values for a sample item."""
    item = spec.attention_style.sample(geometry)
    for modality in spec.modalities:  # each item role at its per_item value
        for role, formula in modality.per_item.items():
            try:
                item[role] = formula.evaluate(geometry)
            except FormulaError as exc:
                yield formula_diagnostic(loaded, ("modalities", modality.name, "per_item", role), exc)
                return
        if modality.per_item:
            break
    sample = {**item, **geometry}
    checks = [("input_size", spec.input_size), ("output_tokens", spec.output_tokens), ("frames", spec.frames)]
    if spec.valid is not None:  # an item without padding: output_tokens reads its full rows
        try:
            item["valid"] = sample["valid"] = spec.valid.full.evaluate(sample)
        except FormulaError as exc:
            yield formula_diagnostic(loaded, ("items", "valid", "full"), exc)
            return
    for key, formula in checks:
        try:
            value = formula.evaluate(sample)
        except FormulaError as exc:
            yield (formula_diagnostic(loaded, ("items", key), exc) if key in loaded.data["items"]
                   else loaded.diagnostic(("items",), exc.message, code="formula"))
            continue
        if value <= 0:
            described = ", ".join(f"{k}={v}" for k, v in item.items())
            yield error(loaded, ("items", key), f"{key} is {value} for a sample item ({described}); it must be > 0")


def buffer_sizes_positive(loaded: LoadedYaml, spec: Spec, geometry: Mapping[str, int]) -> Iterator[Diagnostic]:
    """Each buffer dimension and host value is positive at the min budget (when that budget is itself positive)."""
    budget = _budget_bounds(spec, geometry)["min"]
    if isinstance(budget, FormulaError) or budget <= 0:
        return
    sizes = {**cat.buffer_names(budget, 1, 1), **geometry}
    for i, buffer in enumerate(spec.buffers):
        formulas: list[tuple[tuple[Any, ...], Any]] = (
            [(("value",), buffer.value)] if buffer.value is not None
            else [(("shape", j), f) for j, f in enumerate(buffer.shape)])
        for where, formula in formulas:
            path = ("buffers", i) + where
            try:
                value = formula.evaluate(sizes)
            except FormulaError as exc:
                yield formula_diagnostic(loaded, path, exc)
                continue
            if value <= 0:
                yield error(loaded, path, f"evaluates to {value} for budget={sizes['budget']}, max_items=1, "
                            "max_frames=1; sizes must be > 0")


def _capture_elements(spec: Spec, geometry: Mapping[str, int], low: int, high: int) -> tuple[int, str, str]:
    """Elements of the tensor buffers at budget ``high``, the largest buffer, and the pack the sizes assume.

    The pack is the one vLLM infers: ``max_budget // min_budget`` items (at most ``min_budget``) and
    every video's frames. Dimensions that fail to evaluate count as 1; other rules report them.
    """
    items = max(1, min(high // low, low))
    frames = items * max((m.max_frames_per_video for m in spec.modalities if m.name == "video"), default=0)
    sizes = {**cat.buffer_names(high, items, frames), **geometry}
    total, largest = 0, (0, "")
    for buffer in spec.buffers:
        count = 1
        for formula in buffer.shape or ():
            with contextlib.suppress(FormulaError):
                count *= max(formula.evaluate(sizes), 1)
        if buffer.shape:
            total += count
            largest = max(largest, (count, buffer.name))
    return total, largest[1], f"max_items={items}, max_frames={frames}"


def resources_bounded(loaded: LoadedYaml, spec: Spec,
                      geometries: Mapping[str, Mapping[str, int]]) -> Iterator[Diagnostic]:
    """Under the default limits and every config, the max budget and its capture buffers stay within the bounds."""
    for label, geometry in geometries.items():
        bounds = _budget_bounds(spec, geometry)
        low, high = bounds["min"], bounds["max"]
        if isinstance(low, FormulaError) or isinstance(high, FormulaError) or not 0 < low <= high:
            continue  # budgets_positive and budget_order say why
        config = "the config defaults" if label == "defaults" else label
        if high > cat.MAX_BUDGET_TOKENS:
            yield error(loaded, ("budget", "max"), f"max budget is {high:,} tokens {_LIMITS_HINT} and {config}; "
                        f"budgets are limited to {cat.MAX_BUDGET_TOKENS:,} (2**20)",
                        hint="bound it by the engine limits: min(max_num_batched_tokens, max_model_len)")
            return
        total, largest, pack = _capture_elements(spec, geometry, low, high)
        if total > cat.MAX_BUFFER_ELEMENTS:
            yield error(loaded, ("budget", "max"), f"the capture buffers of max budget {high:,} ({pack}, {config}) "
                        f"hold {total:,} elements, most in {largest!r}; they are limited to "
                        f"{cat.MAX_BUFFER_ELEMENTS:,} (2**30)",
                        hint="lower budget.max, or the buffer shapes that grow with it")
            return


# Vacuous tiny configs: `vitcg check` compares the graphs with eager calls of the tiny tower; a tiny config that
# skips the code under test makes those comparisons equal whatever the spec says (issue 26, item 4).
DEPTH_FIELDS = ("num_hidden_layers", "depth", "num_layers", "num_global_layers")
"""Config fields counting the layers of a stack: zero of them skips the stack."""
TOWER_DEPTH_FIELDS = DEPTH_FIELDS[:3]
"""The fields, in order, that give the depth of a tower's main stack (what layer indexes count)."""
LAYER_INDEX_FIELDS = {
    "deepstack_visual_indexes": "the deepstack merger of that layer",
    "fullatt_block_indexes": "full attention of that block (between windowed blocks)",
    "global_attn_indexes": "global attention of that layer (between windowed layers)",
    "intermediate_layers_indices": "the intermediate feature of that layer",
}
"""Config fields listing layers that take an extra path, and what that path is: indexes in ``0..depth-1``."""
HIDDEN_STATE_FIELDS = ("vision_feature_layer", "feature_layer")
"""Config fields and call arguments selecting hidden states (``depth + 1`` of them: the embeddings' then each
layer's output), as ``output_hidden_states`` and ``hidden_states[k]`` outputs do."""
NOT_TOWER_CONFIGS = ("text_config", "audio_config")
"""Sub-configs of a VLM config that build no part of the vision tower."""
_HIDDEN_STATE_OUTPUT = re.compile(r"^hidden_states\[(-?[0-9]+)\]$")
_TINY = ("tests", "tiny_config")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tower_tables(snapshot: Mapping[str, Any]) -> Iterator[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """``(path, table)`` of each config table that builds part of the tower: the config itself (unless it is a VLM
    config with a vision_config, whose own depth is the text model's) and its sub-configs but text and audio."""
    if not isinstance(snapshot.get("vision_config"), Mapping):
        yield (), snapshot
    for key, value in snapshot.items():
        if isinstance(value, Mapping) and key not in NOT_TOWER_CONFIGS:
            yield (key,), value


def _depth(snapshot: Mapping[str, Any], path: tuple[str, ...]) -> tuple[tuple[str, ...], int] | None:
    """``(field path, layers)`` of the main stack of the table at ``path`` (a VLM config: of its vision_config)."""
    table: Any = snapshot
    for key in path:
        table = table.get(key) if isinstance(table, Mapping) else None
    if path == () and isinstance(snapshot.get("vision_config"), Mapping):
        path, table = ("vision_config",), snapshot["vision_config"]
    for name in TOWER_DEPTH_FIELDS:
        if isinstance(table, Mapping) and _int(table.get(name)):
            return (*path, name), table[name]
    return None


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def tiny_layers_present(loaded: LoadedYaml, snapshots: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Every layer stack of the tiny tower has at least one layer: a zero-layer tower makes every comparison equal
    whatever the spec computes."""
    for path, table in _tower_tables(snapshots["tiny_config"]):
        for name in DEPTH_FIELDS:
            value = table.get(name)
            if _int(value) and value <= 0:
                where = (*path, name)
                yield error(loaded, (*_TINY, *where), f"the tiny config builds {_dotted(where)} = {value} layers: "
                            "the tiny checks would compare outputs that skip every layer under test",
                            hint=f"set tests.tiny_config.{_dotted(where)} to 1 or more")


def tiny_layer_indexes_in_depth(loaded: LoadedYaml,
                                snapshots: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Layer indexes of the tiny config (deepstack, full-attention, global-attention and intermediate layers) name
    layers of the tiny tower, and keep at least one where the default config has some: otherwise the path they
    select never runs in the tiny checks."""
    tiny, defaults = snapshots["tiny_config"], snapshots["defaults"]
    for path, table in _tower_tables(tiny):
        depth = _depth(tiny, path)
        for name, what in LAYER_INDEX_FIELDS.items():
            indexes = table.get(name)
            if depth is None or depth[1] <= 0 or not isinstance(indexes, list) or not all(_int(i) for i in indexes):
                continue  # no depth to count in, or none at all (tiny_layers_present says so)
            where = (*path, name)
            yield from _layer_indexes(loaded, where, indexes, depth, _value_at(defaults, where), what)


def _layer_indexes(loaded: LoadedYaml, where: tuple[str, ...], indexes: list[int], depth: tuple[tuple[str, ...], int],
                   default: Any, what: str) -> Iterator[Diagnostic]:
    """The layer indexes ``indexes`` at ``where`` of a tiny tower of ``depth`` (its path and layers): none where
    the model has ``default``, or some past the depth."""
    depth_path, layers = depth
    if not indexes and isinstance(default, list) and default:
        yield error(loaded, (*_TINY, *where), f"the tiny config sets {_dotted(where)} to [] where the "
                    f"model has {default}: {what} never runs in the tiny checks",
                    hint=f"list at least one layer within 0..{layers - 1}")
    outside = [i for i in indexes if not 0 <= i < layers]
    if outside:
        yield error(loaded, (*_TINY, *where), f"the tiny config's {_dotted(where)} = {indexes} names "
                    f"layers {outside} of a tower with {_dotted(depth_path)} = {layers}: {what} never runs "
                    "in the tiny checks",
                    hint=f"set tests.tiny_config.{_dotted(depth_path)} to {max(outside) + 1} or more, or "
                    f"{_dotted(where)} to layers within 0..{layers - 1}")


def _value_at(snapshot: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = snapshot
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _hidden_state_selectors(spec: Spec, tiny: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, ...], Any]]:
    """``(what, depth table path, index or indexes)`` of each hidden-state selection: config fields, the encoder
    call's arguments and ``hidden_states[k]`` outputs (the last two select from the tower's own depth)."""
    for path, table in {(): tiny, **dict(_tower_tables(tiny))}.items():
        for name in HIDDEN_STATE_FIELDS:
            if name in table:
                yield f"the tiny config's {_dotted((*path, name))}", path, table[name]
    for name in (*HIDDEN_STATE_FIELDS, "output_hidden_states"):
        if name in spec.encoder.call_kwargs:
            yield f"encoder.call_kwargs.{name}", (), thaw(spec.encoder.call_kwargs[name])
    for i, output in enumerate(spec.encoder.outputs):
        found = _HIDDEN_STATE_OUTPUT.match(output)
        if found:
            yield f"encoder.outputs[{i}] ({output})", (), int(found.group(1))


def tiny_feature_layers_in_depth(loaded: LoadedYaml, spec: Spec,
                                 snapshots: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """Hidden states selected as features (``vision_feature_layer``, ``output_hidden_states`` indexes,
    ``hidden_states[k]`` outputs) are the output of a layer of the tiny tower: not past its depth, and not the
    embeddings' output (index 0), which no layer computes."""
    tiny = snapshots["tiny_config"]
    for what, path, selection in _hidden_state_selectors(spec, tiny):
        depth = _depth(tiny, path)
        indexes = selection if isinstance(selection, list) else [selection]
        if depth is None or depth[1] <= 0 or not indexes or not all(_int(i) for i in indexes):
            continue  # a flag (output_hidden_states: true), a strategy name, an unknown or a zero depth
        depth_path, layers = depth
        index = next((i for i in indexes if not 0 < _position(i, layers) <= layers), None)
        if index is not None:
            yield _no_layer_output(loaded, what, index, depth_path, layers)


def _position(index: int, layers: int) -> int:
    """Which of a tower's ``layers + 1`` hidden states (the embeddings' first) ``index`` selects."""
    return index if index >= 0 else layers + 1 + index


def _no_layer_output(loaded: LoadedYaml, what: str, index: int, depth_path: tuple[str, ...],
                     layers: int) -> Diagnostic:
    """The diagnostic for ``what`` selecting hidden state ``index``, no layer's output of a tiny tower of
    ``layers`` layers (its depth at ``depth_path``)."""
    state = ("the embeddings' output, before every layer" if _position(index, layers) == 0
             else f"past the {layers + 1} hidden states (the embeddings' and {layers} layers')")
    hint = (f"select a layer's output: 1..{layers} or -1..-{layers}" if index == 0 else
            f"set tests.tiny_config.{_dotted(depth_path)} to {abs(index)} or more")
    return error(loaded, (*_TINY, *depth_path), f"{what} selects hidden state {index}: {state} of the tiny "
                 f"tower ({_dotted(depth_path)} = {layers}), so the tiny checks skip the layers the features "
                 "come from", hint=hint)


def _not_layer_types(loaded: LoadedYaml, field: str, label: str, snapshot: Mapping[str, Any]) -> Diagnostic:
    """``layer_args.types`` names no config field, or one that is not a list of strings."""
    if field not in snapshot:
        lists = sorted(k for k, v in snapshot.items() if isinstance(v, list) and v and all(isinstance(t, str) for t in v))
        return error(loaded, ("layer_args", "types"), f"the encoder config ({label}) has no field {field!r}",
                     hint=suggest(field, lists) or f"fields listing strings: {', '.join(lists) or 'none'}")
    return error(loaded, ("layer_args", "types"), f"the encoder config's {field} ({label}) is {snapshot[field]!r}, "
                 "not a type (a string) per layer", hint="name the config field that lists one type per layer, "
                                                         "such as layer_types")


def _listed_types(field: str, snapshots: Mapping[str, Mapping[str, Any]]) -> dict[str, str] | tuple[str, Mapping]:
    """Each layer type the configs list in ``field`` -> the first config listing it; or ``(label, snapshot)`` of the
    first config whose ``field`` is no list of strings."""
    listed: dict[str, str] = {}
    for label, snapshot in snapshots.items():
        types = snapshot.get(field)
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            return label, snapshot
        listed.update({kind: label for kind in types if kind not in listed})
    return listed


def layer_types_covered(loaded: LoadedYaml, spec: Spec,
                        snapshots: Mapping[str, Mapping[str, Any]]) -> Iterator[Diagnostic]:
    """``layer_args.types`` names a config field listing one type (a string) per layer; every type a config
    (defaults, tiny_config, real_config) lists has its entry in ``by_type``, and every entry is a type some config
    lists (a misspelt one would leave its layers without their arguments)."""
    layer_args = spec.layer_args
    if layer_args is None:
        return
    listed = _listed_types(layer_args.types, snapshots)
    if isinstance(listed, tuple):
        yield _not_layer_types(loaded, layer_args.types, *listed)
        return
    missing = [kind for kind in listed if kind not in layer_args.by_type]
    if missing:
        yield error(loaded, ("layer_args", "by_type"), f"config.{layer_args.types} lists layer types "
                    f"{', '.join(missing)} ({', '.join(sorted({listed[k] for k in missing}))}), which by_type "
                    "leaves out: those layers would get none of their arguments",
                    hint=f"add by_type entries for {', '.join(missing)}", key=True)
    for kind in layer_args.by_type:
        if kind not in listed:
            yield error(loaded, ("layer_args", "by_type", kind), f"no encoder config lists layer type {kind!r} in "
                        f"{layer_args.types} ({', '.join(listed)})", hint=suggest(kind, list(listed)), key=True)


def _vlm_class(vlm: Mapping[str, Any], spec: Spec, bindings: Bindings) -> str | None:
    """The VLM class transformers has of ``tests.vlm.architecture``, else of the spec's architectures, the
    encoder's own class left out; None when there is none."""
    named = [vlm["architecture"]] if vlm.get("architecture") else list(spec.architectures)
    encoder = spec.encoder.class_path.rsplit(".", 1)[1]
    return next((n for n in named if n != encoder and bindings.check_class(f"transformers.{n}")["ok"]), None)


MODALITY_CALLS = {"image": "get_image_features", "video": "get_video_features"}
"""The VLM method that runs each modality through the tower: a VLM with it has that modality."""


def vlm_modalities_covered(loaded: LoadedYaml, spec: Spec, bindings: Bindings) -> Iterator[Diagnostic]:
    """Each modality the VLM has (a ``get_image_features`` / ``get_video_features`` method) is a modality of the
    spec, or ``tests.vlm.omits`` says why not: no check runs a modality the spec leaves out. A reason for a modality
    the spec declares contradicts it. A spec without ``tests.vlm`` is not asked: ``vitcg check`` already refuses it
    as unproven until it describes (or skips, saying why) the end-to-end stage, whose section holds the reason."""
    vlm = loaded.data["tests"].get("vlm")
    if vlm is None:
        return
    omits = vlm.get("omits") or {}
    declared = {m.name for m in spec.modalities}
    for name in omits:
        if name in declared:
            yield error(loaded, ("tests", "vlm", "omits", name), f"tests.vlm.omits gives a reason to leave out "
                        f"{name}, but the spec declares modalities.{name}", key=True,
                        hint=f"remove tests.vlm.omits.{name}")
    found = _vlm_class(vlm, spec, bindings)
    if found is None:
        return  # a standalone vision model, or architectures_exist said what is missing
    for name, method in MODALITY_CALLS.items():
        if name in declared or name in omits or not bindings.check_method(f"transformers.{found}", method)["ok"]:
            continue
        yield error(loaded, ("modalities",), f"{found} has {method}, but the spec has no {name} modality: no "
                    f"check runs the VLM's {name}s", key=True,
                    hint=f"add modalities.{name}, or say why it is left out: tests.vlm.omits: "
                    f"{{{name}: \"the reason\"}}")
