"""Capturing one CUDA graph: a warm-up call on a side stream (lazy initialization stays out of the graph),
then the capture. Shared by the manager (one graph per budget) and ``vitcg bench`` (exact-shape graphs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture_graph(fn: Callable[[], Any], device: torch.device, pool: Any = None) -> tuple[Any, Any]:
    """``(graph, output)``: ``fn`` run once on a side stream, then captured into a ``torch.cuda.CUDAGraph``
    (in ``pool`` when given) under inference mode; replaying the graph rewrites ``output`` in place."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.inference_mode():
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
        output = fn()
    return graph, output
