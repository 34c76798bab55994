"""The manager against a minimal protocol implementation: packing, routing, order, clones, stats.

``ToyEncoder`` is a real :class:`SupportsEncoderCudaGraph` built through its constructor: each output row
is its input row plus the sum of its segment, so a wrong segment boundary changes the numbers.
"""

from __future__ import annotations

import pytest
import torch

from vitcg.errors import InputError
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.runtime.protocol import (
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
    """A hand-written model implementing vLLM's protocol and nothing else (no vitcg import but the data
    objects): vitcg's manager must drive it as vLLM's would."""

    supports_encoder_cudagraph = True

    def __init__(self, min_budget: int = 4):
        self.min_budget = min_budget
        self.forward_calls = 0

    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(["image"], ["x", "cu"], 2, {"cu": self._pad_cu})

    @staticmethod
    def _pad_cu(buffer, value):
        """Boundaries first; padding rows form one trailing segment that ends at the buffer set's rows."""
        end = int(buffer[-1])  # captured with the row count last
        buffer.fill_(end)
        buffer[:value.shape[0]].copy_(value)

    def get_input_modality(self, mm_kwargs):
        if "x" not in mm_kwargs:
            raise InputError("no x")
        return "image"

    def get_max_frames_per_video(self):
        return 1

    def get_encoder_cudagraph_budget_range(self, vllm_config):
        return self.min_budget, min(vllm_config.scheduler_config.max_num_batched_tokens,
                                    vllm_config.model_config.max_model_len)

    def get_encoder_cudagraph_item_specs(self, mm_kwargs):
        return [EncoderItemSpec(int(n), int(n)) for n in mm_kwargs["sizes"]]

    def select_encoder_cudagraph_items(self, mm_kwargs, indices):
        sizes = mm_kwargs["sizes"].tolist()
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        rows = [mm_kwargs["x"][offsets[i]:offsets[i + 1]] for i in indices]
        return {"x": torch.cat(rows) if rows else mm_kwargs["x"][:0],
                "sizes": mm_kwargs["sizes"][list(indices)]}

    def postprocess_encoder_output(self, outputs, indices, per_item_out_tokens, dest, clone=False,
                                   batch_mm_kwargs=None):
        offset = 0
        for i in indices:
            piece = outputs["default"][offset:offset + per_item_out_tokens[i]]
            dest[i] = piece.clone() if clone else piece
            offset += per_item_out_tokens[i]

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch,
                                                 device, dtype, path="default", axis_keys=None):
        cu = torch.full((max_batch_size + 2,), token_budget, dtype=torch.int32)
        cu[0] = 0
        return EncoderCudaGraphCaptureInputs({"x": torch.zeros(token_budget, 2, dtype=dtype), "cu": cu})

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path="default"):
        cu = torch.nn.functional.pad(mm_kwargs["sizes"].cumsum(0), (1, 0)).to(torch.int32)
        return EncoderCudaGraphReplayBuffers({"x": mm_kwargs["x"], "cu": cu})

    def encoder_cudagraph_forward(self, inputs, path="default"):
        self.forward_calls += 1
        return segment_sums(inputs["x"], inputs["cu"])

    def encoder_eager_forward(self, mm_kwargs, path="default"):
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


def test_toy_satisfies_protocol_and_not_the_extension(toy):
    from vitcg.runtime.extension import SupportsVitcgExtension

    assert isinstance(toy, SupportsEncoderCudaGraph)
    assert not isinstance(toy, SupportsVitcgExtension)


def test_manager_reads_only_the_protocol(toy):
    """The manager gets no device or dtype from the model: it uses what it is given, as vLLM does."""
    manager = make(toy)
    assert manager.device == torch.device("cpu") and manager.dtype == torch.float64
    assert manager.extension is None and not manager.scoped


def test_select_follows_indices_order(toy):
    manager = make(toy, max_items_per_batch=3, packing="greedy")
    kwargs = batch(5, 1, 9, 3, 2)
    packs, _ = manager.plan_packs(toy.get_encoder_cudagraph_item_specs(kwargs))
    assert [p.indices for p in packs] == [(1, 4, 3), (0, 2)]  # packing order, not sorted
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


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
    assert [p.indices for p in packs] == [(1, 5, 3), (0, 2)]  # sizes 1,2,3 then 5,9
    assert [p.budget for p in packs] == [8, 16]  # smallest budgets >= 6 and >= 14
    assert all(p.tokens <= p.budget for p in packs)


def test_token_cap_closes_a_pack(toy):
    manager = make(toy, max_items_per_batch=4, packing="greedy")
    packs, _ = manager.plan_packs([EncoderItemSpec(n, n) for n in (20, 10, 15)])
    assert [p.indices for p in packs] == [(1, 2), (0,)]


def test_greedy_closes_a_pack_when_an_item_alone_outweighs_it(toy):
    """vLLM's rule: 3 tokens then a 16-token item: 4 + 16 budget tokens beat one replay of 32."""
    manager = make(toy, max_items_per_batch=4, packing="greedy")
    packs, _ = manager.plan_packs([EncoderItemSpec(n, n) for n in (3, 16)])
    assert [(p.indices, p.budget) for p in packs] == [((0,), 4), ((1,), 16)]


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


def test_padding_logics_are_called_and_keys_without_one_are_zeroed(toy):
    manager = make(toy, max_items_per_batch=2, packing="greedy")
    manager.execute(batch(3, 2, seed=1))
    x = manager.graphs[8].inputs.values["x"]
    assert x[5:].abs().sum() == 0  # the default: zeroed, then the rows copied first
    assert manager.graphs[8].inputs.values["cu"].tolist() == [0, 2, 5, 8]  # packing order; the toy's logic


def test_cuda_graphs_need_cuda(toy):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="need a CUDA device"):
        EncoderCudaGraphManager(toy, use_cuda_graphs=True)


def test_tight_packing_pads_less_than_greedy(toy):
    sizes = (2, 30, 3)  # greedy: 2+3 in 8, 30 in 32; tight: 30+2 in 32, 3 in 4
    greedy = make(toy, max_num_batched_tokens=64, packing="greedy")
    tight = make(toy, max_num_batched_tokens=64, packing="tight")
    items = toy.get_encoder_cudagraph_item_specs(batch(*sizes))
    g_packs, _ = greedy.plan_packs(items)
    t_packs, _ = tight.plan_packs(items)
    assert [p.budget for p in g_packs] == [8, 32]
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
    manager = make(toy, max_num_batched_tokens=64, packing="tight")
    assert sorted(p.budget for p in manager.plan_packs(items)[0]) == [4, 32]
    assert manager.replay_cost(32) == 32 + 4  # the token model: budget plus the smallest budget
    manager.replay_costs = {4: 10.0, 8: 10.5, 16: 11.0, 32: 12.0, 64: 14.0}
    assert [p.budget for p in manager.plan_packs(items)[0]] == [64]
    manager.replay_costs = {4: 1.0, 8: 2.0, 16: 4.0, 32: 8.0, 64: 16.0}  # cost proportional to size
    assert sorted(p.budget for p in manager.plan_packs(items)[0]) == [4, 32]
    kwargs = batch(2, 30, 1, seed=3)
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("packing", ["tight", "greedy"])
def test_packs_cheaper_eagerly_run_eagerly(toy, packing):
    """With injected costs: a pack whose replay costs more than its real tokens cost eagerly (a compute-bound
    batch padded to a large budget) goes to the one eager call; results stay those of eager."""
    items = toy.get_encoder_cudagraph_item_specs(batch(2, 33, 1))
    manager = make(toy, max_num_batched_tokens=64, packing=packing)
    manager.replay_costs = {4: 1.0, 8: 1.1, 16: 1.2, 32: 1.4, 64: 10.0}
    manager.eager_costs = {4: 2.0, 8: 2.0, 16: 2.5, 32: 3.0, 64: 6.0}
    assert manager.eager_cost(33) == pytest.approx(3.0 + 3.0 * 1 / 32)
    assert manager.eager_cost(2) == 2.0 and manager.eager_cost(128) == pytest.approx(12.0)
    packs, eager = manager.plan_packs(items)
    assert eager == [1] or sorted(eager) == [0, 1, 2]
    assert all(p.budget < 64 for p in packs)
    kwargs = batch(2, 33, 1, seed=4)
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)
    assert manager.stats.routed_eager >= 1 and manager.stats.misses >= manager.stats.routed_eager
    manager.route_eager = False
    assert manager.plan_packs(items)[1] == []


def test_real_eager_calls_calibrate_the_eager_estimate(toy):
    """The capture-time eager costs time the graph-less static forward; a real eager call that took half that
    scales every estimate, so a compute-bound pack the estimate kept as a replay now goes eagerly."""
    items = toy.get_encoder_cudagraph_item_specs(batch(20, 20))
    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {4: 1.0, 8: 1.5, 16: 2.0, 32: 3.0, 64: 5.0}
    manager.eager_costs = {4: 3.0, 8: 3.0, 16: 3.5, 32: 4.0, 64: 6.0}
    assert manager.plan_packs(items)[1] == []  # estimated 4.0 eagerly against a 3.0 replay: the graph
    manager.eager_timings = {64: [(32, 2.0)]}  # a real eager call of 32 tokens took 2.0 ms, not 4.0
    assert manager.eager_cost(32) == pytest.approx(2.0) and manager.eager_cost(4) == pytest.approx(1.5)
    assert sorted(manager.plan_packs(items)[1]) == [0, 1]


def test_the_first_compute_bound_calls_of_a_budget_run_wholly_eagerly_timed(toy, monkeypatch):
    from vitcg.runtime import manager as manager_module
    from vitcg.runtime.manager import PackPlan

    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {4: 1.0, 8: 1.5, 16: 2.0, 32: 9.0, 64: 20.0}
    manager.eager_costs = {4: 3.0, 8: 3.0, 16: 3.5, 32: 10.0, 64: 25.0}
    small, large = PackPlan(16, (0,), 10), PackPlan(64, (1, 2), 50)
    assert manager._explore([small, large], []) == ([small, large], [], None)  # CPU: nothing is timed
    manager.use_cuda_graphs = True  # the choice alone; nothing runs here
    monkeypatch.setattr(manager_module, "EXPLORE_MS", 8.0)
    assert manager._explore([small, large], []) == ([], [0, 1, 2], 64)  # the whole call; 60 tokens: class 64
    assert manager._explore([small, large], [3])[2] is None  # other items run eagerly: no clean timing
    assert manager._explore([small], [])[2] is None  # a launch-bound call: its replay costs 2.0 < 8.0
    manager.eager_timings[64] = [(50, 12.0)]
    assert manager._explore([small, large], [])[2] == 64  # one cold call is no price: timed twice
    manager.eager_timings[64].append((50, 11.0))
    assert manager._explore([small, large], []) == ([small, large], [], None)  # timed already
    # a call four times larger is its own size class: small calls' timings cannot price its batched eager call
    many = [PackPlan(64, (i,), 60) for i in range(4)]
    assert manager._explore(many, []) == ([], [0, 1, 2, 3], 256)


def test_measured_costs_route_without_margin(toy):
    """Before both sides are measured, eager must be estimated 10% cheaper to win (the estimate is the static
    forward's); once a budget's real replays and real eager calls are timed, the cheaper side wins outright (a pack
    4% cheaper eagerly, as the H100's mixed batch, runs eagerly)."""
    from vitcg.runtime.manager import OBSERVED_REPLAYS

    items = toy.get_encoder_cudagraph_item_specs(batch(20, 20))
    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {4: 1.0, 8: 1.5, 16: 2.0, 32: 6.0, 64: 10.0}
    manager.eager_costs = {4: 3.0, 8: 3.0, 16: 3.5, 32: 9.0, 64: 9.8}
    assert [p.budget for p in manager.plan_packs(items)[0]] == [64]
    assert manager.plan_packs(items)[1] == []  # 9.2 eagerly against a 10.0 replay: within the margin
    manager._observed_replays[64] = [10.0] * OBSERVED_REPLAYS
    assert manager.plan_packs(items)[1] == []  # only one side measured
    manager.eager_timings[64] = [(40, 9.6)] * OBSERVED_REPLAYS
    assert sorted(manager.plan_packs(items)[1]) == [0, 1]


def test_several_packs_go_eager_together_when_one_eager_call_is_cheaper(toy):
    """Each 30-token pack replays for 5.0, less than the 6.0 its items cost alone eagerly; but one eager call of
    all 90 tokens (about 11.4) is cheaper than three replays (15.0): the whole call runs eagerly."""
    from vitcg.runtime.manager import PackPlan

    items = toy.get_encoder_cudagraph_item_specs(batch(30, 30, 30))
    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {4: 1.0, 8: 1.5, 16: 2.0, 32: 5.0, 64: 9.0}
    manager.eager_costs = {4: 6.0, 8: 6.0, 16: 6.0, 32: 6.0, 64: 9.0}
    packs = [PackPlan(32, (i,), 30) for i in range(3)]
    assert manager._route_eager(items, packs, []) == ([], [0, 1, 2])
    manager.eager_costs = {4: 6.0, 8: 6.0, 16: 6.0, 32: 6.0, 64: 16.0}  # all eagerly about 25: the replays win
    assert manager._route_eager(items, packs, []) == (packs, [])


def test_launch_bound_packs_keep_their_graphs(toy):
    items = toy.get_encoder_cudagraph_item_specs(batch(2, 5, 1))
    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {4: 0.1, 8: 0.1, 16: 0.12, 32: 0.15, 64: 0.2}
    manager.eager_costs = {4: 5.0, 8: 5.0, 16: 5.1, 32: 5.2, 64: 5.5}
    assert manager.plan_packs(items)[1] == []


def test_static_path_measures_nothing(toy):
    report = make(toy).capture()
    assert report.replay_ms == {}


def test_unknown_packing_is_rejected(toy):
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="packing must be one of tight, greedy"):
        make(toy, packing="best")


def test_lean_caps_apply_only_to_inferred_limits(toy):
    from vitcg.runtime.manager import LEAN_ITEMS

    lean = make(toy, max_num_batched_tokens=1024)  # vLLM would infer 1024 // 4 = 256, capped by min budget 4
    vllm = make(toy, max_num_batched_tokens=1024, lean=False)
    assert vllm.plan.max_items == 4 and lean.plan.max_items == min(4, LEAN_ITEMS)
    toy64 = ToyEncoder(min_budget=64)
    assert make(toy64, max_num_batched_tokens=8192, lean=False).plan.max_items == 64
    assert make(toy64, max_num_batched_tokens=8192).plan.max_items == LEAN_ITEMS
    assert make(toy64, max_num_batched_tokens=8192, max_items_per_batch=40).plan.max_items == 40  # given: kept
    assert lean.budgets == vllm.budgets  # budgets are vLLM's either way


def test_a_poisoned_item_runs_eagerly_alone_and_leaves_its_pack_intact(toy):
    """The toy's segment sums multiply by a 0/1 mask, as packed attention multiplies by zero weights: one NaN
    row makes every row of its pack NaN. Isolated, the others come out of the graph exactly as eager."""
    kwargs = batch(3, 2, 4, seed=5)
    kwargs["x"][3, 1] = float("nan")  # item 1
    kwargs["x"][4, 0] = float("inf")
    want = reference(kwargs, toy)
    manager = make(toy)
    got = manager.execute(kwargs)
    for index in (0, 2):
        torch.testing.assert_close(got[index], want[index])
    torch.testing.assert_close(got[1], want[1], equal_nan=True)
    stats = manager.stats
    assert (stats.nonfinite_items, stats.misses, stats.hits, stats.replays) == (1, 1, 2, 1)
    assert stats.as_dict()["nonfinite_items"] == 1

    unguarded = make(toy, isolate_nonfinite=False)
    assert not any(torch.isfinite(out).all() for out in unguarded.execute(kwargs))  # the root cause


def test_finite_inputs_take_the_usual_path(toy):
    kwargs = batch(3, 2, 4, seed=6)
    manager = make(toy)
    got = manager.execute(kwargs)
    for g, w in zip(got, reference(kwargs, toy), strict=True):
        torch.testing.assert_close(g, w)
    assert manager.stats.nonfinite_items == 0 and manager.stats.misses == 0 and manager.stats.replays == 1


def test_the_first_real_replay_of_each_budget_is_timed_on_cuda_only(toy):
    """Capture-time replay costs run padding segments; the first real replay per budget is timed (on CUDA) and
    the larger cost kept, so long real segments are not under-priced against eager."""
    manager = make(toy, max_num_batched_tokens=64)
    manager.replay_costs = {b: 1.0 for b in manager.budgets}
    assert not manager._observe_replay(64)  # CPU: the static path times nothing
    manager.use_cuda_graphs = True  # the decision alone; nothing runs here
    assert manager._observe_replay(64)
    manager._observed_replays[64] = [3.0, 2.0]  # two real replays timed: enough
    assert not manager._observe_replay(64) and manager._observe_replay(32)
    manager.route_eager = False
    assert not manager._observe_replay(32)
