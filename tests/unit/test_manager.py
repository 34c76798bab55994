"""The manager against a minimal protocol implementation: packing, routing, order, clones, stats.

``ToyEncoder`` is a real :class:`SupportsEncoderCudaGraph` built through its constructor: each output row
is its input row plus the sum of its segment, so a wrong segment boundary changes the numbers.
"""

from __future__ import annotations

import pytest
import torch

from vitcg.errors import InputError
from vitcg.manager import EncoderCudaGraphManager
from vitcg.protocol import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
    SupportsEncoderCudaGraph,
)


def segment_sums(x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    seg = torch.searchsorted(cu[1:].contiguous(), torch.arange(x.shape[0], dtype=cu.dtype), right=True)
    mask = (seg[:, None] == seg[None, :]).to(x.dtype)
    return x + mask @ x


class ToyEncoder:
    def __init__(self, min_budget: int = 4):
        self.min_budget = min_budget
        self.forward_calls = 0

    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(["image"], ["x", "cu"], 2, {"x": "zeros", "cu": "trailing_segment"})

    def get_input_modality(self, mm_kwargs):
        if "x" not in mm_kwargs:
            raise InputError("no x")
        return "image"

    def get_encoder_cudagraph_budget_range(self, limits):
        return self.min_budget, min(limits["max_num_batched_tokens"], limits["max_model_len"])

    def get_encoder_cudagraph_item_specs(self, mm_kwargs):
        return [EncoderItemSpec(int(n), int(n)) for n in mm_kwargs["sizes"]]

    def select_encoder_cudagraph_items(self, mm_kwargs, indices):
        sizes = mm_kwargs["sizes"].tolist()
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        rows = [mm_kwargs["x"][offsets[i]:offsets[i + 1]] for i in sorted(indices)]
        return {"x": torch.cat(rows), "sizes": mm_kwargs["sizes"][sorted(indices)]}

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch,
                                                 device, dtype):
        cu = torch.full((max_batch_size + 2,), token_budget, dtype=torch.int32)
        cu[0] = 0
        return EncoderCudaGraphCaptureInputs({"x": torch.zeros(token_budget, 2, dtype=dtype), "cu": cu})

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch):
        cu = torch.nn.functional.pad(mm_kwargs["sizes"].cumsum(0), (1, 0)).to(torch.int32)
        return EncoderCudaGraphReplayBuffers({"x": mm_kwargs["x"], "cu": cu})

    def encoder_cudagraph_forward(self, values):
        self.forward_calls += 1
        return segment_sums(values["x"], values["cu"])

    def encoder_eager_forward(self, mm_kwargs):
        cu = torch.nn.functional.pad(mm_kwargs["sizes"].cumsum(0), (1, 0))
        return segment_sums(mm_kwargs["x"], cu)


def batch(*sizes: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(sum(sizes), 2, generator=g, dtype=torch.float64),
            "sizes": torch.tensor(sizes, dtype=torch.int64)}


def reference(kwargs: dict, toy: ToyEncoder) -> list[torch.Tensor]:
    return [toy.encoder_eager_forward(toy.select_encoder_cudagraph_items(kwargs, [i]))
            for i in range(len(kwargs["sizes"]))]


@pytest.fixture
def toy():
    return ToyEncoder()


def make(toy, **kwargs) -> EncoderCudaGraphManager:
    kwargs.setdefault("max_num_batched_tokens", 32)
    return EncoderCudaGraphManager(toy, dtype=torch.float64, **kwargs)


def test_toy_satisfies_protocol(toy):
    assert isinstance(toy, SupportsEncoderCudaGraph)


def test_results_match_eager_in_caller_order(toy):
    manager = make(toy)
    kwargs = batch(5, 1, 9, 3, 40, 2)
    got = manager.execute(kwargs)
    want = reference(kwargs, toy)
    assert [g.shape[0] for g in got] == [5, 1, 9, 3, 40, 2]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_packing_is_greedy_smallest_first(toy):
    manager = make(toy, max_items_per_batch=3, packing="greedy")
    items = [EncoderItemSpec(n, n) for n in (5, 1, 9, 3, 40, 2)]
    packs, eager = manager.plan_packs(items)
    assert eager == [4]  # 40 > largest budget 32
    assert [p.indices for p in packs] == [(1, 3, 5), (0, 2)]  # sizes 1,2,3 then 5,9
    assert [p.budget for p in packs] == [8, 16]  # smallest budgets >= 6 and >= 14
    assert all(p.tokens <= p.budget for p in packs)


def test_token_cap_closes_a_pack(toy):
    manager = make(toy, max_items_per_batch=4, packing="greedy")
    packs, _ = manager.plan_packs([EncoderItemSpec(n, n) for n in (20, 10, 15)])
    assert [p.indices for p in packs] == [(1, 2), (0,)]


def test_stats_add_up(toy):
    manager = make(toy, max_items_per_batch=3, packing="greedy")
    manager.execute(batch(5, 1, 9, 3, 40, 2))
    stats = manager.stats
    assert stats.items == 6 and stats.hits + stats.misses == stats.items
    assert stats.misses == 1 and stats.eager_calls == 1 and stats.replays == 2
    assert stats.used_tokens == 20 and stats.padded_tokens == (8 - 6) + (16 - 14)
    assert stats.replays_per_budget == {8: 1, 16: 1}
    assert 0 < stats.padding_waste < 1


def test_outputs_are_cloned_before_the_next_replay(toy):
    manager = make(toy)
    first = manager.execute(batch(3, 2, seed=1))
    kept = [t.clone() for t in first]
    manager.execute(batch(3, 2, seed=2))  # same budget, same buffers
    for a, b in zip(first, kept):
        torch.testing.assert_close(a, b)


def test_empty_inputs(toy):
    manager = make(toy)
    assert manager.execute({}) == []
    assert manager.execute({"x": None}) == []
    assert manager.execute(batch()) == []
    assert manager.stats.items == 0


def test_unknown_keys_are_a_clear_error(toy):
    with pytest.raises(InputError, match="no x"):
        make(toy).execute({"y": torch.zeros(1)})


def test_capture_is_lazy_and_once(toy):
    manager = make(toy)
    assert not manager.graphs
    manager.execute(batch(2))
    assert sorted(manager.graphs) == [4, 8, 16, 32]
    report = manager.capture()
    assert report.seconds == 0.0  # already captured


def test_buffer_identity_is_enforced(toy):
    manager = make(toy)
    manager.execute(batch(2))
    entry = manager.graphs[4]
    entry.inputs.values["x"] = entry.inputs.values["x"].clone()  # replace the recorded buffer
    with pytest.raises(RuntimeError, match="buffer identity broken"):
        manager.execute(batch(2))


def test_trailing_segment_end_is_read_from_capture(toy):
    manager = make(toy, max_items_per_batch=2)
    manager.capture()
    assert {b: g.capacity for b, g in manager.graphs.items()} == {4: 4, 8: 8, 16: 16, 32: 32}
    manager.execute(batch(3, 2))
    assert manager.graphs[8].inputs.values["cu"].tolist() == [0, 3, 5, 8]  # items keep caller order; padding 5..8


def test_cuda_graphs_need_cuda(toy):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="need a CUDA device"):
        EncoderCudaGraphManager(toy, use_cuda_graphs=True)


def test_segment_capacity_bounds_packs():
    class FewSlots(ToyEncoder):
        def get_encoder_cudagraph_config(self):
            config = super().get_encoder_cudagraph_config()
            return EncoderCudaGraphConfig(config.modalities, config.buffer_keys, 2, config.padding_logics,
                                          segment_key="cu")

        def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch,
                                                     device, dtype):
            inputs = super().prepare_encoder_cudagraph_capture_inputs(token_budget, 3, max_frames_per_batch,
                                                                       device, dtype)
            return inputs  # 3 + 2 slots: 3 segments per pack whatever max_items says

        def get_encoder_cudagraph_item_specs(self, mm_kwargs):
            return [EncoderItemSpec(int(n), int(n), 0, 1) for n in mm_kwargs["sizes"]]

    toy = FewSlots()
    manager = make(toy, max_items_per_batch=4, packing="greedy")
    assert manager.segment_capacity(32) == 3
    kwargs = batch(1, 1, 1, 1, 1)
    packs, eager = manager.plan_packs(toy.get_encoder_cudagraph_item_specs(kwargs))
    assert [len(p.indices) for p in packs] == [3, 2] and not eager
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


def test_tight_packing_pads_less_than_greedy(toy):
    sizes = (2, 30, 1)  # 33 tokens: greedy pads to 64 in one pack; tight replays 32 and 4
    greedy = make(toy, max_num_batched_tokens=64, packing="greedy")
    tight = make(toy, max_num_batched_tokens=64)  # the default
    items = toy.get_encoder_cudagraph_item_specs(batch(*sizes))
    g_packs, _ = greedy.plan_packs(items)
    t_packs, _ = tight.plan_packs(items)
    assert [p.budget for p in g_packs] == [64]
    assert sorted(p.budget for p in t_packs) == [4, 32]
    padded = lambda packs: sum(p.budget - p.tokens for p in packs)  # noqa: E731
    assert padded(t_packs) < padded(g_packs)
    assert sorted(i for p in t_packs for i in p.indices) == list(range(len(sizes)))
    kwargs = batch(*sizes, seed=5)
    for got, want in zip(tight.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


def test_tight_packing_minimizes_replay_costs(toy):
    """With measured costs (as on CUDA: a replay costs milliseconds of launches whatever its size), tight
    packing prefers one larger replay to two smaller ones; without, it counts padded tokens."""
    items = toy.get_encoder_cudagraph_item_specs(batch(2, 30, 1))
    manager = make(toy, max_num_batched_tokens=64)
    assert sorted(p.budget for p in manager.plan_packs(items)[0]) == [4, 32]
    assert manager.replay_cost(32) == 32 + 4  # the token model: budget plus the smallest budget
    manager.replay_costs = {4: 10.0, 8: 10.5, 16: 11.0, 32: 12.0, 64: 14.0}
    assert [p.budget for p in manager.plan_packs(items)[0]] == [64]
    manager.replay_costs = {4: 1.0, 8: 2.0, 16: 4.0, 32: 8.0, 64: 16.0}  # cost proportional to size
    assert sorted(p.budget for p in manager.plan_packs(items)[0]) == [4, 32]
    kwargs = batch(2, 30, 1, seed=3)
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


def test_static_path_measures_nothing(toy):
    report = make(toy).capture()
    assert report.replay_ms == {}


def test_unknown_packing_is_rejected(toy):
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="packing must be one of tight, greedy"):
        make(toy, packing="best")
