"""Issue 26's examples that no other test pinned, each one edit away from a passing packaged spec.

A spec whose ``encoder.outputs`` leaves out a field the VLM reads passes the spec stage (it is consistent with
itself) and the VLM then fails on None: a raw draft that dropped Qwen3-VL's deepstack features ended in
``TypeError: 'NoneType' object is not iterable``, and a tower captured without its merger (the projector) in
``AttributeError: 'NoneType' object has no attribute 'split'``, naming no step and no field. An escaped NUL inside a
quoted string is refused like the other control characters. And every packaged spec is proven end to end or says
in ``tests.vlm.skip`` why not: `vitcg check --all` fails a spec without ``tests.vlm``, and this keeps that true
for ``vitcg/specs`` in the test suite itself, without running the end-to-end stage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from support.specs import packaged, skip_unavailable, spec_text
from vitcg.errors import SpecError, VitcgError
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings
from vitcg.lang.loader import load_text
from vitcg.tools.check.vlm import check_vlm

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
    if Version(transformers.__version__) < Version("5.23") and message.startswith("greedy generate on images "
                                                                                   "differs"):
        return  # older Qwen3-VL code (5.17) adds no deepstack residual for a None list: the draft fails, later
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
    # the place is the model's frame that read the field, not torch's split (which named functional.py before)
    assert re.search(r"'split' at modeling_qwen2_vl\.py:\d+ in get_image_features \(raised at functional\.py:\d+ "
                     r"in split\); check encoder\.outputs", message), message
    assert ("also sets pooler_output, which the spec's [last_hidden_state] leaves out (None under the graphs); "
            "capture each field the VLM reads") in message


def test_an_escaped_nul_in_a_string_is_refused_at_its_column():
    loaded, problems = load_text('name: x\ndisplay_name: "Qwen2\\0-VL"\n', "f.yaml")
    assert loaded is None and len(problems) == 1
    (problem,) = problems
    assert (problem.line, problem.col) == (2, 15)
    assert problem.message == "string holds the control character U+0000"


PACKAGED = packaged()


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


def diagnostics(name: str, *edits: tuple[str, str]):
    """The diagnostics of spec ``name`` after each ``(old, new)`` text edit (each old text found once)."""
    text = spec_text(name)
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    with pytest.raises(SpecError) as raised:
        spec_from_text(text, f"{name}.yaml", Bindings())
    return raised.value.diagnostics


def test_a_left_out_modality_and_deepstack_past_the_tiny_depth_print_in_one_run():
    """Both of the draft's wrong guesses at once: before, the modality stopped the binding rules, and the
    deepstack indexes showed only after it was fixed."""
    found = diagnostics("qwen3_vl",
                        ("  video:\n    inputs: {pixels: pixel_values_videos, grid: video_grid_thw}\n"
                         "    max_frames_per_video: 32\n", ""),
                        ('  video_placeholder: "<|vision_start|><|video_pad|><|vision_end|>"\n', ""),
                        ("    deepstack_visual_indexes: [0, 1]\n", "    deepstack_visual_indexes: [1, 5]\n"))
    assert [p.path for p in found] == ["$.modalities", "$.tests.tiny_config.deepstack_visual_indexes"]
    assert found[0].message.endswith("has get_video_features, but the spec has no video modality: no check runs "
                                     "the VLM's videos")
    assert found[1].message.startswith("the tiny config's deepstack_visual_indexes = [1, 5] names layers [5]")


SEXAGESIMAL_HINT = ("YAML 1.1 read 1:30 as a base-60 number (90); vitcg reads YAML 1.2, where it is the string "
                    "'1:30': write 90 if that is meant")


@pytest.mark.parametrize(("old", "new", "path"), [
    ("  num_video_frames: 16\n", "  num_video_frames: 1:30\n", "$.tests.num_video_frames"),
    ("max_frames_per_video: 32", "max_frames_per_video: 1:30", "$.modalities.video.max_frames_per_video"),
    ("  patch_size: config.patch_size\n", "  patch_size: 1:30\n", "$.geometry.patch_size"),
])
def test_a_yaml_1_1_base_60_number_says_it_is_a_string_now(old, new, path):
    (problem,) = diagnostics("qwen3_vl", (old, new))
    assert problem.path == path
    assert problem.hint == SEXAGESIMAL_HINT


def test_a_quoted_colon_string_gets_no_base_60_hint():
    (problem,) = diagnostics("qwen3_vl", ("  num_video_frames: 16\n", "  num_video_frames: '1:30'\n"))
    assert problem.message == "'1:30' is not of type 'integer'" and problem.hint is None


def test_a_family_draft_names_its_parent_from_the_working_folder(monkeypatch, tmp_path):
    """`vitcg new vipllava` in a checkout names vitcg/specs/clip.yaml, as docs/writing-specs.md shows; it named the
    absolute path. Outside the folder that holds the parent, the path stays absolute (nothing shorter opens it)."""
    from vitcg.tools.new import scaffold

    parent = scaffold.family_parent(scaffold.draft("vipllava")).file
    root = Path(parent).resolve().parents[2]
    for here, shown in ((root, "vitcg/specs/clip.yaml"), (tmp_path, str(Path(parent).resolve()))):
        monkeypatch.chdir(here)
        text, _ = scaffold.checked_draft("vipllava", None)
        assert f"\nextends: clip   # GUESS: {shown} describes the same tower (CLIPVisionModel from " in text


def test_radio_says_why_the_vlm_that_embeds_it_proves_nothing_here():
    """radio's skip said the Nemotron VLM that embeds the tower is not in transformers; transformers 5.23 has it
    (its vision_config is a RadioConfig), so the reason names it and why its calls do not run this spec."""
    import transformers

    config = getattr(transformers, "NemotronH_Omni_Reasoning_V3_Config", None)
    if config is None:
        pytest.skip(f"transformers {transformers.__version__} has no Nemotron-H Omni")
    assert config().vision_config.model_type == "radio"
    skip = PACKAGED.get("radio").tests.vlm.skip
    assert "not in transformers" not in skip
    assert "NemotronH_Omni_Reasoning_V3, makes this dense call only in get_video_features" in skip


def test_a_failed_case_of_a_channels_first_output_says_so_not_out_hidden_size():
    """`vitcg check`'s spec cases, not only the helper: GOT-OCR 2.0's tower captured at its neck, whose output is
    (batch, channels, h, w), with out_hidden_size the neck's channels. The manager's own message sends the user to
    out_hidden_size, the one field that is right; the failed case names the layout instead."""
    from vitcg.tools.check.cases import check_spec

    skip_unavailable("got_ocr2")
    spec = edited("got_ocr2", ("outputs: [pooler_output]", "outputs: [last_hidden_state]"),
                  ("  tokens_per_tile: ceil_div(ceil_div(grid, 2), 2) ** 2\n", "  tokens_per_tile: grid ** 2\n"),
                  ("  out_hidden_size: config.text_config.hidden_size\n",
                   "  out_hidden_size: config.vision_config.output_channels\n"))
    report = check_spec(spec)
    case = next(c for c in report.cases if c.name == "one small image")
    assert case.error.startswith("encoder output 'last_hidden_state' has shape (1, 32, 8, 8): its features lie on "
                                 "dim 1 (channels first; 32 is out_hidden_size)")
    assert "check the spec's out_hidden_size" not in case.error
