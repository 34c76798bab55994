"""A candidate for vitcg's packed attention kernel (``vitcg/runtime/varlen_triton.py``), measured here until the
GPU gate (``benchmarks/gpu_run.sh gate``) has passed on it in the runtime; the runtime keeps its gated kernel
until then. ``benchmarks/attention_backends.py`` times it (``triton_m*`` rows) against that kernel
(``triton_base``), and ``benchmarks/with_candidate.py`` runs any vitcg command with it in the runtime's place.

One program per head and block of query rows, its rows always inside one segment: each segment of
``cu_seqlens`` is cut into blocks of ``BLOCK_M`` rows, numbered segment by segment (longest segment first in
calls of :data:`ORDER_ROWS` rows or more); a program finds its block from ``cu_seqlens`` alone (vector operations
over at most :data:`SCAN_SEGMENTS` offsets), runs the segment's whole key blocks without a mask and only its
last, partial key block masked by the segment's end. Boundaries are read on the device inside the kernel, so a
CUDA graph of it follows new boundaries on replay, and the call is one launch (the runtime's kernel launches a
``searchsorted`` for segment ids first). The grid has room for one partial block per segment slot; programs past
the last block store nothing. A block of the runtime's kernel that spans two segments computes every row against
both segments' keys; here none does.

Head dims split as in the runtime (80 = 64 + 16 columns of matrix work). The softmax folds the scale into one
multiply-add per score, the matrix products accumulate in place, and each tensor's row stride is a compile-time
constant of its own, so a value that is a strided view of a fused projection is read in place, not copied.

Where a call has more segment slots than :data:`SCAN_SEGMENTS` (window attention: MiniCPM-V 4.6 has one slot per
window, 4,097 at its largest budget), blocks of one tiny segment each would waste most of a tile, and the scan
would not compile (a 4,096-wide vector): such calls run the runtime's kernel, whose blocks span segments.
Configurations: 128 x 64 rows and keys, 4 warps, 3 stages for heads narrower than 128 columns (64 to 96); 64 x 64
for 104, 128 and 224, the fastest there on an H200 (``benchmarks/RESULTS.md``, 2026-12-01).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vitcg.runtime import varlen_triton as runtime_kernel
from vitcg.runtime.packed_configs import PackedConfig, head_split, shared_memory_bytes

SCAN_SEGMENTS = 64
"""The most segment slots a program scans for its block; calls with more run the runtime's kernel."""
ORDER_ROWS = 8192
"""Calls of this many rows or more run the longest segment's blocks first. The ordering gained 5% on the mixed
batch (17,408 rows: 0.668 against 0.704 ms a layer at head dim 80) and nothing below (within 3% either way), and
its lookup (a ranking of every slot against every other, in every program) is the likely cost of the 224 px
image's slower call (``benchmarks/RESULTS.md``, 2026-12-01, where every call was ordered); smaller calls take the
blocks in pack order, found by a running sum. Set after that measurement, not yet measured itself."""
NARROW = PackedConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
WIDE = PackedConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
WIDE_COLUMNS = 128
"""The split's padded width (d0 + d1) from which a head takes :data:`WIDE`: 104, 128 and 224 do, 64 to 96 not."""
MARGIN_BYTES = 2048
"""Room below the device's shared-memory limit: :data:`WIDE` at 224, 229,888 bytes by the runtime's estimate, ran
on an H200 (232,448 bytes, as an H100) on 2026-12-01."""

_RUNTIME = runtime_kernel.varlen_attention
"""The runtime's own kernel, kept before :mod:`with_candidate` puts this module's function in its place."""


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


def config_for(dim: int, limit: int, given: PackedConfig) -> PackedConfig:
    """The candidate's configuration for head dim ``dim`` on a device of ``limit`` bytes per program; ``given``
    (the runtime's choice) where the candidate's does not fit."""
    d0, d1 = head_split(dim)
    config = WIDE if d0 + d1 >= WIDE_COLUMNS else NARROW
    if shared_memory_bytes(config, d0 + d1, 2) + MARGIN_BYTES > limit:
        return given
    return config


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float, config: PackedConfig,
           ordered: bool = True) -> torch.Tensor:
    """This kernel in ``config`` over ``(rows, heads, dim)`` tensors and at most :data:`SCAN_SEGMENTS` segments of
    ``cu``; a contiguous result of q's shape. ``ordered``: the blocks of the longest segments run first (False: in
    pack order)."""
    rows, heads, dim = q.shape
    segments = cu.shape[0] - 1
    if dim < 32 or dim > 256 or segments > SCAN_SEGMENTS:
        raise ValueError(f"packed attention: head dim {dim} (32..256) or {segments} segment slots "
                         f"(at most {SCAN_SEGMENTS}) outside this kernel's range")
    q, k, v = (_rows_in_place(t) for t in (q, k, v))
    out = torch.empty((rows, heads, dim), device=q.device, dtype=q.dtype)
    d0, d1 = head_split(dim)
    # every segment adds at most one partial block; the programs past the last block store nothing
    grid = (heads, triton.cdiv(rows, config.block_m) + segments)
    _varlen_fwd[grid](q, k, v, out, cu, scale * 1.4426950408889634, N_CU=cu.shape[0],
                      SLOTS=max(16, triton.next_power_of_2(segments)), HEADS=heads, STRIDE_Q=q.stride(0),
                      STRIDE_K=k.stride(0), STRIDE_V=v.stride(0), D=dim, D0=d0, D1=d1, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, ORDERED=ordered, num_warps=config.num_warps,
                      num_stages=config.num_stages)
    return out


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                     **runtime_options) -> torch.Tensor:
    """The runtime's ``varlen_attention`` contract, by this kernel in its own configuration (:func:`config_for`;
    the one given is the runtime's choice), longest segment first from :data:`ORDER_ROWS` rows, or by the
    runtime's kernel in the given one for calls of more than :data:`SCAN_SEGMENTS` segment slots."""
    given = PackedConfig(block_m, block_n, num_warps, num_stages)
    if cu.shape[0] - 1 > SCAN_SEGMENTS:
        return _RUNTIME(q, k, v, cu, scale, *given, **runtime_options)
    limit = torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin
    return launch(q, k, v, cu, scale, config_for(q.shape[-1], limit, given), ordered=q.shape[0] >= ORDER_ROWS)
