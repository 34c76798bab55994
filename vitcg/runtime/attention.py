"""Graph-safe attention, registered with transformers under a name containing "flash".

Vision encoders that see a "flash" implementation pass packed boundaries (``cu_seq_lens_q/k``,
``max_length_q/k``) instead of splitting sequences with ``.tolist()``, a host sync that cannot be
captured. On CUDA (fp16/bf16) this calls vitcg's Triton packed kernel on sm90 GPUs (H100, H200), where it measured
faster than FlashAttention-2 (:mod:`vitcg.runtime.varlen_triton`), and ``torch.nn.attention.varlen.varlen_attn``
on other GPUs or where Triton is missing; elsewhere it runs
SDPA with a block-diagonal mask built from ``cu_seqlens`` on the device, so the padded, static-shape
path is the same on CPU. A static mask function is registered under the same name: without one,
transformers' mask creation returns None for an unknown implementation and padding masks of tile
encoders would be silently ignored.

Only the graph path selects this implementation (:func:`use_attention`); the eager path keeps the
model's own attention as the reference. The selection is a field of the model's config, shared by every
thread: :func:`use_attention` counts its users per config and restores the value it found when the last one
leaves, however blocks of several threads interleave, and :func:`encoder_lock` lets callers keep other calls
of the same encoder out of the window.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_NAME = "vitcg_flash_varlen"
"""Must contain "flash": that is how transformers vision encoders decide to pass packed boundaries."""


def _find_varlen():
    """``(varlen_attn, its parameter names)``, or None when this torch has no varlen attention."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


_VARLEN = _find_varlen()
"""Resolved once at import (a plain global, so torch.compile traces no cache wrapper)."""

TRITON_CAPABILITIES = frozenset({9})
"""Compute-capability majors where the Triton packed kernel was measured faster than ``varlen_attn`` (9: Hopper,
``benchmarks/attention_backends.py`` on an H200, 2026-11-26). Other GPUs keep FlashAttention-2 until measured."""


def _find_triton():
    """vitcg's Triton packed attention op, or None when Triton is not installed."""
    try:
        from vitcg.runtime.varlen_triton import packed_attention
    except ImportError:
        return None
    return packed_attention


_TRITON = None
_TRITON_DEVICES: dict[int, bool] = {}
"""CUDA device index -> whether the Triton kernel serves it (capability read once per device)."""


def _use_triton(query: torch.Tensor, same_boundaries: bool) -> bool:
    """Whether the Triton kernel serves this call: one set of boundaries, a head dim of at least 32 (its two
    matrix parts need 16 columns each), a GPU of a measured capability, and Triton installed."""
    global _TRITON
    if not same_boundaries or query.shape[-1] < 32:
        return False
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if index not in _TRITON_DEVICES:
        _TRITON = _TRITON or _find_triton()
        major = torch.cuda.get_device_capability(index)[0]
        _TRITON_DEVICES[index] = _TRITON is not None and major in TRITON_CAPABILITIES
    return _TRITON_DEVICES[index]


def _segment_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """(length, length) boolean mask, True where row and column sit in the same segment. Sync-free."""
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    segment = torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)
    return segment[:, None] == segment[None, :]


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    return states if groups == 1 else states.repeat_interleave(groups, dim=1)


def _use_varlen(query: torch.Tensor) -> bool:
    return (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and query.shape[0] == 1
            and query.shape[-1] % 8 == 0 and query.shape[-1] <= 256 and _VARLEN is not None)


def graph_safe_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """Attention over ``(batch, heads, seq, dim)`` inputs; returns ``(batch, seq, heads, dim)``, None.

    Unknown keyword arguments are ignored on purpose: precomputed metadata keys reach attention
    through nested modules' ``**kwargs``.
    """
    groups = query.shape[1] // key.shape[1]
    if cu_seq_lens_q is not None and _use_varlen(query) and _use_triton(
            query, cu_seq_lens_k is None or cu_seq_lens_k is cu_seq_lens_q):
        q, k, v = (t[0].transpose(0, 1) for t in (query, _repeat_kv(key, groups), _repeat_kv(value, groups)))
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return _TRITON(q, k, v, cu_seq_lens_q, float(scale)).unsqueeze(0), None
    if cu_seq_lens_q is not None and _use_varlen(query):
        varlen_attn, params = _VARLEN
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (seq, heads, dim)
        kwargs = {}
        if "enable_gqa" in params and groups > 1:
            kwargs["enable_gqa"] = True
        else:
            k, v = (s.repeat_interleave(groups, dim=1) for s in (k, v))
        if "scale" in params:
            kwargs["scale"] = scaling
        elif scaling is not None:
            q = q * (scaling * q.shape[-1] ** 0.5)  # older torch: fixed 1/sqrt(d) scale
        out = varlen_attn(q, k, v, cu_seq_lens_q, cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q,
                          int(max_length_q), int(max_length_k if max_length_k is not None else max_length_q), **kwargs)
        return out.unsqueeze(0), None
    mask = attention_mask
    if cu_seq_lens_q is not None:
        mask = _segment_mask(cu_seq_lens_q, query.shape[2])
    out = F.scaled_dot_product_attention(
        query, _repeat_kv(key, groups), _repeat_kv(value, groups), attn_mask=mask, scale=scaling,
        dropout_p=dropout if module.training else 0.0,
    )
    return out.transpose(1, 2).contiguous(), None


def _static_mask(*args, **kwargs):
    """transformers' sdpa mask with its shortcuts off: always a real mask, never None for padding."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


_registered = False


def register() -> str:
    """Register the attention and its mask function with transformers (idempotent); returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTENTION_NAME, graph_safe_attention)
        AttentionMaskInterface.register(ATTENTION_NAME, _static_mask)
        _registered = True
    return ATTENTION_NAME


def configs_of(module: nn.Module) -> list:
    """Every distinct transformers config reachable from ``module``'s submodules."""
    seen: dict[int, object] = {}
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


_SELECTED: dict[int, tuple[object, int, object]] = {}
"""id(config) -> (config, blocks inside :func:`use_attention` on it, the value found when the first entered)."""
_SELECTED_LOCK = threading.Lock()


@contextmanager
def use_attention(configs: list, name: str) -> Iterator[None]:
    """Select attention implementation ``name`` on ``configs`` for the duration of the block. Nested and
    concurrent blocks on one config are counted: the value found before the first is restored when the last
    leaves, in whatever order they leave."""
    with _SELECTED_LOCK:
        for config in configs:
            _, users, found = _SELECTED.get(id(config), (config, 0, config._attn_implementation))
            _SELECTED[id(config)] = (config, users + 1, found)
            config._attn_implementation = name
    try:
        yield
    finally:
        with _SELECTED_LOCK:
            for config in configs:
                _, users, found = _SELECTED[id(config)]
                if users == 1:
                    del _SELECTED[id(config)]
                    config._attn_implementation = found
                else:
                    _SELECTED[id(config)] = (config, users - 1, found)


_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def encoder_lock(module: nn.Module) -> threading.RLock:
    """The one re-entrant lock of ``module`` (created on first use): held around every forward vitcg runs on it,
    so no call of one thread sees the graph path's attention or compiled blocks that another selected."""
    with _LOCKS_LOCK:
        lock = _LOCKS.get(module)
        if lock is None:
            lock = _LOCKS[module] = threading.RLock()
        return lock
