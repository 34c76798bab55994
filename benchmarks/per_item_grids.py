"""Why LFM3-VL's vision tower has no spec (vitcg/lang/gaps.py): the cost of the alternatives, measured on the CPU.

Every ``Lfm3VlVisionShortConv`` layer gets ``grid_thw`` as a Python list and reshapes each item's rows to its
``(t, h, w)`` grid in a Python loop. A graph of the model's own code bakes that list in: it serves only calls
of the very same grids. This script measures, for a tiny and a real-width tower (random weights, float32):

- eager: the model's own forward, time per call;
- the share of that time spent in the conv layers (the part a stack graph would have to leave eager), and the
  operator counts inside and outside them (launches a GPU graph would save or not);
- graph per distinct grid set: how many captures a workload of photos of random sizes needs (one per call
  whose grid list differs from every earlier one).

Run: ``.venv/bin/python benchmarks/per_item_grids.py`` (transformers with lfm3_vl, 5.23 on).
"""

from __future__ import annotations

import random
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.models.lfm3_vl.configuration_lfm3_vl import Lfm3VlVisionConfig
from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionModel, Lfm3VlVisionShortConv

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4}
"""Four layers: conv, conv, attention, conv (the config's default layer order)."""


class _Count(TorchDispatchMode):
    """Counts ATen operator calls, split by whether a conv layer is running."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = self.outside = 0
        self.depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.depth:
            self.inside += 1
        else:
            self.outside += 1
        return func(*args, **(kwargs or {}))


def _tower(overrides: dict) -> Lfm3VlVisionModel:
    config = Lfm3VlVisionConfig(**overrides)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Lfm3VlVisionModel(config).eval()


def _inputs(model: Lfm3VlVisionModel, grids: list[tuple[int, int, int]]) -> dict:
    c = model.config
    rows = sum(t * h * w for t, h, w in grids)
    width = c.in_channels * c.temporal_patch_size * c.patch_size ** 2
    return {"pixel_values": torch.randn(rows, width), "grid_thw": torch.tensor(grids)}


def _conv_time(model: Lfm3VlVisionModel, kwargs: dict, repeats: int) -> tuple[float, float, int, int]:
    """(seconds per call, seconds in conv layers per call, ops inside conv layers, ops outside)."""
    spent = [0.0]
    counter = _Count()

    def before(module, args, kw):
        module._tic = time.perf_counter()
        counter.depth += 1

    def after(module, args, kw, out):
        spent[0] += time.perf_counter() - module._tic
        counter.depth -= 1

    hooks = [m.register_forward_pre_hook(before, with_kwargs=True) for m in model.modules()
             if isinstance(m, Lfm3VlVisionShortConv)]
    hooks += [m.register_forward_hook(after, with_kwargs=True) for m in model.modules()
              if isinstance(m, Lfm3VlVisionShortConv)]
    try:
        with torch.no_grad():
            model(**kwargs)  # warm-up
            with counter:
                model(**kwargs)
            spent[0] = 0.0
            times = []
            for _ in range(repeats):
                tic = time.perf_counter()
                model(**kwargs)
                times.append(time.perf_counter() - tic)
    finally:
        for hook in hooks:
            hook.remove()
    return statistics.median(times), spent[0] / repeats, counter.inside, counter.outside


def _distinct_grid_sets(calls: int, seed: int = 0) -> int:
    """Captures a graph per distinct grid set needs for ``calls`` calls of 1-4 photos of random sizes (processor
    grids: 16 px patches, merge 2, sides 256-1024 px, so h and w are even numbers of patches in 16..64)."""
    rng = random.Random(seed)
    seen = set()
    for _ in range(calls):
        grids = tuple((1, 2 * rng.randint(8, 32), 2 * rng.randint(8, 32)) for _ in range(rng.randint(1, 4)))
        seen.add(grids)
    return len(seen)


def main() -> None:
    torch.set_num_threads(min(8, torch.get_num_threads()))
    workloads = {"1 image 448x448": [(1, 28, 28)], "4 mixed images": [(1, 16, 24), (1, 28, 28), (1, 20, 16),
                                                                     (1, 32, 24)]}
    for label, overrides, repeats in (("tiny", TINY, 20), ("real width (2 layers)", {"num_hidden_layers": 2}, 3)):
        model = _tower(overrides)
        c = model.config
        print(f"{label}: hidden {c.hidden_size}, layers {c.layer_types}")
        for name, grids in workloads.items():
            call, conv, inside, outside = _conv_time(model, _inputs(model, grids), repeats)
            print(f"  {name}: eager {call * 1e3:.2f} ms/call, conv layers {conv * 1e3:.2f} ms "
                  f"({100 * conv / call:.0f}%), ops in conv layers {inside}, elsewhere {outside}")
    for calls in (100, 1000):
        print(f"graph per distinct grid set: {_distinct_grid_sets(calls)} captures for {calls} calls of 1-4 photos")


if __name__ == "__main__":
    main()
