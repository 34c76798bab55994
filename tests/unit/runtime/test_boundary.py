"""The graph boundary, chosen once when an adapter is built: the whole encoder call (``adapter.WholeCall``) or a
scoped submodule call (``scope.Scope``), behind one small interface (``scope.Boundary``) that the adapter asks."""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.runtime import extension, scope
from vitcg.runtime.adapter import ScopedSpecAdapter, SpecAdapter, WholeCall
from vitcg.runtime.scope import Boundary, Scope

SPECS = packaged()


@pytest.fixture(scope="module")
def whole():
    return tiny_adapter(SPECS["qwen2_vl"])


@pytest.fixture(scope="module")
def scoped():
    return tiny_adapter(SPECS["pixtral"])


def test_a_whole_encoder_spec_gets_the_whole_call(whole):
    boundary = whole._boundary
    assert isinstance(whole, SpecAdapter) and isinstance(boundary, WholeCall) and isinstance(boundary, Boundary)
    assert boundary.target is whole.module and not boundary.scoped
    assert whole.is_encoder_cudagraph_scoped() is False


def test_a_graph_scoped_spec_gets_its_scope(scoped):
    boundary = scoped._boundary
    assert isinstance(scoped, ScopedSpecAdapter) and isinstance(boundary, Scope) and isinstance(boundary, Boundary)
    assert boundary.target is scoped.module.get_submodule("transformer.layers") and boundary.scoped
    assert scoped.is_encoder_cudagraph_scoped() is True


@pytest.mark.parametrize("name", ["whole", "scoped"])
def test_the_fixed_shape_forward_is_the_boundarys(name, request, monkeypatch):
    adapter = request.getfixturevalue(name)
    seen = []
    monkeypatch.setattr(adapter._boundary, "forward", lambda inputs: seen.append(inputs) or "out")
    inputs = {"x": torch.zeros(1)}
    assert adapter.encoder_cudagraph_forward(inputs) == "out" and seen == [inputs]


def test_the_whole_call_stores_pixels_rows_first_and_nothing_else_moves():
    spec = SPECS["paddleocr_vl"]  # the tower takes (1, rows, C, p, p)
    adapter = tiny_adapter(spec)
    pixels = next(b for b in spec.buffers if b.name == "pixel_values")
    grid = next(b for b in spec.buffers if b.name == "grid_thw")
    assert adapter._boundary.storage_shape(pixels, (1, 64, 3, 14, 14)) == (64, 3, 14, 14)
    assert adapter._boundary.storage_shape(grid, (5, 3)) == (5, 3)


def test_a_scope_stores_every_argument_rows_first(scoped):
    hidden = next(b for b in scoped.spec.buffers if b.rows_dim)
    assert scoped._boundary.storage_shape(hidden, (1, 64, 32)) == (64, 1, 32)


def test_replay_is_declared_once():
    assert scope.Replay is extension.Replay
