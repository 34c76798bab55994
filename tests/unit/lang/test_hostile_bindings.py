"""A corrupt bindings cache (issue #13) is a cache miss: ignored, recomputed and rewritten, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitcg.lang.bindings import Bindings

# Outside transformers: answered without importing anything.
CLASS = "x.Y"
ANSWER = {"ok": False, "error": "'x.Y' is outside the transformers package"}


@pytest.mark.parametrize("content", [
    "not json {",
    "[1, 2]",
    "3",
    "null",
    json.dumps({f"class:{CLASS}": {"ok": True}}),  # no 'bases'
    json.dumps({f"class:{CLASS}": {"ok": True, "bases": 7}}),
    json.dumps({f"class:{CLASS}": {"ok": True, "bases": [1, 2]}}),
    json.dumps({f"class:{CLASS}": {"ok": False}}),  # no 'error'
    json.dumps({f"class:{CLASS}": {"ok": "yes", "bases": []}}),
    json.dumps({f"class:{CLASS}": ["ok"]}),
    json.dumps({f"class:{CLASS}": None}),
], ids=["not-json", "list", "number", "null", "no-bases", "bases-int", "bases-ints", "no-error", "ok-str",
        "entry-list", "entry-null"])
@pytest.mark.filterwarnings("ignore:vitcg. ignoring the bindings cache")
def test_corrupt_cache_is_a_miss_and_is_rewritten(tmp_path: Path, monkeypatch, content: str):
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    bindings = Bindings()
    bindings.path.write_text(content)
    assert bindings.check_class(CLASS) == ANSWER
    bindings.save()
    assert json.loads(bindings.path.read_text())[f"class:{CLASS}"] == ANSWER
    assert Bindings().check_class(CLASS) == ANSWER


@pytest.mark.parametrize("key, entry", [
    ("method:x.Y:forward", {"ok": 1}),
    ("config:x.Y:{}", {"ok": True, "snapshot": []}),
    ("config:x.Y:{}", {"ok": True}),
    ("config:x.Y:{}", {"ok": False, "unknown_keys": [["a"]]}),
    ("config:x.Y:{}", {"ok": False, "unknown_keys": "a"}),
])
def test_corrupt_method_and_config_entries_are_recomputed(tmp_path: Path, key: str, entry: dict):
    bindings = Bindings(cache_dir=tmp_path)
    bindings.path.write_text(json.dumps({key: entry}))
    if key.startswith("method:"):
        assert bindings.check_method("x.Y", "forward") == {"ok": False}
    else:
        assert bindings.check_config("x.Y", {}) == ANSWER


def test_valid_entries_are_used_as_they_are(tmp_path: Path):
    bindings = Bindings(cache_dir=tmp_path)
    cached = {f"class:{CLASS}": {"ok": True, "bases": ["a.B"], "config_class": None, "sub_configs": []},
              "config:x.Y:{}": {"ok": False, "unknown_keys": [["vision_config", "depthh", ["depth"]]]}}
    bindings.path.write_text(json.dumps(cached))
    assert bindings.check_class(CLASS) == cached[f"class:{CLASS}"]
    assert bindings.check_config("x.Y", {}) == cached["config:x.Y:{}"]


def test_class_entries_without_their_config_class_are_recomputed(tmp_path: Path):
    """A cache written before class entries named the config class they are built from is a miss."""
    real = "transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLModel"
    bindings = Bindings(cache_dir=tmp_path)
    bindings.path.write_text(json.dumps({f"class:{real}": {"ok": True, "bases": ["a.B"]}}))
    fresh = bindings.check_class(real)
    assert fresh["ok"] and fresh["bases"] != ["a.B"]
    assert fresh["config_class"] == "transformers.models.qwen2_vl.configuration_qwen2_vl.Qwen2VLConfig"


def test_a_sub_config_model_type_that_is_not_a_string_is_a_config_error():
    # Found by tests/acceptance/test_fuzz.py: `model_type: {k: qwen2}` was looked up in CONFIG_MAPPING and raised.
    bindings = Bindings(use_cache=False)
    result = bindings.check_config("transformers.models.internvl.configuration_internvl.InternVLConfig",
                                   {"text_config": {"model_type": {"k": "qwen2"}, "hidden_size": 48}})
    assert result["ok"] is False
    assert result["error"].startswith("InternVLConfig(**overrides) failed: ")


# issue 27, item 5: a cache file changes no result; one that cannot be read is ignored with one warning

@pytest.mark.parametrize("content, reason", [
    ("[" * 100_000 + "]" * 100_000, "nests deeper than 32 levels"),  # RecursionError in json.loads
    (json.dumps({f"class:{CLASS}": {"ok": False, "error": "x", "deep": json.loads("[" * 31 + "]" * 31)}}),
     "nests deeper than 32 levels"),  # 33 levels: parsed, but refused before any entry is used
    ("not json {", "not JSON"),
    ("null", "expected a JSON object, got null"),
], ids=["100k-deep", "deep-entry", "not-json", "null"])
def test_an_unreadable_cache_is_ignored_with_one_warning_and_rewritten(tmp_path: Path, content: str, reason: str):
    bindings = Bindings(cache_dir=tmp_path)
    bindings.path.write_text(content)
    with pytest.warns(UserWarning, match=f"ignoring the bindings cache {bindings.path}: it {reason}|"
                                         f"ignoring the bindings cache {bindings.path}: {reason}"):
        assert bindings.check_class(CLASS) == ANSWER
    bindings.save()
    assert json.loads(bindings.path.read_text()) == {f"class:{CLASS}": ANSWER}


def test_an_oversized_cache_is_not_read(tmp_path: Path, monkeypatch):
    from vitcg.lang import bindings as module

    monkeypatch.setattr(module, "MAX_CACHE_BYTES", 1000)
    bindings = Bindings(cache_dir=tmp_path)
    bindings.path.write_text(json.dumps({f"class:{CLASS}": ANSWER, "pad": "x" * 1000}))
    with pytest.warns(UserWarning, match="holds 10[0-9]{2} bytes, over the limit of 1000"):
        assert bindings.check_class(CLASS) == ANSWER


def test_a_cache_that_is_a_folder_is_ignored(tmp_path: Path):
    bindings = Bindings(cache_dir=tmp_path)
    bindings.path.mkdir()
    with pytest.warns(UserWarning, match="it is not a regular file"):
        assert bindings.check_class(CLASS) == ANSWER
    bindings.save()  # os.replace cannot put a file over a folder: the save fails quietly, the answer stands
    assert bindings.path.is_dir()


def test_a_missing_cache_is_no_warning(tmp_path: Path, recwarn):
    assert Bindings(cache_dir=tmp_path).check_class(CLASS) == ANSWER
    assert not [w for w in recwarn if "bindings cache" in str(w.message)]


# issue 37, item 1: the cache is never written through a link, nor over a file vitcg did not write

@pytest.mark.parametrize("kind", ["link", "dangling-link", "fifo", "oversized"])
def test_a_cache_entry_vitcg_did_not_write_is_left_alone(tmp_path: Path, monkeypatch, kind: str):
    import os
    import warnings

    from vitcg.lang import bindings as module

    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.json"
    bindings = Bindings(cache_dir=tmp_path / "cache")
    bindings.path.parent.mkdir()
    if kind == "link":
        precious.write_text("{}")
        bindings.path.symlink_to(precious)
    elif kind == "dangling-link":
        bindings.path.symlink_to(precious)
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs")
        os.mkfifo(bindings.path)
    else:
        monkeypatch.setattr(module, "MAX_CACHE_BYTES", 1000)
        bindings.path.write_text(json.dumps({"pad": "x" * 1000}))
    before = os.lstat(bindings.path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert bindings.check_class(CLASS) == ANSWER
        bindings.save()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and str(bindings.path) in messages[0] and "left alone" in messages[0], messages
    after = os.lstat(bindings.path)
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)
    assert (precious.read_text() == "{}") if kind == "link" else not precious.exists()


def test_a_cache_entry_made_meanwhile_is_not_replaced(tmp_path: Path):
    """A FIFO put in place after the read (nothing there then) is refused on save, with one warning."""
    import os
    import warnings

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs")
    bindings = Bindings(cache_dir=tmp_path)
    assert bindings.check_class(CLASS) == ANSWER
    os.mkfifo(bindings.path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bindings.save()
    assert [str(w.message) for w in caught] == [f"vitcg: not writing the bindings cache: {bindings.path} is a FIFO, "
                                                f"not a file vitcg wrote: left alone"]
    assert not bindings.path.is_file()
