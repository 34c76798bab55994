"""``vitcg new``'s drafting pieces: names, the schema reference, and the checks before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitcg.errors import UsageError, VitcgError
from vitcg.tools import scaffold


@pytest.mark.parametrize("model_type, name", [("qwen2_vl", "qwen2_vl"), ("kosmos-2.5", "kosmos_2_5"),
                                              ("data2vec-vision", "data2vec_vision"), ("2x", "m_2x")])
def test_spec_name_is_a_valid_spec_name(model_type, name):
    assert scaffold.spec_name(model_type) == name


def test_schema_reference_is_relative_inside_the_project_and_absolute_outside(tmp_path, monkeypatch):
    repo = Path(scaffold.__file__).resolve().parents[2]
    assert scaffold.schema_reference(repo / "vitcg" / "specs" / "x.yaml") == "../lang/schema.json"
    assert scaffold.schema_reference(repo / "x.yaml") == "vitcg/lang/schema.json"
    outside = scaffold.schema_reference(tmp_path / "x.yaml")
    assert Path(outside).is_absolute() and Path(outside).is_file()
    # stdout: as for the default output, a file in the working folder
    monkeypatch.chdir(repo)
    assert scaffold.schema_reference(None) == "vitcg/lang/schema.json"
    monkeypatch.chdir(tmp_path)
    assert scaffold.schema_reference(None) == outside


def test_a_draft_that_does_not_validate_is_never_returned(monkeypatch):
    """The last guard: a rendering bug for some model type is an error naming it, not a broken file."""
    real = scaffold.render

    def broken(d, path=None, schema=None):
        lines = real(d, path, schema)
        lines.lines = [line.replace("  patch_size: config.patch_size", "  patch_size: config.no_such_field")
                       for line in lines.lines]
        return lines

    monkeypatch.setattr(scaffold, "render", broken)
    with pytest.raises(VitcgError, match=r"the draft of 'glm_ocr' does not validate, so nothing was written"
                                         r"(.|\n)*no_such_field") as info:
        scaffold.checked_draft("glm_ocr")
    assert not isinstance(info.value, UsageError)  # exit 1: a bug to report, not a misuse


def test_model_code_that_fails_is_an_error_naming_the_model_type(monkeypatch):
    def fails(model_type):
        raise KeyError("vision_config")

    monkeypatch.setattr(scaffold, "draft", fails)
    with pytest.raises(VitcgError, match=r"cannot draft 'glm_ocr': KeyError: 'vision_config'; write the spec by hand"):
        scaffold.checked_draft("glm_ocr")


def test_no_vision_sub_config_and_no_pixels_is_refused():
    with pytest.raises(UsageError, match=r"'bert' is not a vision model vitcg can draft: BertConfig has no "
                                         r"vision_config or video_config, and its model class BertModel takes "
                                         r"'input_ids' first"):
        scaffold.draft("bert")
