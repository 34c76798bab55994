"""The spec vocabulary, one record per word, declared without torch.

Every attention style, metadata provider, padding rule and dtype a spec may name is one record here, with
its parameters and its doc line. Everything else is derived from these records: the JSON Schema's enums and
provider params (:func:`vocabulary_schema`), the semantic checks, the generated ``registry/VOCABULARY.md``
and the labels of the supported-models page. The runtime implements each provider and padding rule under
the same name (``vitcg.runtime.providers``, ``vitcg.runtime.padding``); a test ties the two together.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .formulas import Formula, parse

DTYPES = ("model", "bool", "int32", "int64", "float32")
"""Buffer and example-input dtypes: ``model`` is the encoder's own dtype."""

LIMIT_NAMES = ("max_num_batched_tokens", "max_model_len")
BUFFER_NAMES = ("budget", "max_items", "max_frames", "max_segments")
DEFAULT_LIMITS = {"max_num_batched_tokens": 8192, "max_model_len": 32768}
"""Limits the budget formulas are checked with when no engine is in sight (vLLM's online defaults)."""
MERGE_NAME = "spatial_merge_size"
"""The geometry name of the merge block size of :attr:`AttentionStyle.merged` item names."""
MAX_BUDGET_TOKENS = 2**20
"""Largest max budget a spec may reach under :data:`DEFAULT_LIMITS` (32x the largest in ``vitcg/specs/``): a
budget is a capture buffer's row count, so an unbounded one exhausts memory before anything runs."""
MAX_BUFFER_ELEMENTS = 2**30
"""Most elements the tensor buffers of the max budget's capture may hold together (4 GiB in float32; the
largest spec in ``vitcg/specs/`` needs 2.0e8)."""
GRID_COLUMNS = ("t", "h", "w")
"""The full columns of a grid row; a modality's ``grid_columns`` may leave ``t`` out (then t is 1)."""
SHAPING_NAMES = {"image": ("height", "width"), "video": ("frames", "height", "width")}
"""What a ``tests.shaping`` formula may read besides geometry: the size of one image or video in pixels."""


def buffer_names(budget: int, max_items: int, max_frames: int) -> dict[str, int]:
    """The values of :data:`BUFFER_NAMES` for one capture. ``max_segments`` is derived: the most attention
    segments a pack of ``max_items`` items and ``max_frames`` frames can have (every segment has at least one
    output token, so never more than ``budget``)."""
    return {"budget": budget, "max_items": max_items, "max_frames": max_frames,
            "max_segments": min(budget, max_items + max_frames)}


@dataclass(frozen=True)
class PaddingRule:
    name: str
    doc: str
    row_wise: bool = False
    """Writes value rows first and fills the rest row by row: a buffer padded so counts the rows (or tiles)."""
    refilled: bool = True
    """False for host integers fixed at capture: the runtime has no function for the rule."""


PADDINGS: Mapping[str, PaddingRule] = MappingProxyType({r.name: r for r in (
    PaddingRule("zeros", "value rows first, zero rows after them", row_wise=True),
    PaddingRule("ones", "value rows first, rows of ones after them (masks of padding tiles, grids divided by)",
                row_wise=True),
    PaddingRule("trailing_segment", "boundaries first; padding rows form trailing segments of their own and "
                                    "unused slots repeat the last offset"),
    PaddingRule("trailing_item", "grid rows first, then one row making the padding rows an item of their own "
                                 "(spatial_merge_size by the rest), then zero rows: for encoders that derive their "
                                 "attention segments from the grid"),
    PaddingRule("identity", "indices first, then every padding slot maps to itself"),
    PaddingRule("square_mask", "an attention mask over the rows on its rows dimension and again on its last: the "
                               "value's mask top-left, padding rows attend only to themselves, real rows never to "
                               "padding"),
    PaddingRule("repeat", "value rows first, each one's entries along dim 1 repeated to fill the buffer's dim 1 "
                          "(which they must divide: a mean over it is unchanged), zero rows after them",
                row_wise=True),
    PaddingRule("fixed", "a host integer fixed at capture, never refilled", refilled=False),
)})


@dataclass(frozen=True)
class Absence:
    """What a graph-scoped buffer's ``absent`` key means: the value a replay gives a buffer whose argument the
    scoped call leaves out (None). Without the key only a mask (``padding: ones``) may be absent (all ones)."""

    name: str
    doc: str
    paddings: tuple[str, ...]
    """The padding rules of the buffers it may be set on (what the buffer must be for the value to mean it)."""


ABSENCES: Mapping[str, Absence] = MappingProxyType({a.name: a for a in (
    Absence("one_segment", "the call's rows are one attention segment: the replay fills the boundaries [0, rows], "
                           "then the padding segments (a model that passes no cu_seqlens for a call of one image)",
            paddings=("trailing_segment",)),
)})


@dataclass(frozen=True)
class AttentionStyle:
    """What an item is for one attention style, and everything that follows from it.

    An item is a grid row ``(t, h, w)`` (``count_role`` ``grid``) or a tile count ``n`` (``tiles``). The
    methods here are the only place that tells the two apart; they work on plain integers and on anything
    with ``tolist`` (tensors), so the spec language stays free of torch."""

    name: str
    label: str
    """How the supported-models page describes it."""
    doc: str
    count_role: str
    """The input role holding one count row per item: ``grid`` or ``tiles``."""
    item_names: tuple[str, ...]
    """Names an item formula reads: the grid row, or the tile count."""
    segments: tuple[str, ...]
    """Values of ``attention.segments`` (first = default); ``tile`` means the key does not apply."""
    count_required: bool
    """False: a modality may leave the count role out, and then every tile is an item of its own."""
    required_providers: tuple[str, ...]
    geometry: tuple[str, ...] = ()
    """Geometry names every spec of this style defines."""
    shaping: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Default ``tests.shaping`` per modality: item name -> formula over :data:`SHAPING_NAMES` and geometry,
    how the model's processor turns one image or video into one item."""
    markers: tuple[str, ...] = ()
    """``transformers.vision_utils`` helpers whose call in an encoder's source marks this style (``vitcg new``)."""
    merged: tuple[str, ...] = ()
    """Item names the encoder merges in blocks of geometry :data:`MERGE_NAME` (when the spec defines it): each
    must be a multiple of it."""

    @property
    def defaults(self) -> Mapping[str, Any]:
        """What a spec of this style gets unless it writes otherwise: ``items``, ``budget`` and, for a spec without
        ``graph_scope``, the standard ``buffers``. Written in the style's base file (``vitcg/lang/styles/_NAME.yaml``,
        :mod:`.bases`), which :mod:`.resolve` merges the spec over."""
        from .bases import style_defaults
        return MappingProxyType(style_defaults(self.name))

    @property
    def segmented(self) -> bool:
        """Whether attention runs over segments of packed rows (cu_seqlens and friends apply)."""
        return self.count_role == "grid"

    @property
    def roles(self) -> tuple[str, ...]:
        return ("pixels", self.count_role)

    def count_shape(self, columns: int | None = None) -> str:
        """The shape of the count input, in words: ``(items, 3)`` (``columns`` per grid row, default all item
        names) or ``(items,)``."""
        return f"(items, {columns or len(self.item_names)})" if self.segmented else "(items,)"

    def counts_fit(self, shape: Sequence[int], columns: int | None = None) -> bool:
        """Whether a count input of ``shape`` has one row per item (``columns`` per grid row)."""
        width = (columns or len(self.item_names),) if self.segmented else ()
        return tuple(shape[1:]) == width and len(shape) >= 1

    def empty_counts_shape(self) -> tuple[int, ...]:
        return (0, len(self.item_names)) if self.segmented else (0,)

    def names(self, row: Any) -> dict[str, int]:
        """The item names of one count row (a grid row or a tile count)."""
        values = row.tolist() if hasattr(row, "tolist") else row
        values = [values] if not isinstance(values, (list, tuple)) else values
        return {k: int(v) for k, v in zip(self.item_names, values, strict=True)}

    def check_item(self, frames: int, a: int, b: int, geometry: Mapping[str, int]) -> int | list[int]:
        """The count row ``vitcg check`` feeds for an item of ``a x b`` merged tokens over ``frames`` frames
        (tiles: ``a`` tiles, or one tile per frame for video)."""
        if not self.segmented:
            return a if frames == 0 else frames
        m = geometry[MERGE_NAME]
        return [max(frames, 1), a * m, b * m]

    def sample(self, geometry: Mapping[str, int]) -> dict[str, int]:
        """A typical item, to check that item formulas are positive."""
        return dict(zip(self.item_names, self.check_item(2, 4, 6, geometry) if self.segmented else [3]))


_PACKED_SHAPING = {
    "image": {"t": "1",
              "h": "max(1, (2 * height + patch_size * spatial_merge_size) // (2 * patch_size * spatial_merge_size))"
                   " * spatial_merge_size",
              "w": "max(1, (2 * width + patch_size * spatial_merge_size) // (2 * patch_size * spatial_merge_size))"
                   " * spatial_merge_size"},
    "video": {"t": "max(1, frames // temporal_patch_size)",
              "h": "max(1, (2 * height + patch_size * spatial_merge_size) // (2 * patch_size * spatial_merge_size))"
                   " * spatial_merge_size",
              "w": "max(1, (2 * width + patch_size * spatial_merge_size) // (2 * patch_size * spatial_merge_size))"
                   " * spatial_merge_size"},
}

STYLES: Mapping[str, AttentionStyle] = MappingProxyType({s.name: s for s in (
    AttentionStyle("packed", "packed varlen (rotary)",
                   "one sequence of patch rows; varlen attention by cu_seqlens", "grid", ("t", "h", "w"),
                   ("frame", "clip"), True, ("pixels", "cu_seqlens", "max_seqlen"),
                   ("patch_size", "spatial_merge_size"), _PACKED_SHAPING,
                   ("get_vision_attention_seqlens", "get_vision_cu_seqlens"), ("h", "w")),
    AttentionStyle("windowed", "windowed varlen (rotary)",
                   "packed, plus Qwen2.5-VL-style windows between full-attention layers", "grid", ("t", "h", "w"),
                   ("frame", "clip"), True,
                   ("pixels", "cu_seqlens", "max_seqlen", "window_index", "cu_window_seqlens", "max_window_seqlen"),
                   ("patch_size", "spatial_merge_size"), _PACKED_SHAPING, ("get_vision_window_index",), ("h", "w")),
    AttentionStyle("tiles", "fixed-size tiles on dim 0",
                   "fixed-size tiles batched on dim 0; attention within each tile", "tiles", ("n",),
                   ("tile",), False, ("pixels",), (), {"image": {"n": "1"}, "video": {"n": "frames"}}),
)})

class _Deferred(Mapping[str, Any]):
    """A read-only mapping computed when first read: the defaults live in the base files (:mod:`.bases`), which
    need the YAML loader, itself needing this module."""

    def __init__(self, compute):
        self._compute = compute

    def __getitem__(self, key: str) -> Any:
        return self._compute()[key]

    def __iter__(self):
        return iter(self._compute())

    def __len__(self) -> int:
        return len(self._compute())


def _harness_defaults() -> Mapping[str, Any]:
    from .bases import harness_defaults
    return harness_defaults()


STYLE_DEFAULTS: Mapping[str, Mapping[str, Any]] = _Deferred(lambda: {s.name: s.defaults for s in STYLES.values()})
"""Each style's defaults (:attr:`AttentionStyle.defaults`, from its base file), by style name."""
TESTS_DEFAULTS: Mapping[str, Any] = _Deferred(_harness_defaults)
"""What a spec's harness (``tests``) gets unless it writes otherwise (``vitcg/lang/styles/_spec.yaml``): the budgets
``vitcg check`` captures and the ``max_model_len`` it assumes."""



def style_of(helpers: set[str]) -> AttentionStyle:
    """The style an encoder that calls ``helpers`` most likely has: the most specific one whose markers it
    calls (windowed before packed), else one without markers (tiles)."""
    marked = [s for s in STYLES.values() if s.markers and helpers & set(s.markers)]
    if marked:
        return max(marked, key=lambda s: len(s.required_providers))
    return next(s for s in STYLES.values() if not s.markers)


SEGMENT_DOCS = {"frame": "one segment per frame", "clip": "one segment per clip",
                "tile": "attention within each tile"}


@dataclass(frozen=True)
class ArgumentForm:
    """A form in which the model code of a later transformers release takes a provider's buffer, where it differs
    from the stored one (the spec's shape, padded by the spec's rule). The runtime rebuilds it from the stored
    value inside the fixed-shape forward (``vitcg.runtime.providers.REBUILDS``), so one spec serves both
    releases."""

    since: str
    """The first transformers release whose model code takes this form."""
    doc: str
    """What the argument is in this form."""


CAPACITY_NAMES = ("max_items", "max_segments", "grid_rows")
"""What a :class:`Capacity` formula reads: the buffer names of a capture, and ``grid_rows`` (see
:func:`capacity_names`)."""


def capacity_names(budget: int, max_items: int, max_frames: int, split: bool) -> dict[str, int]:
    """:func:`buffer_names` of one capture plus ``grid_rows``, the grid rows the encoder can see: one per segment
    where a modality splits its items by frames (``split``), else one per item."""
    names = buffer_names(budget, max_items, max_frames)
    return {**names, "grid_rows": names["max_segments"] if split else max_items}


@dataclass(frozen=True)
class Capacity:
    """The leading rows a provider's buffer needs to hold any pack a capture serves. A spec writes the buffer's
    first dimension; ``vitcg validate`` checks it against this need at the spec's budgets and item counts, and a
    capture allocates what the spec wrote, never more (a smaller buffer is an error naming both)."""

    rows: Mapping[str, str]
    """Padding rule -> the need, a formula over :data:`CAPACITY_NAMES`; a padding rule not here needs nothing
    beyond the spec's shape."""
    doc: str
    """What the rows are, in words (diagnostics and ``registry/VOCABULARY.md``)."""
    item_roles_only: bool = False
    """The need holds only for a buffer whose ``params.role`` is aligned with the items (``per_item``); one
    aligned with the pixels follows the spec's shape."""

    def formula(self, padding: str, role: str | None, item_roles: frozenset[str]) -> Formula | None:
        """The need of a buffer padded by ``padding`` carrying ``role``, or None where it has none."""
        if self.item_roles_only and role not in item_roles:
            return None
        source = self.rows.get(padding)
        return parse(source, CAPACITY_NAMES) if source is not None else None


@dataclass(frozen=True)
class Provider:
    """A metadata provider: fills one buffer of the graph from the items of a pack."""

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
    doc: str
    geometry: tuple[str, ...] = ()
    """Geometry names the provider reads; the spec must define them."""
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Allowed keys of the buffer's ``params``, each with its JSON Schema."""
    scoped: bool = False
    """Fills the arguments of a graph-scoped submodule call (``graph_scope``) and nothing else."""
    forms: tuple[ArgumentForm, ...] = ()
    """Later forms of the argument, oldest first; before the first's release the stored value is the argument."""
    capacity: Capacity | None = None
    """The leading rows its buffer needs for any pack of a capture; None: the spec's shape alone says."""

    def needs(self, padding: str, role: str | None, item_roles: frozenset[str]) -> Formula | None:
        """The leading rows (a formula over :data:`CAPACITY_NAMES`) that its buffer padded by ``padding`` and
        carrying ``role`` (``params.role``) needs, where ``item_roles`` are aligned with the items; None: none."""
        return self.capacity.formula(padding, role, item_roles) if self.capacity is not None else None


ALL = frozenset(STYLES)
SEGMENTED = frozenset(s.name for s in STYLES.values() if s.segmented)
_MERGE = {"type": "integer", "minimum": 1, "maximum": 16,
          "description": "the merge block size this provider orders rows by, where the encoder's helpers use "
                         "another than geometry spatial_merge_size (default: that geometry)"}
INTERP_AXES = {"thw": (0, 1, 2), "twh": (0, 2, 1)}
"""``params.axes`` of the interpolation providers -> the grid columns, in order, the helper is called with: ``twh``
swaps h and w (a tower whose patch (h, w) reads its position table at (w, h), as MuseGlimmer's does)."""
_INTERP = {"mode": {"enum": ["bilinear", "bicubic"]}, "align_corners": {"type": "boolean"},
           "padding": {"enum": ["border", "zeros"]}, "spatial_merge_size": _MERGE,
           "axes": {"enum": list(INTERP_AXES),
                    "description": "the grid's axis order the encoder passes its helper (default thw; twh: h and w "
                                   "swapped, `grid_thw[:, [0, 2, 1]]`)"}}
_DTYPE = {"enum": list(DTYPES), "description": "the buffer's dtype (default model)"}
_ROWS_DIM = {"type": "integer", "minimum": 0, "maximum": 3,
             "description": "the dimension of the call's argument holding the rows (default 0); the buffer is "
                            "stored rows-first"}
_BELOW = {"type": ["integer", "string"],
          "description": "a formula over geometry: the values of an integer role (dtype int64 or int32) index a table "
                         "of this many rows (a vocabulary, the aspect-ratio embedding), so each must lie in "
                         "[0, below); the input check refuses others by name before any tensor work"}
_ROW_WIDTH = {"type": ["integer", "string"],
              "description": "a formula over geometry: how many entries of the rows dimension (rows_dim) one row "
                             "spans, its patches laid side by side (default 1)"}
_ON_HOST = {"type": "boolean",
            "description": "keep the buffer on the host, filled once at capture and never refilled: for an encoder "
                           "whose forward reads its grid only where the graph keeps no value of it (a `.tolist()` "
                           "feeding a loop a `replace` took over, a column swap whose result a precomputed buffer "
                           "makes unused); what the capture read is what every replay computes with, and `vitcg "
                           "check`'s items (grids other than the capture's) prove the graph reads nothing of it"}
_SEGMENT_SLOTS = Capacity(rows={"trailing_segment": "max_segments + 2"},
                          doc="a slot for the leading zero, one per segment and one for the padding segment")

PROVIDERS: Mapping[str, Provider] = MappingProxyType({p.name: p for p in (
    Provider("pixels", "tensor", ALL, ("zeros",), "model",
             "pixel rows (packed) or tiles (dim 0) of the pack, zero rows after them; `rows_dim: k` passes them "
             "to the encoder on its dimension k, `row_width` entries each (default 1)", (),
             {"rows_dim": _ROWS_DIM, "row_width": _ROW_WIDTH}),
    Provider("grid", "tensor", SEGMENTED, ("zeros", "ones", "trailing_item"), "int64",
             "the items' t/h/w rows (`ones` padding when the encoder divides by them, `trailing_item` when it "
             "derives its attention segments from them); `on_host: true` keeps the buffer on the host",
             params={"on_host": _ON_HOST},
             capacity=Capacity(rows={"zeros": "grid_rows", "ones": "grid_rows", "trailing_item": "grid_rows + 1"},
                               doc="a row per grid row the encoder sees (per item, or per frame of a modality "
                                   "with `split: frames`), and the padding item's row with `trailing_item`")),
    Provider("cu_seqlens", "tensor", SEGMENTED, ("trailing_segment",), "int32",
             "segment boundaries per frame or per clip (`get_vision_cu_seqlens`)", capacity=_SEGMENT_SLOTS),
    Provider("max_seqlen", "host", SEGMENTED, ("fixed",), "int64",
             "worst-case segment length for the budget, fixed at capture"),
    Provider("position_ids", "tensor", SEGMENTED, ("zeros",), "int64",
             "rotary (h, w) or (t, h, w) position ids in merge-block order (`get_vision_position_ids`; "
             "`spatial_merge_size: 1` gives raster order)",
             ("spatial_merge_size",), {"include_temporal": {"type": "boolean"}, "spatial_merge_size": _MERGE}),
    Provider("nearest_position_ids", "tensor", SEGMENTED, ("zeros",), "int64",
             "flat indices into a learned `num_grid_per_side ** 2` position table, each (h, w) grid mapped to its "
             "nearest buckets in raster order (`get_vision_nearest_position_ids`, MiniCPM-V)", ("num_grid_per_side",)),
    Provider("window_index", "tensor", SEGMENTED, ("identity",), "int64",
             "window order of merged units (`get_vision_window_index`); padding units map to themselves",
             ("spatial_merge_size", "window_size", "patch_size"), {"spatial_merge_size": _MERGE}),
    Provider("cu_window_seqlens", "tensor", SEGMENTED, ("trailing_segment",), "int32",
             "window boundaries (`get_vision_window_index`); padding forms trailing windows",
             ("spatial_merge_size", "window_size", "patch_size"), {"spatial_merge_size": _MERGE}),
    Provider("max_window_seqlen", "host", frozenset({"windowed"}), ("fixed",), "int64",
             "worst-case window length for the budget, fixed at capture"),
    Provider("interp_indices", "tensor", SEGMENTED, ("zeros",), "int64",
             "gather indices resampling a learned position table to each grid "
             "(`get_vision_interpolation_indices_and_weights`)",
             ("num_grid_per_side", "spatial_merge_size"), _INTERP),
    Provider("interp_weights", "tensor", SEGMENTED, ("zeros",), "float32",
             "weights of those taps; zero for padding rows", ("num_grid_per_side", "spatial_merge_size"), _INTERP),
    Provider("pixel_shuffle_index", "tensor", SEGMENTED, ("identity",), "int64",
             "gather index taking each frame's rows from raster to merge-block order, each `merge x merge` block "
             "as `merge**2` consecutive rows (MuseGlimmer's `get_vision_pixel_shuffle_index`); padding rows map "
             "to themselves", ("spatial_merge_size",)),
    Provider("frame_index", "tensor", SEGMENTED, ("zeros",), "int64",
             "each row's frame in its item, counted from 1, into a temporal table whose row 0 adds nothing: 0 "
             "for every row of a one-frame item (an image), f + 1 for frame f of a longer one"),
    Provider("temporal_merge_index", "tensor", SEGMENTED, ("repeat",), "int64",
             "(merged tokens, frame slots, merge**2) gather index: per merged token, the rows of its merge block "
             "in every frame of its item, each frame in the same number of slots, so that a mean over dim 1 "
             "pools the item's frames (slots: a multiple of every frame count, e.g. 12 for 1 to 4 frames)",
             ("spatial_merge_size",),
             forms=(ArgumentForm("5.24", "`(destination, weight, tokens)` for an `index_add_` into `tokens * merge**2` "
                                         "slots: per row, its slot and 1 / its item's frames (zero for padding "
                                         "rows); `tokens` is dim 0, fixed at capture"),)),
    Provider("grid_neighbours", "tensor", SEGMENTED, ("zeros",), "int64",
             "per row, the packed rows of the k x k cells around it in its own frame (k: geometry "
             "conv_kernel_size), in the kernel's row-major order, -1 outside the frame: a 'same' convolution over "
             "each item's grid as a gather, read by a `replace` (rows in merge-block order; `spatial_merge_size: 1` "
             "gives raster order); padding rows read row 0, and no real row reads them",
             ("spatial_merge_size", "conv_kernel_size"), {"spatial_merge_size": _MERGE}),
    Provider("aligned", "tensor", ALL, ("zeros", "ones"), "param",
             "an extra input aligned with the pixels on dim 0 (a per-tile mask, per-image shapes), sliced and "
             "padded like them", (),
             {"role": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                       "description": "the extra input role it carries"}, "dtype": _DTYPE, "below": _BELOW},
             capacity=Capacity(rows={"zeros": "max_items", "ones": "max_items"}, item_roles_only=True,
                               doc="a row per item, for a role aligned with the items (`per_item`)")),
    Provider("scope_arg", "either", ALL, tuple(PADDINGS), "param",
             "an argument of the graph-scoped submodule call, taken from the model's own eager prologue at "
             "replay; host integers (`value`) are fixed at capture", (),
             {"dtype": _DTYPE, "rows_dim": _ROWS_DIM},
             scoped=True, capacity=_SEGMENT_SLOTS),
)})

@dataclass(frozen=True)
class Replacement:
    """A graph-safe form of a module whose own forward builds per-item structure on the host (a Python loop over
    ``grid_thw.tolist()``, which a graph would bake in). A spec's ``replace`` puts it in place of every module of
    a class inside the encoder (``vitcg.runtime.replacements``). It reads that structure from the one buffer of
    :attr:`provider`, which the providers fill on the host at every replay and the encoder call passes as a
    keyword argument that the model hands down to the module; where that argument is absent (the model's own
    eager calls) the module's own forward runs, unchanged."""

    name: str
    doc: str
    provider: str
    """The provider of the buffer it reads: the spec must have one buffer of it."""
    attributes: tuple[str, ...]
    """The submodules the replaced module must hold (checked when the adapter is built)."""


REPLACEMENTS: Mapping[str, Replacement] = MappingProxyType({r.name: r for r in (
    Replacement("gated_grid_conv",
                "LFM-VL's gated short convolution: `in_proj` to three chunks (input gate, output gate, values), a "
                "depthwise `spatial_conv` (an nn.Conv2d, one group per channel, 'same' padding) over each frame's "
                "grid of the gated values, the output gate, `out_proj`; the convolution runs as a gather over "
                "`grid_neighbours`", "grid_neighbours", ("in_proj", "spatial_conv", "out_proj")),
)})
READ_BY_REPLACEMENTS = frozenset(r.provider for r in REPLACEMENTS.values())
"""Providers whose buffers only a replacement reads: a spec with such a buffer needs a ``replace`` that reads it."""

STANDARD_ROLES = ("pixels", *dict.fromkeys(s.count_role for s in STYLES.values()))
"""Input roles with a fixed meaning; any other role is an extra input aligned with the pixels on dim 0."""


def _union_params() -> dict[str, Any]:
    """Every provider param's schema, its description prefixed with the providers that take it."""
    merged: dict[str, Any] = {}
    takers: dict[str, list[str]] = {}
    for provider in PROVIDERS.values():
        for key, node in provider.params.items():
            if key in merged and merged[key] != node:
                raise ValueError(f"param {key!r} has two schemas ({merged[key]} vs {node})")
            merged[key] = node
            takers.setdefault(key, []).append(provider.name)
    out = {}
    for key, node in merged.items():
        out[key] = dict(node)
        if "description" in node:
            out[key]["description"] = f"{', '.join(takers[key])}: {node['description']}"
    return out


def vocabulary_schema(base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (the structural schema) with every vocabulary enum and the provider params filled in from
    the records above."""
    out = copy.deepcopy(dict(base))
    props = out["properties"]
    attention = props["attention"]["properties"]
    attention["style"]["enum"] = list(STYLES)
    attention["segments"]["enum"] = [s for s in dict.fromkeys(x for st in STYLES.values() for x in st.segments)
                                     if s != "tile"]
    buffer = props["buffers"]["items"]["properties"]
    buffer["provider"]["enum"] = list(PROVIDERS)
    buffer["padding"]["enum"] = list(PADDINGS)
    buffer["absent"]["enum"] = list(ABSENCES)
    buffer["params"]["properties"] = _union_params()
    props["replace"]["items"]["properties"]["with"]["enum"] = list(REPLACEMENTS)
    props["tests"]["properties"]["inputs"]["additionalProperties"]["properties"]["dtype"]["enum"] = list(DTYPES)
    return out


def vocabulary() -> dict[str, Any]:
    """The vocabulary as plain data for templates (``registry/VOCABULARY.md``, style labels): styles,
    providers and padding rules by name, in declaration order."""
    return {
        "styles": {s.name: {"name": s.name, "label": s.label, "doc": s.doc, "items": list(s.item_names),
                    "count_role": s.count_role, "count_required": s.count_required,
                    "segments": [{"name": x, "doc": SEGMENT_DOCS[x]} for x in s.segments],
                    "required_providers": list(s.required_providers), "geometry": list(s.geometry),
                    "shaping": {m: dict(f) for m, f in s.shaping.items()},
                    "defaults": copy.deepcopy(dict(s.defaults))} for s in STYLES.values()},
        "tests_defaults": copy.deepcopy(dict(TESTS_DEFAULTS)),
        "providers": {p.name: {"name": p.name, "kind": p.kind, "doc": p.doc, "paddings": list(p.paddings),
                       "styles": [s for s in STYLES if s in p.styles], "dtype": p.dtype,
                       "geometry": list(p.geometry), "params": sorted(p.params), "scoped": p.scoped,
                       "forms": [{"since": f.since, "doc": f.doc} for f in p.forms],
                       "capacity": {"rows": dict(p.capacity.rows), "doc": p.capacity.doc} if p.capacity else None}
                      for p in PROVIDERS.values()},
        "paddings": {r.name: {"name": r.name, "doc": r.doc, "row_wise": r.row_wise} for r in PADDINGS.values()},
        "absences": {a.name: {"name": a.name, "doc": a.doc, "paddings": list(a.paddings)} for a in ABSENCES.values()},
        "replacements": {r.name: {"name": r.name, "doc": r.doc, "provider": r.provider,
                                  "attributes": list(r.attributes)} for r in REPLACEMENTS.values()},
        "dtypes": list(DTYPES),
    }
