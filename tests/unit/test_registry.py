"""The Registry object: lookup by name with did-you-mean, by model type and architecture, file selection."""

from __future__ import annotations

import pathlib

import pytest

from vitcg.errors import UsageError
from vitcg.lang import load_registry, select_specs

REPO = pathlib.Path(__file__).resolve().parents[2]
REGISTRY = load_registry([REPO / "specs"], bindings=False)


def test_iteration_is_sorted_by_name_and_complete():
    names = [s.name for s in REGISTRY]
    assert names == sorted(names) == REGISTRY.names
    assert len(REGISTRY) == len(list((REPO / "specs").glob("*.yaml")))
    assert "qwen2_vl" in REGISTRY and "nope" not in REGISTRY


def test_unknown_name_gets_did_you_mean():
    with pytest.raises(UsageError, match=r"no spec named 'qwen2_vll'.*did you mean 'qwen2_vl'"):
        REGISTRY["qwen2_vll"]


def test_find_by_architecture_before_model_type():
    assert REGISTRY.find(architectures=["Qwen2_5_VLForConditionalGeneration"]).name == "qwen2_5_vl"
    assert REGISTRY.find(model_type="qwen2_vl").name == "qwen2_vl"
    assert REGISTRY.find(model_type="llama", architectures=["LlamaForCausalLM"]) is None


def test_select_by_file_loads_only_that_file(tmp_path):
    broken = tmp_path / "specs"
    broken.mkdir()
    (broken / "broken.yaml").write_text("name: [\n")
    good = REPO / "specs" / "clip.yaml"
    chosen = select_specs([str(good)], specs_dir=broken)
    assert [s.name for s in chosen] == ["clip"]
    assert [s.name for s in select_specs(["siglip", "clip", "siglip"], specs_dir=REPO / "specs")] == ["siglip", "clip"]
