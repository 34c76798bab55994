"""Structural rules: the JSON Schema, and one explanation per schema keyword built from jsonschema's error fields.

Like jsonschema's own keyword functions, each explanation handles one keyword. It reads only the structured
fields of the error (``validator``, ``validator_value``, ``instance``, ``absolute_path``, ``schema``,
``context``), never the English ``message``, so the wording is vitcg's own and stable across jsonschema versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from ...errors import Diagnostic, shown, suggest
from .. import catalogue as cat
from ..formulas import MAX_SOURCE_CHARS
from ..loader import LoadedYaml, Path_, sexagesimal_hint


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema shipped inside the package, its vocabulary filled in from :mod:`..catalogue` (the
    shipped file is kept identical to this by ``vitcg schema -o vitcg/lang/schema.json``; a test checks it)."""
    return cat.vocabulary_schema(json.loads(resources.files("vitcg.lang").joinpath("schema.json").read_text()))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def schema_diagnostics(loaded: LoadedYaml) -> list[Diagnostic]:
    """Every structural problem, one diagnostic each, pointing at the key or value that causes it."""
    out: list[Diagnostic] = []
    for error in _validator().iter_errors(loaded.data):
        out.extend(explain(loaded, error))
    return _dedupe(out)


def _dedupe(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    for d in diagnostics:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return sorted(out, key=lambda d: (d.line, d.col, d.path))


def explain(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """The diagnostics of one jsonschema error: its keyword's explanation, else one message built for it."""
    explainer = EXPLAINERS.get(error.validator)
    if explainer is not None:
        return explainer(loaded, error)
    return [loaded.diagnostic(tuple(error.absolute_path), message(error))]


MOVED: dict[tuple[str, ...], tuple[str, ...]] = {
    ("encoder", "tiny_config"): ("tests", "tiny_config"),
    ("encoder", "real_config"): ("tests", "real_config"),
}
"""Keys of an older spec layout -> where they live now. Such a key is not reported as unknown (with the key it
resembles) but as moved, at its own line; the key it should be is then not also reported missing."""


def _dotted(path: Path_) -> str:
    return ".".join(map(str, path))


def additional_properties(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """Each key the schema does not list, with the closest allowed key (typed maps report their values instead);
    a key of the old layout says where it moved (:data:`MOVED`)."""
    path: Path_ = tuple(error.absolute_path)
    if not isinstance(error.instance, dict):
        return [loaded.diagnostic(path, message(error))]
    allowed = list(error.schema.get("properties", {}))
    if not allowed and isinstance(error.schema.get("additionalProperties"), dict):
        return []
    out = []
    for k in error.instance:
        if k in allowed:
            continue
        moved = MOVED.get(path + (k,))
        if moved is not None:
            out.append(loaded.diagnostic(
                path + (k,), f"{_dotted(path + (k,))} moved to {_dotted(moved)}", key=True,
                hint=f"move it to {_dotted(moved)} (the {moved[-1]} key of the spec's {moved[0]}: mapping, or of "
                     "NAME.tests.yaml's top level beside the spec)"))
            continue
        out.append(loaded.diagnostic(path + (k,), f"unknown key {shown(k)}", key=True,
                                     hint=suggest(k, allowed) or (f"allowed keys: {', '.join(allowed)}" if allowed
                                                                  else None)))
    return out


def required(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """Each required key the mapping lacks (jsonschema reports them one error each; duplicates are dropped): at the
    ``remove`` entry of an inheriting spec that took it away, else at the mapping; but not one still written where
    the old layout had it (:data:`MOVED`: reported there)."""
    path: Path_ = tuple(error.absolute_path)
    present = error.instance if isinstance(error.instance, dict) else {}
    problems = []
    for k in error.validator_value:
        if k in present or _written_at_old_place(loaded, path + (k,)):
            continue
        removal = loaded.removed.get(("key", _dotted(path + (k,))))
        if removal is None:
            problems.append(loaded.diagnostic(path, f"missing required key {k!r}"))
        else:
            problems.append(loaded.at_removal(removal, path, f"missing required key {k!r}", "a spec needs it: keep "
                                              "it, or write it afresh beside the remove: list", "schema"))
    return problems


def _written_at_old_place(loaded: LoadedYaml, path: Path_) -> bool:
    for old, new in MOVED.items():
        if new == path:
            value = loaded.data
            for key in old:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                return True
    return False


def enum(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """A value outside the allowed set, listing the set and the closest member."""
    options = [str(o) for o in error.validator_value]
    return [loaded.diagnostic(tuple(error.absolute_path), f"{shown(error.instance)} is not one of: {', '.join(options)}",
                              hint=suggest(str(error.instance), options))]


def alternatives(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """anyOf / oneOf: a formula, a buffer's shape or value, else the most relevant failure of the alternatives."""
    path: Path_ = tuple(error.absolute_path)
    if error.schema is schema()["$defs"]["formula"]:
        text, hint = _not_a_formula(error.instance)
        return [loaded.diagnostic(path, text, hint=hint)]
    if error.validator == "oneOf" and path and path[0] == "buffers" and isinstance(error.instance, dict):
        has = [k for k in ("shape", "value") if k in error.instance]
        text = ("a buffer has either 'shape' (tensor) or 'value' (host integer), not both" if len(has) == 2
                else "a buffer needs 'shape' (tensor) or 'value' (host integer)")
        return [loaded.diagnostic(path, text)]
    if error.context:
        return explain(loaded, best_match(error.context))
    return [loaded.diagnostic(path, message(error))]


def _not_a_formula(value: Any) -> tuple[str, str | None]:
    """Why a value fails the formula schema, and a hint; a long formula is measured, not echoed."""
    if isinstance(value, str) and len(value) > MAX_SOURCE_CHARS:
        return (f"formula is {len(value):,} characters; formulas are limited to {MAX_SOURCE_CHARS}",
                "name its parts in geometry and use the names")
    if isinstance(value, str):
        return "formula is empty", None
    return f"{shown(value)} is not a formula (an integer or a string)", None


def min_properties(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """A mapping with too few keys (an empty one, for every minProperties of the shipped schema)."""
    path: Path_ = tuple(error.absolute_path)
    if isinstance(error.instance, dict) and not error.instance:
        return [loaded.diagnostic(path, "must not be empty")]
    return [loaded.diagnostic(path, message(error))]


def type_(loaded: LoadedYaml, error: ValidationError) -> list[Diagnostic]:
    """A value of the wrong type; a number YAML 1.1 wrote in base 60 (``1:30``), now a string, says so."""
    path: Path_ = tuple(error.absolute_path)
    wanted = [error.validator_value] if isinstance(error.validator_value, str) else error.validator_value
    hint = sexagesimal_hint(loaded, path, error.instance) if {"integer", "number"} & set(wanted) else None
    return [loaded.diagnostic(path, message(error), hint=hint)]


EXPLAINERS: dict[str, Callable[[LoadedYaml, ValidationError], list[Diagnostic]]] = {
    "type": type_,
    "additionalProperties": additional_properties,
    "required": required,
    "enum": enum,
    "anyOf": alternatives,
    "oneOf": alternatives,
    "minProperties": min_properties,
}
"""Keywords explained by more than a message at the error's path."""


def _too_short(error: ValidationError) -> str:
    return "should be non-empty" if error.validator_value == 1 else "is too short"


def _too_long(error: ValidationError) -> str:
    return "is expected to be empty" if error.validator_value == 0 else "is too long"


def _one_of(error: ValidationError) -> str:
    """Several alternatives match (jsonschema names them: the others that match, then the first)."""
    valid = [s for s in error.validator_value if _validator().evolve(schema=s).is_valid(error.instance)]
    if len(valid) < 2:
        return "is not valid under any of the given schemas"
    return "is valid under each of " + ", ".join(repr(s) for s in valid[1:] + valid[:1])


MESSAGES: dict[str, Callable[[ValidationError], str]] = {
    "type": lambda e: "is not of type " + ", ".join(
        repr(t) for t in ([e.validator_value] if isinstance(e.validator_value, str) else e.validator_value)),
    "minimum": lambda e: f"is less than the minimum of {e.validator_value!r}",
    "maximum": lambda e: f"is greater than the maximum of {e.validator_value!r}",
    "minLength": _too_short,
    "minItems": _too_short,
    "maxLength": _too_long,
    "maxItems": _too_long,
    "minProperties": lambda e: "should be non-empty" if e.validator_value == 1 else "does not have enough properties",
    "pattern": lambda e: f"does not match {e.validator_value!r}",
    "uniqueItems": lambda e: "has non-unique elements",
    "additionalProperties": lambda e: "has keys the schema does not allow",
    "anyOf": lambda e: "is not valid under any of the given schemas",
    "oneOf": _one_of,
}
"""What an error of each keyword says after the offending value's repr; the shipped schema uses all of them
(``propertyNames`` errors arrive as the ``pattern`` errors of the key, ``items`` and ``$ref`` ones as the errors
of the item or referenced schema)."""


def message(error: ValidationError) -> str:
    """The offending value and what its keyword requires; for a keyword not in MESSAGES, the keyword and its value."""
    build = MESSAGES.get(error.validator)
    if build is not None:
        return f"{shown(error.instance)} {build(error)}"
    if error.validator is None:
        return "no value is allowed here"
    return f"does not satisfy {error.validator}: {error.validator_value!r}"
