"""The two ceilings of the machine and the floor they put under one encoder forward.

A forward can be no faster than reading its weights once from memory, nor than doing its matrix work at the
matmul peak: ``floor = max(weight bytes / copy bandwidth, FLOPs / matmul rate)``. Both ceilings are measured
here, on the device at hand (a large bf16 matmul; a device-to-device copy, counting the bytes read and
written), and the FLOPs of a forward are counted by ``torch.utils.flop_counter`` on the eager call itself
(matmuls, convolutions and attention, as the model really runs them), so the floor needs no per-model formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ...runtime.timing import timed


@dataclass(frozen=True)
class Ceilings:
    matmul_tflops: float
    """Measured bf16 (or the given dtype) matmul rate, TFLOP/s."""
    copy_tb_s: float
    """Measured device memory bandwidth of a copy (bytes read plus written), TB/s."""

    def floor_ms(self, flops: float, weight_bytes: float) -> float:
        return max(flops / (self.matmul_tflops * 1e12), weight_bytes / (self.copy_tb_s * 1e12)) * 1e3


def measure_ceilings(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, n: int = 8192,
                     copy_mib: int = 2048) -> Ceilings:
    """Median of a few runs each: an ``n x n x n`` matmul and a ``copy_mib`` MiB device copy."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    ms = timed(lambda: torch.mm(a, b, out=out), 10, 3, device)
    tflops = 2 * n**3 / (ms * 1e-3) / 1e12
    src = torch.empty(copy_mib * 2**20, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), 10, 3, device)
    bandwidth = 2 * src.numel() / (ms * 1e-3) / 1e12
    return Ceilings(tflops, bandwidth)


def forward_flops(call: Callable[[], Any]) -> int:
    """FLOPs of one ``call()`` as torch counts them (matmuls, convolutions, attention)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        call()
    return counter.get_total_flops()


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
