"""The plugin's router (vitcg.vllm_plugin.routing): what it learns from timed replays and eager calls, and when it
sends a whole call to the eager forward. The prices are observed directly here; under vLLM's own manager the
routing itself is tests/vllm/test_plugin.py's."""

from __future__ import annotations

import torch

from vitcg.runtime.costs import CostModel
from vitcg.vllm_plugin.routing import Router

BUDGETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
MIXED = [450, 520, 530, 560, 570, 580, 590, 513]
"""Eight items of 4,313 tokens in all: vLLM packs them into one replay at 8,192."""


def learning_router() -> Router:
    router = Router(torch.device("cpu"))
    router.costs = CostModel(learn=True)  # as on CUDA
    for budget in BUDGETS:
        router.note_capture(budget, 64, 128)
    return router


def test_nothing_is_routed_before_vllm_captured_or_without_prices():
    assert not Router(torch.device("cpu")).wholly_eager(MIXED)
    router = Router(torch.device("cpu"))  # on the CPU nothing is timed, so nothing is learnt
    for budget in BUDGETS:
        router.note_capture(budget, 64, 128)
    assert not router.wholly_eager(MIXED)


def test_a_costly_replay_is_explored_eagerly_then_the_cheaper_side_wins():
    router = learning_router()
    assert not router.wholly_eager(MIXED)  # the replay's price is not known yet: the graphs
    for _ in range(2):
        router.costs.observe_replay(8192, 120.0)
    assert router.wholly_eager(MIXED)  # the eager price is not known, and the replay costs over 1 ms: explore
    for _ in range(2):
        router.costs.observe_eager(sum(MIXED), 80.0)
    assert router.wholly_eager(MIXED)  # measured: 80 ms eagerly against a 120 ms replay
    slower = learning_router()
    for _ in range(2):
        slower.costs.observe_replay(8192, 120.0)
        slower.costs.observe_eager(sum(MIXED), 150.0)
    assert not slower.wholly_eager(MIXED)


def test_a_cheap_replay_is_never_explored():
    router = learning_router()
    for _ in range(2):
        router.costs.observe_replay(64, 0.5)
    assert not router.wholly_eager([40])


def test_a_call_with_an_item_over_every_budget_is_left_to_vllm():
    router = Router(torch.device("cpu"))
    router.costs = CostModel(replay=dict.fromkeys(BUDGETS, 1000.0), eager=lambda tokens: 1.0)
    for budget in BUDGETS:
        router.note_capture(budget, 64, 128)
    assert router.wholly_eager([100, 200])
    assert not router.wholly_eager([100, 9000])  # vLLM runs that item eagerly itself and packs the rest


def test_the_first_replays_of_each_budget_are_timed_then_no_longer():
    router = learning_router()
    assert router.times_replays()
    for budget in BUDGETS:
        for _ in range(2):
            router.replay_starts(budget)
            router.replay_ended()
    assert set(router.costs.replay) == set(BUDGETS) and not router.times_replays()
    router.replay_starts(100)  # every budget is priced: nothing is timed, and ending it records nothing
    router.replay_ended()
    assert all(len(samples) == 2 for samples in router.costs.replay_samples.values())


def test_eager_calls_are_timed_per_size_class_and_counted():
    router = learning_router()
    assert [router.eager(4313, lambda: "rows") for _ in range(3)] == ["rows"] * 3
    assert router.eager_calls == 3
    assert len(router.costs.eager_samples[8192]) == 2  # the first two of the size class only
