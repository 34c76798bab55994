"""``layer_args`` against the encoder config: every layer type the configs list has its arguments, and every
entry of ``by_type`` is a type some config lists (MuseGlimmer's tower, whose layer_types alternate)."""

from __future__ import annotations

import shutil

import pytest

from support import REPO
from vitcg.lang import SpecSource

SPECS = REPO / "vitcg" / "specs"
UNAVAILABLE = SpecSource.of_files([SPECS / "muse_glimmer.yaml"]).specs[0].unavailable
if UNAVAILABLE:  # its bindings, where these rules run, are not checked
    pytest.skip(f"muse_glimmer is {UNAVAILABLE}", allow_module_level=True)
WINDOW = "    window_attention: {max_seqlen: max_window_seqlen}\n"


def diagnostics(tmp_path, old: str, new: str) -> list[str]:
    text = (SPECS / "muse_glimmer.yaml").read_text()
    assert old in text
    (tmp_path / "muse_glimmer.yaml").write_text(text.replace(old, new))
    shutil.copy(SPECS / "muse_glimmer.tests.yaml", tmp_path)
    return [f"{d.path}: {d.message} / {d.hint}" for d in SpecSource.of_files([tmp_path / "muse_glimmer.yaml"]).diagnostics]


def test_the_packaged_spec_covers_every_type(tmp_path):
    assert diagnostics(tmp_path, WINDOW, WINDOW) == []


def test_a_type_left_out_is_named(tmp_path):
    found = diagnostics(tmp_path, WINDOW, "")
    assert found == ["$.layer_args.by_type: config.layer_types lists layer types window_attention (defaults), which "
                     "by_type leaves out: those layers would get none of their arguments / add by_type entries for "
                     "window_attention"]


def test_a_misspelt_type_is_named_with_the_close_one(tmp_path):
    found = diagnostics(tmp_path, WINDOW, WINDOW.replace("window_attention", "window_atention"))
    assert len(found) == 2
    assert found[0].startswith("$.layer_args.by_type: config.layer_types lists layer types window_attention")
    assert found[1].startswith("$.layer_args.by_type.window_atention: no encoder config lists layer type "
                               "'window_atention' in layer_types (window_attention, full_attention)")
    assert "did you mean 'window_attention'?" in found[1]


def test_a_field_the_config_lacks_is_named(tmp_path):
    found = diagnostics(tmp_path, "types: layer_types", "types: layer_kinds")
    assert found == ["$.layer_args.types: the encoder config (defaults) has no field 'layer_kinds' / did you mean "
                     "'layer_types'?"]
