"""Issue 26's examples that no other test pinned, each one edit away from a passing packaged spec.

A spec whose ``encoder.outputs`` leaves out a field the VLM reads passes the spec stage (it is consistent with
itself) and the VLM then fails on None: a raw draft that dropped Qwen3-VL's deepstack features ended in
``TypeError: 'NoneType' object is not iterable``, and a tower captured without its merger (the projector) in
``AttributeError: 'NoneType' object has no attribute 'split'``, naming no step and no field. An escaped NUL inside a
quoted string is refused like the other control characters."""

from __future__ import annotations

import pytest
from spec_files import spec_text

from vitcg.errors import VitcgError
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings
from vitcg.lang.loader import load_text
from vitcg.tools.vlm import check_vlm

pytest.importorskip("PIL")


def edited(name: str, *edits: tuple[str, str]):
    """Spec ``name`` (its harness written in) after each ``(old, new)`` text edit, each old text found once."""
    text = spec_text(name)
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return spec_from_text(text, f"{name}.yaml", Bindings())


def test_dropped_deepstack_features_name_the_step_and_the_field():
    spec = edited("qwen3_vl",
                  ("outputs: [pooler_output, deepstack_features]", "outputs: [pooler_output]"),
                  ("config.out_hidden_size * (1 + len(config.deepstack_visual_indexes))", "config.out_hidden_size"))
    with pytest.raises(VitcgError) as raised:
        check_vlm(spec)
    message = str(raised.value)
    assert message.startswith("Qwen3VLForConditionalGeneration's feature call on the graphs' outputs failed: "
                              "TypeError: 'NoneType' object is not iterable at modeling_qwen3_vl.py:")
    assert "check encoder.outputs: the encoder's own output also sets " in message
    assert "deepstack_features, which the spec's [pooler_output] leaves out (None under the graphs)" in message


def test_a_tower_captured_without_its_merger_names_the_output_the_vlm_reads():
    spec = edited("qwen2_vl",
                  ("outputs: [pooler_output]", "outputs: [last_hidden_state]"),
                  ("out_hidden_size: config.hidden_size", "out_hidden_size: config.embed_dim"),
                  ("\nbuffers:", "\nitems:\n  output_tokens: t * h * w\n\nbuffers:"))
    with pytest.raises(VitcgError) as raised:
        check_vlm(spec)
    message = str(raised.value)
    assert message.startswith("Qwen2VLForConditionalGeneration's feature call on the graphs' outputs failed: "
                              "AttributeError: 'NoneType' object has no attribute 'split'")
    assert ("also sets pooler_output, which the spec's [last_hidden_state] leaves out (None under the graphs); "
            "capture each field the VLM reads") in message


def test_an_escaped_nul_in_a_string_is_refused_at_its_column():
    loaded, problems = load_text('name: x\ndisplay_name: "Qwen2\\0-VL"\n', "f.yaml")
    assert loaded is None and len(problems) == 1
    (problem,) = problems
    assert (problem.line, problem.col) == (2, 15)
    assert problem.message == "string holds the control character U+0000"
