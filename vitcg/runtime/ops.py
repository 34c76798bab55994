"""vitcg's custom torch ops, defined without importing Triton: everything a stored compiled block may call.

A block compiled ahead of time (:class:`vitcg.runtime.regions.AheadOfTime`) and stored by one command calls
``torch.ops.vitcg.packed_attention`` by name when a later process loads it, without running the attention code
that chose it. When the op was defined only in :mod:`vitcg.runtime.varlen_triton`, imported at the first
attention call that took the Triton path, a fresh process loading a cache ``vitcg bench`` wrote failed with
``AttributeError: '_OpNamespace' 'vitcg' object has no attribute 'packed_attention'`` (2026-11-28, H100). So the
op and its fake live here, with Triton imported inside the op's body at its first run, and every module that
loads stored compiled code (:mod:`vitcg.runtime.compile_cache`, :mod:`vitcg.runtime.regions`) imports this one.

The kernel a device cannot hold is a fallback, never an error: where Triton refuses a configuration
(``OutOfResources``, which the choice of :mod:`vitcg.runtime.packed_configs` should already have avoided), cannot
compile the kernel for a call shape (``CompilationError``: on 2026-12-01 a scan over 4,097 segment slots did not
compile, the capture of MiniCPM-V 4.6 failed, and the whole model ran stock), or cannot be imported, the op
remembers it in :data:`REFUSED`, warns once, and answers with block-diagonal SDPA; the attention reads
:data:`REFUSED` on every call and sends later calls of that shape to its next backend.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

REFUSED: dict[tuple[int, int], str] = {}
"""(CUDA device index, head dim) -> why the Triton kernel could not run there. A plain dict, read by the traced
attention on every call (:func:`vitcg.runtime.attention.graph_safe_attention`) and written only here."""


@torch.library.custom_op("vitcg::packed_attention", mutates_args=())
def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float,
                     block_m: int, block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """Attention within the packed segments of ``cu`` over ``(rows, heads, dim)`` tensors, by the Triton
    kernel in the given block configuration (:class:`vitcg.runtime.packed_configs.PackedConfig`), as one opaque op:
    compiled blocks call it, CUDA graphs capture it like any kernel."""
    key = (q.get_device(), q.shape[-1])
    if key not in REFUSED:
        try:
            from .varlen_triton import CompilationError, OutOfResources, varlen_attention
        except ImportError as exc:
            _refuse(key, f"Triton cannot be imported ({exc})")
        else:
            try:
                return varlen_attention(q, k, v, cu, scale, block_m=block_m, block_n=block_n, num_warps=num_warps,
                                        num_stages=num_stages)
            except (OutOfResources, CompilationError) as exc:  # raised at compile time, before any launch
                _refuse(key, f"Triton: {type(exc).__name__}: {str(exc)[:300]}")
    return segment_attention(q, k, v, cu, scale)


@packed_attention.register_fake
def _(q, k, v, cu, scale, block_m, block_n, num_warps, num_stages):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _refuse(key: tuple[int, int], why: str) -> None:
    REFUSED[key] = why
    log.warning("vitcg: the packed Triton attention kernel cannot run head dim %d on cuda:%d (%s); that shape runs "
                "the next attention backend from now on", key[1], key[0], why)


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """What :func:`packed_attention` computes, by SDPA with a block-diagonal mask built on the device from ``cu``
    (no host sync, so a CUDA graph may hold it): the op's answer where the kernel cannot run."""
    rows = q.shape[0]
    positions = torch.arange(rows, device=cu.device, dtype=cu.dtype)
    segment = torch.searchsorted(cu[1:].contiguous(), positions, right=True)
    mask = segment[:, None] == segment[None, :]
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), attn_mask=mask,
                                         scale=scale)
    return out[0].transpose(0, 1).contiguous()
