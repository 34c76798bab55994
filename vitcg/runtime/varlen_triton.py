"""Packed (varlen) attention forward in Triton, vitcg's graph-safe attention on sm90 GPUs: one program per block of
packed query rows and head; its keys run from the start of its first row's segment to the end of its last row's
segment, masked where a key's segment differs from the row's. A block of rows that lies inside one segment (most
of them, in a compute-bound pack) runs its whole key blocks without reading segment ids or masking, and only the
segment's last partial key block masked. Boundaries are read on the device (``cu_seqlens``
and each row's segment), so a CUDA graph of it follows new boundaries on replay.

Head dims that are not a power of two are split into a power-of-two part and a remainder padded to the next
power of two (80 = 64 + 16), instead of padding the whole head to 128 as FlexAttention's Triton kernel does:
for Qwen2-VL's 80 that is 80 columns of matrix work instead of 128.

Measured against torch's ``varlen_attn`` (FlashAttention-2) by ``benchmarks/attention_backends.py`` on an H200,
one layer of 16 heads of 80, replayed in a CUDA graph on new boundaries: 1.09 against 1.21 ms on the qwen2_vl
mixed batch (17,408 rows), 0.054 against 0.073 ms at 8x224, 0.069 against 0.099 ms on a 4-frame video (2026-11-26,
``benchmarks/RESULTS.md``). Running whole key blocks unmasked took a further 18-24% off on an H100: 0.874 against
1.087 ms on the mixed batch, 0.414 against 0.502 ms on generate_ttft.py's mixed3 (2026-11-26). The block
configuration below is the fastest of the five timed there, with and without that. Strides are compile-time
constants (``HEADS * D`` and ``D``): with Qwen3-VL's head dim of 72 passed as a runtime stride, the compiler could
not prove the loads aligned, and the kernel took 31.3 ms of a 27-layer mixed call against 16.5 ms now
(``benchmarks/mixed_profile.py qwen3_vl``, H100).

The launch is wrapped in the ``torch.library`` custom op ``vitcg::packed_attention``
(:mod:`vitcg.runtime.ops`, which defines it without Triton so that stored compiled blocks that call it load in
any process), so compiled blocks treat it as one opaque call and CUDA graphs capture it like any kernel. The block
configuration comes from :mod:`vitcg.runtime.packed_configs`, chosen per head dim by the shared memory the device
holds. This module imports Triton: import it only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .packed_configs import head_split

__all__ = ["OutOfResources", "head_split", "varlen_attention"]


@triton.jit
def _key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base, stride_row, qk_scale,
               D: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """One block of keys folded into the running softmax. Unmasked: every key lies in the rows' one segment
    (no segment ids read, no bounds on the loads, no row without a key)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    k_rows = offs_n[:, None] * stride_row + base
    if MASKED:
        valid_n = offs_n < hi
        k0 = tl.load(K + k_rows + d0[None, :], mask=valid_n[:, None], other=0.0)
        k1 = tl.load(K + k_rows + d1[None, :], mask=valid_n[:, None] & (d1[None, :] < D), other=0.0)
        v0 = tl.load(V + k_rows + d0[None, :], mask=valid_n[:, None], other=0.0)
        v1 = tl.load(V + k_rows + d1[None, :], mask=valid_n[:, None] & (d1[None, :] < D), other=0.0)
    else:
        k0 = tl.load(K + k_rows + d0[None, :])
        k1 = tl.load(K + k_rows + d1[None, :], mask=d1[None, :] < D, other=0.0)
        v0 = tl.load(V + k_rows + d0[None, :])
        v1 = tl.load(V + k_rows + d1[None, :], mask=d1[None, :] < D, other=0.0)
    s = tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1))
    if MASKED:
        seg_k = tl.load(SEG + offs_n, mask=valid_n, other=-2)
        s = tl.where(seg_q[:, None] == seg_k[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet in this range
    else:
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    p16 = p.to(v0.dtype)
    acc0 = acc0 * alpha[:, None] + tl.dot(p16, v0)
    acc1 = acc1 * alpha[:, None] + tl.dot(p16, v1)
    return acc0, acc1, m_new, l_i


@triton.jit
def _varlen_fwd(Q, K, V, OUT, SEG, CU, rows, qk_scale, HEADS: tl.constexpr,
                D: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SPLIT: tl.constexpr):
    # contiguous (rows, heads, dim) tensors, strides known at compile time: a head's columns start at a multiple of
    # D, which the compiler can then prove aligned for wide loads (a runtime stride of 72 it could not)
    stride_row = HEADS * D
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid_m = offs_m < rows
    seg_q = tl.load(SEG + offs_m, mask=valid_m, other=-1)
    first = tl.load(SEG + pid_m * BLOCK_M)
    last = tl.load(SEG + tl.minimum(pid_m * BLOCK_M + BLOCK_M, rows) - 1)
    lo = tl.load(CU + first)
    hi = tl.load(CU + last + 1)
    # rows of one segment: whole key blocks need no mask, only the segment's last partial block does
    full_end = lo
    if SPLIT:  # noqa: SIM102  (a compile-time branch around a runtime one)
        if first == last:
            full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    base = head * D
    q_rows = offs_m[:, None] * stride_row + base
    q0 = tl.load(Q + q_rows + d0[None, :], mask=valid_m[:, None], other=0.0)
    q1 = tl.load(Q + q_rows + d1[None, :], mask=valid_m[:, None] & (d1[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, D0], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D1], tl.float32)
    for start in tl.range(lo, full_end, BLOCK_N):
        acc0, acc1, m_i, l_i = _key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base,
                                          stride_row, qk_scale, D, D0, D1, BLOCK_N, False)
    for start in tl.range(full_end, hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base,
                                          stride_row, qk_scale, D, D0, D1, BLOCK_N, True)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o_rows = offs_m[:, None] * stride_row + base
    tl.store(OUT + o_rows + d0[None, :], (acc0 / l_i[:, None]).to(OUT.dtype.element_ty), mask=valid_m[:, None])
    tl.store(OUT + o_rows + d1[None, :], (acc1 / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=valid_m[:, None] & (d1[None, :] < D))


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                     split: bool = True) -> torch.Tensor:
    """Attention within the packed segments of ``cu`` over contiguous ``(rows, heads, dim)`` tensors (same heads
    for q, k and v); returns the same shape. ``cu`` holds int32 offsets, its last one equal to ``rows``.
    ``split``: a block of rows inside one segment runs its whole key blocks unmasked (False: every key block
    masked, the kernel as first measured)."""
    rows, heads, dim = q.shape
    if dim < 32 or dim > 256:
        raise ValueError(f"packed attention: head dim {dim} is outside the kernel's range 32..256")
    q, k, v = (t.contiguous() for t in (q, k, v))
    positions = torch.arange(rows, device=cu.device, dtype=cu.dtype)
    seg = torch.searchsorted(cu[1:].contiguous(), positions, right=True).to(torch.int32)
    out = torch.empty_like(q)
    d0, d1 = head_split(dim)
    grid = (triton.cdiv(rows, block_m), heads)
    _varlen_fwd[grid](q, k, v, out, seg, cu, rows, scale * 1.4426950408889634, HEADS=heads,
                      D=dim, D0=d0, D1=d1, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split, num_warps=num_warps,
                      num_stages=num_stages)
    return out
