"""The roofline floor: FLOPs counted on the real call, weights read once, whichever bound is higher."""

import pytest
import torch

from vitcg.tools.bench.roofline import Ceilings, forward_flops, measure_ceilings, weight_bytes


def test_the_floor_is_the_higher_of_the_two_bounds():
    ceilings = Ceilings(matmul_tflops=1000.0, copy_tb_s=2.0)
    assert ceilings.floor_ms(flops=1e12, weight_bytes=1e9) == pytest.approx(1.0)    # compute-bound: 1 ms
    assert ceilings.floor_ms(flops=1e9, weight_bytes=4e9) == pytest.approx(2.0)     # memory-bound: 2 ms


def test_flops_and_weights_of_a_linear_layer():
    layer = torch.nn.Linear(64, 32, bias=False)
    assert forward_flops(lambda: layer(torch.randn(10, 64))) == 2 * 10 * 64 * 32
    assert weight_bytes(layer) == 64 * 32 * 4
    assert weight_bytes(layer.to(torch.bfloat16)) == 64 * 32 * 2


def test_ceilings_are_measured_rates():
    ceilings = measure_ceilings("cpu", torch.float32, n=128, copy_mib=4)
    assert ceilings.matmul_tflops > 0 and ceilings.copy_tb_s > 0
