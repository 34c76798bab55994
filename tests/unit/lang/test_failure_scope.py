"""Scope of a failure (DESIGN.md section 10): a broken, unreadable or missing user spec file or folder makes only
that spec unusable. The host's source (``SpecSource(host=True)``, what the vLLM plugin and
``vitcg.accelerate`` load) warns once per broken file and keeps every other spec; only asking for the broken
spec by name reports its diagnostics. ``vitcg generate`` needs every file valid (``require_valid``), and the
commands keep their own rules (a named spec works beside a broken file; a ``$VITCG_SPECS_DIR`` entry that is not
a folder is a usage
error)."""

from __future__ import annotations

import logging
import os
import pathlib
import re

import pytest

from support import REPO
from support.specs import spec_text
from vitcg.errors import SpecError, UsageError
from vitcg.lang import InvalidSpec, SpecSource, spec_folders

PACKAGED = REPO / "vitcg" / "specs"


def unparsable(path: pathlib.Path) -> int:
    path.write_text("name: clip\nmodel_types: [\n")
    return 3


def schema_invalid(path: pathlib.Path) -> int:
    text = spec_text("clip")
    path.write_text(text + "bogus_key: 1\n")
    return text.count("\n") + 1


def dangling_symlink(path: pathlib.Path) -> int:
    path.symlink_to(path.with_name("gone.yaml"))
    return 0


BREAKERS = [unparsable, schema_invalid, dangling_symlink]


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("vitcg")]


@pytest.mark.parametrize("stem", ["clip", "draft"])
@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__)
def test_a_broken_user_file_makes_only_its_spec_unusable(tmp_path, monkeypatch, caplog, breaker, stem):
    """``clip``: a broken override of a packaged spec; ``draft``: a broken spec of the user's own."""
    broken = tmp_path / f"{stem}.yaml"
    line = breaker(broken)
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = SpecSource(host=True, bindings=False)
    with caplog.at_level(logging.INFO, logger="vitcg"):
        SpecSource(host=True, bindings=False)  # a host builds a second model: no second warning
    assert "qwen2_vl" in registry and registry["qwen2_vl"].file == str(PACKAGED / "qwen2_vl.yaml")
    assert registry.find("llama", ["LlamaForCausalLM"]) is None
    assert [entry.file for entry in registry.invalid] == [str(broken)]
    assert all(isinstance(entry, InvalidSpec) for entry in registry.invalid)
    (warning,) = warnings_of(caplog)
    assert warning.levelno == logging.WARNING
    assert re.search(re.escape(str(broken)) + rf":{line}:\d+: ", warning.getMessage()), warning.getMessage()
    # asking for it by name reports its diagnostics, never "no spec named", never the packaged clip
    with pytest.raises(SpecError, match=re.escape(str(broken)) + rf":{line}:\d+: "):
        registry[stem]
    with pytest.raises(SpecError):
        registry.get(stem)
    assert stem not in registry.names
    if stem == "clip":
        # a lookup by model type cannot know the broken file's model types: it uses the packaged spec, and the
        # warning says so
        assert registry.find("llava", ["LlavaForConditionalGeneration"]).file == str(PACKAGED / "clip.yaml")
        assert str(PACKAGED / "clip.yaml") in warning.getMessage()


def test_a_source_that_must_be_whole_says_which_file_is_broken(tmp_path, monkeypatch):
    unparsable(tmp_path / "clip.yaml")
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    source = SpecSource(bindings=False)
    assert source["qwen2_vl"].name == "qwen2_vl" and not source.ok
    with pytest.raises(SpecError, match=re.escape(str(tmp_path / "clip.yaml"))):
        source.require_valid()


def test_a_later_valid_spec_replaces_an_earlier_broken_file_without_a_warning(tmp_path, monkeypatch, caplog):
    (tmp_path / "a").mkdir()
    unparsable(tmp_path / "a" / "clip.yaml")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "clip.yaml").write_text(spec_text("clip").replace("display_name: CLIP ViT (LLaVA)\n",
                                                                        "display_name: Mine\n"))
    monkeypatch.setenv("VITCG_SPECS_DIR", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = SpecSource(host=True, bindings=False)
    assert registry["clip"].display_name == "Mine" and registry.invalid == []
    assert warnings_of(caplog) == []


def test_a_missing_environment_folder_is_skipped_by_the_host_with_one_warning(tmp_path, monkeypatch, caplog):
    missing = tmp_path / "nowhere"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "qwen2_vl.yaml").write_text(spec_text("qwen2_vl").replace("display_name: Qwen2-VL\n",
                                                                      "display_name: Mine\n"))
    monkeypatch.setenv("VITCG_SPECS_DIR", os.pathsep.join([str(missing), str(mine)]))
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = SpecSource(host=True, bindings=False)
    assert registry["qwen2_vl"].display_name == "Mine" and "clip" in registry
    assert registry.find("llama", ["LlamaForCausalLM"]) is None
    (warning,) = warnings_of(caplog)
    assert "$VITCG_SPECS_DIR" in warning.getMessage() and str(missing) in warning.getMessage()
    # commands, run by the user, keep reporting it as a usage error
    with pytest.raises(UsageError, match=r"\$VITCG_SPECS_DIR names '.*nowhere', which is not a folder"):
        spec_folders()


def test_a_folder_named_like_a_spec_file_is_a_folder(tmp_path, monkeypatch, caplog):
    (tmp_path / "clip.yaml").mkdir()
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = SpecSource(host=True, bindings=False)
    assert registry["clip"].file == str(PACKAGED / "clip.yaml") and registry.invalid == []
    assert warnings_of(caplog) == []


def test_accelerates_registry_is_the_hosts(tmp_path, monkeypatch, caplog):
    from vitcg.runtime.accelerate import source_for

    unparsable(tmp_path / "clip.yaml")
    monkeypatch.setenv("VITCG_SPECS_DIR", os.pathsep.join([str(tmp_path), str(tmp_path / "nowhere")]))
    with caplog.at_level(logging.INFO, logger="vitcg"):
        registry = source_for()
    assert registry["qwen2_vl"].file == str(PACKAGED / "qwen2_vl.yaml")
    assert len(warnings_of(caplog)) == 2  # the broken file, the missing folder
    with pytest.raises(SpecError, match=re.escape(str(tmp_path / "clip.yaml"))):
        registry["clip"]
    # a folder the caller names is an explicit request: missing, it is still a usage error
    with pytest.raises(UsageError, match="no such file or folder"):
        source_for(tmp_path / "gone")


def test_a_named_spec_is_selected_beside_a_broken_file_in_the_environment_folder(tmp_path, monkeypatch):
    """What ``vitcg check qwen2_vl`` selects: the broken clip.yaml does not block it, and naming clip reports it
    (tests/acceptance/test_cli_check.py runs the command)."""
    unparsable(tmp_path / "clip.yaml")
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    (chosen,) = SpecSource().select(["qwen2_vl"])
    assert chosen.file == str(PACKAGED / "qwen2_vl.yaml")
    (broken,) = SpecSource().select(["clip"])
    assert isinstance(broken, InvalidSpec) and broken.file == str(tmp_path / "clip.yaml")
