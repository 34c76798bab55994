"""``layer_args``: each layer of a stack gets the host integers of its type while the fixed-shape forward runs,
and only then; a module or config that cannot say each layer's type is refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitcg.errors import SpecRuntimeError
from vitcg.lang.model import LayerArgs
from vitcg.runtime.layers import LayerCalls

BY_TYPE = {"full_attention": {"max_seqlen": "max_seqlen"}, "window_attention": {"max_seqlen": "max_window_seqlen"}}


class Layer(nn.Module):
    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def forward(self, hidden: torch.Tensor, max_seqlen: int | None = None) -> torch.Tensor:
        self.seen.append(max_seqlen)
        return hidden + 1


class Tower(nn.Module):
    """A tower whose loop passes its layers nothing but the hidden states (MuseGlimmer's passes boundaries)."""

    def __init__(self, types: list[str]):
        super().__init__()
        self.seen: list = []
        self.layers = nn.ModuleList(Layer(self.seen) for _ in types)
        self.config = type("Config", (), {"layer_types": types})()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


def test_each_layer_gets_the_value_of_its_type_inside_the_block_only():
    tower = Tower(["window_attention", "window_attention", "full_attention", "window_attention"])
    calls = LayerCalls("t", LayerArgs("layers", "layer_types", BY_TYPE), tower)
    with calls.passed({"max_seqlen": 256, "max_window_seqlen": 16, "other": 1}):
        tower(torch.zeros(2))
    assert tower.seen == [16, 16, 256, 16]
    tower.seen.clear()
    tower(torch.zeros(2))  # the eager forward is the model's own again
    assert tower.seen == [None] * 4


def test_a_value_the_forward_passes_itself_is_kept():
    tower = Tower(["full_attention"])
    calls = LayerCalls("t", LayerArgs("layers", "layer_types", BY_TYPE), tower)
    with calls.passed({"max_seqlen": 256, "max_window_seqlen": 16}):
        tower.layers[0](torch.zeros(2), max_seqlen=7)
    assert tower.seen == [7]


def test_hooks_are_removed_when_the_forward_raises():
    tower = Tower(["full_attention"])
    calls = LayerCalls("t", LayerArgs("layers", "layer_types", BY_TYPE), tower)
    with pytest.raises(RuntimeError), calls.passed({"max_seqlen": 256, "max_window_seqlen": 16}):
        raise RuntimeError("capture failed")
    assert not tower.layers[0]._forward_pre_hooks


@pytest.mark.parametrize("args, types, message", [
    (LayerArgs("layers.0", "layer_types", BY_TYPE), ["full_attention"], "is a Layer, not the nn.ModuleList"),
    (LayerArgs("layers", "kinds", BY_TYPE), ["full_attention"], "config.kinds = None does not give a type"),
    (LayerArgs("layers", "layer_types", BY_TYPE), ["full_attention", "sliding"], "layer types sliding that"),
])
def test_a_stack_without_a_type_per_layer_is_refused(args, types, message):
    tower = Tower(types)
    with pytest.raises(SpecRuntimeError, match=message):
        LayerCalls("t", args, tower)
