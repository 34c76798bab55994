"""One source for the spec vocabulary: the records of ``vitcg.lang.catalogue``.

The shipped schema, the runtime's implementations, the generated vocabulary page and the supported-models
labels all follow the records; no module outside the catalogue compares style names."""

from __future__ import annotations

import ast
import json
import pathlib

import jsonschema
import pytest

from support import REPO
from vitcg.lang import catalogue as cat
from vitcg.lang.checks import schema
from vitcg.runtime import padding, providers


def test_shipped_schema_file_carries_the_catalogue_vocabulary():
    shipped = json.loads((REPO / "vitcg" / "lang" / "schema.json").read_text())
    assert shipped == schema(), "vitcg/lang/schema.json is stale: run vitcg schema -o vitcg/lang/schema.json"


def test_schema_enums_come_from_the_records():
    props = schema()["properties"]
    assert props["attention"]["properties"]["style"]["enum"] == list(cat.STYLES)
    buffer = props["buffers"]["items"]["properties"]
    assert buffer["provider"]["enum"] == list(cat.PROVIDERS)
    assert buffer["padding"]["enum"] == list(cat.PADDINGS)
    assert set(buffer["params"]["properties"]) == {k for p in cat.PROVIDERS.values() for k in p.params}


def test_every_tensor_provider_has_exactly_one_implementation():
    wanted = {p.name for p in cat.PROVIDERS.values() if p.kind == "tensor" and not p.scoped}
    assert set(providers.PROVIDED) == wanted


def test_every_refilled_padding_rule_has_exactly_one_implementation():
    assert set(padding.PADDING_RULES) == {r.name for r in cat.PADDINGS.values() if r.refilled}


def test_dtypes_have_torch_counterparts():
    assert set(providers.DTYPES) == set(cat.DTYPES) - {"model"}


def test_records_refer_to_each_other_consistently():
    for style in cat.STYLES.values():
        assert style.segments and set(style.segments) <= set(cat.SEGMENT_DOCS)
        assert set(style.shaping) == set(cat.SHAPING_NAMES)
        for modality, formulas in style.shaping.items():
            assert list(formulas) == list(style.item_names), (style.name, modality)
        for name in style.required_providers:
            assert style.name in cat.PROVIDERS[name].styles, (style.name, name)
    for provider in cat.PROVIDERS.values():
        assert provider.styles <= set(cat.STYLES) and set(provider.paddings) <= set(cat.PADDINGS)
        assert provider.doc


@pytest.mark.parametrize("style", list(cat.STYLES.values()), ids=list(cat.STYLES))
def test_style_objects_shape_items_consistently(style):
    geometry = {"spatial_merge_size": 2, "patch_size": 14}
    image = style.check_item(0, 3, 5, geometry)
    names = style.names(image)
    assert list(names) == list(style.item_names)
    assert style.counts_fit((4, *style.empty_counts_shape()[1:]))
    assert not style.counts_fit((4, 7) if not style.segmented else (4,))


def test_generated_vocabulary_page_lists_every_record():
    page = (REPO / "registry" / "VOCABULARY.md").read_text()
    for name in [*cat.STYLES, *cat.PROVIDERS, *cat.PADDINGS]:
        assert f"| `{name}` |" in page, name


@pytest.mark.parametrize("style", list(cat.STYLES))
def test_style_defaults_are_valid_spec_parts_and_listed_on_the_page(style):
    """The defaults are spec text like any other: each buffer passes the schema's buffer entry and names a provider
    and a padding that the style allows; every formula parses over the names a spec of the style can define."""
    from vitcg.lang import schema
    from vitcg.lang.formulas import parse

    defaults = cat.STYLE_DEFAULTS[style]
    entry = {**schema()["properties"]["buffers"]["items"], "$defs": schema()["$defs"]}
    page = (REPO / "registry" / "VOCABULARY.md").read_text()
    for buffer in defaults["buffers"]:
        jsonschema.Draft202012Validator(entry).validate(buffer)
        provider = cat.PROVIDERS[buffer["provider"]]
        assert style in provider.styles and buffer["padding"] in provider.paddings, buffer
        assert f"`{buffer['name']}`: `{buffer['provider']}`" in page
    names = [*cat.STYLES[style].item_names, *cat.LIMIT_NAMES, *cat.BUFFER_NAMES, "spatial_merge_size", "patch_size",
             "in_channels", "temporal_patch_size", "tokens_per_tile", "image_size", "window_size"]
    for value in [*defaults["items"].values(), *defaults["budget"].values()]:
        parse(value, names)
    assert {"items", "budget", "buffers"} == set(defaults)
    for key, value in cat.TESTS_DEFAULTS.items():
        assert f"`{key}: {value}`" in page


def test_supported_models_labels_come_from_the_style_records():
    page = (REPO / "registry" / "SUPPORTED_MODELS.md").read_text()
    assert all(style.label in page for style in cat.STYLES.values())


def _style_comparisons(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in cat.STYLES:
                        found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_style_name_is_compared_outside_the_catalogue():
    package = REPO / "vitcg"
    found = [hit for path in sorted(package.rglob("*.py")) if path != package / "lang" / "catalogue.py"
             for hit in _style_comparisons(path)]
    assert not found, f"compare styles through vitcg.lang.catalogue.STYLES, not by name: {found}"
