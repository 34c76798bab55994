"""The Triton packed kernel's block configuration, chosen by the shared memory a device holds (torch-free).

The numbers are Triton's own: on an H100 (232,448 bytes per program) the measured configuration at head dim 224
asked for 262,656 bytes and was refused (``vitcg check exaone4_5 --device cuda --size real``, 2026-11-28)."""

from __future__ import annotations

import pytest

from vitcg.runtime.packed_configs import (
    MARGIN_BYTES,
    NARROW,
    SMALL,
    WIDE,
    choose_config,
    head_split,
    shared_memory_bytes,
)

H100 = 232448
MEASURED = NARROW


def reference_split(dim):
    """The split as the kernel computed it with Triton's helpers (``bit_length``, ``next_power_of_2``)."""
    d0 = 1 << (dim.bit_length() - 1)
    if d0 == dim:
        d0 //= 2
    rest = dim - d0
    return d0, max(16, 1 << (rest - 1).bit_length())


@pytest.mark.parametrize("dim", range(32, 257))
def test_head_split_is_the_kernels(dim):
    assert head_split(dim) == reference_split(dim)


def test_the_estimate_is_tritons_figure_for_the_refused_launch():
    assert MEASURED == (128, 64, 4, 3)
    assert shared_memory_bytes(MEASURED, sum(head_split(224)), 2) == 262656


def test_head_dim_224_on_an_h100_takes_the_wide_configuration_within_the_margin():
    """The wide configuration at 224 (229,888 bytes) ran on an H200, whose limit is an H100's."""
    assert shared_memory_bytes(WIDE, sum(head_split(224)), 2) == 229888
    assert choose_config(224, 2, H100) == WIDE


def test_a_device_of_less_shared_memory_takes_the_smaller_configuration():
    limit = shared_memory_bytes(WIDE, 256, 2) + MARGIN_BYTES - 1
    assert choose_config(224, 2, limit) == SMALL
    assert shared_memory_bytes(SMALL, 256, 2) + MARGIN_BYTES <= limit
    assert choose_config(80, 2, limit) == MEASURED


@pytest.mark.parametrize("dim", [64, 72, 80, 88, 96])
def test_the_measured_configuration_serves_the_narrow_head_dims(dim):
    assert choose_config(dim, 2, H100) == MEASURED


@pytest.mark.parametrize("dim", [104, 128, 224])
def test_wide_head_dims_take_half_the_query_rows(dim):
    assert sum(head_split(dim)) >= 128
    assert choose_config(dim, 2, H100) == WIDE == (64, 64, 4, 3)


@pytest.mark.parametrize("dim", [16, 31, 257, 320])
def test_head_dims_outside_the_kernel_get_none(dim):
    assert choose_config(dim, 2, H100) is None


def test_a_device_that_holds_no_configuration_gets_none():
    assert choose_config(224, 2, 100_000) is None
    assert choose_config(80, 2, 0) is None
