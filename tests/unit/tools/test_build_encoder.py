"""Building encoders from specs: dtype handling and output selection."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.errors import SpecRuntimeError
from vitcg.runtime.adapter import SpecAdapter
from vitcg.tools.encoders import build_encoder

SPECS = packaged()


def test_complex_buffers_keep_their_dtype():
    module = build_encoder(SPECS["llama4"], dtype=torch.bfloat16)
    buffers = dict(module.named_buffers())
    assert any(b.is_complex() for b in buffers.values())  # Llama 4's rotary table stays complex
    assert all(p.dtype == torch.bfloat16 for p in module.parameters() if p.is_floating_point())


def test_same_seed_same_weights():
    a = build_encoder(SPECS["qwen2_vl"], seed=3)
    b = build_encoder(SPECS["qwen2_vl"], seed=3)
    c = build_encoder(SPECS["qwen2_vl"], seed=4)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def adapter_with_outputs(*outputs: str) -> SpecAdapter:
    spec = SPECS["qwen2_vl"]
    spec = dataclasses.replace(spec, encoder=dataclasses.replace(spec.encoder, outputs=outputs))
    return tiny_adapter(spec)


def test_output_selection_and_clear_errors():
    hidden = {"hidden_states": (None, torch.ones(2, 3), torch.zeros(2, 3))}
    with pytest.raises(SpecRuntimeError, match="not tensors; pick one element"):
        adapter_with_outputs("hidden_states").combine_output(hidden)
    assert torch.equal(adapter_with_outputs("hidden_states[-2]").combine_output(hidden), torch.ones(2, 3))
    with pytest.raises(SpecRuntimeError, match="has no 'hidden_states\\[7\\]'"):
        adapter_with_outputs("hidden_states[7]").combine_output({"hidden_states": ()})
