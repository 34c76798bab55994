"""Items routed to the eager call in a call holding images and videos are selected images first, whatever order
the packing left them in (found on the H100: an image+video pack timed eagerly failed with "interleave
modalities")."""

from __future__ import annotations

import torch

from support.tiny import tiny_adapter, tiny_manager
from vitcg.lang import SpecSource
from vitcg.runtime.costs import CostModel
from vitcg.tools.workloads import InputBuilder


def test_a_mixed_call_routed_eagerly_matches_eager_per_item():
    spec = SpecSource(["vitcg/specs/qwen2_vl.yaml"])["qwen2_vl"]
    adapter = tiny_adapter(spec)
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
    kwargs = {**builder.inputs("image", [builder.image(2, 2)]), **builder.inputs("video", [builder.video(2, 4, 4)])}
    manager = tiny_manager(adapter)
    # replays dear, eager cheap: the one pack (video first, the larger item) goes to the eager call
    manager.costs = CostModel({b: 100.0 for b in manager.budgets}, eager=lambda tokens: 1.0)
    routed = manager.route([item.output_tokens for item in adapter.get_encoder_cudagraph_item_specs(kwargs)],
                           adapter.get_encoder_cudagraph_item_frames(kwargs))
    assert not routed.packs and routed.eager == [1, 0]
    got = manager.execute(kwargs)
    for index in (0, 1):
        want = adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
        torch.testing.assert_close(got[index], want, rtol=1e-5, atol=1e-6)
    assert manager.stats.misses == 2 and manager.stats.replays == 0
