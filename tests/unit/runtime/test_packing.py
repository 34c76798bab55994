"""Packing as pure functions: which items share a replay, at which budget (no torch, no model)."""

from __future__ import annotations

import pytest

from vitcg.runtime.budgets import BudgetPlan
from vitcg.runtime.packing import fit, plan_except, plan_packs, token_price


def plan(budgets=(4, 8, 16, 32), items=16, frames=0) -> BudgetPlan:
    return BudgetPlan(tuple(budgets), items, frames, budgets[0], budgets[-1])


def test_greedy_packs_smallest_first_under_the_largest_budget():
    packs, eager = plan_packs([5, 1, 9, 3, 40, 2], plan(items=3), policy="greedy")
    assert eager == [4]  # 40 > the largest budget 32
    assert [p.indices for p in packs] == [(1, 5, 3), (0, 2)]  # sizes 1,2,3 then 5,9
    assert [p.budget for p in packs] == [8, 16]  # the smallest budgets >= 6 and >= 14
    assert [p.tokens for p in packs] == [6, 14]


def test_the_item_cap_closes_a_greedy_pack():
    packs, _ = plan_packs([20, 10, 15], plan(items=4), policy="greedy")
    assert [p.indices for p in packs] == [(1, 2), (0,)]


def test_greedy_closes_a_pack_when_an_item_alone_outweighs_it():
    """vLLM's rule: 3 tokens then a 16-token item: 4 + 16 budget tokens beat one replay of 32."""
    packs, _ = plan_packs([3, 16], plan(items=4), policy="greedy")
    assert [(p.indices, p.budget) for p in packs] == [((0,), 4), ((1,), 16)]


def test_tight_pads_less_than_greedy():
    ladder = plan((4, 8, 16, 32, 64))
    greedy, _ = plan_packs([2, 30, 3], ladder, policy="greedy")  # 2+3 in 8, 30 in 32
    tight, _ = plan_packs([2, 30, 3], ladder)  # 30+2 in 32, 3 in 4
    assert [p.budget for p in greedy] == [8, 32] and sorted(p.budget for p in tight) == [4, 32]
    assert sorted(i for p in tight for i in p.indices) == [0, 1, 2]


def test_tight_minimizes_the_replay_price():
    """Measured prices (a replay costs milliseconds of launches whatever its size) favour one larger replay;
    prices proportional to size favour the two smaller ones; without prices, tokens decide."""
    ladder = plan((4, 8, 16, 32, 64))
    assert token_price(ladder)(32) == 32 + 4
    assert sorted(p.budget for p in plan_packs([2, 30, 1], ladder)[0]) == [4, 32]
    flat = {4: 10.0, 8: 10.5, 16: 11.0, 32: 12.0, 64: 14.0}
    assert [p.budget for p in plan_packs([2, 30, 1], ladder, price=flat.__getitem__)[0]] == [64]
    linear = {4: 1.0, 8: 2.0, 16: 4.0, 32: 8.0, 64: 16.0}
    assert sorted(p.budget for p in plan_packs([2, 30, 1], ladder, price=linear.__getitem__)[0]) == [4, 32]


def test_frames_over_the_cap_run_eagerly():
    packs, eager = plan_packs([4, 4, 4], plan(frames=8), frames=[2, 9, 6])
    assert eager == [1]
    assert all(sum((2, 9, 6)[i] for i in p.indices) <= 8 for p in packs)
    assert sorted(i for p in packs for i in p.indices) == [0, 2]


def test_plan_except_keeps_the_callers_indices():
    packs, eager = plan_except([5, 40, 3, 2], plan(), excluded=[0])
    assert eager == [1]
    assert sorted(i for p in packs for i in p.indices) == [2, 3]


def test_fit_and_unknown_policy():
    assert fit(plan(), 9) == 16 and fit(plan(), 33) is None
    with pytest.raises(ValueError, match="tight, greedy"):
        plan_packs([1], plan(), policy="best")


def test_packing_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, vitcg.runtime.packing, vitcg.runtime.costs; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
