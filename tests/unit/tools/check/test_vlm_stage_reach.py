"""The end-to-end stage runs what it can (issue 39, item 4): a per-item feature comparison declared out of reach
(``tests.vlm.features.out_of_reach``) leaves the greedy-token comparison running, where ``tests.vlm.skip`` drops
both; the processor's other inputs that the VLM's forward names reach ``generate``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from support import REPO
from support.specs import packaged
from vitcg.errors import VitcgError
from vitcg.lang import SpecSource
from vitcg.lang.harness import Placeholder
from vitcg.tools.check import vlm as stage
from vitcg.tools.check.cases import CaseResult, SpecReport
from vitcg.tools.check.report import verdict

VALID = REPO / "tests" / "specs" / "valid"


def _features_that_differ_under_the_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The VLM's feature call gives other rows once vitcg routes it (its third call: after the VLM's own call and
    the call that learns the output layout), as a feature call that cannot be compared item by item would."""
    original, calls = stage._features, []

    def features(vlm, inputs, modality="image"):
        calls.append(modality)
        rows = original(vlm, inputs, modality)
        return [r + 1 for r in rows] if len(calls) > 2 else rows
    monkeypatch.setattr(stage, "_features", features)


def test_features_out_of_reach_still_compares_the_greedy_tokens(monkeypatch: pytest.MonkeyPatch):
    (spec,) = SpecSource.of_files([VALID / "features_out_of_reach.yaml"]).specs
    assert spec.tests.vlm.features_out_of_reach == "an example: the stage compares the greedy tokens only"
    assert spec.tests.vlm.skip is None
    _features_that_differ_under_the_graphs(monkeypatch)
    items, error, route = stage.check_vlm(spec)
    assert items == 3 and error == 0.0
    assert route.endswith("; per-item features out of reach (tests.vlm.features)"), route
    assert route.startswith("1 replays, 0 eager")  # generate reached the graphs (no feature call under them)


def test_without_it_the_features_are_compared():
    spec = packaged().get("qwen2_vl")
    assert spec.tests.vlm.features_out_of_reach is None


def test_the_feature_comparison_fails_where_it_is_in_reach(monkeypatch: pytest.MonkeyPatch):
    _features_that_differ_under_the_graphs(monkeypatch)
    with pytest.raises(VitcgError, match="image features differ from the VLM's own"):
        stage.check_vlm(packaged().get("qwen2_vl"))


def test_the_verdict_says_only_the_tokens_were_compared():
    case = CaseResult("VLM features and generate (float32)", items=3, stage="vlm", tolerance=1e-5,
                      route="2 replays, 0 eager; per-item features out of reach (tests.vlm.features)")
    report = SpecReport("x", "cpu", "float32", cases=[CaseResult("one small image", items=1, tolerance=1e-5), case])
    assert verdict(report)[1] == ("1 case, and the VLM end to end on 3 items (greedy tokens only: per-item features "
                                  "out of reach, tests.vlm.features)")


class _Kosmos25Like(torch.nn.Module):
    """A VLM whose forward takes the image size and a prompt-shaped mask of the image rows, as Kosmos-2.5's."""

    config = SimpleNamespace(image_token_id=7, boi_token_id=8, eoi_token_id=9)

    def forward(self, input_ids=None, flattened_patches=None, width=None, height=None,
                image_embeds_position_mask=None, attention_mask=None):
        raise NotImplementedError


def test_the_processors_other_inputs_the_forward_names_reach_generate():
    """Was: only get_image_features' inputs reached generate, so Kosmos-2.5's width, height and
    image_embeds_position_mask never did."""
    vlm = _Kosmos25Like()
    patches, rows_mask = torch.zeros(1, 4, 6), torch.ones(1, 4)
    made = {"flattened_patches": patches, "attention_mask": rows_mask, "width": torch.tensor([28]),
            "height": torch.tensor([14]), "rows": torch.tensor([1]), "note": "not a tensor"}
    taken = {"flattened_patches": patches}
    extra = stage.extra_inputs(vlm, made, taken)
    assert sorted(extra) == ["height", "width"]  # the processor's attention_mask is its patches', not the prompt's
    placeholder = Placeholder("image_token_id", before=("boi_token_id",), after=("eoi_token_id",))
    kwargs = stage._generate_kwargs(vlm, [(placeholder, 3, 1)], taken, "cpu", extra)
    assert kwargs["input_ids"].tolist() == [[1, 2, 3, 8, 7, 7, 7, 9, 4, 5]]
    # as Kosmos2_5Processor marks them: 1 on the image rows, -1 on the tokens around them
    assert kwargs["image_embeds_position_mask"].tolist() == [[0, 0, 0, -1, 1, 1, 1, -1, 0, 0]]
    assert kwargs["attention_mask"].tolist() == [[1] * 10]
    assert kwargs["width"].tolist() == [28] and kwargs["flattened_patches"] is patches
