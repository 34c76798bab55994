"""Issue 26's examples that no other test pinned, each one edit away from a passing packaged spec.

A spec whose ``encoder.outputs`` leaves out a field the VLM reads passes the spec stage (it is consistent with
itself) and the VLM then fails on None: a raw draft that dropped Qwen3-VL's deepstack features ended in
``TypeError: 'NoneType' object is not iterable``, and a tower captured without its merger (the projector) in
``AttributeError: 'NoneType' object has no attribute 'split'``, naming no step and no field. An escaped NUL inside a
quoted string is refused like the other control characters. And every packaged spec is proven end to end or says
in ``tests.vlm.skip`` why not: `vitcg check --all` fails a spec without ``tests.vlm``, and this keeps that true
for ``vitcg/specs`` in the test suite itself, without running the end-to-end stage."""

from __future__ import annotations

import pytest
from spec_files import spec_text

from vitcg.errors import SpecError, VitcgError
from vitcg.lang import load_registry, spec_from_text
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


PACKAGED = load_registry()


@pytest.mark.parametrize("name", PACKAGED.names)
def test_every_packaged_spec_is_proven_end_to_end_or_says_why_not(name):
    vlm = PACKAGED.get(name).tests.vlm
    assert vlm is not None, f"{name}: no tests.vlm, so vitcg check fails it unproven; add it, or tests.vlm.skip"
    if vlm.skip is not None:
        assert len(vlm.skip.split()) >= 5, f"{name}: tests.vlm.skip is not a written reason: {vlm.skip!r}"


def test_a_skip_that_is_no_reason_is_refused():
    text = spec_text("aimv2")
    assert "skip: " in text
    start = text.index("skip: ")
    end = text.index("\n", start)
    with pytest.raises(SpecError, match=r"tests\.vlm\.skip: 'todo' is too short"):
        spec_from_text(text[:start] + "skip: todo" + text[end:], "aimv2.yaml", Bindings())
