"""Which block configuration of the Triton packed attention kernel a device can hold, per head dim (torch-free).

The kernel (:mod:`vitcg.runtime.varlen_triton`) keeps a block of query rows in shared memory for its whole run,
and pipelines ``num_stages`` blocks of keys and values through it. Its measured configuration (128 query rows,
64 keys, 3 stages) needs 82,432 bytes at Qwen2-VL's head dim of 80, but at EXAONE 4.5's 224 (split 128 + 128)
it needs 262,656 bytes, over the 232,448 an H100 gives one program: Triton refused it with ``OutOfResources``
and ``vitcg check exaone4_5 --device cuda --size real`` failed before any case (2026-11-28). So a configuration
is chosen per head dim: the measured one for its width, else a smaller one, the first whose estimate
(:func:`shared_memory_bytes`), plus :data:`MARGIN_BYTES`, fits the device's limit; None when none does, and the
caller runs its next backend.

These functions run inside the attention that ``torch.compile`` traces: plain integer arithmetic and tuples, no
``int.bit_length`` or library calls, so dynamo folds them into constants.
"""

from __future__ import annotations

from typing import NamedTuple


class PackedConfig(NamedTuple):
    """One launch configuration of the packed kernel (the arguments of ``varlen_attention`` of the same names)."""

    block_m: int
    """Query rows per program."""
    block_n: int
    """Keys per step of a program's loop."""
    num_warps: int
    num_stages: int
    """Key and value blocks in flight (software pipelining): each stage holds one of each in shared memory."""


NARROW = PackedConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
"""For heads whose split is narrower than :data:`WIDE_COLUMNS` (64 to 96): the fastest of the configurations
``benchmarks/attention_backends.py`` timed on an H100 and an H200 at head dim 80 (2026-11-26), and of the
segment-block kernel's at 64 to 96 on the compute-bound rows (H200, 2026-12-01)."""
WIDE = PackedConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
"""For splits of :data:`WIDE_COLUMNS` and more (104, 128, 224): half the query rows, 0.96 against 1.34 ms a layer
at 128 on the mixed batch (H200, 2026-12-02), and a block's fp32 accumulators (64 x 256 at 224) within a warp
group's registers."""
SMALL = PackedConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)
"""Where the first does not fit (a device of less shared memory): one stage fewer, 164,352 bytes at a head dim of
224 or 256."""
WIDE_COLUMNS = 128
"""The split's padded width (d0 + d1) from which a head takes :data:`WIDE` first."""

MIN_HEAD_DIM = 32
"""The kernel's least head dim: its two matrix parts need 16 columns each (``tl.dot``'s least K)."""
MAX_HEAD_DIM = 256
"""The kernel's largest head dim (a split of 128 + 128)."""

BOOKKEEPING_BYTES = 512
"""What Triton adds to the tiles (barriers of the pipeline): its figure for 224, 262,656 bytes, is the tiles'
262,144 plus this."""
MARGIN_BYTES = 2048
"""Room left below the device's limit. The estimate matched Triton's figure to the byte for one configuration
(above); :data:`WIDE` at head dim 224, 229,888 bytes by the estimate, compiled and ran within an H200's 232,448
(an H100's limit too) on 2026-12-01 and 2026-12-02, and took 2.95 to 2.40 ms a layer on the mixed batch against
:data:`SMALL`, which a margin of 16,384 bytes had chosen there (``benchmarks/RESULTS.md``). A configuration Triton
refuses all the same is a fallback, not an error (:mod:`vitcg.runtime.ops`)."""


def head_split(dim: int) -> tuple[int, int]:
    """(power-of-two part, padded remainder) of a head dim, as the kernel computes it: the largest power of two
    below ``dim``, and the rest padded to a power of two of at least 16 (``tl.dot``'s least K). 80 -> (64, 16),
    224 -> (128, 128), 128 -> (64, 64)."""
    d0 = 1
    while d0 * 2 <= dim:
        d0 *= 2
    if d0 == dim:
        d0 //= 2
    d1 = 16
    while d1 < dim - d0:
        d1 *= 2
    return d0, d1


def shared_memory_bytes(config: PackedConfig, columns: int, element_bytes: int) -> int:
    """Shared memory one program of ``config`` needs for heads of ``columns`` (the split's padded width, d0 + d1)
    in elements of ``element_bytes``: its block of queries, and a key and a value block per stage."""
    queries = config.block_m * columns * element_bytes
    keys_and_values = 2 * config.num_stages * config.block_n * columns * element_bytes
    return queries + keys_and_values + BOOKKEEPING_BYTES


def choose_config(head_dim: int, element_bytes: int, limit: int) -> PackedConfig | None:
    """:data:`NARROW` or :data:`WIDE` by the head's split, else :data:`SMALL`: the first that fits ``limit`` bytes
    of shared memory per program with :data:`MARGIN_BYTES` to spare at ``head_dim``; None when neither does or the
    kernel does not take this head dim (the caller then runs its next backend)."""
    if head_dim < MIN_HEAD_DIM or head_dim > MAX_HEAD_DIM:
        return None
    d0, d1 = head_split(head_dim)
    for config in (WIDE if d0 + d1 >= WIDE_COLUMNS else NARROW, SMALL):
        if shared_memory_bytes(config, d0 + d1, element_bytes) + MARGIN_BYTES <= limit:
            return config
    return None
