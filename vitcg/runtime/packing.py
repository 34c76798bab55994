"""Packing: which items share a replay, and at which budget.

Pure functions over item tokens, frames, the budget plan (:class:`~vitcg.runtime.budgets.BudgetPlan`) and a
replay price; no torch and no model, so ``vitcg plan`` calls them as the manager does. An item runs eagerly
when no budget holds it or it has more frames than a pack allows; each pack replays the smallest budget that
holds its tokens.

``tight`` (default, a deliberate difference from vLLM) packs largest item first into the budgets whose
replays cost least (H100, Qwen2-VL-7B tower, mixed batch of 8 images: 129 ms against greedy's 206 ms;
benchmarks/RESULTS.md). ``greedy`` is vLLM's policy, for drop-in parity: items sorted by tokens, packed under
the largest budget and the item cap, a pack closed early when an item alone needs at least its budget and
two replays cost fewer budget tokens than one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .budgets import BudgetPlan

PACKING = ("tight", "greedy")

Price = Callable[[int], float]
"""What one replay at a budget costs (any unit, the same for every budget)."""


@dataclass(frozen=True)
class PackPlan:
    """One planned replay: the budget it runs at, the items it holds (indices into the call), their tokens."""

    budget: int
    indices: tuple[int, ...]
    tokens: int


def fit(plan: BudgetPlan, tokens: int) -> int | None:
    """The smallest budget holding ``tokens`` output tokens, or None."""
    return next((b for b in plan.budgets if b >= tokens), None)


def token_price(plan: BudgetPlan) -> Price:
    """The price when nothing was measured: the tokens a replay computes, plus the smallest budget per replay
    (every replay costs at least that much in launches)."""
    return lambda budget: budget + plan.budgets[0]


def plan_packs(tokens: Sequence[int], plan: BudgetPlan, *, frames: Sequence[int] | None = None,
               policy: str = "tight", price: Price | None = None) -> tuple[list[PackPlan], list[int]]:
    """``(packs, eager item indices)`` for items of ``tokens`` output tokens (and ``frames`` video frames each).
    A pack's indices are in the order its items were packed."""
    frames = list(frames) if frames is not None else [0] * len(tokens)
    eager = [i for i, n in enumerate(tokens) if frames[i] > plan.max_frames or fit(plan, n) is None]
    skip = set(eager)
    rest = [i for i in range(len(tokens)) if i not in skip]
    packer = _Packer(tokens, frames, plan, price or token_price(plan))
    if policy == "tight":
        return packer.tight(sorted(rest, key=lambda i: (-tokens[i], i))), eager
    if policy == "greedy":
        return packer.greedy(sorted(rest, key=lambda i: (tokens[i], i))), eager
    raise ValueError(f"packing must be one of {', '.join(PACKING)}, got {policy!r}")


def plan_except(tokens: Sequence[int], plan: BudgetPlan, excluded: Sequence[int], *,
                frames: Sequence[int] | None = None, policy: str = "tight", price: Price | None = None
                ) -> tuple[list[PackPlan], list[int]]:
    """:func:`plan_packs` over every item but ``excluded``, in the indices of ``tokens``."""
    skip = set(excluded)
    rest = [i for i in range(len(tokens)) if i not in skip]
    packs, eager = plan_packs([tokens[i] for i in rest], plan, frames=[frames[i] for i in rest] if frames else None,
                              policy=policy, price=price)
    return ([PackPlan(p.budget, tuple(rest[j] for j in p.indices), p.tokens) for p in packs],
            [rest[j] for j in eager])


class _Packer:
    def __init__(self, tokens: Sequence[int], frames: Sequence[int], plan: BudgetPlan, price: Price):
        self.tokens, self.frames, self.plan, self.price = tokens, frames, plan, price

    def pack(self, chosen: Sequence[int]) -> PackPlan:
        tokens = sum(self.tokens[j] for j in chosen)
        return PackPlan(fit(self.plan, tokens), tuple(chosen), tokens)

    def feasible(self, chosen: Sequence[int], limit: int) -> bool:
        """Whether ``chosen`` forms one pack replayable at a budget no larger than ``limit``."""
        if len(chosen) > self.plan.max_items or sum(self.frames[j] for j in chosen) > self.plan.max_frames:
            return False
        budget = fit(self.plan, sum(self.tokens[j] for j in chosen))
        return budget is not None and budget <= limit

    def greedy(self, order: list[int]) -> list[PackPlan]:
        packs, current = [], []
        for i in order:
            if current and (not self.feasible([*current, i], self.plan.budgets[-1]) or self.defer(current, i)):
                packs.append(self.pack(current))
                current = []
            current.append(i)
        return [*packs, self.pack(current)] if current else packs

    def defer(self, current: list[int], i: int) -> bool:
        """vLLM's early close: item ``i`` alone needs at least the current pack's budget, and two replays
        cost fewer budget tokens than one merged replay."""
        tokens = sum(self.tokens[j] for j in current)
        alone, now = fit(self.plan, self.tokens[i]), fit(self.plan, tokens)
        merged = fit(self.plan, tokens + self.tokens[i])
        return alone >= now and now + alone < merged

    def tight(self, order: list[int]) -> list[PackPlan]:
        """The cheaper of: everything in one pack, or the largest budget not above the total filled largest
        item first and the rest packed the same way. ``order``: largest item first."""
        if not order:
            return []
        candidates = []
        if self.feasible(order, self.plan.budgets[-1]):
            candidates.append([self.pack(order)])
        total = sum(self.tokens[i] for i in order)
        below = [b for b in self.plan.budgets if b <= total]
        if below and (not candidates or below[-1] < candidates[0][0].budget):
            candidates += self._filled(order, below[-1])
        if not candidates:  # nothing fits under the total: the largest item alone, then the rest
            candidates.append([self.pack(order[:1]), *self.tight(order[1:])])
        return min(candidates, key=lambda packs: sum(self.price(p.budget) for p in packs))

    def _filled(self, order: list[int], budget: int) -> list[list[PackPlan]]:
        """The candidate of :meth:`tight` that fills ``budget`` largest item first and packs the rest the same way
        (none when no item fits it)."""
        chosen: list[int] = []
        for i in order:
            if self.feasible([*chosen, i], budget):
                chosen.append(i)
        if not chosen:
            return []
        taken = set(chosen)
        return [[self.pack(chosen), *self.tight([i for i in order if i not in taken])]]
