"""The end-to-end stage feeds the VLM's processor outputs to the graphs under the spec's input keys, as an engine
does: a spec whose keys are swapped or misnamed fails there (issue 26, item 3). Routing inside ``generate`` goes
by the encoder call's arguments, so before this such a spec passed both stages and failed only when served."""

from __future__ import annotations

import pytest

from support import REPO
from support.specs import spec_text
from vitcg.errors import SpecError, VitcgError
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings
from vitcg.tools.check.vlm import check_vlm

pytest.importorskip("PIL")
QWEN2_PATH = REPO / "vitcg" / "specs" / "qwen2_vl.yaml"
QWEN2 = spec_text("qwen2_vl")
IMAGE_KEYS = "inputs: {pixels: pixel_values, grid: image_grid_thw}"


def variant(image_keys: str):
    assert IMAGE_KEYS in QWEN2
    return spec_from_text(QWEN2.replace(IMAGE_KEYS, image_keys, 1), "qwen2_vl.yaml", Bindings())


def test_the_real_keys_pass():
    items, worst, _ = check_vlm(variant(IMAGE_KEYS))
    assert items >= 3 and worst <= 1e-5


def test_swapped_keys_fail_naming_the_inputs():
    with pytest.raises(VitcgError, match=r"under the spec's input keys fail: .*'image_grid_thw'.*check "
                                         r"modalities\.image\.inputs \(image_grid_thw, pixel_values\)"):
        check_vlm(variant("inputs: {pixels: image_grid_thw, grid: pixel_values}"))


def test_a_key_the_processor_does_not_make_fails_naming_it():
    with pytest.raises(VitcgError, match=r"the processor makes no 'image_grid' for images \(it makes .*"
                                         r"image_grid_thw.*\): check modalities\.image\.inputs"):
        check_vlm(variant("inputs: {pixels: pixel_values, grid: image_grid}"))


def test_a_spec_without_tests_vlm_fails_unproven():
    """Unproven is not passed (issue 26, item 1): the stage fails and says what to add."""
    text = QWEN2[:QWEN2.index("\n  vlm:")] + "\n"
    with pytest.raises(VitcgError, match=r"the spec has no tests\.vlm, so nothing proves it against the real VLM: "
                                         r"add tests\.vlm .* or tests\.vlm\.skip with the reason"):
        check_vlm(spec_from_text(text, "qwen2_vl.yaml", Bindings()))


def test_a_misspelt_architecture_is_a_validation_error_with_a_did_you_mean():
    """Before, validate passed and check reported the end-to-end stage as skipped ('has none of ...'), and the spec
    counted as passed (issue 26, item 1)."""
    text = QWEN2.replace("Qwen2VLForConditionalGeneration", "Qwen2VLForConditionalGenration")
    with pytest.raises(SpecError) as caught:
        spec_from_text(text, "qwen2_vl.yaml", Bindings())
    (problem,) = caught.value.diagnostics
    assert problem.path == "$.architectures[0]" and problem.line == 3
    assert "has no class 'Qwen2VLForConditionalGenration'" in problem.message
    assert problem.hint == "did you mean 'Qwen2VLForConditionalGeneration'?"


def test_the_checkpoints_architecture_may_differ_when_tests_vlm_names_transformers_class():
    minimax = spec_text("minimax_m3_vl")
    assert "architectures: [MiniMaxM3VLForConditionalGeneration]" in minimax  # config.json's name, not transformers'
    if spec_from_text(minimax, "minimax_m3_vl.yaml", Bindings()).unavailable:
        pytest.skip("this transformers predates minimax_m3_vl: its classes are not checked")
    with pytest.raises(SpecError, match="has no class 'MiniMaxM3SparseForConditionalGenration'"):
        spec_from_text(minimax.replace("MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3SparseForConditionalGenration"),
                       "minimax_m3_vl.yaml", Bindings())
