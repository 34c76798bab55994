"""The engine compilation config that turns on encoder CUDA graphs, as vLLM's ``--enable-vit-cuda-graph`` builds it.

Rules of vLLM PR #40580: one vision item per batch for ``image`` or ``video``, two for ``image+video``,
any other modality is an error; the keys are merged into an existing config rather than replacing it.
Budgets and items are checked with :func:`vitcg.runtime.budgets.check_limits` (vLLM PR #38040), without
importing torch.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import UsageError
from ...runtime.budgets import BUDGETS, MAX_FRAMES, MAX_ITEMS, check_limits

ITEMS_PER_BATCH = {"image": 1, "video": 1, "image+video": 2}
"""Default ``encoder_cudagraph_max_vision_items_per_batch`` per modality."""

ENABLE = "cudagraph_mm_encoder"

MAX_VALUE = 2**31 - 1
"""Largest token budget, item count or frame count accepted. Engines size tensors and index them with these
numbers; beyond int32 no batch fits on a device, so a larger value is a typo to report, not one to print."""


class _NotFinite(ValueError):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise _NotFinite(text)
    return value


def _no_constant(text: str) -> float:
    raise _NotFinite(text)  # NaN, Infinity, -Infinity: Python's json accepts them, JSON does not


def check_bound(name: str, value: object) -> None:
    """Raise UsageError naming ``name`` and ``value`` when ``value`` is an integer above :data:`MAX_VALUE`."""
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_VALUE:
        raise UsageError(f"{name}: {value} is too large; the limit is {MAX_VALUE} (2**31-1)")


def parse_base(text: str | None) -> dict[str, Any]:
    """The ``--base`` compilation config: a JSON object. Returns {} for None. Raises UsageError otherwise."""
    if text is None:
        return {}
    try:
        base = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except _NotFinite as exc:
        raise UsageError(f"--base holds {exc.text}, which is not a finite number (JSON has no Infinity or NaN)") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--base is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError("--base is nested too deeply to be a compilation config") from None
    if not isinstance(base, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(base), "a number")
        raise UsageError(f"--base must be a JSON object (a compilation config), got {kind}: {text}")
    return base


def parse_budgets(text: str | None) -> list[int] | None:
    """``1024,2048,4096`` -> [1024, 2048, 4096]; None stays None. Raises UsageError for a non-integer entry."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        budgets = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--budgets must be comma-separated integers such as 1024,2048,4096, got {text!r}") from None
    for budget in budgets:
        check_bound("--budgets", budget)
    return budgets


def compile_config(modality: str, base: Mapping[str, Any] | None = None, *, budgets: Sequence[int] | None = None,
                   max_items: int | None = None, max_frames: int | None = None) -> dict[str, Any]:
    """``base`` with encoder CUDA graphs turned on for ``modality``; ``base`` itself is not changed.

    Returns a new dict: the keys of ``base`` in their order, then ``cudagraph_mm_encoder: true``,
    ``encoder_cudagraph_max_vision_items_per_batch`` (``max_items``, else 1 for image or video and 2 for
    image+video) and, when given, ``encoder_cudagraph_token_budgets`` (sorted, without repeats) and
    ``encoder_cudagraph_max_frames_per_batch``. Budgets already in ``base`` are kept and checked too.
    Raises UsageError for an unknown modality, frames without video, or a budget, item or frame count above
    :data:`MAX_VALUE`; BudgetError when the limits break an invariant.
    """
    if modality not in ITEMS_PER_BATCH:
        raise UsageError(f"modality must be one of {', '.join(ITEMS_PER_BATCH)}, got {modality!r}")
    if max_frames and "video" not in modality:
        raise UsageError(f"max frames per batch applies to video; modality {modality!r} has none")
    config = dict(base or {})
    config[ENABLE] = True
    config[MAX_ITEMS] = ITEMS_PER_BATCH[modality] if max_items is None else max_items
    if budgets is not None:
        check_limits(budgets, 0)
        config[BUDGETS] = sorted(set(budgets))
    if max_frames is not None:
        config[MAX_FRAMES] = max_frames
    all_budgets = config.get(BUDGETS)  # from --budgets or from the base
    for budget in all_budgets if isinstance(all_budgets, list) else ():
        check_bound(BUDGETS, budget)
    check_bound(MAX_ITEMS, config[MAX_ITEMS])
    check_bound(MAX_FRAMES, config.get(MAX_FRAMES))
    check_limits(config.get(BUDGETS), config[MAX_ITEMS], config.get(MAX_FRAMES))
    return config


def serve_command(model: str, config: Mapping[str, Any]) -> str:
    """The ``vllm serve`` command line that serves ``model`` through vLLM's Transformers backend (where vitcg's
    plugin gives its encoder CUDA graphs) with the compilation config ``config``, quoted for a POSIX shell.
    Raises UsageError for an empty model name, or one starting with ``-``: quoting keeps it one word, but
    ``vllm serve`` would still read that word as one of its options (``--trust-remote-code``), not as the model."""
    if not model.strip():
        raise UsageError("--serve needs a model name or folder, got an empty one")
    if model.startswith("-"):
        raise UsageError(f"--serve {shlex.quote(model)}: the model name starts with '-', so `vllm serve` would read "
                         f"it as one of its options, not as a model; for a folder of that name, pass "
                         f"{shlex.quote('./' + model)}")
    return shlex.join(["vllm", "serve", model, "--model-impl", "transformers", "--compilation-config",
                       json.dumps(config, allow_nan=False, separators=(",", ":"))])
