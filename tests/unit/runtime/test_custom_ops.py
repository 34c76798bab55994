"""vitcg's custom ops exist before stored compiled code runs, and the packed attention falls back where the Triton
kernel cannot run (issue 36).

A block compiled ahead of time calls ``torch.ops.vitcg.packed_attention`` by name; a fresh process that loads a
cache another command wrote runs no attention code first, so the op must be registered by what loads the cache,
without importing Triton."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from vitcg.runtime import attention, ops
from vitcg.runtime.packed_configs import NARROW, WIDE

H100 = 232448


@pytest.mark.parametrize("module", ["vitcg.runtime.compile_cache", "vitcg.runtime.regions"])
def test_what_loads_stored_code_registers_the_ops_without_triton(module):
    code = (f"import sys, torch, {module}\n"
            "op = torch.ops.vitcg.packed_attention.default\n"
            "print(op.name(), 'vitcg.runtime.varlen_triton' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["vitcg::packed_attention", "False"]


def reference(q, k, v, cu, scale):
    bounds = cu.tolist()
    pieces = [F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)), scale=scale)
              for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat([p.transpose(0, 1) for p in pieces])


def test_a_refused_shape_is_answered_by_segment_attention(monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(10, 2, 32) for _ in range(3))
    cu = torch.tensor([0, 3, 3, 7, 10], dtype=torch.int32)
    monkeypatch.setitem(ops.REFUSED, (q.get_device(), 32), "out of resource: shared memory")
    out = torch.ops.vitcg.packed_attention(q, k, v, cu, 0.3, 128, 64, 4, 3)
    torch.testing.assert_close(out, reference(q, k, v, cu, 0.3))


def test_the_fake_gives_the_shape_without_running(monkeypatch):
    q = torch.empty(10, 2, 32, device="meta")
    out = torch.ops.vitcg.packed_attention(q, q, q, torch.empty(3, dtype=torch.int32, device="meta"), 0.3,
                                           128, 64, 4, 3)
    assert out.shape == q.shape and out.device.type == "meta"


def query(dim, index=0):
    """What ``_triton_config`` reads of a query: its device and head dim (no CUDA needed)."""
    return types.SimpleNamespace(device=torch.device("cuda", index), shape=(1, 16, 1024, dim))


@pytest.fixture
def hopper(monkeypatch):
    """A device 0 that holds an H100's shared memory per program, Triton serving it."""
    monkeypatch.setattr(attention, "_TRITON_DEVICES", {0: H100})


def test_selection_by_head_dim_on_an_h100(hopper):
    assert attention._triton_config(query(80), same_boundaries=True) == NARROW
    assert attention._triton_config(query(224), same_boundaries=True) == WIDE
    assert attention._triton_config(query(16), same_boundaries=True) is None
    assert attention._triton_config(query(80), same_boundaries=False) is None


def test_a_head_dim_triton_refused_goes_to_the_next_backend(hopper, monkeypatch):
    monkeypatch.setitem(ops.REFUSED, (0, 224), "out of resource: shared memory")
    assert attention._triton_config(query(224), same_boundaries=True) is None
    assert attention._triton_config(query(80), same_boundaries=True) == NARROW


def test_a_device_the_kernel_does_not_serve_gets_none(monkeypatch):
    monkeypatch.setattr(attention, "_TRITON_DEVICES", {0: 0})
    assert attention._triton_config(query(80), same_boundaries=True) is None


class CompileFailed(Exception):
    """Stands in for Triton's ``CompilationError`` (Triton is not installed here)."""


class Refused(Exception):
    """Stands in for Triton's ``OutOfResources``."""


@pytest.mark.parametrize("raised", [CompileFailed, Refused])
def test_a_kernel_triton_cannot_build_is_refused_once_and_answered_by_segment_attention(monkeypatch, caplog, raised):
    """Where Triton fails to compile or to fit the kernel for a shape, the op answers that call with segment
    attention, records the head dim in REFUSED with the reason, warns once, and tries Triton no more for it. The
    Triton module is replaced by one whose kernel raises (the op imports it by name at its first run)."""
    calls = []

    def failing_kernel(*args, **kwargs):
        calls.append(args)
        raise raised("at 9:18: def _segment_fwd(...)")

    fake = types.ModuleType("vitcg.runtime.varlen_triton")
    fake.CompilationError, fake.OutOfResources, fake.varlen_attention = CompileFailed, Refused, failing_kernel
    monkeypatch.setitem(sys.modules, "vitcg.runtime.varlen_triton", fake)
    monkeypatch.setattr(ops, "REFUSED", {})
    torch.manual_seed(0)
    q, k, v = (torch.randn(10, 2, 48) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with caplog.at_level("WARNING", logger=ops.__name__):
        for _ in range(2):
            out = torch.ops.vitcg.packed_attention(q, k, v, cu, 0.25, 128, 64, 4, 3)
            torch.testing.assert_close(out, reference(q, k, v, cu, 0.25))
    assert len(calls) == 1
    assert list(ops.REFUSED) == [(q.get_device(), 48)]
    assert raised.__name__ in ops.REFUSED[(q.get_device(), 48)]
    assert len([r for r in caplog.records if "cannot run head dim 48" in r.message]) == 1
