"""A segment buffer a model leaves out for a call of one segment (issue 26, item 8): ``absent: one_segment``.

RadioModel's packed mode passes ``cu_seqlens=None`` to its layer stack when a call holds one image
(``vitcg/specs/radio_packed.yaml``). With the key, the scoped replay fills the boundaries of one segment over the
call's rows (then the padding segments) and gives what eager gives; without it the call is refused with a message
that names the key. Before the key existed, every such call was refused ("only a mask may be absent") and the
spec could not be written.
"""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged, skip_unavailable, spec_text
from vitcg.errors import SpecRuntimeError
from vitcg.lang import catalogue as cat
from vitcg.lang import spec_from_text
from vitcg.runtime import padding
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.runtime.scope import Scope
from vitcg.tools.encoders import build_encoder

ABSENT_LINE = "    absent: one_segment            # RadioModel passes cu_seqlens=None for a call of one image\n"
PREFIX = 5  # the tiny config's 3 class tokens and 2 registers, in front of every image's patches


@pytest.fixture(scope="module")
def spec():
    skip_unavailable("radio_packed")
    return packaged()["radio_packed"]


@pytest.fixture(scope="module")
def tower(spec):
    torch.manual_seed(0)
    return build_encoder(spec)


def images(*grids: tuple[int, int], seed: int = 0) -> dict[str, torch.Tensor]:
    rows = sum(h * w for h, w in grids)
    return {"pixel_values": torch.randn(rows, 3 * 16 * 16, generator=torch.Generator().manual_seed(seed)),
            "image_grid_hw": torch.tensor(grids, dtype=torch.int64)}


def manager_for(spec, tower) -> EncoderCudaGraphManager:
    return EncoderCudaGraphManager(adapter_for(spec, tower), max_num_batched_tokens=256, max_model_len=256,
                                   device="cpu", dtype=torch.float32)


def test_one_image_without_cu_seqlens_replays_equal_to_eager(spec, tower):
    manager = manager_for(spec, tower)
    mm = images((4, 6))
    [got] = manager.execute(mm)
    want = tower(**mm).features
    assert manager.stats.replays == 1 and got.shape == want.shape == (24, 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    [budget] = manager.stats.replays_per_budget
    values = manager.graphs[budget].inputs.values
    capacity = values["hidden_states"].shape[0]
    bounds = values["cu_seqlens"].tolist()
    assert bounds[:2] == [0, 24 + PREFIX]  # the call's rows as one segment, its prefix tokens included
    assert bounds[-1] == capacity and all(b >= a for a, b in zip(bounds, bounds[1:]))


def test_images_the_model_passes_cu_seqlens_for_still_replay_equal_to_eager(spec, tower):
    manager = manager_for(spec, tower)
    mm = images((4, 6), (2, 3), seed=1)
    got = torch.cat(manager.execute(mm))
    torch.testing.assert_close(got, tower(**mm).features, rtol=1e-5, atol=1e-6)


def test_without_the_key_the_refusal_names_it(tower):
    text = spec_text("radio_packed")
    assert ABSENT_LINE in text
    scope = Scope(spec_from_text(text.replace(ABSENT_LINE, ""), "radio_packed.yaml"), tower)
    hidden = torch.zeros(1, 24 + PREFIX, 64)

    def replay(values):
        raise AssertionError(f"replayed with {sorted(values)}")

    with pytest.raises(SpecRuntimeError) as caught:
        scope.run(lambda: scope.layers[0](hidden, cu_seqlens=None), replay)
    assert str(caught.value) == (
        "radio_packed: the scoped call passes no 'cu_seqlens', but the graph was captured with one; only a mask "
        "(padding: ones) or a buffer with an absent key may be absent; if the model leaves it out for a call of one "
        "segment, add absent: one_segment to buffer 'cu_seqlens'")


def test_one_segment_pads_like_any_boundaries():
    dest = torch.zeros(5, dtype=torch.int32)
    padding.fill("trailing_segment", dest, padding.one_segment(7), 12, "cu_seqlens")
    assert dest.tolist() == [0, 7, 9, 11, 12]  # the call's rows, then its 5 padding rows spread over 3 slots


def test_every_absence_has_exactly_one_implementation():
    assert set(padding.ABSENT_VALUES) == set(cat.ABSENCES)
    assert all(set(a.paddings) <= set(padding.PADDING_RULES) for a in cat.ABSENCES.values())
