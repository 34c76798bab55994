"""The end-to-end stage's messages name the step, the place and the spec field to fix (issue 26, item 7): model
code failing inside the tiny VLM, a placeholder token outside the tiny vocabulary, calls that never reached the
graphs, a feature call without feature rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support.specs import packaged
from vitcg.errors import VitcgError
from vitcg.lang.model import freeze, thaw
from vitcg.runtime.accelerate import AccelerateStats
from vitcg.tools.check import failures
from vitcg.tools.check import vlm as stage


def _qwen2_vl(**text_config):
    """The packaged qwen2_vl spec, its end-to-end stage's text_config updated with ``text_config``."""
    spec = packaged().get("qwen2_vl")
    config = thaw(spec.tests.vlm.config)
    config["text_config"] = {**config["text_config"], **text_config}
    test = dataclasses.replace(spec.tests.vlm, config=freeze(config))
    return dataclasses.replace(spec, tests=dataclasses.replace(spec.tests, vlm=test))


def test_a_placeholder_token_outside_the_tiny_vocabulary_names_the_field():
    """Was ``IndexError: index out of range in self`` from the embedding, with no stage, model or field."""
    spec = _qwen2_vl(vocab_size=1000)
    with pytest.raises(VitcgError) as raised:
        stage.check_vlm(spec)
    message = str(raised.value)
    assert "tests.vlm.placeholder: the prompt's token" in message
    assert "outside the tiny language model's vocabulary (text_config.vocab_size 1000)" in message
    assert "set tests.vlm.config.text_config.vocab_size above" in message


def test_model_code_failing_while_the_vlm_is_built_names_the_step_the_place_and_the_fields():
    spec = _qwen2_vl(hidden_act="no_such_activation")
    with pytest.raises(VitcgError) as raised:
        stage.check_vlm(spec)
    message = str(raised.value)
    assert message.startswith("building the tiny VLM failed: KeyError: ")
    assert " at activations.py:" in message
    assert "check tests.vlm.config" in message


def test_calls_that_never_reached_the_graphs_say_why():
    """Was "the VLM's calls ran the original encoder call: " with nothing after the colon."""
    spec = packaged().get("qwen2_vl")
    never = stage.not_routed(spec, AccelerateStats(), {})
    assert never.startswith("the VLM's feature calls never called model.visual.forward")
    assert "encoder.vlm_attribute and encoder.method" in never
    once = stage.not_routed(spec, AccelerateStats(calls=3, original=3), {})
    assert "called 3 times, and only the first one" in once
    reasons = stage.not_routed(spec, AccelerateStats(), {"inputs the spec does not describe: x": 2})
    assert reasons.endswith(": inputs the spec does not describe: x (2x)")


def test_a_feature_call_without_rows_names_the_call_and_the_fix(monkeypatch: pytest.MonkeyPatch):
    """Was ``TypeError: 'NoneType' object is not iterable`` (a feature call whose pooler_output is None)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    spec = packaged().get("qwen2_vl")
    model = stage.build_vlm(spec)
    monkeypatch.setattr(model.base_model, "get_image_features",
                        lambda **_: BaseModelOutputWithPooling(last_hidden_state=torch.zeros(1, 4)))
    with pytest.raises(VitcgError) as raised:
        stage._features(model, {})
    message = str(raised.value)
    assert "get_image_features returned BaseModelOutputWithPooling whose pooler_output holds NoneType" in message
    assert "(it has last_hidden_state)" in message and "tests.vlm.architecture" in message


def test_a_call_missing_a_required_argument_points_at_the_arguments_not_the_outputs():
    """Issue 37, item 6: a TypeError for a missing argument after the graphs' call said "check encoder.outputs"."""
    def forward(hidden_states, grid_thw):
        return hidden_states

    spec = packaged().get("qwen2_vl")
    with pytest.raises(VitcgError) as raised, failures.step("the feature call", stage._uncaptured(spec, {})):
        forward(torch.zeros(1))
    message = str(raised.value)
    assert "check encoder.args (the eager call) and the buffers' arg (the captured call): the call misses " \
           "'grid_thw'" in message
    assert "encoder.outputs" not in message
    with pytest.raises(VitcgError, match="check encoder.outputs"), failures.step("the feature call",
                                                                                 stage._uncaptured(spec, {})):
        raise TypeError("'NoneType' object is not subscriptable")
