"""The typed spec: frozen dataclasses built once, after validation; nothing downstream reads raw dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .catalogue import GRID_COLUMNS, PADDINGS, STANDARD_ROLES, STYLES, AttentionStyle, buffer_names
from .formulas import Formula, parse

if TYPE_CHECKING:  # the harness is the test rig: the runtime, which imports this module, never loads it
    from .harness import TestMeta


def freeze(value: Any) -> Any:
    """Deep-freeze plain YAML data: dicts become read-only mappings, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze`: fresh dicts and lists a caller may change."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Modality:
    name: str
    """``image`` or ``video``."""
    inputs: Mapping[str, str]
    """Input role (``pixels``, ``grid``, ``tiles``) -> key in the multimodal kwargs."""
    max_frames_per_video: int
    """Largest frame count of one item (1 for images)."""
    grid_columns: tuple[str, ...] = GRID_COLUMNS
    """The columns of the grid input and of the grid the encoder receives (``t, h, w``, or ``h, w``: t is 1)."""
    split: str | None = None
    """``frames``: the encoder receives one grid row ``(1, h, w)`` per frame of each item row; None: the item
    rows as given."""
    per_item: Mapping[str, Formula] = field(default_factory=lambda: MappingProxyType({}))
    """Item-aligned extra roles (``per_item``): role -> its value for an item where no input is at hand (a
    formula over geometry). Such an input holds one integer per item, not one row per pixel row; item formulas
    read it by the role's name."""
    separate: bool = False
    """Items of this modality never share an encoder call (a graph pack or an eager call) with another
    modality's items; the adapter then offers one capture axis over the modalities."""

    def item_row(self, given: Sequence[int]) -> list[int]:
        """One grid row as given (in :attr:`grid_columns`) as a full ``(t, h, w)`` row; a missing column is 1."""
        values = dict(zip(self.grid_columns, given, strict=True))
        return [values.get(name, 1) for name in GRID_COLUMNS]

    def encoder_rows(self, row: Sequence[int]) -> list[list[int]]:
        """The ``(t, h, w)`` rows the encoder sees for one item row: ``t`` rows ``(1, h, w)`` when the modality
        splits by frames, else the row itself."""
        if self.split == "frames":
            return [[1, *row[1:]] for _ in range(row[0])]
        return [list(row)]

    def encoder_grid(self, row: Sequence[int]) -> list[int]:
        """One ``(t, h, w)`` encoder row in the columns the encoder receives (:attr:`grid_columns`)."""
        return [row[GRID_COLUMNS.index(name)] for name in self.grid_columns]

    @property
    def reshapes_grid(self) -> bool:
        """Whether the encoder's grid differs from the grid as given (split rows or other columns)."""
        return self.split is not None or self.grid_columns != GRID_COLUMNS

    @property
    def pixels_key(self) -> str:
        return self.inputs["pixels"]

    @property
    def count_key(self) -> str | None:
        """The per-item metadata key: the grid (packed, windowed) or the tile counts (tiles); None when
        every tile is an item of its own."""
        return next((self.inputs[r] for r in STANDARD_ROLES[1:] if r in self.inputs), None)

    @property
    def extra_roles(self) -> tuple[str, ...]:
        """Roles of extra inputs aligned with the pixels on dim 0 (masks, per-image shapes)."""
        return tuple(r for r in self.inputs if r not in STANDARD_ROLES and r not in self.per_item)

    @property
    def item_roles(self) -> tuple[str, ...]:
        """Roles of extra inputs aligned with the items: one integer per item (``per_item``)."""
        return tuple(self.per_item)

    def item_defaults(self, geometry: Mapping[str, int]) -> dict[str, int]:
        """Each item role's value for an item where no input is at hand (``per_item``), at ``geometry``."""
        return {role: formula.evaluate(geometry) for role, formula in self.per_item.items()}


@dataclass(frozen=True)
class Encoder:
    class_path: str
    """Import path of the module that is built and called."""
    config_class: str
    """Import path of the config class it is built from."""
    vlm_attribute: str
    """Where the encoder sits inside the full VLM (``model.visual``)."""
    method: str
    """Method called on the built module."""
    args: Mapping[str, str]
    """Eager call: encoder argument -> input role."""
    call_kwargs: Mapping[str, Any]
    """Constant keyword arguments passed on both paths."""
    outputs: tuple[str, ...]
    """Output fields holding merged tokens, concatenated on the last dimension: ``field``, ``field[i]`` (element
    ``i`` of a tuple field) or ``field[*]`` (a tuple of per-item tensors, joined on the rows)."""


@dataclass(frozen=True)
class Buffer:
    name: str
    """Key of the buffer in the capture and replay values."""
    arg: str
    """Encoder keyword argument it is passed as."""
    provider: str
    """Name of the metadata provider that fills it (``vitcg.lang.catalogue.PROVIDERS``)."""
    shape: tuple[Formula, ...] | None
    """Shape formulas of a tensor buffer, over budget, max_items, max_frames and geometry."""
    value: Formula | None
    """Value formula of a host-integer buffer, fixed at capture."""
    padding: str
    """Padding rule: zeros, trailing_segment, identity or fixed."""
    params: Mapping[str, Any]
    """Provider parameters."""
    absent: str | None = None
    """``scope_arg``: what the buffer holds when the scoped call passes None for it
    (:data:`vitcg.lang.catalogue.ABSENCES`); None: only a mask (``padding: ones``) may be absent."""

    @property
    def is_host(self) -> bool:
        return self.value is not None

    @property
    def rows_dim(self) -> int:
        """The dimension of the call's argument that holds the rows (``params.rows_dim``, default 0); the
        buffer itself is stored rows-first."""
        return int(self.params.get("rows_dim", 0))

    def index_bound(self, geometry: Mapping[str, int]) -> int | None:
        """The rows of the table this buffer's index role indexes (``params.below``, a formula over geometry):
        its values must lie in ``[0, bound)``; None when the spec sets no bound. Raises FormulaError."""
        source = self.params.get("below")
        return None if source is None else parse(source, geometry).evaluate(geometry)

    def pixel_layout(self, names: Mapping[str, int]) -> PixelLayout:
        """Where the rows of this (pixels) buffer lie in the call's argument, for geometry and buffer ``names``:
        see :class:`PixelLayout`. Raises FormulaError for a shape formula that does not evaluate."""
        k = self.rows_dim
        ones = 0
        while ones < k and self.shape[ones].source.strip() == "1":
            ones += 1
        width = parse(self.params.get("row_width", 1), names).evaluate(names)
        return PixelLayout(ones, tuple(f.evaluate(names) for f in self.shape[ones:k]), width,
                           tuple(f.evaluate(names) for f in self.shape[k + 1:]))


@dataclass(frozen=True)
class PixelLayout:
    """How the call's pixel argument holds its rows, and the shape of one row as the graphs and the inputs hold
    it (rows first). The argument's shape is ``(1,) * ones + lead + (rows * width,) + trail``: after ``ones``
    leading dimensions of size 1 (a batch of one), each row owns ``lead`` and ``trail`` and ``width`` entries of
    the rows dimension (``params.row_width``, default 1). PaddleOCR-VL's tower takes ``(1, rows, C, p, p)``
    (ones 1, width 1); MiniCPM-V's takes the patches side by side, ``(1, C, p, rows * p)`` (ones 1, lead
    ``(C, p)``, width p). Without ``rows_dim`` the rows are dim 0."""

    ones: int
    lead: tuple[int, ...]
    width: int
    trail: tuple[int, ...]

    @property
    def row(self) -> tuple[int, ...]:
        """One row, rows-first: ``lead``, then ``width`` (only where a row spans several entries), then
        ``trail``."""
        return (*self.lead, *((self.width,) if self.width != 1 else ()), *self.trail)

    @property
    def plain(self) -> bool:
        """Whether the call's argument is the rows-first tensor behind leading dimensions of 1 (a view)."""
        return not self.lead and self.width == 1

    def call_shape(self, rows: int) -> tuple[int, ...]:
        return (*(1,) * self.ones, *self.lead, rows * self.width, *self.trail)


@dataclass(frozen=True)
class ValidRows:
    """``items.valid``: how many rows of an item are not padding, read from an extra input role."""

    role: str
    """The extra input role that marks padding rows."""
    padding: int
    """Its value on a padding row: a patch whose values all equal it is padding."""
    full: Formula
    """``valid`` of an item without padding (item names and geometry): where no input is at hand."""


@dataclass(frozen=True)
class Replace:
    """One ``replace`` entry: every module of class :attr:`module` inside the encoder runs vitcg's graph-safe
    form :attr:`form` (:data:`vitcg.lang.catalogue.REPLACEMENTS`), reading the buffer :attr:`argument`."""

    module: str
    """Class name of the modules replaced."""
    form: str
    """The replacement's name (``with``)."""
    argument: str
    """The encoder keyword argument (a buffer's ``arg``) the replacement reads; absent, the module's own forward
    runs."""


@dataclass(frozen=True)
class LayerArgs:
    """``layer_args``: host integers a whole-encoder graph adds to the calls of a layer stack, per layer type."""

    module: str
    """Dotted path of the ``nn.ModuleList`` whose layers the encoder's forward loops over."""
    types: str
    """The encoder config's field listing one type per layer (``layer_types``)."""
    by_type: Mapping[str, Mapping[str, str]]
    """Layer type -> {argument of the layer's call: name of the host buffer whose value it gets}."""


@dataclass(frozen=True)
class Docs:
    notes: str
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class Spec:
    """One validated encoder spec."""

    file: str
    name: str
    display_name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    checkpoints: tuple[str, ...]
    encoder: Encoder
    geometry: tuple[tuple[str, Formula], ...]
    """Geometry formulas in file order; each may read config.* and the names above it."""
    style: str
    """Attention style: packed, windowed or tiles."""
    segments: str
    """``frame`` or ``clip`` for packed and windowed styles; ``tile`` for tiles."""
    modalities: tuple[Modality, ...]
    input_size: Formula
    output_tokens: Formula
    frames: Formula
    budget_min: Formula
    budget_max: Formula
    buffers: tuple[Buffer, ...]
    docs: Docs
    tests: TestMeta
    """The harness (``tests``, or ``NAME.tests.yaml``): how ``vitcg check`` builds and feeds the model."""
    graph_scope: str | None = None
    """Dotted path of the submodule whose call is captured; None: the whole encoder call is captured."""
    transformers: str | None = None
    """The oldest transformers release with the classes this spec names (``transformers``), or None."""
    unavailable: str | None = None
    """Why the installed transformers cannot run this spec (older than :attr:`transformers`), or None."""
    valid: ValidRows | None = None
    """``items.valid``: output_tokens may read the item's non-padding rows as ``valid``; None: it may not."""
    epilogue: str | None = None
    """``epilogue.select`` (``masked_rows``): what of the forward's data-dependent end runs after the graph."""
    replace: tuple[Replace, ...] = ()
    """``replace``: modules of the encoder that run a graph-safe form of vitcg's instead of their own forward."""
    layer_args: LayerArgs | None = None
    """Host integers passed to each layer of a stack, by layer type; None: the layers get what the forward passes."""

    @property
    def attention_style(self) -> AttentionStyle:
        """The record of :attr:`style`: what an item is, how counts are shaped, what check and bench feed."""
        return STYLES[self.style]

    def modality(self, name: str) -> Modality | None:
        return next((m for m in self.modalities if m.name == name), None)

    @property
    def modality_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modalities)

    @property
    def separate_modalities(self) -> bool:
        """Whether a modality says ``separate``: then no encoder call mixes modalities."""
        return any(m.separate for m in self.modalities)

    @property
    def grid_columns(self) -> tuple[str, ...]:
        """The columns of the grid the encoder receives (every modality with a grid agrees on them)."""
        return next((m.grid_columns for m in self.modalities if "grid" in m.inputs), GRID_COLUMNS)

    @property
    def rows_buffer(self) -> Buffer:
        """The buffer whose first dimension is the row (or tile) capacity, where padding segments end and
        outputs are cut: the first one padded row by row (the pixels, for a whole-encoder spec)."""
        return next(b for b in self.buffers if PADDINGS[b.padding].row_wise)

    def providers(self) -> dict[str, Buffer]:
        return {b.provider: b for b in self.buffers}

    @property
    def pixels_rows_dim(self) -> int:
        """The dimension of the encoder's pixel argument that holds the rows (the pixel buffer's ``rows_dim``; 0
        without one): PaddleOCR-VL's tower takes ``(1, rows, C, p, p)``."""
        buffer = self.providers().get("pixels")
        return buffer.rows_dim if buffer is not None else 0

    def pixel_layout(self, geometry: Mapping[str, int]) -> PixelLayout | None:
        """The pixel buffer's :class:`PixelLayout` under ``geometry``; None without a pixel buffer with a shape."""
        buffer = self.providers().get("pixels")
        if buffer is None or buffer.shape is None:
            return None
        return buffer.pixel_layout({**buffer_names(1, 1, 1), **geometry})

    def resolve_geometry(self, config: Mapping[str, Any]) -> dict[str, int]:
        """Evaluate every geometry formula against ``config`` (a ``to_dict()`` snapshot). Raises FormulaError."""
        values: dict[str, int] = {}
        for name, formula in self.geometry:
            values[name] = formula.evaluate(values, config)
        return values

    def shape_item(self, modality: str, entry: tuple[int, ...], geometry: Mapping[str, int]) -> int | list[int]:
        """The count row of one image ``(height, width)`` or video ``(frames, height, width)`` in pixels, as the
        model's processor would shape it: the spec's ``tests.shaping`` (or its attention style's default);
        1 for a modality without counts (one resized tile, or one whole clip, per item)."""
        m = self.modality(modality)
        if m is None or m.count_key is None:
            return 1
        sizes = dict(zip(("height", "width") if modality == "image" else ("frames", "height", "width"), entry))
        names = {**geometry, **sizes}
        row = [formula.evaluate(names) for formula in self.tests.shaping[modality].values()]
        return row if self.attention_style.segmented else row[0]

    def item_sizes(self, modality: str, row: Any, geometry: Mapping[str, int],
                   valid: int | None = None, values: Mapping[str, int] | None = None) -> tuple[int, int, int]:
        """``(input_size, output_tokens, frames)`` of one item from its count row (a grid row or a tile
        count): the ``items`` formulas at ``geometry``; frames are 0 for images. ``valid``: the item's
        non-padding rows (``items.valid``); None: those of an item without padding (``items.valid.full``).
        ``values``: the item's values of the modality's item roles (``per_item``); None: their defaults."""
        m = self.modality(modality)
        per_item = m.item_defaults(geometry) if m is not None else {}
        names = {**self.attention_style.names(row), **geometry, **per_item, **(values or {})}
        if self.valid is not None:
            names["valid"] = self.valid.full.evaluate(names) if valid is None else valid
        frames = self.frames.evaluate(names) if modality == "video" else 0
        return self.input_size.evaluate(names), self.output_tokens.evaluate(names), frames

    def to_json(self) -> dict[str, Any]:
        """Plain data for templates and ``registry/index.json``: formulas as their source text."""
        return {
            "name": self.name,
            "file": self.file,
            "display_name": self.display_name,
            "architectures": list(self.architectures),
            "model_types": list(self.model_types),
            "checkpoints": list(self.checkpoints),
            "encoder": _encoder_json(self.encoder),
            "geometry": {name: formula.source for name, formula in self.geometry},
            "attention": {"style": self.style, "segments": self.segments},
            "graph_scope": self.graph_scope,
            **({"epilogue": self.epilogue} if self.epilogue is not None else {}),
            **({"layer_args": {"module": self.layer_args.module, "types": self.layer_args.types,
                               "by_type": thaw(self.layer_args.by_type)}} if self.layer_args is not None else {}),
            "modalities": {m.name: _modality_json(m) for m in self.modalities},
            "items": self._items_json(),
            "budget": {"min": self.budget_min.source, "max": self.budget_max.source},
            "buffers": [_buffer_json(b) for b in self.buffers],
            "docs": {"notes": self.docs.notes, "shared_by": list(self.docs.shared_by)},
            "tests": _tests_json(self.tests),
        }

    def _items_json(self) -> dict[str, Any]:
        return {
            "input_size": self.input_size.source,
            "output_tokens": self.output_tokens.source,
            "frames": self.frames.source,
            **({"valid": {"role": self.valid.role, "padding": self.valid.padding,
                          "full": self.valid.full.source}} if self.valid is not None else {}),
        }


def _encoder_json(encoder: Encoder) -> dict[str, Any]:
    return {
        "class": encoder.class_path,
        "config_class": encoder.config_class,
        "vlm_attribute": encoder.vlm_attribute,
        "method": encoder.method,
        "args": dict(encoder.args),
        "call_kwargs": thaw(encoder.call_kwargs),
        "outputs": list(encoder.outputs),
    }


def _modality_json(m: Modality) -> dict[str, Any]:
    """A modality's inputs and frame cap, with the optional fields only where they are set."""
    return {"inputs": dict(m.inputs), "max_frames_per_video": m.max_frames_per_video,
            **({"grid_columns": list(m.grid_columns)} if m.grid_columns != GRID_COLUMNS else {}),
            **({"split": m.split} if m.split else {}),
            **({"per_item": {r: str(f) for r, f in m.per_item.items()}} if m.per_item else {}),
            **({"separate": True} if m.separate else {})}


def _buffer_json(b: Buffer) -> dict[str, Any]:
    return {
        "name": b.name,
        "arg": b.arg,
        "provider": b.provider,
        **({"value": b.value.source} if b.value is not None else {"shape": [f.source for f in b.shape]}),
        "padding": b.padding,
        "params": thaw(b.params),
    }


def _tests_json(tests: TestMeta) -> dict[str, Any]:
    return {
        "prompt_template": tests.prompt_template,
        "image_placeholder": tests.image_placeholder,
        "video_placeholder": tests.video_placeholder,
        "num_video_frames": tests.num_video_frames,
        "max_model_len": tests.max_model_len,
        "needs_video_metadata": tests.needs_video_metadata,
        "runner_kwargs": thaw(tests.runner_kwargs),
        "marks": list(tests.marks),
        "budgets": list(tests.budgets),
        "inputs": {role: {"shape": [f.source for f in e.shape],
                          "fill": e.fill if isinstance(e.fill, str) else [f.source for f in e.fill],
                          "dtype": e.dtype} for role, e in tests.inputs.items()},
    }
