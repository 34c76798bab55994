"""Vacuous checks are refused (issue 26, item 4): a tiny config that skips the code under test (zero layers, layer
or feature indexes past the tiny depth) and a modality the VLM has that the spec leaves out without a reason are
`vitcg validate` diagnostics. Before, each spec below validated, and `vitcg check` compared outputs that never ran
the layers, mergers or modality in question."""

from __future__ import annotations

import pytest

from support.specs import skip_unavailable, spec_text
from vitcg.errors import Diagnostic, SpecError
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings


def problems(name: str, *edits: tuple[str, str]) -> list[Diagnostic]:
    """The diagnostics of spec ``name`` (its harness written in) after each ``(old, new)`` text edit."""
    skip_unavailable(name)
    text = spec_text(name)
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    with pytest.raises(SpecError) as caught:
        spec_from_text(text, f"{name}.yaml", Bindings())
    return caught.value.diagnostics


def line_of(name: str, needle: str) -> int:
    """The 1-based line of ``needle`` in :func:`spec_text`'s text of ``name``."""
    return next(i for i, line in enumerate(spec_text(name).splitlines(), 1) if needle in line)


def test_a_zero_layer_tower_is_refused_at_its_depth():
    (problem,) = problems("qwen2_vl", ("{depth: 2,", "{depth: 0,"))
    assert problem.path == "$.tests.tiny_config.depth" and problem.line == line_of("qwen2_vl", "{depth: 2,")
    assert problem.message == ("the tiny config builds depth = 0 layers: the tiny checks would compare outputs that "
                               "skip every layer under test")
    assert problem.hint == "set tests.tiny_config.depth to 1 or more"


def test_a_zero_layer_vision_config_of_a_vlm_config_is_refused():
    """Only the depth is reported: the feature layers it leaves nothing to select from follow from it."""
    (problem,) = problems("aya_vision", ("    num_hidden_layers: 2\n", "    num_hidden_layers: 0\n"))
    assert problem.path == "$.tests.tiny_config.vision_config.num_hidden_layers"
    assert "vision_config.num_hidden_layers = 0 layers" in problem.message


def test_deepstack_indexes_past_the_tiny_depth_are_refused():
    """The drafted tiny config of the issue: fewer layers than the deepstack indexes, so no merger ever ran."""
    (problem,) = problems("qwen3_vl", ("    deepstack_visual_indexes: [0, 1]\n", "    deepstack_visual_indexes: [1, 5]\n"))
    assert problem.path == "$.tests.tiny_config.deepstack_visual_indexes"
    assert problem.message == ("the tiny config's deepstack_visual_indexes = [1, 5] names layers [5] of a tower with "
                               "depth = 3: the deepstack merger of that layer never runs in the tiny checks")
    assert problem.hint == "set tests.tiny_config.depth to 6 or more, or deepstack_visual_indexes to layers within 0..2"


def test_default_deepstack_indexes_past_a_written_depth_point_at_the_tiny_config():
    (problem,) = problems("qwen3_vl", ("    deepstack_visual_indexes: [0, 1]\n", ""))
    assert problem.path == "$.tests.tiny_config.deepstack_visual_indexes"
    assert problem.line == line_of("qwen3_vl", "    depth: 3")  # not written: where the tiny config's mapping starts
    assert "= [8, 16, 24] names layers [8, 16, 24] of a tower with depth = 3" in problem.message


def test_an_empty_index_list_where_the_model_has_some_is_refused():
    (problem,) = problems("qwen3_vl", ("    deepstack_visual_indexes: [0, 1]\n", "    deepstack_visual_indexes: []\n"))
    assert problem.message == ("the tiny config sets deepstack_visual_indexes to [] where the model has [8, 16, 24]: "
                               "the deepstack merger of that layer never runs in the tiny checks")


def test_full_attention_blocks_past_the_tiny_depth_are_refused():
    (problem,) = problems("qwen2_5_vl", ("  depth: 4\n", "  depth: 2\n"))
    assert problem.path == "$.tests.tiny_config.fullatt_block_indexes"
    assert "names layers [3] of a tower with depth = 2: full attention of that block" in problem.message


def test_a_hidden_states_output_past_the_tiny_depth_is_refused():
    (problem,) = problems("molmo2", ("  num_hidden_layers: 7 ", "  num_hidden_layers: 5 "))
    assert problem.path == "$.tests.tiny_config.num_hidden_layers"
    assert problem.message == (
        "encoder.outputs[1] (hidden_states[-7]) selects hidden state -7: past the 6 hidden states (the embeddings' "
        "and 5 layers') of the tiny tower (num_hidden_layers = 5), so the tiny checks skip the layers the features "
        "come from")
    assert problem.hint == "set tests.tiny_config.num_hidden_layers to 7 or more"


def test_a_selection_of_the_embeddings_output_is_refused():
    """hidden_states[-2] of a one-layer tower is the embeddings' output: no layer runs before it."""
    found = problems("clip", ("  num_hidden_layers: 2\n", "  num_hidden_layers: 1\n"))
    assert [p.message.split(" selects")[0] for p in found] == ["encoder.call_kwargs.output_hidden_states",
                                                               "encoder.outputs[0] (hidden_states[-2])"]
    assert all("the embeddings' output, before every layer" in p.message for p in found)


def test_a_config_feature_layer_of_the_vision_config_is_refused():
    found = problems("phi4_multimodal", ("    num_hidden_layers: 2\n", "    num_hidden_layers: 1\n"))
    assert [p.path for p in found] == ["$.tests.tiny_config.vision_config.num_hidden_layers"]
    assert found[0].message.startswith("the tiny config's vision_config.feature_layer selects hidden state -2: the "
                                       "embeddings' output")


@pytest.mark.parametrize("name", ["molmo2", "minicpmv4_6"])
def test_a_modality_the_vlm_has_needs_a_reason_to_be_left_out(name):
    omits = next(line for line in spec_text(name).splitlines(keepends=True) if "omits:" in line)
    (problem,) = problems(name, (omits, ""))
    assert problem.path == "$.modalities" and problem.line == line_of(name, "modalities:")
    assert problem.message.endswith("has get_video_features, but the spec has no video modality: no check runs "
                                    "the VLM's videos")
    assert problem.hint == 'add modalities.video, or say why it is left out: tests.vlm.omits: {video: "the reason"}'


def test_a_reason_to_leave_out_a_declared_modality_is_refused():
    (problem,) = problems("qwen2_vl", ("  vlm:\n", '  vlm:\n    omits: {video: "videos are not checked here"}\n'))
    assert problem.path == "$.tests.vlm.omits.video"
    assert problem.message == ("tests.vlm.omits gives a reason to leave out video, but the spec declares "
                               "modalities.video")


def test_a_reason_is_a_sentence_for_a_known_modality():
    found = problems("molmo2", ('omits: {video: "get_video_features', 'omits: {video: "", x: "get_video_features'))
    assert [(p.path, p.message) for p in found] == [("$.tests.vlm.omits", "'x' is not one of: image, video"),
                                                    ("$.tests.vlm.omits.video", "'' is too short")]
