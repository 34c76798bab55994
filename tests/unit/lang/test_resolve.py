"""Resolution (``vitcg.lang.resolve``): ``extends``, the ``NAME.tests.yaml`` harness and the language's defaults;
what merges how, where a diagnostic points, and the errors of a chain that cannot resolve."""

from __future__ import annotations

import json

import pytest

from support.specs import copy_spec, spec_text
from vitcg.lang import SpecSource, resolve_file, resolver
from vitcg.lang import catalogue as cat
from vitcg.lang.resolve import merge


def resolved(folder, name):
    loaded, problems = resolve_file(folder / f"{name}.yaml")
    assert not problems, [d.format() for d in problems]
    return loaded


def child(folder, text: str, name: str = "child"):
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_child_merges_mappings_by_key_buffers_by_name_and_replaces_other_lists(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    child(tmp_path, "name: child\nextends: qwen2_vl\nmodel_types: [kid]\n"
                    "geometry:\n  in_channels: 4\n"
                    "buffers:\n"
                    "  - {name: max_seqlen, value: budget}\n"
                    "  - {name: position_ids, remove: true}\n"
                    "  - {name: extra, provider: aligned, shape: [budget], padding: zeros}\n")
    parent, kid = resolved(tmp_path, "qwen2_vl").data, resolved(tmp_path, "child").data
    assert kid["name"] == "child" and "extends" not in kid
    assert kid["model_types"] == ["kid"]                           # a list is replaced
    assert kid["geometry"] == {**parent["geometry"], "in_channels": 4}  # a mapping merges, order kept
    names = [b["name"] for b in kid["buffers"]]
    assert names == [b["name"] for b in parent["buffers"] if b["name"] != "position_ids"] + ["extra"]
    seqlen = next(b for b in kid["buffers"] if b["name"] == "max_seqlen")
    assert seqlen == {**next(b for b in parent["buffers"] if b["name"] == "max_seqlen"), "value": "budget"}
    assert kid["tests"] == parent["tests"]                          # the harness file is inherited too


def test_writing_shape_drops_an_inherited_value_and_the_other_way_round():
    from vitcg.lang.loader import load_text
    base, _ = load_text("buffers:\n  - {name: a, value: budget, padding: fixed}\n", "base.yaml")
    over, _ = load_text("buffers:\n  - {name: a, shape: [budget]}\n", "over.yaml")
    merged, problems = merge(base, over)
    assert not problems
    assert merged.data["buffers"] == [{"name": "a", "padding": "fixed", "shape": ["budget"]}]


def test_a_diagnostic_points_at_the_file_and_line_that_wrote_the_value(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    # the child renames the eager call's pixel argument; the buffer that passes the old name is the parent's
    path = child(tmp_path, "name: child\nextends: qwen2_vl\n"
                           "encoder:\n  args: {pixel_values: pixels, grid_thw: grid}\n")
    result = SpecSource.of_files([path], bindings=False)
    (d,) = result.diagnostics
    parent = tmp_path / "qwen2_vl.yaml"
    assert d.file == str(parent) and d.via == str(path) and d.path == "$.buffers[0].arg"
    assert d.line == parent.read_text().splitlines().index("  - {name: pixel_values, arg: hidden_states}") + 1
    assert d.format().startswith(f"{parent}:{d.line}:") and f"(checking {path})" in d.format()
    assert result.invalid_files == [str(path)]
    assert SpecSource.of_files([parent], bindings=False).ok


def test_a_default_value_names_the_default_and_how_to_replace_it():
    text = spec_text("clip").replace("  tokens_per_tile: (image_size // patch_size) ** 2 + 1   # patches + CLS\n", "")
    loaded, problems = resolver().resolve_text(text, "clip.yaml")
    assert not problems
    from vitcg.lang.checks import check
    spec, found = check(loaded, None)
    assert spec is None
    style_line = text.splitlines().index("  style: tiles") + 1
    item = next(d for d in found if d.path == "$.items.output_tokens")
    assert item.message == "unknown name 'tokens_per_tile'" and item.line == style_line
    assert "the 'tiles' style's default: write items.output_tokens in the spec to replace it" in item.hint


def test_a_harness_file_is_the_tests_section_and_may_not_be_written_twice(tmp_path):
    copy_spec("clip", tmp_path)
    loaded = resolved(tmp_path, "clip")
    assert loaded.data["tests"]["tiny_config"]["num_hidden_layers"] == 2
    assert loaded.file_of(("tests", "tiny_config")) == str(tmp_path / "clip.tests.yaml")
    (tmp_path / "clip.yaml").write_text((tmp_path / "clip.yaml").read_text() + "tests: {budgets: [64]}\n")
    _, problems = resolve_file(tmp_path / "clip.yaml")
    assert [d.message for d in problems] == [f"the harness is written twice: here and in {tmp_path / 'clip.tests.yaml'}"]
    assert SpecSource.of_files([tmp_path], bindings=False).files == [str(tmp_path / "clip.yaml")]  # not a spec of its own


def test_an_error_in_the_harness_file_names_it_and_the_spec(tmp_path):
    copy_spec("clip", tmp_path)
    harness = tmp_path / "clip.tests.yaml"
    harness.write_text(harness.read_text().replace("marks: [core_model]", "marks: [core_model]\nbudget: [1]"))
    result = SpecSource.of_files([tmp_path], bindings=False)
    (d,) = result.diagnostics
    assert d.file == str(harness) and d.via == str(tmp_path / "clip.yaml") and d.message == "unknown key 'budget'"
    assert result.invalid_files == [str(tmp_path / "clip.yaml")]


@pytest.mark.parametrize(("text", "message"), [
    ("name: child\nextends: nowhere\n", "no spec named 'nowhere' to extend"),
    ("name: child\nextends: [a]\n", "extends names one spec, not ['a']"),
    ("name: child\nextends: ../qwen2_vl\n", "no spec named '../qwen2_vl' to extend"),
    ("extends: qwen2_vl\n", "a spec that extends another states its own name"),
    ("name: child\nextends: child\n", "extends cycle: child -> child"),
    ("name: child\nextends: qwen2_vl\nbuffers:\n  - {name: nothing, remove: true}\n",
     "no inherited buffer named 'nothing' to remove"),
    ("name: child\nextends: qwen2_vl\nbuffers:\n  - {name: cu_seqlens, remove: true, shape: [1]}\n",
     "remove takes the value true and stands alone with the buffer's name (found also: shape)"),
])
def test_a_chain_that_cannot_resolve_says_why(tmp_path, text, message):
    copy_spec("qwen2_vl", tmp_path)
    _, problems = resolve_file(child(tmp_path, text))
    assert [d.message for d in problems] == [message]
    assert problems[0].file == str(tmp_path / "child.yaml") and problems[0].code == "extends"


def test_a_misspelt_parent_gets_a_did_you_mean(tmp_path):
    _, problems = resolve_file(child(tmp_path, "name: child\nextends: qwen3_vll\n"))
    assert [(d.message, d.hint) for d in problems] == [("no spec named 'qwen3_vll' to extend", "did you mean 'qwen3_vl'?")]


def test_cycles_and_invalid_parents_are_errors_at_the_extends_line(tmp_path):
    child(tmp_path, "name: a\nextends: b\n", "a")
    child(tmp_path, "name: b\nextends: a\n", "b")
    _, problems = resolve_file(tmp_path / "a.yaml")
    assert problems and problems[0].line == 2
    assert "extends cycle: a -> b -> a" in problems[0].message or "'b'" in problems[0].message
    copy_spec("qwen2_vl", tmp_path)
    parent = tmp_path / "qwen2_vl.yaml"
    parent.write_text(parent.read_text().replace("style: packed", "style: bogus"))
    _, problems = resolve_file(child(tmp_path, "name: child\nextends: qwen2_vl\n"))
    (d,) = problems
    assert d.message.startswith("the parent spec 'qwen2_vl'") and "does not validate (" in d.message
    assert d.hint.startswith(f"vitcg validate {parent}")


def test_a_parent_found_by_file_name_must_carry_that_name(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    (tmp_path / "other.yaml").write_text((tmp_path / "qwen2_vl.yaml").read_text())
    (tmp_path / "other.tests.yaml").write_text((tmp_path / "qwen2_vl.tests.yaml").read_text())
    _, problems = resolve_file(child(tmp_path, "name: child\nextends: other\n"))
    assert [d.message for d in problems] == [f"{tmp_path / 'other.yaml'} is named 'qwen2_vl', not 'other'"]


def test_a_packaged_parent_serves_a_spec_in_another_folder(tmp_path):
    path = child(tmp_path, "name: my_qwen\nextends: qwen2_vl\ndisplay_name: Mine\n")
    result = SpecSource.of_files([path])
    assert result.ok, [d.format() for d in result.diagnostics]
    assert result.specs[0].name == "my_qwen" and result.specs[0].display_name == "Mine"


def test_style_defaults_fill_what_a_spec_leaves_out_and_remove_drops_one():
    text = spec_text("clip")
    loaded, _ = resolver().resolve_text(text, "clip.yaml")
    tiles = cat.STYLE_DEFAULTS["tiles"]
    assert loaded.data["items"] == tiles["items"] and loaded.data["budget"] == tiles["budget"]
    assert loaded.data["buffers"] == tiles["buffers"]
    assert loaded.data["tests"]["budgets"] == cat.TESTS_DEFAULTS["budgets"]
    assert loaded.data["tests"]["max_model_len"] == 4096  # written: the default does not replace it
    scoped = spec_text("siglip2")
    loaded, _ = resolver().resolve_text(scoped, "siglip2.yaml")
    assert [b["provider"] for b in loaded.data["buffers"]] == ["scope_arg", "scope_arg"]  # no pixels default


def test_validate_resolved_prints_the_flattened_spec(tmp_path):
    from typer.testing import CliRunner

    from vitcg.cli import app
    copy_spec("qwen2_vl", tmp_path)
    path = child(tmp_path, "name: child\nextends: qwen2_vl\n")
    result = CliRunner().invoke(app, ["validate", "--resolved", "--json", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)[str(path)]
    assert data["name"] == "child" and data["buffers"] == resolved(tmp_path, "qwen2_vl").data["buffers"]
    result = CliRunner().invoke(app, ["validate", "--resolved", str(child(tmp_path, "name: c\nextends: no\n", "c"))])
    assert result.exit_code == 1 and "no spec named 'no' to extend" in result.output


def test_remove_drops_keys_the_parent_holds(tmp_path):
    copy_spec("pixtral", tmp_path)
    parent = resolved(tmp_path, "pixtral").data
    assert "output_hidden_states" in parent["encoder"]["call_kwargs"] and parent["tests"]["real_config"]
    child(tmp_path, "name: child\nextends: pixtral\nremove: [encoder.call_kwargs.output_hidden_states, tests.real_config]\n"
                    "encoder:\n  outputs: [last_hidden_state]\n")
    kid = resolved(tmp_path, "child").data
    assert "output_hidden_states" not in kid["encoder"]["call_kwargs"] and "real_config" not in kid["tests"]
    assert kid["encoder"]["outputs"] == ["last_hidden_state"] and "remove" not in kid
    assert resolved(tmp_path, "pixtral").data == parent  # the parent itself is untouched


@pytest.mark.parametrize(("text", "message"), [
    ("name: child\nextends: pixtral\nremove: [encoder.nothing]\n", "the parent holds no key 'encoder.nothing' to remove"),
    ("name: child\nextends: pixtral\nremove: encoder\n", "remove lists dotted key paths, not 'encoder'"),
    ("name: child\nremove: [encoder]\n", "remove drops keys a spec inherits; this spec extends none"),
])
def test_a_remove_that_cannot_apply_says_why(tmp_path, text, message):
    copy_spec("pixtral", tmp_path)
    _, problems = resolve_file(child(tmp_path, text))
    assert [d.message for d in problems] == [message] and problems[0].code == "extends"


# issue 37, item 2: spec, parent and harness files are regular files, and a link that leaves the spec's folder is
# refused naming the link, never echoing what it points at
SECRET = "sekrit:*:19000:0:99999:7:::\n"


def outside_secret(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text(SECRET)
    folder = tmp_path / "specs"
    folder.mkdir()
    return folder, secret


@pytest.mark.parametrize("role", ["spec", "parent", "harness"])
def test_a_link_that_leaves_the_spec_folder_is_refused_naming_the_link(tmp_path, role):
    folder, secret = outside_secret(tmp_path)
    copy_spec("qwen2_vl", folder)
    if role == "spec":
        link = folder / "child.yaml"
        link.symlink_to(secret)
    elif role == "parent":
        child(folder, "name: child\nextends: par\n")
        link = folder / "par.yaml"
        link.symlink_to(secret)
    else:
        child(folder, "name: child\nextends: qwen2_vl\n")
        link = folder / "child.tests.yaml"
        link.symlink_to(secret)
    result = SpecSource.of_files([folder / "child.yaml"], bindings=False)
    text = "\n".join(d.format() for d in result.diagnostics)
    assert str(link) in text and "outside" in text, text
    assert "sekrit" not in text and "19000" not in text
    assert result.invalid_files == [str(folder / "child.yaml")]


def test_a_link_inside_the_spec_folder_is_followed(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    (tmp_path / "alias.yaml").symlink_to(tmp_path / "qwen2_vl.yaml")
    (tmp_path / "alias.tests.yaml").symlink_to("qwen2_vl.tests.yaml")  # relative: inside the folder too
    child(tmp_path, "name: child\nextends: alias\n")
    _, problems = resolve_file(tmp_path / "child.yaml")
    assert [d.message for d in problems] == [f"{tmp_path / 'alias.yaml'} is named 'qwen2_vl', not 'alias'"]


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling", "device"])
@pytest.mark.parametrize("role", ["parent", "harness"])
def test_a_parent_or_harness_that_is_not_a_regular_file_says_what_it_is(tmp_path, kind, role):
    import os
    copy_spec("qwen2_vl", tmp_path)
    child(tmp_path, "name: child\nextends: " + ("par" if role == "parent" else "qwen2_vl") + "\n")
    path = tmp_path / ("par.yaml" if role == "parent" else "child.tests.yaml")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(tmp_path / "gone.yaml")
    else:
        (tmp_path / "dev").symlink_to("/dev")  # a device reached inside the folder's own tree is still refused
        path.symlink_to(tmp_path / "dev" / "zero")
    _, problems = resolve_file(tmp_path / "child.yaml")
    text = "\n".join(d.format() for d in problems)
    assert problems and str(path) in text and "did you mean" not in text, text
    want = {"fifo": "a FIFO", "folder": "a folder", "device": "outside",
            "dangling": "which does not exist"}[kind]  # the file is a link to '.../gone.yaml', which does not exist
    assert want in text.lower() or want in text, text


def test_a_tests_yml_harness_is_loaded_like_a_tests_yaml_one(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    child(tmp_path, "name: child\nextends: qwen2_vl\n")
    (tmp_path / "child.tests.yml").write_text("max_model_len: 1234\nbudgets: [64]\n")
    loaded = resolved(tmp_path, "child")
    assert loaded.data["tests"]["max_model_len"] == 1234 and loaded.data["tests"]["budgets"] == [64]
    assert loaded.file_of(("tests", "budgets")) == str(tmp_path / "child.tests.yml")
    assert SpecSource.of_files([tmp_path], bindings=False).files == [str(tmp_path / "child.yaml"),
                                                                      str(tmp_path / "qwen2_vl.yaml")]
    (tmp_path / "child.tests.yaml").write_text("max_model_len: 99\n")
    _, problems = resolve_file(tmp_path / "child.yaml")
    assert [d.message for d in problems] == ["the harness is written twice: in child.tests.yaml and child.tests.yml"]
    assert problems[0].file == str(tmp_path / "child.yaml")


def test_the_chain_limit_fails_only_the_file_whose_own_chain_is_too_long_whatever_was_loaded_first(tmp_path):
    from vitcg.lang.resolve import MAX_CHAIN
    copy_spec("qwen2_vl", tmp_path)
    parent = "qwen2_vl"
    for i in range(1, MAX_CHAIN + 2):  # c1 .. c9: c7 is the last in a chain of 8 specs
        child(tmp_path, f"name: c{i}\nextends: {parent}\n", f"c{i}")
        parent = f"c{i}"

    def invalid(order):
        resolving = resolver()
        results = {name: resolving.resolve_file(tmp_path / f"{name}.yaml") for name in order}
        return sorted(name for name, (loaded, problems) in results.items() if problems), results

    names = [f"c{i}" for i in range(1, MAX_CHAIN + 2)]
    for order in (names, names[::-1]):
        bad, results = invalid(order)
        assert bad == [f"c{MAX_CHAIN}", f"c{MAX_CHAIN + 1}"], order
        (d,) = results[f"c{MAX_CHAIN}"][1]
        assert d.file == str(tmp_path / f"c{MAX_CHAIN}.yaml") and d.line == 2
        assert d.message.startswith(f"extends chain longer than {MAX_CHAIN} specs")
    assert SpecSource.of_files([tmp_path], bindings=False).invalid_files == [str(tmp_path / f"c{n}.yaml") for n in (8, 9)]


def test_a_two_spec_cycle_is_named_as_a_cycle_from_either_file(tmp_path):
    child(tmp_path, "name: a\nextends: b\n", "a")
    child(tmp_path, "name: b\nextends: a\n", "b")
    resolving = resolver()
    for name, cycle in (("a", "a -> b -> a"), ("b", "b -> a -> b")):
        _, problems = resolving.resolve_file(tmp_path / f"{name}.yaml")
        assert [(d.file, d.line, d.message) for d in problems] == [
            (str(tmp_path / f"{name}.yaml"), 2, f"extends cycle: {cycle}")], name
    for name, cycle in (("b", "b -> a -> b"), ("a", "a -> b -> a")):  # each alone, the other first
        _, problems = resolver().resolve_file(tmp_path / f"{name}.yaml")
        assert [d.message for d in problems] == [f"extends cycle: {cycle}"]


# issue 37, item 6: a spec that validates runs its own cases: what the captured method needs is passed
@pytest.mark.parametrize(("text", "line", "where", "path"), [
    ("name: child\nextends: qwen2_vl\nbuffers:\n  - {name: grid_thw, remove: true}\n", 4, "child", "$.buffers"),
    ("name: child\nextends: qwen2_vl\nremove: [encoder.args.grid_thw]\n", 3, "child", "$.encoder.args"),
])
def test_an_argument_the_encoder_call_needs_is_a_validate_error_where_it_was_removed(tmp_path, text, line, where, path):
    copy_spec("qwen2_vl", tmp_path)
    spec = child(tmp_path, text)
    result = SpecSource.of_files([spec])
    messages = [d.format() for d in result.diagnostics]
    (d,) = result.diagnostics
    assert (d.file, d.line, d.path, d.code) == (str(tmp_path / f"{where}.yaml"), line, path, "binding"), messages
    assert "'grid_thw'" in d.message and "forward" in d.message


def test_encoder_args_without_a_required_argument_is_an_error_at_encoder_args(tmp_path):
    text = spec_text("qwen2_vl").replace("args: {hidden_states: pixels, grid_thw: grid}", "args: {hidden_states: pixels}")
    path = copy_spec("qwen2_vl", tmp_path, text)
    result = SpecSource.of_files([path])
    (d,) = result.diagnostics
    line = text.splitlines().index("  args: {hidden_states: pixels}") + 1
    assert (d.file, d.line, d.path) == (str(path), line, "$.encoder.args") and "'grid_thw'" in d.message
    assert "encoder.args" in d.hint and "outputs" not in d.hint


def test_a_childs_own_encoder_args_without_a_required_argument_is_an_error_at_its_args(tmp_path):
    """The override form: the parent's args removed whole and written afresh without grid_thw."""
    copy_spec("qwen2_vl", tmp_path)
    spec = child(tmp_path, "name: child\nextends: qwen2_vl\nremove: [encoder.args]\nencoder:\n"
                           "  args: {hidden_states: pixels}\n")
    (d,) = SpecSource.of_files([spec]).diagnostics
    assert (d.file, d.line, d.path, d.code) == (str(spec), 5, "$.encoder.args", "binding")
    assert d.message.endswith("needs the argument 'grid_thw', which the eager call does not pass")


def test_a_required_key_removed_and_not_written_afresh_is_an_error_at_the_remove_entry(tmp_path):
    """It pointed at the parent's encoder: line, a file the user need not change."""
    copy_spec("qwen2_vl", tmp_path)
    spec = child(tmp_path, "name: child\nextends: qwen2_vl\nremove: [encoder.args]\n")
    (d,) = SpecSource.of_files([spec], bindings=False).diagnostics
    assert (d.file, d.line, d.path, d.message) == (str(spec), 3, "$.encoder", "missing required key 'args' (removed here)")


def test_a_child_whose_class_needs_more_than_its_inherited_args_is_an_error_at_its_class(tmp_path):
    copy_spec("siglip", tmp_path)  # pixel_values only; Siglip2VisionModel needs two more
    spec = child(tmp_path, "name: child\nextends: siglip\nencoder:\n"
                           "  class: transformers.models.siglip2.modeling_siglip2.Siglip2VisionModel\n"
                           "  config_class: transformers.models.siglip2.configuration_siglip2.Siglip2VisionConfig\n")
    problems = [d for d in SpecSource.of_files([spec]).diagnostics if "needs the argument" in d.message]
    assert problems and {(d.file, d.line) for d in problems} == {(str(spec), 4)}, [d.format() for d in problems]


def test_remove_entries_that_repeat_or_run_long_are_named_briefly(tmp_path):
    copy_spec("pixtral", tmp_path)
    long = "encoder." + "x" * 10_000
    _, problems = resolve_file(child(tmp_path, f"name: child\nextends: pixtral\nremove: [{long}]\n"))
    (d,) = problems
    assert len(d.format()) < 600 and d.message.startswith("the parent holds no key 'encoder.xxx")
    _, problems = resolve_file(child(tmp_path, "name: child\nextends: pixtral\nremove:\n"
                                               "  - encoder.call_kwargs.output_hidden_states\n"
                                               "  - encoder.call_kwargs.output_hidden_states\n"))
    assert [(d.line, d.message) for d in problems] == [
        (5, "'encoder.call_kwargs.output_hidden_states' is removed twice (first at remove[0])")]


def test_budgets_of_the_harness_are_bounded(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    (tmp_path / "child.tests.yaml").write_text("budgets: [64, 100000000000000000000000]\n")
    result = SpecSource.of_files([child(tmp_path, "name: child\nextends: qwen2_vl\n")], bindings=False)
    (d,) = result.diagnostics
    assert (d.file, d.line, d.path) == (str(tmp_path / "child.tests.yaml"), 1, "$.tests.budgets[1]")
    assert "maximum of 1048576" in d.message


def test_buffer_errors_in_a_child_point_at_its_own_entries(tmp_path):
    copy_spec("qwen2_vl", tmp_path)
    path = child(tmp_path, "name: child\nextends: qwen2_vl\nbuffers:\n"
                           "  - {name: extra, provider: aligned, shape: [budget], padding: bogus}\n")
    result = SpecSource.of_files([path], bindings=False)
    d = next(d for d in result.diagnostics if "bogus" in d.message)
    assert (d.file, d.line, d.path) == (str(path), 4, "$.buffers[0].padding") and d.via is None  # not buffers[5]


def test_buffer_rules_in_a_child_show_its_own_index_and_name_the_parents_entry_by_its_file(tmp_path):
    """Issue 37, item 7: a child's buffer errors printed the merged index ($.buffers[5] for the file's first entry),
    and a clash with an inherited buffer named that one by its merged index too, in no file."""
    parent = child(tmp_path, "name: par\nextends: qwen2_vl\nbuffers:\n"
                             "  - {name: cu2, provider: cu_seqlens, shape: [max_segments + 2], padding: trailing_segment}\n"
                             "  - {name: cu_seqlens, remove: true}\n", "par")
    copy_spec("qwen2_vl", tmp_path)
    path = child(tmp_path, "name: child\nextends: par\nbuffers:\n"
                           "  - {name: position_ids, shape: [budget * spatial_merge_size ** 2, 2]}\n"
                           "  - {name: other, arg: cu2, provider: aligned, shape: [budget], padding: zeros}\n")
    result = SpecSource.of_files([path], bindings=False)
    clash = next(d for d in result.diagnostics if "already used" in d.message)
    assert (clash.file, clash.line, clash.path) == (str(path), 5, "$.buffers[1].arg")
    assert clash.message == f"buffer arg 'cu2' is already used by buffers[0] of {parent}:4, buffer 'cu2'"
    role = next(d for d in result.diagnostics if "params.role" in d.message)
    assert (role.line, role.path) == (5, "$.buffers[1].params")
    default = next(d for d in SpecSource.of_files([child(tmp_path, "name: c2\nextends: qwen2_vl\nbuffers:\n"
                   "  - {name: g2, arg: grid_thw, provider: aligned, shape: [budget], padding: zeros}\n", "c2")],
                                              bindings=False).diagnostics if "already used" in d.message)
    style = spec_text("qwen2_vl").splitlines().index("  style: packed") + 1
    assert default.path == "$.buffers[0].arg" and default.message == (
        "buffer arg 'grid_thw' is already used by the 'packed' style's default "
        f"({tmp_path / 'qwen2_vl.yaml'}:{style} chose it), buffer 'grid_thw'")


def test_a_cycle_through_a_file_named_like_a_packaged_spec_names_the_file_it_stands_in_for(tmp_path):
    """Two drafts of vitcg new in one folder: clip.yaml extends llava_next, meaning vitcg/specs/llava_next.yaml,
    but llava_next.yaml beside it is found first, and it extends clip, found beside it as well. The hint says which
    file stands in for which."""
    from vitcg.lang import packaged_specs_dir

    child(tmp_path, "name: clip\nextends: llava_next\n", "clip")
    child(tmp_path, "name: llava_next\nextends: clip\n", "llava_next")
    _, problems = resolve_file(tmp_path / "clip.yaml")
    (d,) = problems
    assert (d.line, d.message) == (2, "extends cycle: clip -> llava_next -> clip")
    assert d.hint.startswith(f"llava_next.yaml beside clip.yaml stands in for {packaged_specs_dir() / 'llava_next.yaml'} "
                             "(a parent is looked up beside the file first)"), d.hint


def test_a_text_about_to_be_written_resolves_as_the_file_it_will_be(tmp_path):
    """spec_from_text(..., at=PATH) (vitcg new's check before it writes): a spec beside PATH that extends PATH's name
    would find the new file, so a cycle through it is an error before the file exists, not after."""
    from vitcg.errors import SpecError
    from vitcg.lang import spec_from_text

    child(tmp_path, "name: llava_next\nextends: clip\n", "llava_next")
    text = "name: clip\nextends: llava_next\n"
    with pytest.raises(SpecError, match="extends cycle: clip -> llava_next -> clip"):
        spec_from_text(text, str(tmp_path / "clip.yaml"), at=tmp_path / "clip.yaml")
    loaded, problems = resolver().resolve_text(text, "clip.yaml", at=tmp_path / "elsewhere" / "clip.yaml")
    assert not problems and loaded.data["name"] == "clip"  # in another folder the packaged llava_next is found
