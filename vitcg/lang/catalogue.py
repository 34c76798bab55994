"""What each metadata provider is, declared without torch: the spec checks read this, ``vitcg.runtime.providers`` implements it.

A provider fills one buffer of the graph from the items of a pack. Its declaration says which attention
styles may use it, which padding rule it implements, which geometry names and params it reads, and
whether it is a tensor refilled in place or a host integer fixed at capture.
"""

from __future__ import annotations

from dataclasses import dataclass

STYLES = ("packed", "windowed", "tiles")
SEGMENTED = frozenset({"packed", "windowed"})


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    kind: str
    """``tensor`` (allocated at capture, refilled in place), ``host`` (an int fixed at capture), or
    ``either`` (a buffer with ``value`` is a host int, one with ``shape`` a tensor)."""
    styles: frozenset[str]
    paddings: tuple[str, ...]
    """Padding rules the provider supports; a spec must name one of them."""
    dtype: str
    """``model`` (the encoder's dtype), ``int32``, ``int64``, ``float32``, or ``param`` (the buffer's
    ``params.dtype``, default ``model``)."""
    geometry: tuple[str, ...] = ()
    """Geometry names the provider reads; the spec must define them."""
    params: frozenset[str] = frozenset()
    """Allowed keys of the buffer's ``params``."""
    description: str = ""
    scoped: bool = False
    """Fills the arguments of a graph-scoped submodule call (``graph_scope``) and nothing else."""


PROVIDERS: dict[str, ProviderInfo] = {
    p.name: p
    for p in (
        ProviderInfo("pixels", "tensor", frozenset(STYLES), ("zeros",), "model",
                     description="pixel rows (packed) or tiles (dim 0) of the pack, zero rows after them"),
        ProviderInfo("grid", "tensor", SEGMENTED, ("zeros", "ones"), "int64",
                     description="the items' t/h/w rows, zero rows after them"),
        ProviderInfo("cu_seqlens", "tensor", SEGMENTED, ("trailing_segment",), "int32",
                     description="segment boundaries (per frame or per clip); padding rows form one trailing "
                                 "segment and unused slots repeat the last offset"),
        ProviderInfo("max_seqlen", "host", SEGMENTED, ("fixed",), "int64",
                     description="worst-case segment length for the budget, fixed at capture"),
        ProviderInfo("position_ids", "tensor", SEGMENTED, ("zeros",), "int64", ("spatial_merge_size",),
                     frozenset({"include_temporal"}),
                     description="rotary (h, w) or (t, h, w) position ids in merge-block order"),
        ProviderInfo("window_index", "tensor", frozenset({"windowed"}), ("identity",), "int64",
                     ("spatial_merge_size", "window_size", "patch_size"),
                     description="window order of merged units; padding units map to themselves"),
        ProviderInfo("cu_window_seqlens", "tensor", frozenset({"windowed"}), ("trailing_segment",), "int32",
                     ("spatial_merge_size", "window_size", "patch_size"),
                     description="window boundaries; padding forms one trailing window"),
        ProviderInfo("max_window_seqlen", "host", frozenset({"windowed"}), ("fixed",), "int64",
                     description="worst-case window length for the budget, fixed at capture"),
        ProviderInfo("interp_indices", "tensor", SEGMENTED, ("zeros",), "int64",
                     ("num_grid_per_side", "spatial_merge_size"), frozenset({"mode", "align_corners", "padding"}),
                     description="gather indices resampling a learned position table to each grid"),
        ProviderInfo("interp_weights", "tensor", SEGMENTED, ("zeros",), "float32",
                     ("num_grid_per_side", "spatial_merge_size"), frozenset({"mode", "align_corners", "padding"}),
                     description="weights of those taps; zero for padding rows"),
        ProviderInfo("aligned", "tensor", frozenset(STYLES), ("zeros", "ones"), "param", (),
                     frozenset({"role", "dtype"}),
                     description="an extra input aligned with the pixels on dim 0 (a per-tile mask, per-image "
                                 "shapes), sliced and padded like them; params: role, dtype"),
        ProviderInfo("scope_arg", "either", frozenset(STYLES), ("zeros", "ones", "trailing_segment", "identity", "fixed"),
                     "param", (), frozenset({"dtype", "rows_dim"}), scoped=True,
                     description="an argument of the graph-scoped submodule call, taken from the model's own "
                                 "eager prologue at replay; host integers (value) are fixed at capture"),
    )
}

REQUIRED_PROVIDERS: dict[str, tuple[str, ...]] = {
    "packed": ("pixels", "cu_seqlens", "max_seqlen"),
    "windowed": ("pixels", "cu_seqlens", "max_seqlen", "window_index", "cu_window_seqlens", "max_window_seqlen"),
    "tiles": ("pixels",),
}
"""Providers each attention style cannot do without."""

INPUT_ROLES: dict[str, tuple[str, ...]] = {
    "packed": ("pixels", "grid"),
    "windowed": ("pixels", "grid"),
    "tiles": ("pixels",),
}
"""The mm_kwargs roles every modality of a style must name."""
OPTIONAL_ROLES: dict[str, tuple[str, ...]] = {"packed": (), "windowed": (), "tiles": ("tiles",)}
"""Roles a style may name: tiles without a per-item count are one item each."""
STANDARD_ROLES = ("pixels", "grid", "tiles")
"""Any other role is an extra input aligned with the pixels on dim 0."""
DTYPES = ("model", "bool", "int32", "int64", "float32")

ITEM_NAMES: dict[str, tuple[str, ...]] = {
    "packed": ("t", "h", "w"),
    "windowed": ("t", "h", "w"),
    "tiles": ("n",),
}
"""Per-item names an item formula may read: the grid row, or the tile count."""

LIMIT_NAMES = ("max_num_batched_tokens", "max_model_len")
BUFFER_NAMES = ("budget", "max_items", "max_frames", "max_segments")


def buffer_names(budget: int, max_items: int, max_frames: int) -> dict[str, int]:
    """The values of :data:`BUFFER_NAMES` for one capture. ``max_segments`` is derived: the most attention
    segments a pack of ``max_items`` items and ``max_frames`` frames can have (every segment has at least one
    output token, so never more than ``budget``)."""
    return {"budget": budget, "max_items": max_items, "max_frames": max_frames,
            "max_segments": min(budget, max_items + max_frames)}

DEFAULT_LIMITS = {"max_num_batched_tokens": 8192, "max_model_len": 32768}
"""Limits the budget formulas are checked with when no engine is in sight (vLLM's online defaults)."""
