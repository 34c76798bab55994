"""The cost model and the router, with injected timings (torch-free), and the manager learning from real calls."""

from __future__ import annotations

import random

import pytest

from vitcg.runtime.costs import EXPLORE_MS, OBSERVED, CostModel, route, size_class
from vitcg.runtime.packing import PackPlan


def measured(replay: dict[int, float], eager: dict[int, float] | None = None) -> CostModel:
    """Costs as after calibration: replays per budget, eager calls timed ``OBSERVED`` times at each size."""
    costs = CostModel(dict(replay), learn=True)
    for tokens, ms in (eager or {}).items():
        for _ in range(OBSERVED):
            costs.observe_eager(tokens, ms)
    return costs


def test_size_classes():
    assert [size_class(n) for n in (1, 2, 3, 256, 257, 1024, 1025)] == [1, 2, 4, 256, 512, 1024, 2048]


def test_the_h100_case_replays_once_eager_calls_of_its_size_are_measured():
    """benchmarks/generate_ttft.py, 4 images of 448 px (1024 tokens): a budget-1024 replay took 21.0 ms and the
    eager call about 31; the old estimate scaled a 256-token eager call (18.3 ms) by a flat static curve and
    sent the call eagerly. An eager call of 256 tokens prices nothing at 1024: the call is explored, then
    replayed."""
    costs = measured({256: 6.8, 1024: 21.0}, {256: 18.3})
    pack = [PackPlan(1024, (0, 1, 2, 3), 1024)]
    assert costs.eager_cost(1024) is None
    assert costs.explores(1024, pack)
    costs.observe_eager(1024, 33.0)  # a cold first call
    assert costs.explores(1024, pack)
    costs.observe_eager(1024, 31.0)
    assert not costs.explores(1024, pack) and costs.eager_cost(1024) == 31.0
    chosen = route([256] * 4, pack, [], costs)
    assert chosen.packs == pack and chosen.eager == [] and chosen.moved == 0


def test_a_compute_bound_pack_measured_cheaper_eagerly_runs_eagerly():
    """The mixed batch: one pack padded to 2048 replays for 45 ms; its 1571 tokens took 40 ms eagerly."""
    costs = measured({1024: 21.0, 2048: 45.0}, {1571: 40.0})
    chosen = route([600, 500, 471], [PackPlan(2048, (0, 1, 2), 1571)], [], costs)
    assert chosen.packs == [] and sorted(chosen.eager) == [0, 1, 2] and chosen.moved == 3


@pytest.mark.parametrize("seed", range(20))
def test_after_calibration_the_measured_faster_side_runs(seed):
    rng = random.Random(seed)
    tokens = [rng.randint(100, 500) for _ in range(rng.randint(1, 4))]
    replay_ms, eager_ms = rng.uniform(5, 50), rng.uniform(5, 50)
    costs = measured({2048: replay_ms}, {sum(tokens): eager_ms})
    chosen = route(tokens, [PackPlan(2048, tuple(range(len(tokens))), sum(tokens))], [], costs)
    assert (chosen.eager != []) == (eager_ms < replay_ms)


def test_several_packs_go_eager_together_when_one_eager_call_is_cheaper():
    """Each 30-token pack replays for 5.0, less than 6.0 alone eagerly; one eager call of all 90 tokens (11.0) is
    cheaper than three replays (15.0)."""
    packs = [PackPlan(32, (i,), 30) for i in range(3)]
    costs = measured({32: 5.0}, {30: 6.0, 60: 9.0, 90: 11.0})
    chosen = route([30, 30, 30], packs, [], costs)
    assert chosen.packs == [] and chosen.eager == [0, 1, 2] and "one eager call" in chosen.why
    costs = measured({32: 5.0}, {30: 6.0, 60: 12.0, 90: 25.0})
    assert route([30, 30, 30], packs, [], costs).packs == packs


def test_an_unmeasured_price_keeps_the_packs():
    packs = [PackPlan(32, (0,), 30)]
    assert route([30], packs, [], CostModel({32: 50.0})).packs == packs  # eager never timed
    assert route([30], packs, [], CostModel(eager=lambda n: 1.0)).packs == packs  # replay never timed


def test_launch_bound_calls_are_never_explored():
    costs = CostModel({64: EXPLORE_MS / 2, 256: EXPLORE_MS * 3}, learn=True)
    assert not costs.explores(60, [PackPlan(64, (0,), 60)])
    assert costs.explores(200, [PackPlan(256, (0,), 200)])
    assert not CostModel({256: 9.0}).explores(200, [PackPlan(256, (0,), 200)])  # not learning: the CPU path


def test_eager_prices_interpolate_within_a_size_class():
    costs = measured({}, {600: 30.0, 1000: 40.0})
    assert costs.eager_cost(800) == pytest.approx(35.0)
    assert costs.eager_cost(513) == pytest.approx(30.0)  # below the fastest sample: held flat
    assert costs.eager_cost(1100) is None  # another class: unmeasured
    assert costs.eager_cost(0) == 0.0


def test_real_replays_replace_the_capture_price_with_their_fastest():
    costs = CostModel({1024: 15.0, 2048: 50.0}, learn=True)
    assert costs.times_replay(1024) and not costs.times_replay(512)
    costs.observe_replay(1024, 25.0)
    assert costs.replay_cost(1024) == 15.0  # one replay is no price
    costs.observe_replay(1024, 21.0)
    assert costs.replay_cost(1024) == 21.0 and not costs.times_replay(1024)
    for ms in (44.0, 43.0):  # a noisy capture-time run priced it too high
        costs.observe_replay(2048, ms)
    assert costs.replay_cost(2048) == 43.0
    assert not CostModel({1024: 15.0}).times_replay(1024)  # not learning
