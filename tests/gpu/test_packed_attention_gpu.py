"""vitcg's graph-safe attention on a GPU (skipped without CUDA): on sm90 it runs the Triton packed kernel, whose
output equals a float32 per-segment reference, also replayed in a CUDA graph after the boundaries changed.

Tolerance: bf16 relative error ||out - reference|| / ||reference|| <= 1e-2, as in test_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from support.specs import packaged
from vitcg.runtime import attention

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(q, k, v, cu, scale):
    """(1, rows, heads, dim) float32 attention within each segment of ``cu``; k/v heads repeated for groups."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    out = torch.zeros(q.shape[2], q.shape[1], q.shape[3], device=q.device)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            seg = (t[0, :, a:b].float() for t in (q, k, v))
            out[a:b] = F.scaled_dot_product_attention(*seg, scale=scale).transpose(0, 1)
    return out[None]


def error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


@needs_cuda
def test_sm90_selects_the_triton_kernel():
    query = torch.zeros(1, 2, 8, 80, device="cuda", dtype=torch.bfloat16)
    assert attention._triton_config(query[..., :16], same_boundaries=True) is None  # tiny heads: FlashAttention-2
    hopper = torch.cuda.get_device_capability()[0] == 9
    assert (attention._triton_config(query, same_boundaries=True) is not None) == hopper
    assert attention._triton_config(query, same_boundaries=False) is None


@needs_cuda
@pytest.mark.parametrize("dim,groups", [(80, 1), (64, 2), (72, 1), (128, 1)])
def test_packed_attention_equals_reference_and_follows_new_boundaries_in_a_graph(dim, groups):
    torch.manual_seed(0)
    rows, heads, scale = 1024, 4, dim ** -0.5
    q = torch.randn(1, heads, rows, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, heads // groups, rows, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, 100, 100, 613, 700, 1024, 1024, 1024], dtype=torch.int32, device="cuda")

    def call():
        return attention.graph_safe_attention(nn.Module(), q, k, v, scaling=scale, cu_seq_lens_q=cu,
                                              cu_seq_lens_k=cu, max_length_q=rows, max_length_k=rows)[0]

    assert error(call(), reference(q, k, v, cu, scale)) <= 1e-2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    cu.copy_(torch.tensor([0, 7, 519, 519, 1000, 1001, 1024, 1024], dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    graph.replay()
    assert error(out, reference(q, k, v, cu, scale)) <= 1e-2


def real_head_dims() -> list[int]:
    """Every head dim of every packaged spec's encoder at real size: each encoder built from its ``real_config`` on
    the meta device (no memory), reading its modules' ``head_dim`` (pix2struct names none: its 768 / 12 = 64 is
    covered by the others)."""
    from vitcg.lang.bindings import import_object
    from vitcg.tools.encoders import build_config

    dims = set()
    for spec in packaged():
        if spec.unavailable:
            continue
        with torch.device("meta"):
            module = import_object(spec.encoder.class_path)(build_config(spec, "real"))
        dims.update(m.head_dim for m in module.modules() if isinstance(getattr(m, "head_dim", None), int))
    return sorted(dims)


@needs_cuda
def test_every_packaged_specs_real_head_dim_equals_reference():
    """Through the attention's own choice (Triton in the configuration the device holds, else varlen_attn), bf16,
    three packed segments. On 2026-11-28 exaone4_5's 224 failed with Triton's OutOfResources on an H100."""
    dims = real_head_dims()
    assert 224 in dims and 80 in dims, dims
    failures = {}
    for dim in dims:
        torch.manual_seed(dim)
        rows, heads, scale = 300, 4, dim ** -0.5
        q, k, v = (torch.randn(1, heads, rows, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0, 100, 213, 300], dtype=torch.int32, device="cuda")
        out = attention.graph_safe_attention(nn.Module(), q, k, v, scaling=scale, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                             max_length_q=113, max_length_k=113)[0]
        err = error(out, reference(q, k, v, cu, scale))
        if not err <= 1e-2:
            failures[dim] = err
    assert not failures, failures


@needs_cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Triton kernel serves sm90 only")
def test_head_dim_224_runs_the_wide_triton_configuration_on_hopper():
    """The shared-memory estimate, not the OutOfResources backstop, keeps 224 on Triton: no refusal recorded."""
    from vitcg.runtime import ops
    from vitcg.runtime.packed_configs import WIDE

    q = torch.randn(1, 2, 256, 224, device="cuda", dtype=torch.bfloat16)
    assert attention._triton_config(q, same_boundaries=True) == WIDE
    cu = torch.tensor([0, 64, 256], dtype=torch.int32, device="cuda")
    out = attention.graph_safe_attention(nn.Module(), q, q, q, scaling=224 ** -0.5, cu_seq_lens_q=cu,
                                         cu_seq_lens_k=cu, max_length_q=192, max_length_k=192)[0]
    assert error(out, reference(q, q, q, cu, 224 ** -0.5)) <= 1e-2
    assert (torch.cuda.current_device(), 224) not in ops.REFUSED, ops.REFUSED


@needs_cuda
@pytest.mark.parametrize("slots", [6, 100])
def test_both_kernels_equal_reference_on_a_strided_value_in_a_graph(slots):
    """At most 64 segment slots run the segment-block kernel, more (windows) the spanning one; the value is a
    strided view of a fused projection, as towers pass it. The segment kernel also writes zeros to rows past a
    last offset below the rows (never uninitialized memory). Replayed in a CUDA graph on new boundaries."""
    pytest.importorskip("triton")
    from vitcg.runtime import varlen_triton
    from vitcg.runtime.packed_configs import NARROW

    torch.manual_seed(slots)
    rows, heads, dim, scale = 1000, 4, 80, 80 ** -0.5
    qkv = torch.randn(rows, 3, heads, dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    end = rows - 37 if slots <= varlen_triton.SCAN_SEGMENTS else rows

    def boundaries(seed):
        cuts = torch.randint(0, end + 1, (slots - 1,), generator=torch.Generator().manual_seed(seed)).sort().values
        return torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([end])]).to(torch.int32).cuda()

    def want(cu):
        return reference(*(t.transpose(0, 1)[None] for t in (q, k, v)), cu, scale)[0]

    cu = boundaries(0)
    out = varlen_triton.varlen_attention(q, k, v, cu, scale, *NARROW)
    assert error(out, want(cu)) <= 1e-2
    if end < rows:
        assert bool((out[end:] == 0).all())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        varlen_triton.varlen_attention(q, k, v, cu, scale, *NARROW)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = varlen_triton.varlen_attention(q, k, v, cu, scale, *NARROW)
    cu.copy_(boundaries(1))
    qkv.copy_(torch.randn_like(qkv))
    graph.replay()
    assert error(out, want(cu)) <= 1e-2


def compiled_kernels(function) -> int:
    """How many kernels a Triton ``JITFunction`` holds compiled (its per-device caches' first member)."""
    return sum(len(cache[0]) for cache in function.device_caches.values())


@needs_cuda
def test_one_segment_kernel_serves_every_count_of_items_and_rows():
    """The eager forward packs any number of items into any number of rows: the segment-block kernel must not be
    specialized on either (a new count would compile a kernel, about a second, at a request), only on its slots.
    Each call equals the float32 reference."""
    pytest.importorskip("triton")
    from vitcg.runtime import varlen_triton
    from vitcg.runtime.packed_configs import NARROW

    heads, dim, scale = 4, 80, 80 ** -0.5
    counts = []
    for cuts in ([0, 64], [0, 100, 613, 1000], [0, 1024, 1200, 1900, 2800, 4313], [0, 7, 8, 16, 33, 49, 64, 80, 96]):
        rows = cuts[-1]
        torch.manual_seed(rows)
        q, k, v = (torch.randn(rows, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor(cuts, dtype=torch.int32, device="cuda")
        out = varlen_triton.varlen_attention(q, k, v, cu, scale, *NARROW)
        assert error(out, reference(*(t.transpose(0, 1)[None] for t in (q, k, v)), cu, scale)[0]) <= 1e-2
        counts.append(compiled_kernels(varlen_triton._segment_fwd))
    assert counts[1:] == counts[:1] * 3, counts
