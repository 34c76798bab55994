"""Schema and semantic checks: loaded YAML in, a typed :class:`Spec` or every diagnostic out.

Order: JSON Schema (structure) -> formulas parse against each field's vocabulary -> cross-field rules
(roles, providers, padding) -> bindings (import paths, config defaults, tiny and real configs).
A later stage runs only when the earlier ones found nothing, so each message is about a real cause.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from types import MappingProxyType
from importlib import resources
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from ..errors import Diagnostic, FormulaError, suggest
from . import catalogue as cat
from .bindings import Bindings
from .formulas import Formula, parse
from .loader import LoadedYaml, Path_, format_path
from .model import Buffer, Docs, Encoder, ExampleInput, Modality, Spec, TestMeta, freeze, thaw

TORCH_MODULE = "torch.nn.modules.module.Module"
PRETRAINED_CONFIG = "transformers.configuration_utils.PreTrainedConfig"
REQUIRED_GEOMETRY = {"out_hidden_size": "the width of one output row (all output fields concatenated)"}


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema shipped inside the package, its vocabulary filled in from :mod:`.catalogue` (the
    shipped file is kept identical to this by ``vitcg schema -o vitcg/lang/schema.json``; a test checks it)."""
    return cat.vocabulary_schema(json.loads(resources.files("vitcg.lang").joinpath("schema.json").read_text()))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def _properties(schema_node: dict[str, Any]) -> list[str]:
    return list(schema_node.get("properties", {}))


def schema_diagnostics(loaded: LoadedYaml) -> list[Diagnostic]:
    """Every structural problem, one diagnostic each, pointing at the key or value that causes it."""
    out: list[Diagnostic] = []
    for error in _validator().iter_errors(loaded.data):
        out.extend(_explain(loaded, error))
    return _dedupe(out)


def _explain(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    path: Path_ = tuple(error.absolute_path)
    validator = error.validator
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = _properties(error.schema)
        extra = [k for k in error.instance if k not in allowed]
        if not allowed and isinstance(error.schema.get("additionalProperties"), dict):
            return []  # a typed map (geometry, args): the value errors are reported separately
        return [
            loaded.diagnostic(path + (k,), f"unknown key {k!r}", key=True,
                              hint=suggest(k, allowed) or (f"allowed keys: {', '.join(allowed)}" if allowed else None))
            for k in extra
        ]
    if validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [loaded.diagnostic(path, f"missing required key {missing!r}")]
    if validator == "enum":
        options = [str(o) for o in error.validator_value]
        return [loaded.diagnostic(path, f"{error.instance!r} is not one of: {', '.join(options)}",
                                  hint=suggest(str(error.instance), options))]
    if validator == "propertyNames":
        return [loaded.diagnostic(path + (error.instance,), f"invalid key {error.instance!r}: "
                                  f"keys here must match {error.validator_value.get('pattern', '')}", key=True)]
    if validator in ("anyOf", "oneOf") and error.schema is schema()["$defs"]["formula"]:
        return [loaded.diagnostic(path, f"{error.instance!r} is not a formula (an integer or a string)")]
    if validator == "oneOf" and path and path[0] == "buffers" and isinstance(error.instance, dict):
        has = [k for k in ("shape", "value") if k in error.instance]
        message = ("a buffer has either 'shape' (tensor) or 'value' (host integer), not both" if len(has) == 2
                   else "a buffer needs 'shape' (tensor) or 'value' (host integer)")
        return [loaded.diagnostic(path, message)]
    if validator in ("anyOf", "oneOf") and error.context:
        return _explain(loaded, best_match(error.context))
    if validator == "minProperties" and isinstance(error.instance, dict) and not error.instance:
        return [loaded.diagnostic(path, "must not be empty")]
    return [loaded.diagnostic(path, error.message)]


def _dedupe(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    for d in diagnostics:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return sorted(out, key=lambda d: (d.line, d.col, d.path))


class SemanticChecker:
    """Checks one schema-valid file and builds its :class:`Spec`; collects every problem it can find."""

    def __init__(self, loaded: LoadedYaml, bindings: Bindings | None):
        self.loaded = loaded
        self.data = loaded.data
        self.bindings = bindings
        self.diagnostics: list[Diagnostic] = []

    def error(self, path: Path_, message: str, *, hint: str | None = None, code: str = "semantic",
              key: bool = False) -> None:
        self.diagnostics.append(self.loaded.diagnostic(path, message, hint=hint, code=code, key=key))

    def formula(self, path: Path_, vocabulary: Iterable[str], *, allow_config: bool = False) -> Formula | None:
        source = self._get(path)
        try:
            return parse(source, vocabulary, allow_config=allow_config)
        except FormulaError as exc:
            self.diagnostics.append(self._formula_diagnostic(path, exc))
            return None

    def _formula_diagnostic(self, path: Path_, exc: FormulaError, context: str = "") -> Diagnostic:
        pos = self.loaded.position(path)
        source = self._get(path)
        quoted = 1 if self.loaded.styles.get(path) in ("'", '"') else 0
        lead = len(source) - len(source.lstrip()) if isinstance(source, str) else 0
        col = pos.col + quoted + lead + exc.col if self.loaded.styles.get(path) in (None, "'", '"') else pos.col
        message = exc.message + (f" ({context})" if context else "")
        hint = exc.hint
        if isinstance(path[-1], int) and ("never closed" in exc.message or "unmatched ')'" in exc.message):
            hint = "in a YAML [...] list a comma splits items: quote a formula that holds commas"
        return Diagnostic(self.loaded.file, pos.line, col, format_path(path), message, hint, "formula")

    def _get(self, path: Path_) -> Any:
        node = self.data
        for part in path:
            node = node[part]
        return node

    def run(self) -> Spec | None:
        data = self.data
        style = cat.STYLES[data["attention"]["style"]]
        geometry = self._geometry()
        names = list(data["geometry"])  # every declared name, so one bad entry does not cascade
        self._required_geometry(style)
        segments = self._segments(style)
        modalities = self._modalities(style)
        item_vocab = [*style.item_names, *names]
        input_size = self.formula(("items", "input_size"), item_vocab)
        output_tokens = self.formula(("items", "output_tokens"), item_vocab)
        default_frames = style.item_names[0]
        frames = (self.formula(("items", "frames"), item_vocab) if "frames" in data["items"]
                  else parse(default_frames, item_vocab))
        budget_vocab = [*cat.LIMIT_NAMES, *names]
        budget_min = self.formula(("budget", "min"), budget_vocab)
        budget_max = self.formula(("budget", "max"), budget_vocab)
        encoder = self._encoder(style, modalities)
        scope = data.get("graph_scope")
        buffers = self._buffers(style, names, encoder, modalities, scope is not None)
        tests = self._tests(style, modalities, names, scope is not None)
        if self.diagnostics:
            return None
        spec = Spec(
            file=self.loaded.file,
            graph_scope=scope["module"] if scope else None,
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
        if self.bindings is not None:
            self._check_bindings(spec)
        return None if self.diagnostics else spec

    def _geometry(self) -> list[tuple[str, Formula]]:
        declared = list(self.data["geometry"])
        out: list[tuple[str, Formula]] = []
        for index, name in enumerate(declared):
            path = ("geometry", name)
            try:
                out.append((name, parse(self.data["geometry"][name], declared[:index], allow_config=True)))
            except FormulaError as exc:
                later = [n for n in declared[index:] if exc.message == f"unknown name {n!r}"]
                if later:
                    exc.hint = f"{later[0]!r} is defined below; geometry entries may only use names above them"
                self.diagnostics.append(self._formula_diagnostic(path, exc))
        return out

    def _required_geometry(self, style: cat.AttentionStyle) -> None:
        for name in REQUIRED_GEOMETRY:
            if name not in self.data["geometry"]:
                self.error(("geometry",), f"geometry must define {name!r}", hint=REQUIRED_GEOMETRY[name])
        for name in style.geometry:
            if name not in self.data["geometry"]:
                self.error(("geometry",), f"{style.name} style needs geometry {name!r}",
                           hint=f"a {style.name} spec defines: {', '.join(style.geometry)}")

    def _segments(self, style: cat.AttentionStyle) -> str:
        given = self.data["attention"].get("segments")
        if given is not None and given not in style.segments:
            self.error(("attention", "segments"), f"{style.name} style: {cat.SEGMENT_DOCS[style.segments[0]]}; "
                       "'segments' does not apply", hint="remove 'segments'")
        return given if given in style.segments else style.segments[0]

    def _modalities(self, style: cat.AttentionStyle) -> list[Modality]:
        required = style.roles if style.count_required else ("pixels",)
        optional = () if style.count_required else (style.count_role,)
        allowed = [*required, *optional]
        out, seen_keys, extras = [], {}, {}
        for name, entry in self.data["modalities"].items():
            inputs = entry["inputs"]
            for role in required:
                if role not in inputs:
                    self.error(("modalities", name, "inputs"), f"{style.name} style needs input role {role!r}",
                               hint=f"a {style.name} modality names: {', '.join(allowed)}")
            for role in inputs:
                if role in cat.STANDARD_ROLES and role not in allowed:
                    self.error(("modalities", name, "inputs", role),
                               f"input role {role!r} does not apply to {style.name} style",
                               hint=f"a {style.name} modality names: {', '.join(allowed)}", key=True)
            extras[name] = sorted(r for r in inputs if r not in cat.STANDARD_ROLES)
            for role, key in inputs.items():
                if key in seen_keys:
                    self.error(("modalities", name, "inputs", role), f"input key {key!r} is already used by {seen_keys[key]}")
                seen_keys[key] = f"{name}.{role}"
            frames = entry.get("max_frames_per_video")
            if name == "image" and frames is not None:
                self.error(("modalities", name, "max_frames_per_video"), "images have one frame; "
                           "max_frames_per_video applies to video only", key=True)
            if name == "video" and frames is None:
                self.error(("modalities", name), "video needs 'max_frames_per_video'",
                           hint="the largest frame count of one video item (grid t, or tiles)")
            out.append(Modality(name, freeze(inputs), frames or 1))
        if len({tuple(v) for v in extras.values()}) > 1:
            self.error(("modalities",), "every modality must name the same extra input roles, got "
                       + "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in extras.items()))
        return out

    def _encoder(self, style: cat.AttentionStyle, modalities: list[Modality]) -> Encoder:
        enc = self.data["encoder"]
        roles = sorted({role for m in modalities for role in m.inputs})
        for arg, role in enc["args"].items():
            if role not in roles:
                self.error(("encoder", "args", arg), f"input role {role!r} is not an input of the modalities",
                           hint=suggest(role, roles) or f"roles: {', '.join(roles)}")
        if "pixels" not in enc["args"].values():
            self.error(("encoder", "args"), "the eager call must pass the 'pixels' role",
                       hint="e.g. args: {hidden_states: pixels, grid_thw: grid}")
        return Encoder(
            class_path=enc["class"],
            config_class=enc["config_class"],
            vlm_attribute=enc["vlm_attribute"],
            method=enc.get("method", "forward"),
            args=freeze(enc["args"]),
            call_kwargs=freeze(enc.get("call_kwargs", {})),
            outputs=tuple(enc["outputs"]),
            tiny_config=freeze(enc["tiny_config"]),
            real_config=freeze(enc.get("real_config", {})),
        )

    def _buffers(self, style: cat.AttentionStyle, geometry: list[str], encoder: Encoder, modalities: list[Modality],
                 scoped: bool) -> list[Buffer]:
        out: list[Buffer] = []
        vocab = [*cat.BUFFER_NAMES, *geometry]
        names: dict[str, int] = {}
        args: dict[str, int] = {}
        providers: dict[str, int] = {}
        for i, entry in enumerate(self.data["buffers"]):
            base = ("buffers", i)
            name, provider = entry["name"], entry["provider"]
            arg = entry.get("arg", name)
            info = cat.PROVIDERS[provider]
            unique = ((names, name, "name"), (args, arg, "arg"))
            if provider not in ("aligned", "scope_arg"):
                unique += ((providers, provider, "provider"),)
            for table, key, what in unique:
                if key in table:
                    self.error(base + (what,) if what in entry else base,
                               f"buffer {what} {key!r} is already used by buffers[{table[key]}]")
                table[key] = i
            if "." in arg and provider != "scope_arg":
                self.error(base + ("arg",), "only scope_arg buffers address tuple elements (name.N)")
            if style.name not in info.styles:
                self.error(base + ("provider",), f"provider {provider!r} does not apply to {style.name} style",
                           hint=f"it serves: {', '.join(sorted(info.styles))}")
                continue
            if info.scoped != scoped:
                self.error(base + ("provider",), f"provider {provider!r} fills the arguments of a graph_scope call"
                           if info.scoped else f"with graph_scope every buffer is a 'scope_arg', not {provider!r}",
                           hint="add graph_scope.module" if info.scoped else "provider: scope_arg")
                continue
            if entry["padding"] not in info.paddings:
                self.error(base + ("padding",), f"provider {provider!r} pads with {' or '.join(map(repr, info.paddings))}, "
                           f"not {entry['padding']!r}", hint=f"padding: {info.paddings[0]}")
            rows_dim = entry.get("params", {}).get("rows_dim", 0)
            if rows_dim and "shape" in entry and rows_dim >= len(entry["shape"]):
                self.error(base + ("params", "rows_dim"), f"rows_dim {rows_dim} is beyond the buffer's "
                           f"{len(entry['shape'])} dimensions")
            if (entry["padding"] == "fixed") != ("value" in entry) and info.kind == "either":
                self.error(base + ("padding",), "a host integer ('value') has padding 'fixed', a tensor ('shape') "
                           "does not")
            extra_roles = sorted({r for m in modalities for r in m.inputs if r not in cat.STANDARD_ROLES})
            if provider == "aligned" and entry.get("params", {}).get("role") not in extra_roles:
                self.error(base + ("params",), f"an 'aligned' buffer names one of the extra input roles in "
                           f"params.role ({', '.join(extra_roles) or 'the modalities have none'})")
            if info.kind == "host" and "shape" in entry:
                self.error(base + ("shape",), f"{provider!r} is a host integer fixed at capture: give 'value', "
                           "not 'shape'", key=True)
            if info.kind == "tensor" and "value" in entry:
                self.error(base + ("value",), f"{provider!r} is a tensor buffer: give 'shape', not 'value'", key=True)
            for param in entry.get("params", {}):
                if param not in info.params:
                    allowed = ", ".join(sorted(info.params)) or "none"
                    self.error(base + ("params", param), f"provider {provider!r} takes no param {param!r}",
                               hint=f"its params: {allowed}", key=True)
            for needed in info.geometry:
                if needed not in geometry:
                    self.error(base + ("provider",), f"provider {provider!r} reads geometry {needed!r}, "
                               "which the spec does not define", hint=f"add geometry.{needed}")
            shape = value = None
            if "shape" in entry:
                shape = tuple(self.formula(base + ("shape", j), vocab) for j in range(len(entry["shape"])))
                if not entry["shape"]:
                    self.error(base + ("shape",), "a tensor buffer needs at least one dimension")
            else:
                value = self.formula(base + ("value",), vocab)
            out.append(Buffer(name, arg, provider, shape, value, entry["padding"], freeze(entry.get("params", {}))))
        tuples: dict[str, list[int]] = {}
        for buffer in out:
            name, _, index = buffer.arg.partition(".")
            if index:
                tuples.setdefault(name, []).append(int(index))
        for name, indices in tuples.items():
            if sorted(indices) != list(range(len(indices))):
                self.error(("buffers",), f"tuple argument {name!r} has elements {sorted(indices)}; "
                           f"give {name}.0 to {name}.{len(indices) - 1} without gaps")
        if out and not any(cat.PADDINGS[b.padding].row_wise for b in out):
            self.error(("buffers",), "no buffer is padded row by row, so none says how many rows a capture holds",
                       hint="pad the buffer of the call's rows with " + " or ".join(
                           r.name for r in cat.PADDINGS.values() if r.row_wise))
        for needed in () if scoped else style.required_providers:
            if needed not in providers:
                self.error(("buffers",), f"{style.name} style needs a buffer filled by provider {needed!r}",
                           hint=cat.PROVIDERS[needed].doc)
        by_role = {role: arg for arg, role in encoder.args.items()}
        for role in style.roles:
            buffer = next((b for b in out if b.provider == role), None)
            if buffer is not None and role in by_role and buffer.arg != by_role[role]:
                self.error(("buffers", providers[role], "arg" if "arg" in self.data["buffers"][providers[role]] else "name"),
                           f"the {role} buffer is passed as {buffer.arg!r}, but the eager call passes {role} as "
                           f"{by_role[role]!r}", hint=f"arg: {by_role[role]}")
        return out

    def _tests(self, style: cat.AttentionStyle, modalities: list[Modality], geometry: list[str],
               scoped: bool) -> TestMeta:
        t = self.data["tests"]
        roles = sorted({role for m in modalities for role in m.inputs if role not in cat.STANDARD_ROLES[1:]})
        examples = {}
        for role, entry in t.get("inputs", {}).items():
            base = ("tests", "inputs", role)
            if role not in roles:
                self.error(base, f"{role!r} is not an input role of the modalities", key=True,
                           hint=suggest(role, roles) or f"roles: {', '.join(roles)}")
                continue
            shape = tuple(self.formula(base + ("shape", j), geometry) for j in range(len(entry["shape"])))
            fill = entry.get("fill", "randn")
            if not isinstance(fill, str):
                fill = tuple(self.formula(base + ("fill", j), geometry) for j in range(len(fill)))
            examples[role] = ExampleInput(shape, fill, entry.get("dtype", "model"))
        needed = [r for r in roles if r != "pixels" or scoped]
        for role in needed:
            if role not in examples:
                self.error(("tests",), f"tests.inputs must say how to build input role {role!r} for vitcg check",
                           hint="e.g. inputs: {" + role + ": {shape: [max_patches], fill: ones, dtype: bool}}")
        has_video = any(m.name == "video" for m in modalities)
        if has_video and "video_placeholder" not in t:
            self.error(("tests",), "a spec with video needs 'video_placeholder'")
        if not has_video and "video_placeholder" in t:
            self.error(("tests", "video_placeholder"), "the spec has no video modality", key=True)
        if "{question}" not in t["prompt_template"]:
            self.error(("tests", "prompt_template"), "prompt_template needs a {question} field")
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
            inputs=MappingProxyType(examples),
            shaping=self._shaping(style, modalities, geometry),
        )

    def _shaping(self, style: cat.AttentionStyle, modalities: list[Modality],
                 geometry: list[str]) -> MappingProxyType:
        """Per modality and item name: the formula of ``tests.shaping``, else the style's default. Either may
        read only the image or video size and names the spec defines."""
        given = self.data["tests"].get("shaping", {})
        present = {m.name for m in modalities}
        for name in given:
            if name not in present:
                self.error(("tests", "shaping", name), f"the spec has no {name} modality", key=True)
        out = {}
        for m in modalities:
            vocab = [*cat.SHAPING_NAMES[m.name], *geometry]
            base = ("tests", "shaping", m.name)
            for key in given.get(m.name, {}):
                if key not in style.item_names:
                    self.error(base + (key,), f"a {style.name} item is {', '.join(style.item_names)}, not {key!r}",
                               key=True, hint=suggest(key, style.item_names))
            formulas = {}
            for key in style.item_names:
                if key in given.get(m.name, {}):
                    formulas[key] = self.formula(base + (key,), vocab)
                    continue
                source = style.shaping[m.name][key]
                try:
                    formulas[key] = parse(source, vocab)
                except FormulaError as exc:
                    self.error(("tests",), f"the {style.name} style's default shaping of a {m.name} "
                               f"({key}: {source}) fails: {exc.message}",
                               hint=f"define it in geometry, or give tests.shaping.{m.name}.{key}")
            out[m.name] = MappingProxyType(formulas)
        return MappingProxyType(out)

    def _check_bindings(self, spec: Spec) -> None:
        bindings = self.bindings
        enc = spec.encoder
        for field_name, path, base in (("class", enc.class_path, TORCH_MODULE),
                                       ("config_class", enc.config_class, PRETRAINED_CONFIG)):
            result = bindings.check_class(path)
            if not result["ok"]:
                self.error(("encoder", field_name), result["error"], code="binding",
                           hint="check the module path in the installed transformers " + bindings.version)
            elif base not in result["bases"]:
                self.error(("encoder", field_name), f"{path} is not a {base.rsplit('.', 1)[1]} subclass", code="binding")
            elif field_name == "class" and not bindings.check_method(path, enc.method)["ok"]:
                self.error(("encoder", "method" if "method" in self.data["encoder"] else "class"),
                           f"{path.rsplit('.', 1)[1]} has no method {enc.method!r}", code="binding")
        if self.diagnostics:
            return
        snapshots = {}
        for label, overrides, where in (("defaults", {}, ("encoder", "config_class")),
                                        ("tiny_config", enc.tiny_config, ("encoder", "tiny_config")),
                                        ("real_config", enc.real_config, ("encoder", "real_config"))):
            if label == "real_config" and not overrides:
                continue  # the defaults, already checked
            result = bindings.check_config(enc.config_class, thaw(overrides))
            if result["ok"]:
                snapshots[label] = result["snapshot"]
                continue
            for *key_path, known in result.get("unknown_keys", ()):
                self.error(where + tuple(key_path), f"{enc.config_class.rsplit('.', 1)[1]} has no field {key_path[-1]!r}",
                           hint=suggest(key_path[-1], known), code="binding", key=True)
            if "error" in result:
                self.error(where, result["error"], code="binding")
        if self.diagnostics:
            return
        geometry = {}
        for label, snapshot in snapshots.items():
            values: dict[str, int] = {}
            for name, formula in spec.geometry:
                try:
                    values[name] = formula.evaluate(values, snapshot)
                except FormulaError as exc:
                    self.diagnostics.append(self._formula_diagnostic(("geometry", name), exc, f"with {label}"))
                    return  # later configs would repeat the same complaint
            geometry[label] = values
        self._literal_geometry(spec, snapshots)
        self._evaluations(spec, geometry["defaults"])

    def _literal_geometry(self, spec: Spec, snapshots: dict[str, dict]) -> None:
        """A literal geometry value whose name is also a config field must agree with that field."""
        for name, formula in spec.geometry:
            if formula.names or formula.config_paths:
                continue
            literal = formula.evaluate({})
            for label, snapshot in snapshots.items():
                found = _config_field(snapshot, name)
                if found is not None and found[1] != literal:
                    scope, value = found
                    self.error(("geometry", name), f"geometry {name} is {literal}, but the {label} config has "
                               f"{scope}{name} = {value}", hint=f"read it from the config: config.{scope}{name}")
                    break

    def _evaluations(self, spec: Spec, geometry: dict[str, int]) -> None:
        """Formulas must evaluate to sensible values under default limits and the default config."""
        limits = {**cat.DEFAULT_LIMITS, **geometry}
        bounds = {}
        for key, formula in (("min", spec.budget_min), ("max", spec.budget_max)):
            try:
                bounds[key] = formula.evaluate(limits)
            except FormulaError as exc:
                self.diagnostics.append(self._formula_diagnostic(("budget", key), exc))
                continue
            if bounds[key] <= 0:
                self.error(("budget", key), f"{key} budget evaluates to {bounds[key]}; budgets must be > 0",
                           hint=f"with {', '.join(f'{k}={v}' for k, v in cat.DEFAULT_LIMITS.items())}")
        if len(bounds) == 2 and 0 < bounds["max"] < bounds["min"]:
            self.error(("budget", "min"), f"min budget {bounds['min']} is larger than max budget {bounds['max']}",
                       hint=f"with {', '.join(f'{k}={v}' for k, v in cat.DEFAULT_LIMITS.items())}")
        item = spec.attention_style.sample(geometry)
        sample = {**item, **geometry}
        for key, formula in (("input_size", spec.input_size), ("output_tokens", spec.output_tokens),
                             ("frames", spec.frames)):
            try:
                value = formula.evaluate(sample)
            except FormulaError as exc:
                self.diagnostics.append(self._formula_diagnostic(("items", key), exc) if key in self.data["items"]
                                        else self.loaded.diagnostic(("items",), exc.message, code="formula"))
                continue
            if value <= 0:
                self.error(("items", key), f"{key} is {value} for a sample item ({', '.join(f'{k}={v}' for k, v in item.items())}); "
                           "it must be > 0")
        if bounds.get("min", 0) <= 0:
            return  # buffer sizes depend on a valid budget
        sizes = {**cat.buffer_names(bounds["min"], 1, 1), **geometry}
        for i, buffer in enumerate(spec.buffers):
            formulas = [("value", buffer.value)] if buffer.value is not None else [
                (("shape", j), f) for j, f in enumerate(buffer.shape)]
            for where, formula in formulas:
                path = ("buffers", i) + (where if isinstance(where, tuple) else (where,))
                try:
                    value = formula.evaluate(sizes)
                except FormulaError as exc:
                    self.diagnostics.append(self._formula_diagnostic(path, exc))
                    continue
                if value <= 0:
                    self.error(path, f"evaluates to {value} for budget={sizes['budget']}, max_items=1, max_frames=1; "
                               "sizes must be > 0")


def _config_field(snapshot: dict, name: str) -> tuple[str, int] | None:
    """``(scope, value)`` of an integer config field called ``name`` (top level or vision_config), if any."""
    for scope, table in (("", snapshot), ("vision_config.", snapshot.get("vision_config"))):
        found = table.get(name) if isinstance(table, dict) else None
        if isinstance(found, list) and found and all(v == found[0] for v in found):
            found = found[0]  # (14, 14) patch sizes
        if isinstance(found, int) and not isinstance(found, bool):
            return scope, found
    return None

