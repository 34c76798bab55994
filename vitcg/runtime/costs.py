"""One cost model for replays and eager calls, and the router that reads it.

Torch-free: the manager fills it from timings (capture, then real calls) and ``vitcg plan`` from cost curves
(:mod:`vitcg.tools.plan`); both route with :func:`route`.

A replay's price is its budget's: measured once at capture (padding segments, which attend only to themselves),
then replaced by the fastest of its first real replays (real items make longer segments, whose attention costs
more; one capture-time run is no price either).
An eager call's price is that of eager calls measured at a comparable size: the same :func:`size_class` of
output tokens (an eager call's cost is far from proportional to its tokens: 8 images batched cost 2.7x one,
not 8x, on the H100's Gemma 4 tower; and a graph-less forward at budget size prices nothing, since it is
launch-bound where the eager call is not). Until a size class has :data:`OBSERVED` eager timings, a call of that
size whose largest replay costs over :data:`EXPLORE_MS` runs wholly eagerly, timed: exploring costs what eager
costs, nothing more. Once both sides are measured the cheaper one runs; a side that is not measured is never
chosen over one that is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .budgets import interpolate
from .packing import PackPlan

OBSERVED = 2
"""Real replays per budget, and eager calls per size class, timed before their price is trusted (the fastest
counts: one cold call is no price)."""
EXPLORE_MS = 1.0
"""A replay costing more than this (ms) may lose to the model's own eager forward (a compute-bound pack, or a
batched eager call with no padding): below it, graphs always win and nothing is explored."""


def size_class(tokens: int) -> int:
    """The power of two at or above ``tokens``: calls within a factor of two of each other share eager timings."""
    return 1 << max(tokens - 1, 0).bit_length()


@dataclass
class CostModel:
    """Prices of replays (per budget) and eager calls (per output tokens), in ms or any one unit.

    ``replay``: per budget; empty means unmeasured, and packing then prices by tokens. ``eager``: a known eager
    price (``vitcg plan``'s curve); None means it is learnt from eager calls (:meth:`observe_eager`).
    ``learn``: whether real calls are timed and whether unmeasured sizes are explored (the manager on CUDA with
    routing on)."""

    replay: dict[int, float] = field(default_factory=dict)
    eager: Callable[[int], float] | None = None
    learn: bool = False
    replay_samples: dict[int, list[float]] = field(default_factory=dict)
    """Times of the first real replays per budget."""
    eager_samples: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Timed eager calls by size class: (output tokens, time) each."""

    def replay_cost(self, budget: int) -> float | None:
        return self.replay.get(budget)

    def eager_cost(self, tokens: int) -> float | None:
        """The price of one eager call of ``tokens`` output tokens, or None when that size is unmeasured:
        interpolated between the fastest timing at each size of the same size class."""
        if not tokens:
            return 0.0
        if self.eager is not None:
            return self.eager(tokens)
        seen = self.eager_samples.get(size_class(tokens), ())
        if len(seen) < OBSERVED:
            return None
        fastest: dict[int, float] = {}
        for n, ms in seen:
            fastest[n] = min(ms, fastest.get(n, ms))
        return interpolate(sorted(fastest.items()), tokens, flat_below=True) if len(fastest) > 1 \
            else next(iter(fastest.values()))

    def times_replay(self, budget: int) -> bool:
        """Whether to time this replay: one of the first :data:`OBSERVED` real replays of a measured budget."""
        return self.learn and budget in self.replay and len(self.replay_samples.get(budget, ())) < OBSERVED

    def times_eager(self, tokens: int) -> bool:
        """Whether to time an eager call of ``tokens``: its size class has fewer than :data:`OBSERVED`."""
        return self.learn and len(self.eager_samples.get(size_class(tokens), ())) < OBSERVED

    def observe_replay(self, budget: int, ms: float) -> None:
        seen = self.replay_samples.setdefault(budget, [])
        seen.append(ms)
        if len(seen) == OBSERVED:
            self.replay[budget] = min(seen)

    def observe_eager(self, tokens: int, ms: float) -> None:
        self.eager_samples.setdefault(size_class(tokens), []).append((tokens, ms))

    def explores(self, tokens: int, packs: Sequence[PackPlan]) -> bool:
        """Whether a call of ``tokens`` served by ``packs`` (nothing else eager) should run wholly eagerly, timed:
        its size is unmeasured and its largest replay costs over :data:`EXPLORE_MS`."""
        if not (self.learn and packs and self.eager is None) or not self.times_eager(tokens):
            return False
        return (self.replay_cost(max(p.budget for p in packs)) or 0.0) > EXPLORE_MS


@dataclass(frozen=True)
class Route:
    """Where one call's items go: packs to replay, items to run in one eager call, and why."""

    packs: list[PackPlan]
    eager: list[int]
    why: str
    moved: int = 0
    """Of ``eager``, items that fit a budget and were moved there by routing (or exploring)."""


def route(tokens: Sequence[int], packs: list[PackPlan], eager: list[int], costs: CostModel) -> Route:
    """Move packs to the eager call while that is measured cheaper: a compute-bound pack padded to a large budget
    can cost more as a replay than its real tokens eagerly; then the whole call to one eager call when that is
    cheaper than the replays left plus the eager part (its fixed cost is paid once). A price that is not known
    keeps the packs as they are."""
    def eager_price(indices: Sequence[int]) -> float | None:
        return costs.eager_cost(sum(tokens[i] for i in indices))

    forced = len(eager)
    kept, eager, why = _move_packs(packs, eager, eager_price, costs)
    if kept and (whole := _one_eager_call(kept, eager, eager_price, costs)) is not None:
        return Route([], whole.eager, whole.why, len(whole.eager) - forced)
    return Route(kept, eager, "; ".join(why) or "nothing to replay", len(eager) - forced)


def _move_packs(packs: list[PackPlan], eager: list[int], eager_price: Callable[[Sequence[int]], float | None],
                costs: CostModel) -> tuple[list[PackPlan], list[int], list[str]]:
    """Largest budget first, each pack moved to the eager call when its items cost less there than its replay;
    the packs kept (in the packing's order), the eager items, and why for each pack."""
    kept, why = [], []
    for pack in sorted(packs, key=lambda p: -p.budget):
        before, after, replay = eager_price(eager), eager_price([*eager, *pack.indices]), costs.replay_cost(pack.budget)
        if None in (before, after, replay):
            kept.append(pack)
            why.append(f"budget {pack.budget}: replayed (eager price unmeasured)")
        elif after - before < replay:
            eager = [*eager, *pack.indices]
            why.append(f"budget {pack.budget}: eager (+{after - before:.2f} against a replay of {replay:.2f})")
        else:
            kept.append(pack)
            why.append(f"budget {pack.budget}: replayed ({replay:.2f} against +{after - before:.2f} eager)")
    return [p for p in packs if any(p is k for k in kept)], eager, why


def _one_eager_call(kept: list[PackPlan], eager: list[int], eager_price: Callable[[Sequence[int]], float | None],
                    costs: CostModel) -> Route | None:
    """Every item in one eager call, when that is measured cheaper than the replays of ``kept`` plus the eager
    call of ``eager``; else None."""
    everything = [*eager, *(i for p in kept for i in p.indices)]
    together, part = eager_price(everything), eager_price(eager)
    replays = [costs.replay_cost(p.budget) for p in kept]
    if together is None or part is None or None in replays or together >= sum(replays) + part:
        return None
    return Route([], everything, f"one eager call ({together:.2f}) is cheaper than the replays and eager "
                 f"part ({sum(replays) + part:.2f})")
