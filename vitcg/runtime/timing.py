"""Median latency of a callable: CUDA events on a GPU, the wall clock elsewhere.

Shared by the manager (replay costs measured at capture) and ``vitcg bench`` (every latency it reports).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def timed(fn: Callable[[], Any], iters: int, warmup: int, device: torch.device) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after ``warmup`` untimed ones (CUDA events on GPU,
    the device idle at each start; wall clock on CPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    cuda = device.type == "cuda"
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            tic = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - tic) * 1e3)
    return statistics.median(samples)
