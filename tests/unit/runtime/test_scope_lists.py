"""A list or tuple argument of a scoped call (issue 26, item 7): the message says how to carry it (one
``scope_arg`` buffer per element, ``arg: NAME.0`` ...), and a list where a buffer expects one tensor is refused by
name. Before, the first said "add a scope_arg buffer for it", and following that advice ended in
``AttributeError: 'list' object has no attribute 'movedim'``."""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged, spec_text
from vitcg.errors import SpecRuntimeError
from vitcg.lang import spec_from_text
from vitcg.runtime.scope import Scope
from vitcg.tools.encoders import build_encoder

PIXTRAL = spec_text("pixtral")
ROTARY = PIXTRAL[PIXTRAL.index("  - name: rotary_cos\n"):PIXTRAL.index("\ndocs:")]


@pytest.fixture(scope="module")
def tower():
    return build_encoder(packaged()["pixtral"])


def scope_of(tower, rotary_buffers: str) -> Scope:
    return Scope(spec_from_text(PIXTRAL.replace(ROTARY, rotary_buffers), "pixtral.yaml"), tower)


def call_layer_0(scope: Scope, position_embeddings) -> None:
    """The first layer of the stack called as the tower calls it, its answer a replay that must not be reached."""
    rows = 8
    hidden = torch.zeros(1, rows, scope.target[0].feed_forward.gate_proj.in_features)
    mask = torch.zeros(1, 1, rows, rows)

    def replay(values):
        raise AssertionError(f"replayed with {sorted(values)}")

    scope.run(lambda: scope.layers[0](hidden, mask, position_embeddings=position_embeddings), replay)


def test_a_list_argument_no_buffer_carries_names_one_buffer_per_element(tower):
    scope = scope_of(tower, "")
    with pytest.raises(SpecRuntimeError) as caught:
        call_layer_0(scope, [torch.zeros(8, 16), torch.zeros(8, 16)])
    assert str(caught.value) == (
        "pixtral: the scoped call passes position_embeddings=a list of 2 elements, which no buffer carries (the graph "
        "would silently ignore it); add one scope_arg buffer per element (arg: position_embeddings.0 ... "
        "position_embeddings.1)")


def test_an_element_left_out_names_its_own_arg(tower):
    scope = scope_of(tower, ROTARY.split("  - name: rotary_sin")[0])
    with pytest.raises(SpecRuntimeError, match=r"passes position_embeddings\.1=Tensor, which no buffer carries .*; "
                                               r"add a scope_arg buffer for it \(arg: position_embeddings\.1\)$"):
        call_layer_0(scope, (torch.zeros(8, 16), torch.zeros(8, 16)))


def test_a_list_for_a_buffers_own_arg_is_refused_by_name(tower):
    one = ("  - name: rotary\n    arg: position_embeddings\n    provider: scope_arg\n    shape: [budget, 2, head_dim]\n"
           "    padding: zeros\n    params: {rows_dim: 1}\n")
    scope = scope_of(tower, one)
    with pytest.raises(SpecRuntimeError) as caught:
        call_layer_0(scope, (torch.zeros(8, 16), torch.zeros(8, 16)))
    assert str(caught.value) == (
        "pixtral: buffer 'rotary' (arg: position_embeddings) expects a tensor, but the scoped call passes "
        "position_embeddings=a tuple of 2 elements; add one scope_arg buffer per element (arg: position_embeddings.0 "
        "... position_embeddings.1)")
