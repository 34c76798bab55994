"""`vitcg check` sizes its engine from the spec's min budget (issue #13), whatever limit bounds the max budget.

The validate-time bounds are cases in tests/specs/invalid/ (budget_too_large, buffers_too_large)."""

from __future__ import annotations

import pytest

from support import REPO
from support.specs import spec_text
from vitcg.errors import SpecError, VitcgError
from vitcg.lang import catalogue as cat
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings
from vitcg.tools.check import cases

SPECS = REPO / "vitcg" / "specs"
BOUNDED = "max: min(max_num_batched_tokens, max_model_len)"


def test_check_sizes_a_spec_bounded_by_max_model_len_for_a_small_engine(monkeypatch):
    # `vitcg check` once passed max_model_len=2**20: `max: max_model_len` meant 20 GB of capture buffers.
    text = spec_text("qwen2_vl").replace("\nbuffers:\n", "\nbudget: {max: max_model_len}\n\nbuffers:\n")
    spec = spec_from_text(text, "qwen2_vl.yaml", Bindings())
    ranges = []

    class Stop(cases.EncoderCudaGraphManager):
        def __init__(self, adapter, **kwargs):
            limits = {k: kwargs[k] for k in cat.LIMIT_NAMES}
            ranges.append(adapter.get_encoder_cudagraph_budget_range(limits))
            raise VitcgError("stopped before capture")

    monkeypatch.setattr(cases, "EncoderCudaGraphManager", Stop)
    report = cases.check_spec(spec)
    assert "stopped before capture" in report.error
    assert ranges == [(64, 4 * 64)]


def test_check_proves_the_graphs_with_eager_routing_off(monkeypatch):
    # On CUDA the router runs the first calls of each size eagerly, to time them; every case of a check is such
    # a call, so with routing on `check --device cuda` compared eager with eager and proved no graph.
    spec = spec_from_text(spec_text("qwen2_vl"), "qwen2_vl.yaml", Bindings())
    seen = []

    class Stop(cases.EncoderCudaGraphManager):
        def __init__(self, adapter, **kwargs):
            seen.append(kwargs["options"].route_eager)
            raise VitcgError("stopped before capture")

    monkeypatch.setattr(cases, "EncoderCudaGraphManager", Stop)
    cases.check_spec(spec)
    assert seen == [False]


def test_a_grid_width_that_does_not_parse_is_a_diagnostic_not_a_crash():
    """Found by CI's fuzz run: a grid buffer whose width names an unknown name crashed validate with
    AttributeError ('NoneType' object has no attribute 'names') in the grid-width rule."""
    grid = "  - {name: grid_thw, shape: [max_items + 1, qwen2_vl]}\n"
    text = spec_text("qwen2_vl").replace("\nbuffers:\n", "\nbuffers:\n" + grid, 1)
    assert "qwen2_vl]" in text
    with pytest.raises(SpecError) as caught:
        spec_from_text(text, "qwen2_vl.yaml", Bindings())
    (problem,) = caught.value.diagnostics
    assert problem.path == "$.buffers[0].shape[1]" and "unknown name 'qwen2_vl'" in problem.message
