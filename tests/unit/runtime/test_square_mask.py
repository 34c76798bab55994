"""``padding: square_mask``: an attention mask whose rows are padded on two dimensions (Pixtral's block mask).

The rule keeps the value's mask top-left, lets each padding row attend only to itself and no real row attend to
padding; specs/pixtral.yaml passes it to the layer stack of a graph scope. The validation errors are cases in
tests/specs/invalid/ (square_mask_*); tests/specs/check_fails/mask_rows_only.yaml shows the same spec failing
`vitcg check` with rows-only padding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from support.specs import packaged
from support.tiny import tiny_manager
from vitcg.errors import InputError, SpecRuntimeError
from vitcg.lang.catalogue import PADDINGS
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.padding import EMPTY, fill, mask_values
from vitcg.runtime.scope import Scope
from vitcg.tools.encoders import build_encoder


def block_mask(sizes: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A (rows, 1, 1, rows) additive block-diagonal mask, stored rows first as the scope stores Pixtral's."""
    rows = sum(sizes)
    mask = torch.full((rows, rows), torch.finfo(dtype).min, dtype=dtype)
    start = 0
    for size in sizes:
        mask[start:start + size, start:start + size] = 0
        start += size
    return mask.reshape(rows, 1, 1, rows)


def test_the_value_lands_top_left_and_padding_rows_see_only_themselves():
    dest = torch.zeros(8, 1, 1, 8)
    src = block_mask([2, 3])
    fill("square_mask", dest, src, 8, "attention_mask")
    attend, masked = mask_values(torch.float32)
    square = dest[:, 0, 0]
    assert torch.equal(square[:5, :5], src[:, 0, 0])
    assert (square[:5, 5:] == masked).all() and (square[5:, :5] == masked).all()  # no real row sees padding
    padding = square[5:, 5:]
    assert torch.equal(padding == attend, torch.eye(3, dtype=torch.bool))


def test_refilling_leaves_nothing_of_a_larger_earlier_value():
    dest = torch.zeros(6, 6)
    fill("square_mask", dest, torch.zeros(6, 6), 6, "m")  # everything attends
    fill("square_mask", dest, torch.zeros(2, 2), 6, "m")
    visible = dest == 0
    expected = torch.eye(6, dtype=torch.bool)
    expected[:2, :2] = True
    assert torch.equal(visible, expected)


def test_capture_and_an_absent_value_give_the_all_padding_mask():
    for value in (None, EMPTY):
        dest = torch.ones(4, 1, 4, dtype=torch.bool)
        fill("square_mask", dest, value, 4, "m")
        assert torch.equal(dest[:, 0], torch.eye(4, dtype=torch.bool))


def test_boolean_masks_keep_true_as_attend():
    dest = torch.zeros(4, 4, dtype=torch.bool)
    fill("square_mask", dest, torch.ones(3, 3, dtype=torch.bool), 4, "m")
    assert dest[:3, :3].all() and dest[3, 3] and not dest[3, :3].any() and not dest[:3, 3].any()


def test_attention_over_the_padded_mask_keeps_real_rows_and_stays_finite():
    torch.manual_seed(0)
    sizes, capacity = [3, 4], 12
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=block_mask(sizes)[:, 0, 0])
    padded = [torch.cat([t, torch.randn(1, 2, capacity - 7, 8) * 1e3], dim=2) for t in (q, k, v)]
    mask = torch.empty(capacity, capacity)
    fill("square_mask", mask, block_mask(sizes)[:, 0, 0], capacity, "m")
    got = F.scaled_dot_product_attention(*padded, attn_mask=mask)
    assert torch.allclose(got[:, :, :7], want, atol=1e-6)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize(("dest", "src", "message"), [
    (torch.zeros(4, 5), torch.zeros(2, 2), "no square mask"),
    (torch.zeros(4, 4), torch.zeros(2, 3), "no square mask fitting"),
    (torch.zeros(4, 1, 4), torch.zeros(2, 2), "no square mask fitting"),
    (torch.zeros(4, 4), torch.zeros(5, 5), "5 rows do not fit"),
])
def test_a_value_that_does_not_fit_is_an_input_error(dest, src, message):
    with pytest.raises(InputError, match=message):
        fill("square_mask", dest, src, dest.shape[0], "attention_mask")


def test_the_rule_is_no_row_buffer():
    """The call's rows come from a row-wise buffer (hidden_states); a mask never sets the capacity."""
    assert not PADDINGS["square_mask"].row_wise


@pytest.fixture(scope="module")
def pixtral():
    spec = packaged()["pixtral"]
    if spec.unavailable:
        pytest.skip(spec.unavailable)
    return spec, build_encoder(spec, seed=0)


def test_pixtral_scope_replays_with_the_padded_mask(pixtral):
    """Two images in one padded pixel tensor: the scoped graph path gives the eager rows, the mask padded by
    square_mask to the budget."""
    spec, module = pixtral
    adapter = adapter_for(spec, module)
    inputs = {"pixel_values": torch.randn(2, 3, 96, 96), "image_sizes": torch.tensor([[32, 48], [24, 16]])}
    capture = adapter.prepare_encoder_cudagraph_capture_inputs(128, 2, 0).values
    logics = adapter.get_encoder_cudagraph_config().padding_logics
    seen = {}

    def replay(values):
        for name, value in values.items():
            if value is not None:
                logics[name](capture[name], value)
        seen["mask"] = capture["attention_mask"][:, 0, 0].clone()
        return adapter.encoder_cudagraph_forward(capture), capture

    got = adapter.encoder_scoped_forward(inputs, replay)
    want = adapter.encoder_eager_forward(inputs)
    rows = (32 // 4) * (48 // 4) + (24 // 4) * (16 // 4)
    assert got.shape == want.shape == (rows, 64)
    assert torch.allclose(got, want, atol=1e-5)
    attend, _ = mask_values(torch.float32)
    visible = seen["mask"] == attend
    assert visible[:96, :96].all() and visible[96:rows, 96:rows].all() and not visible[:96, 96:rows].any()
    assert torch.equal(visible[rows:, rows:], torch.eye(128 - rows, dtype=torch.bool))
    assert not visible[:rows, rows:].any() and not visible[rows:, :rows].any()


def test_a_stack_scope_takes_only_the_last_hidden_state(pixtral):
    spec, module = pixtral
    scope = Scope(spec, module)
    rows = torch.zeros(1, 4, 64)
    arguments = {"hidden_states": rows, "attention_mask": torch.zeros(1, 1, 4, 4),
                 "position_embeddings.0": torch.zeros(4, 16), "position_embeddings.1": torch.zeros(4, 16)}
    assert scope._values({**arguments, "output_hidden_states": -1})["hidden_states"].shape == (4, 1, 64)
    assert scope._values({**arguments, "output_hidden_states": [-1]})
    for asked in (True, -2, [0, -1]):
        with pytest.raises(SpecRuntimeError, match="only the last layer's output exists"):
            scope._values({**arguments, "output_hidden_states": asked})


def test_a_scoped_specs_real_replays_are_timed_for_routing(pixtral):
    """The manager prices a scope's replay by its first real replays, as for whole-encoder specs (capture-time
    replays run padding rows only): the H100 found VideoLLaMA3's scoped 1x448 slower than eager, unrouted."""
    from vitcg.runtime.costs import OBSERVED

    spec, module = pixtral
    manager = tiny_manager(adapter_for(spec, module))
    manager.capture()
    manager.costs.replay.update({b: 0.5 for b in manager.budgets})  # launch-bound: never explored
    manager.costs.learn = True  # as on CUDA: the timing below is injected
    manager._synced_ms = lambda fn: (fn(), 9.0)
    inputs = {"pixel_values": torch.randn(1, 3, 96, 96), "image_sizes": torch.tensor([[32, 48]])}
    for _ in range(OBSERVED):
        manager.execute(inputs)
    assert manager.stats.replays == OBSERVED
    (budget,) = [b for b, seen in manager.costs.replay_samples.items() if seen]
    assert manager.costs.replay_samples[budget] == [9.0] * OBSERVED and manager.costs.replay_cost(budget) == 9.0
