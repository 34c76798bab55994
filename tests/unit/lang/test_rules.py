"""Rule functions called one at a time on small inputs: what each reports, where, and what it lets pass."""

from __future__ import annotations

import jsonschema
import pytest

from support.specs import spec_text
from vitcg.lang import catalogue as cat
from vitcg.lang import resolver
from vitcg.lang.checks import check
from vitcg.lang.model import Buffer, Modality
from vitcg.lang.rules import buffers as buf
from vitcg.lang.rules import modalities as mod
from vitcg.lang.rules import tests as tst
from vitcg.lang.rules.schema import explain, message

PACKED, TILES = cat.STYLES["packed"], cat.STYLES["tiles"]
QWEN2_VL = spec_text("qwen2_vl")


def loaded_from(text: str):
    """``text`` read and resolved (the language's defaults merged in), as checks see a spec."""
    loaded, problems = resolver().resolve_text(text, "f.yaml")
    assert not problems
    return loaded


def messages(diagnostics) -> list[str]:
    return [d.message for d in diagnostics]


BUFFERS = """\
buffers:
  - {name: pixel_values, arg: hidden_states, provider: pixels, shape: [budget, 8], padding: zeros}
  - {name: grid_thw, provider: grid, shape: [max_items, 3], padding: zeros}
  - {name: pixel_values, provider: grid, shape: [max_items, 3], padding: zeros}
"""


def test_duplicate_buffer_name_and_provider_point_at_the_later_entry():
    loaded = loaded_from(BUFFERS)
    found = list(buf.unique_buffers(loaded, loaded.data["buffers"]))
    assert messages(found) == ["buffer name 'pixel_values' is already used by buffers[0] (line 2)",
                               "buffer provider 'grid' is already used by buffers[1] (line 3), buffer 'grid_thw'"]
    assert [(d.path, d.line) for d in found] == [("$.buffers[2].name", 4), ("$.buffers[2].provider", 4)]
    assert all(d.code == "semantic" for d in found)


def test_unique_buffers_pass_and_shared_providers_may_repeat():
    loaded = loaded_from(BUFFERS)
    assert not list(buf.unique_buffers(loaded, loaded.data["buffers"][:2]))
    aligned = [{"name": f"m{i}", "provider": "aligned", "padding": "zeros", "shape": [1]} for i in range(2)]
    assert not list(buf.unique_buffers(loaded, aligned))


def test_provider_not_serving_the_style():
    loaded = loaded_from("buffers:\n  - {name: cu, provider: cu_seqlens, shape: [3], padding: trailing_segment}\n")
    entry = loaded.data["buffers"][0]
    found = list(buf.provider_serves_style(loaded, 0, entry, TILES))
    assert messages(found) == ["provider 'cu_seqlens' does not apply to tiles style"]
    assert found[0].path == "$.buffers[0].provider" and found[0].hint == "it serves: packed, windowed"
    assert not list(buf.provider_serves_style(loaded, 0, entry, PACKED))


def test_missing_required_providers_unless_graph_scoped():
    loaded = loaded_from(BUFFERS)
    entries = loaded.data["buffers"][:2]
    found = list(buf.required_providers(loaded, entries, PACKED, scoped=False))
    assert messages(found) == ["packed style needs a buffer filled by provider 'cu_seqlens'",
                               "packed style needs a buffer filled by provider 'max_seqlen'"]
    assert {d.path for d in found} == {"$.buffers"}
    assert not list(buf.required_providers(loaded, entries, PACKED, scoped=True))
    assert not list(buf.required_providers(loaded, entries, TILES, scoped=False))


def test_host_provider_with_shape_and_tensor_provider_with_value():
    loaded = loaded_from("buffers:\n  - {name: m, provider: max_seqlen, shape: [1], padding: fixed}\n"
                         "  - {name: p, provider: pixels, value: 1, padding: zeros}\n")
    entries = loaded.data["buffers"]
    assert messages(buf.host_or_tensor(loaded, 0, entries[0])) == [
        "'max_seqlen' is a host integer fixed at capture: give 'value', not 'shape'"]
    assert messages(buf.host_or_tensor(loaded, 1, entries[1])) == [
        "'pixels' is a tensor buffer: give 'shape', not 'value'"]


def test_params_padding_and_rows_dim():
    loaded = loaded_from("buffers:\n  - name: s\n    provider: scope_arg\n    shape: [budget]\n    padding: fixed\n"
                         "    params: {rows_dim: 2, role: x}\n")
    entry = loaded.data["buffers"][0]
    params = list(buf.params_allowed(loaded, 0, entry))
    assert messages(params) == ["provider 'scope_arg' takes no param 'role'"]
    assert params[0].hint == "its params: dtype, rows_dim" and params[0].line == 6
    assert messages(buf.rows_dim_in_range(loaded, 0, entry)) == ["rows_dim 2 is beyond the buffer's 1 dimensions"]
    assert messages(buf.host_or_tensor(loaded, 0, entry)) == [
        "a host integer ('value') has padding 'fixed', a tensor ('shape') does not"]
    assert not list(buf.padding_allowed(loaded, 0, entry))


def test_tuple_argument_gaps():
    loaded = loaded_from("buffers: []\n")

    def scoped(arg: str) -> Buffer:
        return Buffer(arg, arg, "scope_arg", None, None, "zeros", {})

    assert not list(buf.tuple_args_complete(loaded, [scoped("x.0"), scoped("x.1")]))
    assert messages(buf.tuple_args_complete(loaded, [scoped("x.0"), scoped("x.2")])) == [
        "tuple argument 'x' has elements [0, 2]; give x.0 to x.1 without gaps"]


def test_pixels_buffer_arg_must_match_the_eager_call():
    loaded = loaded_from(BUFFERS)
    entries = loaded.data["buffers"][:2]
    built = [Buffer(e["name"], buf.buffer_arg(e), e["provider"], (), None, "zeros", {}) for e in entries]
    found = list(buf.eager_args_agree(loaded, entries, built, {"x": "pixels", "grid_thw": "grid"}, PACKED))
    assert messages(found) == [
        "the pixels buffer is passed as 'hidden_states', but the eager call passes pixels as 'x'"]
    assert found[0].path == "$.buffers[0].arg" and found[0].hint == "arg: x"


def test_modality_roles_and_input_keys():
    loaded = loaded_from("modalities:\n  image: {inputs: {pixels: pv, tiles: pv}}\n")
    entries = loaded.data["modalities"]
    assert messages(mod.modality_roles_present(loaded, "image", entries["image"], PACKED)) == [
        "packed style needs input role 'grid'"]
    applies = list(mod.modality_roles_apply(loaded, "image", entries["image"], PACKED))
    assert messages(applies) == ["input role 'tiles' does not apply to packed style"]
    assert messages(mod.input_keys_unique(loaded, entries)) == ["input key 'pv' is already used by image.pixels"]
    assert not list(mod.modality_roles_present(loaded, "image", entries["image"], TILES))


def test_tests_section_rules():
    loaded = loaded_from("tests:\n  prompt_template: 'no field'\n  video_placeholder: v\n"
                         "  inputs: {maks: {shape: [1]}}\n")
    t = loaded.data["tests"]
    image = [Modality("image", {"pixels": "pv", "grid": "g", "mask": "m"}, 1)]
    assert messages(tst.prompt_has_question(loaded, t)) == ["prompt_template needs a {question} field"]
    assert messages(tst.video_placeholder_matches(loaded, t, image)) == ["the spec has no video modality"]
    unknown = list(tst.example_roles_exist(loaded, t, image))
    assert messages(unknown) == ["'maks' is not an input role of the modalities"]
    assert unknown[0].hint == "did you mean 'mask'?"
    assert messages(tst.examples_cover_roles(loaded, t, image, scoped=False)) == [
        "tests.inputs must say how to build input role 'mask' for vitcg check"]


def schema_errors(schema: dict, instance) -> list[jsonschema.ValidationError]:
    return list(jsonschema.Draft202012Validator(schema).iter_errors(instance))


def test_required_names_each_missing_key_from_the_structured_fields():
    loaded = loaded_from("a: 1\n")
    errors = schema_errors({"required": ["a", "b", "c"]}, loaded.data)
    assert len(errors) == 2
    for error in errors:
        error.message = "unrelated text with a 'quote'"
        assert messages(explain(loaded, error)) == ["missing required key 'b'", "missing required key 'c'"]


def test_required_through_the_shipped_schema():
    text = "# a comment line\n" + QWEN2_VL.replace("display_name: Qwen2-VL\n", "")
    spec, found = check(loaded_from(text), None)
    assert spec is None
    assert [(d.message, d.line, d.code) for d in found] == [("missing required key 'display_name'", 2, "schema")]


@pytest.mark.parametrize(("schema", "instance", "expected"), [
    ({"type": "integer"}, "x", "'x' is not of type 'integer'"),
    ({"type": ["integer", "string"]}, 1.5, "1.5 is not of type 'integer', 'string'"),
    ({"minimum": 1}, 0, "0 is less than the minimum of 1"),
    ({"maximum": 3}, 4, "4 is greater than the maximum of 3"),
    ({"minLength": 1}, "", "'' should be non-empty"),
    ({"minLength": 3}, "ab", "'ab' is too short"),
    ({"maxLength": 2}, "abc", "'abc' is too long"),
    ({"pattern": "^[a-z]+$"}, "Ab", "'Ab' does not match '^[a-z]+$'"),
    ({"minItems": 1}, [], "[] should be non-empty"),
    ({"maxItems": 1}, [1, 2], "[1, 2] is too long"),
    ({"uniqueItems": True}, [1, 1], "[1, 1] has non-unique elements"),
    ({"minProperties": 2}, {"a": 1}, "{'a': 1} does not have enough properties"),
    ({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, "s",
     "'s' is valid under each of {'required': ['b']}, {'required': ['a']}"),
])
def test_messages_are_built_per_keyword(schema, instance, expected):
    (error,) = schema_errors(schema, instance)
    error.message = "ignored"
    assert message(error) == expected


def test_unlisted_keyword_falls_back_to_keyword_and_value():
    (error,) = schema_errors({"multipleOf": 3}, 4)
    assert message(error) == "does not satisfy multipleOf: 3"


def test_a_type_error_from_the_shipped_schema_keeps_its_wording():
    text = QWEN2_VL.replace("\ntests:\n", "\ntests:\n  max_model_len: lots\n")
    spec, found = check(loaded_from(text), None)
    assert spec is None
    assert [d.message for d in found] == ["'lots' is not of type 'integer'"]
    assert found[0].path == "$.tests.max_model_len"


def test_check_reports_a_missing_required_provider():
    text = QWEN2_VL.replace("\nbuffers:\n", "\nbuffers:\n  - {name: cu_seqlens, remove: true}\n")
    spec, found = check(loaded_from(text), None)
    assert spec is None
    assert messages(found) == ["packed style needs a buffer filled by provider 'cu_seqlens'"]
    assert check(loaded_from(QWEN2_VL), None)[0] is not None


def test_long_values_are_measured_or_cut_never_echoed_whole():
    long_list = "[" + ", ".join(["1"] * 2000) + "]"
    text = (QWEN2_VL
            .replace("  segments: frame", "  segments: " + "f" * 5000)
            .replace("\nbuffers:\n", f"\nbudget:\n  min: {long_list}\n  max: {'+'.join(['1'] * 1000)}\n\nbuffers:\n")
            + "z" * 1000 + ": 1\n")
    spec, diagnostics = check(loaded_from(text), None)
    assert spec is None
    assert [d.path for d in diagnostics] == ["$.attention.segments", "$.budget.min", "$.budget.max", "$['" + "z" * 56 + "...]"]
    assert messages(diagnostics)[1:3] == ["[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,... is not a formula "
                                          "(an integer or a string)",
                                          "formula is 1,999 characters; formulas are limited to 400"]
    assert all(len(m) < 120 for m in messages(diagnostics)), messages(diagnostics)
