"""Budget planning: vLLM's four configuration paths and their invariants (vLLM PR #38040)."""

from __future__ import annotations

import pytest

from vitcg.errors import BudgetError
from vitcg.runtime.budgets import plan_budgets, power_of_two_budgets


def test_power_of_two_budgets_include_max():
    assert power_of_two_budgets(64, 8192) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert power_of_two_budgets(64, 5000) == [64, 128, 256, 512, 1024, 2048, 4096, 5000]
    assert power_of_two_budgets(100, 1000) == [128, 256, 512, 1000]
    assert power_of_two_budgets(256, 256) == [256]
    assert power_of_two_budgets(1, 4) == [1, 2, 4]


def test_neither_given_generates_budgets_and_caps_items():
    plan = plan_budgets(64, 8192)
    assert plan.budgets == (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    assert plan.max_items == min(8192 // 64, 64)


def test_only_budgets_given():
    plan = plan_budgets(64, 8192, token_budgets=[4096, 1024, 2048, 1024])
    assert plan.budgets == (1024, 2048, 4096)
    assert plan.max_items == min(8192 // 64, 1024)


def test_only_items_given_generates_from_items():
    plan = plan_budgets(64, 8192, max_items=200)
    assert plan.budgets == (200, 400, 800, 1600, 3200, 6400, 8192)  # vLLM's ladder doubles from 200
    assert plan_budgets(64, 8192, max_items=200, ladder="pow2").budgets == (256, 512, 1024, 2048, 4096, 8192)
    assert plan.max_items == 200


def test_ladders_match_vllm_by_default():
    from vitcg.runtime.budgets import doubling_budgets

    assert plan_budgets(144, 2048).budgets == (144, 288, 576, 1152, 2048)  # llama4: not powers of two
    assert plan_budgets(64, 8192).budgets == (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    assert doubling_budgets(577, 577) == [577] and doubling_budgets(100, 1000) == [100, 200, 400, 800, 1000]
    with pytest.raises(BudgetError, match="ladder must be one of vllm, pow2"):
        plan_budgets(64, 8192, ladder="fib")


def test_both_given_and_consistent():
    plan = plan_budgets(64, 8192, token_budgets=[512, 2048], max_items=8)
    assert plan.budgets == (512, 2048) and plan.max_items == 8


def test_items_exceeding_smallest_budget_names_both_values_and_the_fix():
    with pytest.raises(BudgetError) as info:
        plan_budgets(64, 8192, token_budgets=[16, 2048], max_items=32)
    message = str(info.value)
    assert "=32" in message and "16" in message
    assert "Set max items <= 16" in message


@pytest.mark.parametrize("budgets", [[0, 128], [-64], [64, 0.5], []])
def test_non_positive_or_empty_budgets(budgets):
    with pytest.raises(BudgetError):
        plan_budgets(64, 8192, token_budgets=budgets)


def test_budget_above_max_is_rejected():
    with pytest.raises(BudgetError, match=r"token budgets \[16384\] exceed the max token budget 8192"):
        plan_budgets(64, 8192, token_budgets=[1024, 16384])


@pytest.mark.parametrize(("low", "high", "fragment"), [
    (0, 8192, "must be positive"),
    (64, 0, "must be positive"),
    (-1, 8192, "must be positive"),
    (4096, 2048, "min token budget 4096 is larger than max token budget 2048"),
])
def test_budget_range_invariants(low, high, fragment):
    with pytest.raises(BudgetError, match=fragment):
        plan_budgets(low, high)


def test_negative_items_rejected():
    with pytest.raises(BudgetError, match=">= 0"):
        plan_budgets(64, 8192, max_items=-1)


def test_max_frames_rules():
    assert plan_budgets(64, 8192, max_items=4, max_frames_per_video=32).max_frames == 128
    assert plan_budgets(64, 8192, max_items=4, max_frames_per_video=32, video=False).max_frames == 0
    assert plan_budgets(64, 8192, max_items=4, max_frames_per_batch=7).max_frames == 7
    with pytest.raises(BudgetError):
        plan_budgets(64, 8192, max_frames_per_batch=-2)


def test_small_range_never_gives_zero_items():
    plan = plan_budgets(256, 256)
    assert plan.budgets == (256,) and plan.max_items == 1


def test_interpolate_is_piecewise_linear_and_goes_on_past_the_points():
    from vitcg.runtime.budgets import interpolate

    points = [(64, 2.0), (128, 3.0), (512, 9.0)]
    assert interpolate(points, 96) == 2.5 and interpolate(points, 320) == 6.0
    assert interpolate(points, 1024) == 17.0  # the last segment goes on
    assert interpolate(points, 32) == 1.5 and interpolate(points, 32, flat_below=True) == 2.0
    assert interpolate(points, 0) == 1.0 and interpolate([(64, 2.0), (128, 10.0)], 0) == 0.0  # never below 0
    assert interpolate([(100, 4.0)], 250) == 10.0 and interpolate([(100, 4.0)], 50, flat_below=True) == 4.0
