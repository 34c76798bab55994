"""Graph-safe attention, registered with transformers under a name containing "flash".

Vision encoders that see a "flash" implementation pass packed boundaries (``cu_seq_lens_q/k``,
``max_length_q/k``) instead of splitting sequences with ``.tolist()``, a host sync that cannot be
captured. On CUDA (fp16/bf16) the backend is chosen per call shape by what the device holds:

1. vitcg's Triton packed kernel (:mod:`vitcg.runtime.varlen_triton`, through the op of :mod:`vitcg.runtime.ops`)
   on sm90 GPUs (H100, H200), where it measured faster than FlashAttention-2, for one set of boundaries and head
   dims of 32 to 256, in the first block configuration whose shared memory the device holds
   (:mod:`vitcg.runtime.packed_configs`: head dim 224 takes a smaller one than 80), unless Triton refused that
   head dim on this device before (:data:`vitcg.runtime.ops.REFUSED`);
2. else ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2: head dims that are multiples of 8, up to 256);
3. else, and on the CPU, SDPA with a block-diagonal mask built from ``cu_seqlens`` on the device, so the padded,
   static-shape path is the same on CPU.

A static mask function is registered under the same name: without one,
transformers' mask creation returns None for an unknown implementation and padding masks of tile
encoders would be silently ignored.

Only the graph path selects this implementation (:func:`use_attention`); the eager path keeps the
model's own attention as the reference. The selection is a field of the model's config, shared by every
thread: :func:`use_attention` counts its users per config and restores the value it found when the last one
leaves, however blocks of several threads interleave, and :func:`encoder_lock` lets callers keep other calls
of the same encoder out of the window.
"""

from __future__ import annotations

import importlib.util
import inspect
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .ops import REFUSED, packed_attention
from .packed_configs import PackedConfig, choose_config

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


_HAS_TRITON = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (found, not imported: the op imports it at its first run)."""

ELEMENT_BYTES = 2
"""Bytes per element of the kernel's inputs: fp16 and bf16 are the dtypes that reach it (:func:`_use_varlen`)."""

_TRITON_DEVICES: dict[int, int] = {}
"""CUDA device index -> shared memory one Triton program may use there (bytes, the device's opt-in limit), or 0
where the Triton kernel does not serve the device (a capability outside :data:`TRITON_CAPABILITIES`, no Triton).
Read once per device; a plain dict, so torch.compile traces the read."""


def _device_limit(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    if not _HAS_TRITON or props.major not in TRITON_CAPABILITIES:
        return 0
    return getattr(props, "shared_memory_per_block_optin", 0)


def _triton_config(query: torch.Tensor, same_boundaries: bool) -> PackedConfig | None:
    """The Triton kernel's block configuration for this call, or None when it does not serve it: more than one
    set of boundaries, a GPU outside the measured capabilities or without Triton, a head dim the kernel does not
    take or no configuration of it fits the device's shared memory (:func:`choose_config`), or Triton refused
    this head dim on this device at an earlier call (:data:`REFUSED`)."""
    if not same_boundaries:
        return None
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if index not in _TRITON_DEVICES:
        _TRITON_DEVICES[index] = _device_limit(index)
    limit = _TRITON_DEVICES[index]
    if not limit or (index, query.shape[-1]) in REFUSED:
        return None
    return choose_config(query.shape[-1], ELEMENT_BYTES, limit)


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
    if cu_seq_lens_q is not None and _use_varlen(query):
        config = _triton_config(query, cu_seq_lens_k is None or cu_seq_lens_k is cu_seq_lens_q)
        if config is not None:
            return _triton_packed(query, key, value, groups, scaling, cu_seq_lens_q, config), None
        lengths = (max_length_q, max_length_k if max_length_k is not None else max_length_q)
        return _varlen(query, key, value, groups, scaling, cu_seq_lens_q, cu_seq_lens_k, lengths), None
    mask = _segment_mask(cu_seq_lens_q, query.shape[2]) if cu_seq_lens_q is not None else attention_mask
    out = F.scaled_dot_product_attention(
        query, _repeat_kv(key, groups), _repeat_kv(value, groups), attn_mask=mask, scale=scaling,
        dropout_p=dropout if module.training else 0.0,
    )
    return out.transpose(1, 2).contiguous(), None


def _triton_packed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: int, scaling: float | None,
                   cu_seqlens: torch.Tensor, config: PackedConfig) -> torch.Tensor:
    """vitcg's Triton packed kernel over ``(1, heads, seq, dim)`` inputs; ``(1, seq, heads, dim)``."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, _repeat_kv(key, groups), _repeat_kv(value, groups)))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = packed_attention(q, k, v, cu_seqlens, float(scale), config.block_m, config.block_n,
                           config.num_warps, config.num_stages)
    return out.unsqueeze(0)


def _varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: int, scaling: float | None,
            cu_seq_lens_q: torch.Tensor, cu_seq_lens_k: torch.Tensor | None, lengths: tuple) -> torch.Tensor:
    """torch's ``varlen_attn`` (FlashAttention-2) over ``(1, heads, seq, dim)`` inputs; ``(1, seq, heads, dim)``.
    ``lengths``: the longest query and key segment."""
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
                      int(lengths[0]), int(lengths[1]), **kwargs)
    return out.unsqueeze(0)


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
