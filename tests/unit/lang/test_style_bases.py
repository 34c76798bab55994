"""The style bases (issue 39, item 6): the language's defaults are YAML files a user can open
(``vitcg/lang/styles/``), every spec of a style extends its base implicitly or by ``extends: _STYLE``, ``vitcg
validate --resolved`` names them, one merge rule serves every layer, and a base is never a model spec."""

from __future__ import annotations

import fnmatch
import importlib.resources
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest

from support import REPO
from support.specs import SPECS, copy_spec, spec_text
from vitcg.lang import SpecSource, bases, discover, resolve_file, resolver, schema, spec_folders
from vitcg.lang import catalogue as cat
from vitcg.lang.loader import load_file, load_text
from vitcg.lang.resolve import merge

ROOTS = sorted(p.stem for p in SPECS.glob("*.yaml")
               if not p.name.endswith(".tests.yaml") and not re.search(r"^extends:", p.read_text(), re.M))


def test_every_style_has_a_base_and_every_base_is_a_file_of_the_installed_package():
    assert set(bases.NAMES) == {"_spec", *(f"_{s}" for s in cat.STYLES)}
    installed = importlib.resources.files("vitcg") / "lang" / "styles"
    assert sorted(p.name for p in installed.iterdir() if p.name.endswith(".yaml")) == sorted(
        f"{n}.yaml" for n in bases.NAMES)
    for name in bases.NAMES:
        assert bases.file(name).is_file() and bases.file(name) == Path(str(installed / f"{name}.yaml"))


def test_the_wheel_ships_the_bases():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["vitcg"]
    for name in bases.NAMES:
        inside = bases.file(name).relative_to(REPO / "vitcg").as_posix()
        assert any(fnmatch.fnmatch(inside, p) for p in patterns), inside


@pytest.mark.parametrize("name", bases.NAMES)
def test_a_base_is_a_valid_spec_fragment(name):
    """Each base loads as a spec file does, holds only top-level keys a spec may write (``extends`` a base), and
    each of its sections passes the schema of that section."""
    loaded, problems = load_file(bases.file(name))
    assert not problems and isinstance(loaded.data, dict)
    spec_schema = schema()
    keys = set(loaded.data) - {"extends"}
    assert keys and keys <= set(spec_schema["properties"]), keys
    assert loaded.data.get("extends") in (None, *bases.NAMES)
    resolved = bases.data(name)
    for key, value in resolved.items():
        section = {**spec_schema["properties"][key], "$defs": spec_schema["$defs"]}
        section.pop("required", None)  # a fragment: tests holds only what every harness gets
        jsonschema.Draft202012Validator(section).validate(value)
    text = bases.file(name).read_text()
    assert text.startswith("# "), "a base opens with a comment saying what it is"


def test_the_catalogue_reads_its_defaults_from_the_bases():
    for style in cat.STYLES:
        assert dict(cat.STYLE_DEFAULTS[style]) == {k: v for k, v in bases.data(f"_{style}").items() if k != "tests"}
    assert dict(cat.TESTS_DEFAULTS) == bases.data("_spec")["tests"] == {"budgets": [1024, 2048, 4096],
                                                                        "max_model_len": 8192}
    windowed = [b["name"] for b in cat.STYLE_DEFAULTS["windowed"]["buffers"]]  # _windowed extends _packed
    assert windowed == [b["name"] for b in cat.STYLE_DEFAULTS["packed"]["buffers"]] + [
        "window_index", "cu_window_seqlens", "max_window_seqlen"]


def _explicit(text: str, base: str) -> str:
    return re.sub(r"^(name: .*\n)", rf"\1extends: {base}\n", text, count=1, flags=re.M)


@pytest.mark.parametrize("name", ROOTS)
def test_writing_the_style_base_out_resolves_to_the_same_spec(name):
    """Every packaged spec that extends none resolves the same with ``extends: _STYLE`` written out (graph-scoped
    and tiles specs included)."""
    text = spec_text(name)
    implicit, problems = resolver().resolve_text(text, f"{name}.yaml")
    assert not problems
    base = bases.for_style(implicit.data["attention"]["style"])
    assert base != "_spec"
    explicit, problems = resolver().resolve_text(_explicit(text, base), f"{name}.yaml")
    assert not problems, [d.format() for d in problems]
    assert explicit.data == implicit.data
    assert list(explicit.data) == list(implicit.data)


def test_validate_resolved_names_the_chain_down_to_the_bases(tmp_path):
    from typer.testing import CliRunner

    from vitcg.cli import app
    copy_spec("qwen2_vl", tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nextends: qwen2_vl\n")
    result = CliRunner().invoke(app, ["validate", "--resolved", str(child), str(SPECS / "qwen2_5_vl.yaml")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"# extends: qwen2_vl ({tmp_path / 'qwen2_vl.yaml'}) -> _packed ({bases.file('_packed')}) -> _spec " \
           f"({bases.file('_spec')})" in lines
    assert f"# extends: _windowed ({bases.file('_windowed')}) -> _packed ({bases.file('_packed')}) -> _spec " \
           f"({bases.file('_spec')})" in lines
    assert resolver().ancestry(child) == ()  # a resolver tells only what it resolved


def test_an_explicit_base_anchors_its_defaults_at_the_extends_line():
    text = _explicit(spec_text("clip").replace(
        "  tokens_per_tile: (image_size // patch_size) ** 2 + 1   # patches + CLS\n", ""), "_tiles")
    loaded, problems = resolver().resolve_text(text, "clip.yaml")
    assert not problems
    from vitcg.lang.checks import check
    _, found = check(loaded, None)
    item = next(d for d in found if d.path == "$.items.output_tokens")
    assert item.line == 2 and "the 'tiles' style's default" in item.hint  # line 2: extends: _tiles


@pytest.mark.parametrize(("base", "message"), [
    ("_tiles", "_tiles holds the tiles style's defaults, but attention.style is 'packed'"),
    ("_pakced", "no spec named '_pakced' to extend"),
])
def test_a_base_of_another_style_or_a_misspelt_one_is_an_error_at_extends(base, message):
    _, problems = resolver().resolve_text(_explicit(spec_text("qwen2_vl"), base), "q.yaml")
    assert [(d.line, d.message, d.code) for d in problems] == [(2, message, "extends")]
    assert problems[0].hint.startswith("extends: _packed" if base == "_tiles" else "did you mean '_packed'?")


def test_extends_spec_gives_the_harness_defaults_only():
    text = _explicit(spec_text("qwen2_vl"), "_spec")
    loaded, problems = resolver().resolve_text(text, "q.yaml")
    assert not problems
    assert loaded.data["tests"]["budgets"] == [1024, 2048, 4096]
    assert "budget" not in loaded.data and [b["name"] for b in loaded.data["buffers"]] == ["pixel_values"]


def test_remove_takes_keys_out_of_an_explicit_base():
    text = _explicit(spec_text("qwen2_vl"), "_packed").replace("extends: _packed\n",
                                                               "extends: _packed\nremove: [budget]\n")
    text += "budget: {min: 128, max: 4096}\n"
    loaded, problems = resolver().resolve_text(text, "q.yaml")
    assert not problems and loaded.data["budget"] == {"min": 128, "max": 4096}


# The one merge rule, per kind of value
def _merged(base: str, over: str) -> dict:
    b, _ = load_text(base, "base.yaml")
    o, _ = load_text(over, "over.yaml")
    out, problems = merge(b, o)
    assert not problems, [d.format() for d in problems]
    return out.data


def test_a_mapping_merges_key_by_key_in_the_bases_order():
    assert _merged("m: {a: 1, b: {c: 2, d: 3}}\n", "m: {b: {d: 4, e: 5}, f: 6}\n") == {
        "m": {"a": 1, "b": {"c": 2, "d": 4, "e": 5}, "f": 6}}


@pytest.mark.parametrize(("base", "over", "want"), [
    ("a: [1, 2]\n", "a: [3]\n", [3]),                                        # a list
    ("a: [{name: x, k: 1}]\n", "a: [{name: x, j: 2}]\n", [{"name": "x", "j": 2}]),  # named entries outside buffers
    ("a: 1\n", "a: two\n", "two"),                                           # a scalar
    ("a: {b: 1}\n", "a: null\n", None),                                      # a scalar replaces a mapping
    ("a: 1\n", "a: {b: 1}\n", {"b": 1}),                                     # and a mapping a scalar
])
def test_every_other_value_is_replaced(base, over, want):
    assert _merged(base, over)["a"] == want


def test_buffers_merge_entry_by_entry_by_name():
    base = ("buffers:\n  - {name: a, provider: aligned, shape: [1], padding: zeros}\n"
            "  - {name: b, provider: aligned, shape: [2], padding: zeros}\n"
            "  - {name: c, provider: aligned, shape: [3], padding: zeros}\n")
    over = "buffers:\n  - {name: d, provider: aligned, shape: [4]}\n  - {name: b, shape: [5]}\n  - {name: c, remove: true}\n"
    assert _merged(base, over)["buffers"] == [
        {"name": "a", "provider": "aligned", "shape": [1], "padding": "zeros"},
        {"name": "b", "provider": "aligned", "shape": [5], "padding": "zeros"},   # merged, in the inherited place
        {"name": "d", "provider": "aligned", "shape": [4]}]                       # c dropped, d appended


def test_shape_and_value_count_as_one_key_of_a_buffer():
    base = "buffers:\n  - {name: a, value: budget, padding: fixed}\n  - {name: b, shape: [1], padding: zeros}\n"
    over = "buffers:\n  - {name: a, shape: [budget]}\n  - {name: b, value: '2'}\n"
    assert _merged(base, over)["buffers"] == [{"name": "a", "padding": "fixed", "shape": ["budget"]},
                                              {"name": "b", "padding": "zeros", "value": "2"}]


def test_a_new_buffer_of_a_one_buffer_provider_replaces_the_inherited_one_at_every_layer():
    base = ("buffers:\n  - {name: grid_thw, provider: grid, shape: [1], padding: zeros}\n"
            "  - {name: extra, provider: aligned, shape: [1], padding: zeros}\n")
    replaced = _merged(base, "buffers:\n  - {name: sizes, provider: grid, shape: [2], padding: zeros}\n"
                             "  - {name: more, provider: aligned, shape: [2], padding: zeros}\n")["buffers"]
    assert [b["name"] for b in replaced] == ["extra", "sizes", "more"]  # aligned fills many: extra stays
    named = _merged(base, "buffers:\n  - {name: sizes, provider: grid, shape: [2], padding: zeros}\n"
                          "  - {name: grid_thw, remove: true}\n")["buffers"]
    assert [b["name"] for b in named] == ["extra", "sizes"]  # the file names grid_thw: it removes it itself


def test_a_child_may_replace_its_parents_grid_buffer_by_provider(tmp_path):
    """Before, only a spec over its style's defaults could; over a parent it was two grid buffers, an error."""
    copy_spec("qwen2_vl", tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nextends: qwen2_vl\nbuffers:\n"
                     "  - {name: grid2, arg: grid_thw, provider: grid, shape: [max_items + 1, 3], padding: zeros}\n")
    loaded, problems = resolve_file(child)
    assert not problems
    grid = [b for b in loaded.data["buffers"] if b["provider"] == "grid"]
    assert [b["name"] for b in grid] == ["grid2"]
    assert SpecSource.of_files([child], bindings=False).ok


def test_a_base_is_never_offered_as_a_model_spec():
    folders = spec_folders()
    files = discover(folders)
    assert not any(bases.folder() in f.parents or f.name.startswith("_") for f in files)
    source = SpecSource.of_files(folders, bindings=False)
    assert not any(s.name.startswith("_") for s in source.specs)
    assert len(source.specs) == len([p for p in SPECS.glob("*.yaml") if not p.name.endswith(".tests.yaml")])
    rendered = (REPO / "registry" / "SUPPORTED_MODELS.md").read_text()
    assert not any(f"`{name}`" in rendered for name in bases.NAMES)
