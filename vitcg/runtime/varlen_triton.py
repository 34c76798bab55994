"""Packed (varlen) attention forward in Triton, vitcg's graph-safe attention on sm90 GPUs. Boundaries are read on
the device (``cu_seqlens``), so a CUDA graph of a call follows new boundaries on replay. Two kernels, chosen by
the number of segment slots, a shape fixed at capture:

- **Segment blocks** (:func:`_segment_fwd`, calls of at most :data:`SCAN_SEGMENTS` slots: images, frames, tiles).
  Each segment is cut into blocks of ``BLOCK_M`` query rows; one program per block and head finds its block from
  ``cu_seqlens`` inside the kernel (vector operations over the slots), runs the segment's whole key blocks
  without a mask and only its last, partial one masked. No block spans two segments, and a call is one launch.
  Blocks are numbered in pack order: against running the longest segment's first, pack order was at most 4%
  slower and up to 6% faster at every packaged head dim (H200, 2026-12-02), so the kernel does without that
  ranking. The grid has room for one partial block per slot; the programs past the last block write zeros to the
  rows past the last offset (never uninitialized memory), and stop.
- **Spanning blocks** (:func:`_spanning_fwd`, more slots: window attention, where MiniCPM-V 4.6 has one slot per
  window, 4,097 at its largest budget). Blocks of rows are cut from the packed rows as they lie; a block's keys
  run from its first row's segment start to its last row's segment end, masked by segment ids (a
  ``searchsorted`` launched first). Many tiny segments then share a tile, and the scan of the first kernel, a
  vector of every slot, would not compile (Triton ``CompilationError``, 2026-12-01).

Against each other on an H200 (``benchmarks/attention_backends.py``, one layer of 16 heads of 80, replayed in a
CUDA graph on new boundaries, 2026-12-02, ``benchmarks/RESULTS.md``): 0.705 against 0.879 ms on the qwen2_vl mixed
batch (17,408 rows), where a spanning block computes every row against both segments' keys, and 0.269 against
0.423 ms on generate_ttft.py's mixed3; in the encoder, qwen2_vl's mixed call fell from 108.4 to 101.1 ms.

Both split head dims that are not a power of two into a power-of-two part and a remainder padded to the next
power of two (80 = 64 + 16) rather than padding the head to 128 as FlexAttention's Triton kernel does, fold the
scale into the exponent's base-2 multiply, and take row strides as compile-time constants: with Qwen3-VL's head
dim of 72 passed as a runtime stride, the compiler could not prove the loads aligned, and the kernel took 31.3 ms
of a 27-layer mixed call against 16.5 ms (``benchmarks/mixed_profile.py qwen3_vl``, H100, 2026-11-26). The segment
kernel reads each tensor at its own row stride, so a value that is a strided view of a fused projection is read
in place, not copied.

Calls go through the ``torch.library`` custom op ``vitcg::packed_attention`` (:mod:`vitcg.runtime.ops`, which
defines it without Triton so that stored compiled blocks that call it load in any process): compiled blocks treat
it as one opaque call, and CUDA graphs capture it like any kernel. The block configuration comes from
:mod:`vitcg.runtime.packed_configs`, chosen per head dim by the shared memory the device holds. This module
imports Triton: import it only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from .packed_configs import head_split

__all__ = ["CompilationError", "OutOfResources", "SCAN_SEGMENTS", "head_split", "varlen_attention"]

SCAN_SEGMENTS = 64
"""The most segment slots the segment-block kernel scans for its block; calls with more run the spanning one."""
LOG2_E = 1.4426950408889634


@triton.jit
def _row_block(CU, n_cu, SLOTS: tl.constexpr, pid, rows, BLOCK_M: tl.constexpr):
    """(segment start, segment end, first row, end of rows to store) of program ``pid``: the segments of ``CU``
    cut into blocks of ``BLOCK_M`` rows, numbered segment by segment in pack order (a running sum). A program
    past the last block gets an empty segment at the last offset and a block of the rows after it (to be written
    as zeros): the grid holds enough such programs to cover every row up to ``rows``. ``SLOTS``: a power of two
    of at least ``n_cu - 1`` slots."""
    j = tl.arange(0, SLOTS)
    used = j < n_cu - 1
    start = tl.load(CU + j, mask=used, other=0)
    end = tl.load(CU + j + 1, mask=used, other=0)
    blocks = (end - start + BLOCK_M - 1) // BLOCK_M  # 0 for an empty segment
    first = tl.cumsum(blocks, 0) - blocks
    mine = (first <= pid) & (pid < first + blocks)
    total = tl.sum(blocks, 0)
    last = tl.load(CU + n_cu - 1)
    lo = tl.where(pid < total, tl.sum(tl.where(mine, start, 0), 0), last)
    hi = tl.where(pid < total, tl.sum(tl.where(mine, end, 0), 0), last)
    row = tl.where(pid < total, lo + (pid - tl.sum(tl.where(mine, first, 0), 0)) * BLOCK_M,
                   last + (pid - total) * BLOCK_M)
    return lo, hi, row, tl.where(pid < total, hi, rows)


@triton.jit
def _query_block(Q, offs_m, valid_m, STRIDE: tl.constexpr, head, D: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
                 BLOCK_M: tl.constexpr):
    """A block of query rows of one head, split at ``D0`` (rows past ``valid_m`` read as zeros), and an empty
    running softmax: (q0, q1, acc0, acc1, m_i, l_i)."""
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    q_rows = offs_m[:, None] * STRIDE + head * D
    q0 = tl.load(Q + q_rows + d0[None, :], mask=valid_m[:, None], other=0.0)
    q1 = tl.load(Q + q_rows + d1[None, :], mask=valid_m[:, None] & (d1[None, :] < D), other=0.0)
    acc0 = tl.zeros([BLOCK_M, D0], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D1], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    return q0, q1, acc0, acc1, m_i, l_i


@triton.jit
def _store_block(OUT, acc0, acc1, l_i, offs_m, valid_m, STRIDE: tl.constexpr, head, D: tl.constexpr, D0: tl.constexpr,
                 D1: tl.constexpr):
    """The block's normalized rows, stored where ``valid_m``; a row that saw no key (past the last offset) stores
    zeros."""
    d0 = tl.arange(0, D0)
    d1 = D0 + tl.arange(0, D1)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o_rows = offs_m[:, None] * STRIDE + head * D
    tl.store(OUT + o_rows + d0[None, :], (acc0 / l_i[:, None]).to(OUT.dtype.element_ty), mask=valid_m[:, None])
    tl.store(OUT + o_rows + d1[None, :], (acc1 / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=valid_m[:, None] & (d1[None, :] < D))


@triton.jit
def _segment_key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
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


@triton.jit(do_not_specialize=["rows", "n_cu"])
def _segment_fwd(Q, K, V, OUT, CU, rows, n_cu, qk_scale, SLOTS: tl.constexpr, HEADS: tl.constexpr,
                 STRIDE_Q: tl.constexpr, STRIDE_K: tl.constexpr, STRIDE_V: tl.constexpr, D: tl.constexpr,
                 D0: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # (rows, heads, dim) tensors whose heads lie D apart and whose columns are contiguous. Heads vary fastest:
    # the programs of one block of rows start together. The row and offset counts are plain arguments, never
    # specialized on: one compilation serves every pack (a new count of items must not compile a kernel).
    head = tl.program_id(0)
    lo, hi, row, store_end = _row_block(CU, n_cu, SLOTS, tl.program_id(1), rows, BLOCK_M)
    full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N  # whole key blocks: no mask
    offs_m = row + tl.arange(0, BLOCK_M)
    valid_m = offs_m < store_end
    q0, q1, acc0, acc1, m_i, l_i = _query_block(Q, offs_m, valid_m, STRIDE_Q, head, D, D0, D1, BLOCK_M)
    for start in tl.range(lo, full_end, BLOCK_N):
        acc0, acc1, m_i, l_i = _segment_key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
                                                  STRIDE_K, STRIDE_V, D, D0, D1, BLOCK_N, False)
    for start in tl.range(full_end, hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _segment_key_block(acc0, acc1, m_i, l_i, q0, q1, K, V, start, hi, head, qk_scale,
                                                  STRIDE_K, STRIDE_V, D, D0, D1, BLOCK_N, True)
    _store_block(OUT, acc0, acc1, l_i, offs_m, valid_m, HEADS * D, head, D, D0, D1)


@triton.jit
def _spanning_key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base, stride_row, qk_scale,
                        D: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_N: tl.constexpr,
                        MASKED: tl.constexpr):
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


@triton.jit(do_not_specialize=["rows"])
def _spanning_fwd(Q, K, V, OUT, SEG, CU, rows, qk_scale, HEADS: tl.constexpr, D: tl.constexpr, D0: tl.constexpr,
                  D1: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # contiguous (rows, heads, dim) tensors
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
    if first == last:
        full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    base = head * D
    q0, q1, acc0, acc1, m_i, l_i = _query_block(Q, offs_m, valid_m, stride_row, head, D, D0, D1, BLOCK_M)
    for start in tl.range(lo, full_end, BLOCK_N):
        acc0, acc1, m_i, l_i = _spanning_key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base,
                                                   stride_row, qk_scale, D, D0, D1, BLOCK_N, False)
    for start in tl.range(full_end, hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _spanning_key_block(acc0, acc1, m_i, l_i, q0, q1, seg_q, K, V, SEG, start, hi, base,
                                                   stride_row, qk_scale, D, D0, D1, BLOCK_N, True)
    _store_block(OUT, acc0, acc1, l_i, offs_m, valid_m, stride_row, head, D, D0, D1)


def _rows_in_place(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where the segment kernel can read it (heads ``dim`` apart, contiguous columns, rows at a
    stride of at least a row), else a contiguous copy."""
    rows, heads, dim = t.shape
    if t.stride(2) == 1 and (heads == 1 or t.stride(1) == dim) and t.stride(0) >= heads * dim:
        return t
    return t.contiguous()


def segment_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                   block_m: int, block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """The segment-block kernel (at most :data:`SCAN_SEGMENTS` slots)."""
    rows, heads, dim = q.shape
    segments = cu.shape[0] - 1
    q, k, v = (_rows_in_place(t) for t in (q, k, v))
    out = torch.empty((rows, heads, dim), device=q.device, dtype=q.dtype)
    d0, d1 = head_split(dim)
    # every segment adds at most one partial block; the programs past the last block cover the rows after it
    grid = (heads, triton.cdiv(rows, block_m) + segments)
    _segment_fwd[grid](q, k, v, out, cu, rows, cu.shape[0], scale * LOG2_E,
                       SLOTS=max(16, triton.next_power_of_2(segments)), HEADS=heads, STRIDE_Q=q.stride(0),
                       STRIDE_K=k.stride(0), STRIDE_V=v.stride(0), D=dim, D0=d0, D1=d1, BLOCK_M=block_m,
                       BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)
    return out


def spanning_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                    block_m: int, block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """The spanning-block kernel (any number of slots)."""
    rows, heads, dim = q.shape
    q, k, v = (t.contiguous() for t in (q, k, v))
    positions = torch.arange(rows, device=cu.device, dtype=cu.dtype)
    seg = torch.searchsorted(cu[1:].contiguous(), positions, right=True).to(torch.int32)
    out = torch.empty_like(q)
    d0, d1 = head_split(dim)
    grid = (triton.cdiv(rows, block_m), heads)
    _spanning_fwd[grid](q, k, v, out, seg, cu, rows, scale * LOG2_E, HEADS=heads, D=dim, D0=d0, D1=d1,
                        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)
    return out


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Attention within the packed segments of ``cu`` over ``(rows, heads, dim)`` tensors (same heads for q, k and
    v; columns contiguous, any other layout copied); a contiguous result of q's shape. ``cu`` holds int32 offsets,
    its last one ``rows`` (the padding rules end the padding segments there; the segment kernel writes zeros past
    a smaller one). The segment-block kernel for at most :data:`SCAN_SEGMENTS` slots, else the spanning one."""
    dim = q.shape[-1]
    if dim < 32 or dim > 256:
        raise ValueError(f"packed attention: head dim {dim} is outside the kernel's range 32..256")
    kernel = segment_blocks if cu.shape[0] - 1 <= SCAN_SEGMENTS else spanning_blocks
    return kernel(q, k, v, cu, scale, block_m, block_n, num_warps, num_stages)
