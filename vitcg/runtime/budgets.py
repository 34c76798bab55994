"""Token budgets and batch limits: vLLM's configuration paths and the invariants of vLLM PR #38040.

Torch-free, so ``vitcg compile-config`` checks engine options without importing the model stack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BudgetError

BUDGETS = "encoder_cudagraph_token_budgets"
MAX_ITEMS = "encoder_cudagraph_max_vision_items_per_batch"
MAX_FRAMES = "encoder_cudagraph_max_frames_per_batch"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_limits(budgets: Sequence[Any] | None, max_items: Any, max_frames: Any = None) -> None:
    """The model-independent invariants. Raises BudgetError naming the values and a remedy.

    Budgets, when given, are a non-empty list of integers > 0; items is an integer >= 0 (0 = auto) and at
    most ``min(budgets)`` (every item needs at least one token); frames, when given, is an integer >= 0.
    """
    if budgets is not None:
        _check_budgets(budgets)
    if not _is_int(max_items) or max_items < 0:
        raise BudgetError(f"{MAX_ITEMS} must be an integer >= 0 (0 = auto), got {max_items!r}")
    if budgets is not None and max_items > min(budgets):
        smallest = min(budgets)
        raise BudgetError(
            f"{MAX_ITEMS}={max_items} exceeds the smallest token budget {smallest}: every item needs at "
            f"least one token. Set max items <= {smallest} or drop budgets smaller than {max_items}")
    if max_frames is not None and (not _is_int(max_frames) or max_frames < 0):
        raise BudgetError(f"{MAX_FRAMES} must be an integer >= 0, got {max_frames!r}")


def _check_budgets(budgets: Any) -> None:
    """Budgets are a non-empty list of positive integers; BudgetError naming the bad values otherwise."""
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Sequence) or not budgets:
        raise BudgetError(f"{BUDGETS} must be a non-empty list of positive integers, got {budgets!r}")
    if bad := [b for b in budgets if not _is_int(b) or b <= 0]:
        raise BudgetError(f"{BUDGETS} must be positive integers, got {bad}")


LADDERS = ("vllm", "pow2")
"""Generated budget ladders: ``vllm`` (default) doubles from the min budget, as vLLM's manager does, so the
same configuration captures the same budgets in both; ``pow2`` uses powers of two from the first one at
or above the min budget (vitcg's earlier choice: fewer distinct shapes when min is not a power of two)."""


@dataclass(frozen=True)
class BudgetPlan:
    """The token budgets and batch limits one manager captures."""

    budgets: tuple[int, ...]
    """Ascending token budgets (output tokens); one graph each."""
    max_items: int
    """Most items in one pack (``max_batch_size`` of the protocol)."""
    max_frames: int
    """Most video frames in one pack (0 when video is disabled)."""
    min_budget: int
    max_budget: int


LEAN_ITEMS = 16
"""Items per pack when the engine leaves the count to be inferred and ``lean`` is on (vitcg's default).
vLLM infers ``max_budget // min_budget`` (128 for Qwen2-VL at 8192 tokens) and frames per pack as items
times frames per video (4096): capture buffers must then hold that many attention segments, and every
slot of ``cu_seqlens`` widens the flash kernel's grid at every layer. Measured on the H100 (Qwen2-VL-7B
tower, benchmarks/RESULTS.md), vLLM's caps made 8 images 1.4x and a mixed batch 2.3-2.8x slower than
these. Lean caps: this many items, and the frames of one longest video."""


def lean_caps(plan: BudgetPlan, max_frames_per_video: int, infer_frames: bool) -> BudgetPlan:
    """``plan`` with inferred caps made lean: at most :data:`LEAN_ITEMS` items, and (when ``infer_frames``) the
    frames of one longest video. For a plan whose items per batch were inferred."""
    frames = plan.max_frames
    if infer_frames and frames:
        frames = min(frames, max_frames_per_video)
    return dataclasses.replace(plan, max_items=min(plan.max_items, LEAN_ITEMS), max_frames=frames)


def doubling_budgets(start: int, max_budget: int) -> list[int]:
    """vLLM's ladder: ``start, 2*start, 4*start, ...`` while ``<= max_budget``, then ``max_budget`` if missing."""
    budgets, value = [], start
    while value <= max_budget:
        budgets.append(value)
        value *= 2
    if not budgets or budgets[-1] < max_budget:
        budgets.append(max_budget)
    return budgets


def power_of_two_budgets(start: int, max_budget: int) -> list[int]:
    """Powers of two from the first one >= ``start`` up to ``max_budget``, which is always included."""
    budgets, value = [], 1 << max(start - 1, 0).bit_length()
    while value < max_budget:
        budgets.append(value)
        value *= 2
    budgets.append(max_budget)
    return budgets


def _check_range(min_budget: int, max_budget: int, ladder: str) -> None:
    """``0 < min_budget <= max_budget`` and a known ladder; BudgetError naming the values and a remedy."""
    if min_budget <= 0 or max_budget <= 0:
        raise BudgetError(f"token budget range must be positive, got min={min_budget}, max={max_budget}; "
                          "raise max_num_batched_tokens / max_model_len or fix the spec's budget formulas")
    if min_budget > max_budget:
        raise BudgetError(f"min token budget {min_budget} is larger than max token budget {max_budget} "
                          "(min(max_num_batched_tokens, max_model_len)); raise those limits to at least "
                          f"{min_budget}")
    if ladder not in LADDERS:
        raise BudgetError(f"budget ladder must be one of {', '.join(LADDERS)}, got {ladder!r}")


def _ladder(min_budget: int, max_budget: int, token_budgets: Sequence[int] | None, max_items: int,
            ladder: str) -> list[int]:
    """The ascending budgets: those given (none above ``max_budget``), else the ladder generated from
    ``max(min_budget, max_items)``."""
    if token_budgets is not None:
        if too_big := [b for b in token_budgets if b > max_budget]:
            raise BudgetError(f"token budgets {too_big} exceed the max token budget {max_budget} "
                              "(min(max_num_batched_tokens, max_model_len)); drop them or raise those limits")
        return sorted(set(token_budgets))
    generate = doubling_budgets if ladder == "vllm" else power_of_two_budgets
    budgets = generate(max(min_budget, max_items), max_budget)
    if max_items > max_budget:
        raise BudgetError(f"encoder_cudagraph_max_vision_items_per_batch={max_items} exceeds the max token "
                          f"budget {max_budget}; lower it or raise max_num_batched_tokens")
    return budgets


def plan_budgets(
    min_budget: int,
    max_budget: int,
    token_budgets: Sequence[int] | None = None,
    max_items: int = 0,
    max_frames_per_batch: int | None = None,
    max_frames_per_video: int = 1,
    video: bool = True,
    ladder: str = "vllm",
) -> BudgetPlan:
    """Resolve budgets and limits from the engine options, enforcing vLLM's invariants.

    - budgets and items given: ``items <= min(budgets)``;
    - only items given: budgets are generated from ``max(min_budget, items)``;
    - only budgets given, or neither: ``items = min(max_budget // min_budget, min(budgets))``;
    - ``0 < min_budget <= max_budget``; every budget > 0 and <= max_budget;
    - ``max_frames_per_batch``: None means items x max_frames_per_video, and 0 when video is disabled;
    - ``ladder``: how budgets are generated when none are given (:data:`LADDERS`).

    Raises BudgetError naming the values and a remedy.
    """
    _check_range(min_budget, max_budget, ladder)
    check_limits(token_budgets, max_items, max_frames_per_batch)
    budgets = _ladder(min_budget, max_budget, token_budgets, max_items, ladder)
    if not max_items:
        max_items = max(1, min(max_budget // min_budget, budgets[0]))
    if max_frames_per_batch is None:
        max_frames_per_batch = max_items * max_frames_per_video if video else 0
    return BudgetPlan(tuple(budgets), max_items, max_frames_per_batch, min_budget, max_budget)


def interpolate(points: Sequence[tuple[float, float]], x: float, *, flat_below: bool = False) -> float:
    """Piecewise linear through ``points`` (sorted by x, distinct x > 0), never below 0. Beyond the last point
    the last segment goes on (one point: the line through the origin); below the first, the first segment goes
    on, or with ``flat_below`` the first point's value holds (a cost measured at the smallest size is no less
    below it)."""
    x0, y0 = points[0]
    if flat_below and x <= x0:
        return y0
    if len(points) == 1:
        return max(0.0, y0 * x / x0)
    for i in range(1, len(points)):
        (a, ya), (b, yb) = points[i - 1], points[i]
        if x <= b or i == len(points) - 1:
            return max(0.0, ya + (yb - ya) * (x - a) / (b - a))
    raise AssertionError("unreachable")
