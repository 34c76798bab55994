"""Non-finite isolation: a poisoned item never changes another item's output.

Packed attention multiplies the zero weights between segments by the other segments' values, and 0 * NaN is
NaN, so one item with NaN or inf inputs would turn its whole pack into NaN. The manager checks the floating
inputs of a call that replays any pack (one device-to-host sync for all of them, outside the forward; a call
served wholly by the eager forward is what eager gives anyway) and runs the items found non-finite eagerly,
each alone: they get exactly what eager gives them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def finite(kwargs: Mapping[str, Any], exact: bool = False) -> bool:
    """Whether every floating tensor of ``kwargs`` is free of NaN and inf: one device-to-host sync for all.

    Quick (default): a tensor's float32 sum is NaN or inf whenever one of its values is (NaN and inf propagate,
    inf - inf is NaN), so one reduction per tensor answers; only huge finite values can overflow the sum too,
    and then the ``exact`` per-item check (every value tested) decides."""
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not tensors:
        return True
    if exact:
        checks = [torch.isfinite(v).all() for v in tensors]
        return bool(torch.stack([c.to(checks[0].device) for c in checks]).all())
    sums = [v.sum(dtype=torch.float32) for v in tensors]
    total = sums[0] if len(sums) == 1 else torch.stack([s.to(sums[0].device) for s in sums]).sum()
    return bool(torch.isfinite(total))


def nonfinite_items(kwargs: Mapping[str, Any], count: int, select: Callable[[list[int]], Mapping[str, Any]]
                    ) -> list[int]:
    """The items whose floating inputs hold NaN or inf. All inputs are checked at once first; only when
    something is non-finite is each item selected (``select([i])``) and checked exactly."""
    if finite(kwargs):
        return []
    return [i for i in range(count) if not finite(select([i]), exact=True)]
