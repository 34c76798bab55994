"""The plugin's router: a call whose replays would cost more than one eager forward of its items runs eagerly.

vLLM's manager replays every pack that fits a budget, however much of it is padding: eight large images of 4,313
tokens pad to the 8,192 budget of the default ladder, and that replay is slower than the stock backend's eager
forward (`benchmarks/RESULTS.md`). vLLM 0.33.0 gives a model no say over its packs, but it lets a path be left out
of a pack (``EncoderCudaGraphPathConfig.allow_zero_tokens``): items whose tokens on the default path are 0 pack
together (up to the item cap), no graph runs for them, and ``postprocess_encoder_output`` gets no output for the
path. The plugin then runs the pack's eager forward itself (the adapter's, with compiled blocks where the graphs
have them). So the plugin routes a whole call: it gives every item of the call zero tokens on the path, or none.

The decision is vitcg's own router (:mod:`vitcg.runtime.costs`) over vLLM's packing of the call (greedy, as vLLM
packs: :mod:`vitcg.runtime.packing`): replays are priced per budget from the first real replays of each (timed
between ``prepare_encoder_cudagraph_replay_buffers`` and ``postprocess_encoder_output``, the device synchronized),
eager calls per size class from the eager calls the plugin runs; a size whose eager price is unknown is explored
eagerly once its replays cost over a millisecond, and a price not measured keeps the graphs. Only on CUDA, where
the timings mean something.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from ..runtime.budgets import BudgetPlan
from ..runtime.costs import OBSERVED, CostModel, route
from ..runtime.packing import fit, plan_packs

T = TypeVar("T")


class Router:
    """What the plugin knows of vLLM's budgets, and the prices it measured."""

    def __init__(self, device: torch.device):
        self.device = device
        self.costs = CostModel(learn=device.type == "cuda")
        """Replay prices per budget and eager prices per size class (ms); ``learn`` on CUDA only."""
        self.captured: dict[int, tuple[int, int]] = {}
        """Each budget vLLM captured, with the item and frame caps it captured it for."""
        self._replay: tuple[int, float] | None = None
        """The budget of the replay being timed, and when it started."""
        self.eager_calls = 0
        """Calls routed to the eager forward (explorations included)."""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def note_capture(self, budget: int, max_items: int, max_frames: int) -> None:
        self.captured[budget] = (max_items, max_frames)

    def plan(self) -> BudgetPlan | None:
        if not self.captured:
            return None
        budgets = tuple(sorted(self.captured))
        max_items, max_frames = self.captured[budgets[-1]]
        return BudgetPlan(budgets, max_items, max_frames, budgets[0], budgets[-1])

    def wholly_eager(self, tokens: Sequence[int]) -> bool:
        """Whether a call of items of ``tokens`` output tokens should run as eager forwards rather than as the
        replays vLLM would pack it into: while its size's eager price is unknown and its largest replay costs over
        :data:`~vitcg.runtime.costs.EXPLORE_MS` (to measure it), or when one eager call is measured cheaper than
        those replays. Never while vLLM would run some item eagerly anyway (over every budget)."""
        plan = self.plan()
        if plan is None or not tokens or not (self.costs.learn or self.costs.eager is not None):
            return False
        packs, eager = plan_packs(tokens, plan, policy="greedy")
        if eager:
            return False
        if self.costs.explores(sum(tokens), packs):
            return True
        return not route(tokens, packs, [], self.costs).packs

    def times_replays(self) -> bool:
        """Whether some captured budget's first replays are still being timed."""
        return self.costs.learn and any(len(self.costs.replay_samples.get(budget, ())) < OBSERVED
                                        for budget in self.captured)

    def replay_starts(self, tokens: int) -> None:
        """A replay of a pack of ``tokens`` is about to be prepared: timed while its budget's first replays are."""
        plan = self.plan()
        budget = fit(plan, tokens) if plan is not None and self.costs.learn else None
        if budget is not None and len(self.costs.replay_samples.get(budget, ())) < OBSERVED:
            self._sync()
            self._replay = (budget, time.perf_counter())

    def replay_ended(self) -> None:
        """The replay whose start :meth:`replay_starts` timed has run: its price observed."""
        if self._replay is not None:
            budget, start = self._replay
            self._replay = None
            self._sync()
            self.costs.observe_replay(budget, (time.perf_counter() - start) * 1e3)

    def eager(self, tokens: int, forward: Callable[[], T]) -> T:
        """``forward()``, an eager forward of ``tokens`` output tokens, timed while its size class is observed."""
        self._replay = None
        self.eager_calls += 1
        if not self.costs.times_eager(tokens):
            return forward()
        self._sync()
        start = time.perf_counter()
        result = forward()
        self._sync()
        self.costs.observe_eager(tokens, (time.perf_counter() - start) * 1e3)
        return result

    def describe(self) -> dict[str, Any]:
        """The prices measured so far, for logs and benchmarks."""
        return {"replay_ms": dict(self.costs.replay), "eager_samples": {
            str(size): samples for size, samples in self.costs.eager_samples.items()}, "eager_calls": self.eager_calls}
