"""The SpecSource (the front door to spec files): lookup by name with did-you-mean, by model type and architecture,
file selection, and
the folder rule (packaged specs, then $VITCG_SPECS_DIR, then the caller's folders; later ones win by name)."""

from __future__ import annotations

import logging
import os
import pathlib
import zipfile

import pytest

from support import REPO
from support.specs import spec_text
from vitcg.errors import SpecError, UsageError
from vitcg.lang import InvalidSpec, SpecSource, packaged_specs_dir, spec_folders
from vitcg.lang import folders as folders_module

PACKAGED = REPO / "vitcg" / "specs"
REGISTRY = SpecSource([PACKAGED], bindings=False)


def test_iteration_is_sorted_by_name_and_complete():
    names = [s.name for s in REGISTRY]
    assert names == sorted(names) == REGISTRY.names
    assert len(REGISTRY) == len([p for p in (REPO / "vitcg" / "specs").glob("*.yaml") if not p.name.endswith(".tests.yaml")])
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
    good = REPO / "vitcg" / "specs" / "clip.yaml"
    chosen = SpecSource([broken]).select([str(good)])
    assert [s.name for s in chosen] == ["clip"]
    assert [s.name for s in SpecSource([PACKAGED]).select(["siglip", "clip", "siglip"])] == ["siglip", "clip"]


def own_spec(folder: pathlib.Path, display_name: str, name: str = "qwen2_vl", file: str | None = None) -> pathlib.Path:
    """A copy of the packaged spec ``name`` in ``folder`` (as ``file``), with another display name."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (file or f"{name}.yaml")
    text = spec_text(name)
    path.write_text(text.replace("display_name: Qwen2-VL\n", f"display_name: {display_name}\n"))
    return path


def test_the_packaged_specs_are_the_package_folder():
    assert packaged_specs_dir() == PACKAGED
    assert spec_folders() == [PACKAGED]
    assert SpecSource(bindings=False).names == REGISTRY.names


def test_a_user_folder_replaces_a_packaged_spec_by_name_and_says_so(tmp_path, caplog):
    mine = own_spec(tmp_path / "mine", "Mine")
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = SpecSource(spec_folders([tmp_path / "mine"]), bindings=False)
    assert registry["qwen2_vl"].display_name == "Mine" and registry["qwen2_vl"].file == str(mine)
    assert registry.names == REGISTRY.names  # the other packaged specs stay
    (record,) = [r for r in caplog.records if "replaces" in r.getMessage()]
    assert record.name.startswith("vitcg") and record.levelno == logging.INFO
    assert str(mine) in record.getMessage() and str(PACKAGED / "qwen2_vl.yaml") in record.getMessage()


def test_environment_folders_come_after_the_packaged_ones_and_before_the_callers(tmp_path, monkeypatch):
    for folder in ("a", "b", "c"):
        own_spec(tmp_path / folder, f"Qwen2-VL {folder}")
    monkeypatch.setenv("VITCG_SPECS_DIR", os.pathsep.join([str(tmp_path / "b"), "", str(tmp_path / "a")]))
    assert spec_folders([tmp_path / "c"]) == [PACKAGED, tmp_path / "b", tmp_path / "a", tmp_path / "c"]
    assert SpecSource(bindings=False)["qwen2_vl"].display_name == "Qwen2-VL a"
    assert SpecSource(spec_folders([tmp_path / "c"]), bindings=False)["qwen2_vl"].display_name == "Qwen2-VL c"
    # a folder named twice keeps its later place
    assert spec_folders([tmp_path / "b"])[1:] == [tmp_path / "a", tmp_path / "b"]
    assert SpecSource(spec_folders([tmp_path / "b"]), bindings=False)["qwen2_vl"].display_name == "Qwen2-VL b"


def test_an_environment_entry_that_is_not_a_folder_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(UsageError, match=r"\$VITCG_SPECS_DIR names '.*nowhere', which is not a folder"):
        spec_folders()


def test_two_specs_of_one_name_in_one_folder_stay_an_error_naming_both(tmp_path):
    first = own_spec(tmp_path / "mine", "One", file="a.yaml")
    second = own_spec(tmp_path / "mine", "Two", file="b.yaml")
    with pytest.raises(SpecError) as info:
        SpecSource(spec_folders([tmp_path / "mine"]), bindings=False).require_valid()
    message = str(info.value)
    assert f"{second}:" in message and f"spec name 'qwen2_vl' is already used by {first}:" in message


def test_select_all_layers_the_folders_and_keeps_broken_files_as_rows(tmp_path):
    base = tmp_path / "base"
    for name in ("clip", "siglip"):
        own_spec(base, "", name=name)
    mine = own_spec(tmp_path / "mine", "", name="clip")
    (tmp_path / "mine" / "broken.yaml").write_text("name: [\n")
    chosen = SpecSource([base, tmp_path / "mine"]).all()
    assert [entry.name for entry in chosen] == ["broken", "clip", "siglip"]
    assert isinstance(chosen[0], InvalidSpec) and chosen[1].file == str(mine)
    assert SpecSource([base, tmp_path / "mine"]).select(["clip"])[0].file == str(mine)
    with pytest.raises(UsageError, match=r"no spec named 'clipp' in .*base/, .*mine/; did you mean 'clip'"):
        SpecSource([base, tmp_path / "mine"]).select(["clipp"])


def test_packaged_specs_that_are_not_a_folder_on_disk_are_a_usage_error(tmp_path, monkeypatch):
    """vitcg imported from a zip archive: importlib.resources gives no directory, and the message says so."""
    archive = tmp_path / "vitcg.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("vitcg/specs/qwen2_vl.yaml", spec_text("qwen2_vl"))
    monkeypatch.setattr(folders_module.importlib.resources, "files", lambda package: zipfile.Path(archive, "vitcg/"))
    with pytest.raises(UsageError, match=r"vitcg's packaged specs/ folder is not a directory on disk"):
        packaged_specs_dir()


def test_accelerate_takes_a_folder_a_list_of_folders_or_a_source(tmp_path):
    from vitcg.runtime.accelerate import source_for

    own_spec(tmp_path / "a", "Qwen2-VL a")
    own_spec(tmp_path / "b", "Qwen2-VL b")
    assert source_for()["qwen2_vl"].display_name == "Qwen2-VL"
    assert source_for(str(tmp_path / "a"))["qwen2_vl"].display_name == "Qwen2-VL a"
    assert source_for([tmp_path / "b", tmp_path / "a"])["qwen2_vl"].display_name == "Qwen2-VL a"
    assert source_for(REGISTRY) is REGISTRY
