"""What the manager did: counters since it was built."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ManagerStats:
    """Counters since the manager was built. ``hits + misses == items`` always."""

    items: int = 0
    hits: int = 0
    """Items served by a budget graph."""
    misses: int = 0
    """Items that ran eagerly (larger than every budget, too many frames, or cheaper eagerly)."""
    routed_eager: int = 0
    """Of the misses, items that fit a budget but ran eagerly because that was measured cheaper (or explored)."""
    nonfinite_items: int = 0
    """Of the misses, items whose inputs held NaN or inf and so ran eagerly, each alone (``isolate_nonfinite``)."""
    graph_hits = property(lambda self: self.hits, doc="vLLM's name for :attr:`hits`.")
    graph_misses = property(lambda self: self.misses, doc="vLLM's name for :attr:`misses`.")
    replays: int = 0
    eager_calls: int = 0
    used_tokens: int = 0
    """Real output tokens produced by replays."""
    padded_tokens: int = 0
    """Budget tokens replays computed for padding (waste)."""
    replays_per_budget: Counter = field(default_factory=Counter)
    host_seconds: float = 0.0
    """Host time spent in ``execute`` outside graph launches and forwards: what vitcg adds per call."""

    @property
    def padding_waste(self) -> float:
        """Fraction of replayed budget tokens that were padding."""
        total = self.used_tokens + self.padded_tokens
        return self.padded_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"items": self.items, "hits": self.hits, "misses": self.misses, "replays": self.replays,
                "eager_calls": self.eager_calls, "nonfinite_items": self.nonfinite_items,
                "routed_eager": self.routed_eager, "used_tokens": self.used_tokens,
                "padded_tokens": self.padded_tokens, "padding_waste": round(self.padding_waste, 4),
                "host_seconds": round(self.host_seconds, 6),
                "replays_per_budget": dict(sorted(self.replays_per_budget.items()))}
