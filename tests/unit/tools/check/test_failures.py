"""Spec-stage and end-to-end failures name the step, the model file and line, and the spec field most likely at
fault (issue 39, item 3): one wording for both stages (vitcg/tools/check/failures.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support import REPO
from support.specs import packaged
from vitcg.lang import SpecSource
from vitcg.lang.model import freeze, thaw
from vitcg.tools.check import vlm as stage
from vitcg.tools.check.cases import check_spec
from vitcg.tools.check.failures import StepFailed, describe, step

FAILS = REPO / "tests" / "specs" / "check_fails"


def _with_vlm_config(name: str, **config):
    """The packaged spec ``name``, its end-to-end stage's VLM config updated with ``config`` (one level deep)."""
    spec = packaged().get(name)
    merged = thaw(spec.tests.vlm.config)
    for key, value in config.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    test = dataclasses.replace(spec.tests.vlm, config=freeze(merged))
    return dataclasses.replace(spec, tests=dataclasses.replace(spec.tests, vlm=test))


def _check_vlm(spec) -> None:
    """The end-to-end stage of ``spec``; the test is skipped where this transformers cannot build its VLM."""
    try:
        stage.check_vlm(spec)
    except stage.Unavailable as exc:
        pytest.skip(str(exc))


def test_a_validator_message_is_kept_whole_and_placed_at_the_validator():
    """Was "Class validation error for validator 'validate_architecture': at dataclasses.py:253": the validator's
    own message (its second line) dropped, and the place inside huggingface_hub."""
    spec = _with_vlm_config("clip", vision_config={"num_attention_heads": 5})
    with pytest.raises(StepFailed) as raised:
        _check_vlm(spec)
    message = str(raised.value)
    assert message.startswith("building the tiny VLM failed: StrictDataclassClassValidationError: Class validation "
                              "error for validator 'validate_architecture': ValueError: The hidden size (64) is not a "
                              "multiple of the number of attention heads (5). at configuration_clip.py:")
    assert " in validate_architecture (raised at " in message
    assert message.endswith("; check tests.vlm.config (its text_config: fields the config class derives from "
                            "num_hidden_layers, such as layer_types and rope_parameters) and the spec's tiny vision "
                            "config")


def test_a_token_id_past_the_tiny_vocabulary_names_the_ids_and_the_fields():
    """Was ``IndexError: index out of range in self`` from the embedding lookup of a placeholder token id (128060)
    outside a tiny vocabulary (128): nothing said which ids, or which spec field puts them in the prompt."""
    spec = _with_vlm_config("qwen2_vl", text_config={"vocab_size": 128}, image_token_id=128060,
                            vision_start_token_id=10, vision_end_token_id=11)
    with pytest.raises(StepFailed) as raised:
        _check_vlm(spec)
    message = str(raised.value)
    assert message.startswith("greedy generate on the tiny Qwen2VLForConditionalGeneration failed: IndexError: "
                              "index out of range in self at modeling_qwen2_vl.py:")
    assert ("(raised at functional.py:" in message and "in embedding): token ids >= the embedding's vocabulary size "
            "128: 128060 (image_token_id = 128060); check tests.vlm.placeholder (it puts image_token_id, "
            "vision_start_token_id, vision_end_token_id in the prompt) against tests.vlm.config: set "
            "text_config.vocab_size above the largest id, or those token fields below it") in message


def test_rows_of_the_wrong_width_name_the_step_the_layer_and_the_fields_that_shape_them():
    """Was "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1338x448 and 768x64)" (kosmos_2_5's draft),
    bare: no step, no model line, no spec field."""
    (spec,) = SpecSource.of_files([FAILS / "wrong_pixel_width.yaml"]).specs
    report = check_spec(spec)
    error = report.cases[0].error
    assert error.startswith("the graphs failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x192 and "
                            "768x64) at modeling_siglip2.py:")
    assert error.endswith("in forward): the rows reaching this layer are 192 wide, its weight takes 768; check the "
                          "pixel rows' shape (tests.inputs.pixels, else the pixel buffer's shape in buffers) against "
                          "geometry (patch_size, in_channels, image_size) and tests.tiny_config")


def test_an_encoder_that_cannot_be_built_names_the_step_the_model_line_and_the_config():
    (spec,) = SpecSource.of_files([FAILS / "config_not_built.yaml"], bindings=False).specs
    report = check_spec(spec)
    assert report.error.startswith("building the tiny encoder failed: AttributeError: 'Qwen2VLVisionConfig' object "
                                   "has no attribute 'vision_config' at modeling_")
    assert report.error.endswith("; check tests.tiny_config against encoder.config_class (a value its validators "
                                 "refuse, or a field it derives from others) and encoder.class")


def test_the_same_wording_in_both_stages():
    with pytest.raises(StepFailed) as raised, step("a step", "a.field"):
        torch.nn.Linear(4, 2)(torch.zeros(3, 5))
    assert str(raised.value).startswith("a step failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                                        "(3x5 and 4x2) at ")
    assert str(raised.value).endswith(": the rows reaching this layer are 5 wide, its weight takes 4; check a.field")
    assert describe(raised.value) == str(raised.value)  # a step's failure is reported as it is, not re-typed
    assert describe(ValueError("x" * 2000)).endswith("...") and len(describe(ValueError("x " * 2000))) < 1020
