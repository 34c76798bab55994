"""Packed (varlen) attention forward in Triton, vitcg's graph-safe attention on sm90 GPUs: one program per head
and block of query rows, its rows always inside one segment. Each segment of ``cu_seqlens`` is cut into blocks of
``BLOCK_M`` rows, numbered segment by segment, longest segment first; a program finds its block from
``cu_seqlens`` alone (a few vector operations over the offsets), runs the segment's whole key blocks without a
mask and only its last, partial key block masked by the segment's end. Boundaries are read on the device inside
the kernel, so a CUDA graph of it follows new boundaries on replay, and the call is one launch. The grid has room
for one partial block per segment slot; programs past the last block store nothing.

Head dims that are not a power of two are split into a power-of-two part and a remainder padded to the next
power of two (80 = 64 + 16), instead of padding the whole head to 128 as FlexAttention's Triton kernel does:
for Qwen2-VL's 80 that is 80 columns of matrix work instead of 128. The softmax folds the scale into one
multiply-add per score, and the matrix products accumulate in place. Row strides are compile-time constants (with
Qwen3-VL's head dim of 72 passed as a runtime stride the compiler could not prove the loads aligned: 31.3 against
16.5 ms of a 27-layer mixed call, ``benchmarks/mixed_profile.py qwen3_vl``, H100, 2026-11-26), one per tensor, so
a value that is a strided view of a fused projection is read in place rather than copied first.

The kernel before this one (2026-11-26) ran fixed blocks of packed rows, a block that spanned two segments
computing every row against both segments' keys and masking by segment ids, and took the segment ids from a
``searchsorted`` launched before it. ``benchmarks/attention_backends.py`` times the two side by side (``--base``)
at every packaged head dim and bench workload; ``benchmarks/RESULTS.md`` has the table (H200, 2026-12-01).

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
def _row_block(CU, N_CU: tl.constexpr, SLOTS: tl.constexpr, pid, BLOCK_M: tl.constexpr, ORDERED: tl.constexpr):
    """(start, end, first row) of program ``pid``'s block of query rows: the segments of ``CU`` cut into blocks
    of ``BLOCK_M`` rows, numbered segment by segment (in order, or longest segment first); (0, 0, 0) for a
    program past the last block. ``SLOTS``: a power of two of at least ``N_CU - 1`` segments."""
    j = tl.arange(0, SLOTS)
    used = j < N_CU - 1
    start = tl.load(CU + j, mask=used, other=0)
    end = tl.load(CU + j + 1, mask=used, other=0)
    blocks = (end - start + BLOCK_M - 1) // BLOCK_M  # 0 for an empty segment
    if ORDERED:  # blocks of longer segments first (ties in segment order): the longest programs start first
        length = end - start
        before = (length[None, :] > length[:, None]) | ((length[None, :] == length[:, None]) & (j[None, :] < j[:, None]))
        first = tl.sum(tl.where(before, blocks[None, :], 0), 1)
    else:
        first = tl.cumsum(blocks, 0) - blocks
    mine = (first <= pid) & (pid < first + blocks)
    lo = tl.sum(tl.where(mine, start, 0), 0)
    hi = tl.sum(tl.where(mine, end, 0), 0)
    row = lo + (pid - tl.sum(tl.where(mine, first, 0), 0)) * BLOCK_M
    return lo, hi, tl.where(hi > lo, row, 0)


@triton.jit
def _key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
               STRIDE_K: tl.constexpr, STRIDE_V: tl.constexpr, D: tl.constexpr, D0: tl.constexpr,
               D1: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """One block of keys of the rows' segment folded into the running softmax (scores in log2 units:
    ``qk_scale`` holds log2(e)). Masked: the segment's last, partial block (keys from ``hi`` on are another's)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    k_rows = offs_n[:, None] * STRIDE_K + head * D
    v_rows = offs_n[:, None] * STRIDE_V + head * D
    if MASKED:
        valid_n = offs_n < hi
        rest = valid_n[:, None] & (d1[None, :] < D)
        k0 = tl.load(K + k_rows + d0[None, :], mask=valid_n[:, None], other=0.0)
        k1 = tl.load(K + k_rows + d1[None, :], mask=rest, other=0.0)
        v0 = tl.load(V + v_rows + d0[None, :], mask=valid_n[:, None], other=0.0)
        v1 = tl.load(V + v_rows + d1[None, :], mask=rest, other=0.0)
    elif D0 + D1 == D:  # the split covers the head exactly: no column mask either
        k0 = tl.load(K + k_rows + d0[None, :])
        k1 = tl.load(K + k_rows + d1[None, :])
        v0 = tl.load(V + v_rows + d0[None, :])
        v1 = tl.load(V + v_rows + d1[None, :])
    else:
        k0 = tl.load(K + k_rows + d0[None, :])
        k1 = tl.load(K + k_rows + d1[None, :], mask=d1[None, :] < D, other=0.0)
        v0 = tl.load(V + v_rows + d0[None, :])
        v1 = tl.load(V + v_rows + d1[None, :], mask=d1[None, :] < D, other=0.0)
    s = tl.dot(q1, tl.trans(k1), tl.dot(q0, tl.trans(k0)))
    if MASKED:  # the block holds at least one key of the segment, so every row keeps a finite maximum
        s = tl.where(valid_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    p16 = p.to(v0.dtype)
    acc0 = tl.dot(p16, v0, acc0 * alpha[:, None])
    acc1 = tl.dot(p16, v1, acc1 * alpha[:, None])
    return acc0, acc1, m_new, l_i


@triton.jit
def _varlen_fwd(Q, K, V, OUT, CU, qk_scale, N_CU: tl.constexpr, SLOTS: tl.constexpr, HEADS: tl.constexpr,
                STRIDE_Q: tl.constexpr, STRIDE_K: tl.constexpr, STRIDE_V: tl.constexpr, D: tl.constexpr,
                D0: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                ORDERED: tl.constexpr):
    # (rows, heads, dim) tensors whose heads lie D apart and whose columns are contiguous; row strides known at
    # compile time, so a head's columns start at a multiple the compiler can prove aligned for wide loads.
    # Heads vary fastest: the blocks of one segment start together, longest segment first when ORDERED.
    head = tl.program_id(0)
    lo, hi, row = _row_block(CU, N_CU, SLOTS, tl.program_id(1), BLOCK_M, ORDERED)
    full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N  # whole key blocks: no mask
    offs_m = row + tl.arange(0, BLOCK_M)
    valid_m = offs_m < hi
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    q_rows = offs_m[:, None] * STRIDE_Q + head * D
    q0 = tl.load(Q + q_rows + d0[None, :], mask=valid_m[:, None], other=0.0)
    q1 = tl.load(Q + q_rows + d1[None, :], mask=valid_m[:, None] & (d1[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, D0], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D1], tl.float32)
    for start in tl.range(lo, full_end, BLOCK_N):
        acc0, acc1, m_i, l_i = _key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
                                          STRIDE_K, STRIDE_V, D, D0, D1, BLOCK_N, False)
    for start in tl.range(full_end, hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
                                          STRIDE_K, STRIDE_V, D, D0, D1, BLOCK_N, True)
    o_rows = offs_m[:, None] * (HEADS * D) + head * D
    tl.store(OUT + o_rows + d0[None, :], (acc0 / l_i[:, None]).to(OUT.dtype.element_ty), mask=valid_m[:, None])
    tl.store(OUT + o_rows + d1[None, :], (acc1 / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=valid_m[:, None] & (d1[None, :] < D))


def _rows_in_place(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where the kernel can read it (heads ``dim`` apart, contiguous columns, rows at a positive
    stride), else a contiguous copy."""
    rows, heads, dim = t.shape
    if t.stride(2) == 1 and (heads == 1 or t.stride(1) == dim) and t.stride(0) >= heads * dim:
        return t
    return t.contiguous()


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                     ordered: bool = True) -> torch.Tensor:
    """Attention within the packed segments of ``cu`` over ``(rows, heads, dim)`` tensors (same heads for q, k
    and v; read in place where each head's columns are contiguous); returns a contiguous tensor of q's shape.
    ``cu`` holds int32 offsets, its last one equal to ``rows``. ``ordered``: the blocks of the longest segments
    run first (False: in pack order)."""
    rows, heads, dim = q.shape
    if dim < 32 or dim > 256:
        raise ValueError(f"packed attention: head dim {dim} is outside the kernel's range 32..256")
    q, k, v = (_rows_in_place(t) for t in (q, k, v))
    out = torch.empty((rows, heads, dim), device=q.device, dtype=q.dtype)
    d0, d1 = head_split(dim)
    segments = cu.shape[0] - 1
    # every segment adds at most one partial block; the programs past the last block store nothing
    grid = (heads, triton.cdiv(rows, block_m) + segments)
    _varlen_fwd[grid](q, k, v, out, cu, scale * 1.4426950408889634, N_CU=cu.shape[0],
                      SLOTS=triton.next_power_of_2(segments), HEADS=heads, STRIDE_Q=q.stride(0),
                      STRIDE_K=k.stride(0), STRIDE_V=v.stride(0), D=dim, D0=d0, D1=d1, BLOCK_M=block_m,
                      BLOCK_N=block_n, ORDERED=ordered, num_warps=num_warps, num_stages=num_stages)
    return out
