"""The glue between a spec and a Hugging Face model: the tower inside a VLM, a call of it read as the spec's inputs,
and the call's output read as rows and rebuilt from rows.

Three callers stand on it: :func:`vitcg.accelerate` (its router answers the tower's call from the manager's rows),
the vLLM plugin (:mod:`vitcg.vllm_plugin.bridge` answers the tower's call inside the backend's feature call from a
pack's rows) and the tools (``vitcg check``'s end-to-end stage compares the two). The adapter reads outputs and
pixels through it too, so a call's output and its pixel argument are read one way everywhere.

- Finding the tower: :func:`encoder_of` follows the spec's ``encoder.vlm_attribute``.
- Call inputs: :func:`call_inputs` binds one call of the tower to the spec's inputs (rows-first pixels, the tile
  count a style may leave out), or says why the graphs cannot serve it.
- Pixels: :func:`pixels_to_call` and :func:`pixels_to_rows` convert between the graphs' rows-first pixels and the
  call's own layout (``pixels_rows_dim``).
- Outputs, rows out: :func:`combine_output` reads the spec's ``encoder.outputs`` fields of one call as one tensor
  of rows (a ``field[*]`` field, one tensor per item, joined in item order).
- Outputs, rows in: :class:`Layout`, learned from one output of the original call, rebuilds an output of the same
  type and shapes from rows (a ``field[*]`` field split back into one tensor per item); one
  :class:`LayoutEntry` per ``encoder.outputs`` entry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import InputError, SpecRuntimeError, UsageError
from ..lang.bindings import import_object
from ..lang.model import Modality, PixelLayout, Spec

IGNORED_ARGS = frozenset({"return_dict", "use_cache"})
"""Arguments of the captured call that change nothing a graph computes (a structured output is returned; a
vision encoder keeps no cache, though older transformers pass ``generate``'s ``use_cache`` down to it)."""

PER_ITEM = "[*]"
"""The suffix of an ``encoder.outputs`` entry whose field is a tuple of per-item tensors (``pooler_output[*]``,
as ``get_image_features`` splits its rows per image): joined on the rows, in item order."""


def resolve(root: nn.Module, path: str) -> tuple[list[Any], Any]:
    """The objects along ``path`` from ``root`` (root first) and the object at its end; a leading part the
    root does not have is dropped, so the inner model of a VLM works as well as the VLM. Raises UsageError when
    no suffix of ``path`` leads anywhere."""
    parts = path.split(".")
    for start in range(len(parts)):
        chain, node = [root], root
        for part in parts[start:]:
            node = getattr(node, part, None)
            if node is None:
                break
            chain.append(node)
        else:
            return chain[:-1], node
    raise UsageError(f"{type(root).__name__} has no {path!r} (the spec's encoder.vlm_attribute)")


def encoder_of(model: nn.Module, spec: Spec) -> tuple[list[Any], nn.Module]:
    """The modules on the path to ``spec``'s encoder in ``model`` and the encoder itself. Raises UsageError when
    the path is missing or leads to another class."""
    expected = import_object(spec.encoder.class_path)
    # a spec may capture a method of the VLM itself (its get_image_features): then the model is the encoder
    owners, encoder = ([], model) if isinstance(model, expected) else resolve(model, spec.encoder.vlm_attribute)
    if not isinstance(encoder, expected):
        raise UsageError(f"{spec.name}: {spec.encoder.vlm_attribute} of {type(model).__name__} is a "
                         f"{type(encoder).__name__}, not the spec's {expected.__name__}")
    return owners, encoder


def pixels_to_call(layout: PixelLayout | None, rows: torch.Tensor) -> torch.Tensor:
    """Rows-first pixels ``(rows, *row)`` (as the graphs and the inputs hold them) in the call's layout
    (:class:`~vitcg.lang.model.PixelLayout`): behind leading dimensions of 1, or laid side by side on the rows
    dimension (a copy)."""
    if layout is None or not layout.ones and layout.plain:
        return rows
    count = rows.shape[0]
    if not layout.plain:
        rows = rows.reshape(count, *layout.lead, layout.width, *layout.trail).movedim(0, len(layout.lead))
    return rows.reshape(layout.call_shape(count))


def pixels_to_rows(layout: PixelLayout | None, given: torch.Tensor) -> torch.Tensor | None:
    """The inverse of :func:`pixels_to_call`: a call's pixel argument as rows-first pixels, or None when its shape
    does not fit ``layout``."""
    if layout is None or not layout.ones and layout.plain:
        return given
    k = layout.ones + len(layout.lead)
    shape = tuple(given.shape)
    if (len(shape) != k + 1 + len(layout.trail) or any(d != 1 for d in shape[:layout.ones])
            or shape[layout.ones:k] != layout.lead or shape[k + 1:] != layout.trail or shape[k] % layout.width):
        return None
    count = shape[k] // layout.width
    if layout.plain:
        return given.reshape(count, *layout.row)
    return given.reshape(*layout.lead, count, layout.width, *layout.trail).movedim(len(layout.lead), 0).reshape(
        count, *layout.row)


def bound_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any] | str:
    """The call's arguments by name (``**kwargs`` spread out), or why they do not bind to ``signature``."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"arguments do not bind: {exc}"
    given = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            given.update(given.pop(name, {}))
    return given


def call_inputs(spec: Spec, adapter: Any, signature: inspect.Signature, modality_name: str, args: tuple,
                kwargs: dict) -> tuple[dict[str, Any] | None, str | None]:
    """The adapter's multimodal kwargs for one call of the spec's encoder call (``args`` and ``kwargs`` bound to
    ``signature``), for the modality ``modality_name``; or None and why the graphs cannot serve that call (an
    argument the spec does not capture, a ``call_kwargs`` value it differs from, a pixel layout it does not
    describe, an empty batch, a missing input). ``adapter``: the spec's adapter on the tower (its ``module`` and
    ``pixel_layout`` are read)."""
    given = bound_arguments(signature, args, kwargs)
    if isinstance(given, str):
        return None, given
    modality = spec.modality(modality_name)
    if modality is None:
        return None, f"the spec has no {modality_name} modality"
    mm = {modality.inputs[role]: given[arg] for arg, role in spec.encoder.args.items() if given.get(arg) is not None}
    why = _uncaptured_argument(spec, adapter.module, given) or _rows_first(spec, adapter.pixel_layout, mm,
                                                                           modality.pixels_key)
    return (None, why) if why else _missing_inputs(spec, mm, modality)


def _uncaptured_argument(spec: Spec, module: nn.Module, given: Mapping[str, Any]) -> str | None:
    """Why an argument of the call keeps it from the graphs (one the spec does not capture, or a ``call_kwargs``
    value the spec differs from), or None."""
    roles, call_kwargs = spec.encoder.args, spec.encoder.call_kwargs
    for arg, value in given.items():
        if arg in roles or arg in IGNORED_ARGS and value is not False:
            continue
        if arg in call_kwargs:
            # None asks the model for its config's value (older transformers pass their defaults as None)
            default = getattr(getattr(module, "config", None), arg, None) if value is None else value
            if default != call_kwargs[arg]:
                return f"{arg}={value!r} differs from the spec's call_kwargs ({call_kwargs[arg]!r})"
        elif value is not None and value is not False:
            return f"argument {arg}={_short(value)} is not captured by the spec"
    return None


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rows_first(spec: Spec, layout: PixelLayout | None, mm: dict[str, Any], pixels_key: str) -> str | None:
    """Puts the call's pixels in ``mm`` rows first (the graphs' layout), or says why they cannot be served: no pixel
    tensor, a layout the spec does not describe, an empty batch."""
    pixels = mm.get(pixels_key)
    if not isinstance(pixels, torch.Tensor):
        return "no pixel tensor"
    if spec.pixels_rows_dim:  # the call's own pixel layout: the graphs take rows first
        rows = pixels_to_rows(layout, pixels)
        if rows is None:
            return (f"pixels of shape {tuple(pixels.shape)}: the spec's pixel buffer expects rows on dim "
                    f"{spec.pixels_rows_dim} (rows_dim), {layout.width} entries each, after "
                    f"{layout.ones} dimensions of size 1 and {tuple(layout.lead) or 'none'} before them")
        pixels = mm[pixels_key] = rows
    return "empty batch" if pixels.shape[0] == 0 else None


def _missing_inputs(spec: Spec, mm: dict[str, Any], modality: Modality) -> tuple[dict[str, Any] | None, str | None]:
    """``mm`` with the inputs the call may leave out filled in (a tile count of one per tile, where the style
    allows it), or None and the first input the call does not pass."""
    style = spec.attention_style
    for role, key in modality.inputs.items():
        if key in mm:
            continue
        if role == style.count_role and not style.count_required:
            mm[key] = torch.ones(mm[modality.pixels_key].shape[0], dtype=torch.int64)  # the call batches tiles
        else:
            return None, f"the call does not pass the {role} input"
    return mm, None


def per_item(entry: str) -> bool:
    """Whether the ``encoder.outputs`` entry holds one tensor per item (``field[*]``)."""
    return entry.endswith(PER_ITEM)


def output_entry(output: Any, entry: str) -> tuple[str, int | None, Any, int]:
    """One ``encoder.outputs`` entry (``field``, ``field[i]`` or ``field[*]``) read from an encoder call's output:
    ``(field, index or None, value or None when absent, length of the indexed field or 0)``; ``field[*]`` reads
    the whole field."""
    name, _, index_text = entry.partition("[")
    # ModelOutput is a Mapping whose [] raises KeyError for a field left None: .get covers both
    value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
    if not index_text or per_item(entry):
        return name, None, value, 0
    index = int(index_text.rstrip("]"))
    if isinstance(value, (list, tuple)) and -len(value) <= index < len(value):
        return name, index, value[index], len(value)
    return name, index, None, 0


def combine_output(spec: Spec, output: Any, empty_rows: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The spec's ``encoder.outputs`` fields of one call's ``output`` as one tensor of rows: each field's tensors
    flattened to rows, the fields side by side on the last dimension; a ``field[*]`` field's per-item tensors
    joined in item order (``empty_rows()`` when it holds none). Raises SpecRuntimeError when a field is missing,
    holds something else than tensors, or the fields' row counts differ."""
    parts = []
    for entry in spec.encoder.outputs:
        value = output_entry(output, entry)[2]
        if value is None:
            fields = [k for k, v in output.items() if v is not None] if isinstance(output, Mapping) else []
            raise SpecRuntimeError(f"{spec.name}: the encoder output has no {entry!r} (encoder.outputs); "
                                   f"it returned {type(output).__name__}"
                                   + (f" with {', '.join(fields)}" if fields else ""))
        if per_item(entry):
            parts.append(join_items(spec, entry, value, empty_rows))
        else:
            parts.extend(_field_rows(spec, entry, value))
    rows = {p.shape[0] for p in parts}
    if len(rows) != 1:
        raise SpecRuntimeError(f"{spec.name}: output fields {list(spec.encoder.outputs)} have "
                               f"different row counts {sorted(rows)}; they cannot be concatenated")
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _field_rows(spec: Spec, entry: str, value: Any) -> list[torch.Tensor]:
    """The tensors of one output field (a tensor, or a tuple or list of them) as matrices of rows."""
    tensors = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise SpecRuntimeError(f"{spec.name}: output {entry!r} holds {[type(t).__name__ for t in tensors]}, not "
                               "tensors; pick one element with field[i]")
    return [t.reshape(-1, t.shape[-1]) for t in tensors]


def join_items(spec: Spec, entry: str, value: Any, empty_rows: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A ``field[*]`` output (one tensor per item) as one tensor of rows, in item order; ``empty_rows()`` for no
    items. Raises SpecRuntimeError when ``value`` is no tuple or list of tensors sharing a last dimension."""
    if not _all_tensors(value):
        held = type(value).__name__ if not isinstance(value, (list, tuple)) else \
            f"{type(value).__name__} of {sorted({type(t).__name__ for t in value})}"
        raise SpecRuntimeError(f"{spec.name}: output {entry!r}: expected a tuple or list of per-item "
                               f"tensors, got {held}; name the field without [*]")
    if not value:
        return empty_rows()
    widths = {t.shape[-1] if t.dim() else None for t in value}
    if len(widths) != 1 or None in widths:
        raise SpecRuntimeError(f"{spec.name}: output {entry!r}: per-item tensors of shapes "
                               f"{[tuple(t.shape) for t in value]} do not share a last dimension")
    return torch.cat([t.reshape(-1, t.shape[-1]) for t in value])


def _all_tensors(value: Any, min_dim: int = 0) -> bool:
    """Whether ``value`` is a tuple or list of tensors of at least ``min_dim`` dimensions (an empty one is)."""
    return isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) and t.dim() >= min_dim for t in value)


@dataclass(frozen=True)
class LayoutEntry:
    """How one ``encoder.outputs`` entry sits in a call's output, learned from one output of the original call."""

    field: str
    """The output field (``pooler_output`` of ``pooler_output[*]``, ``hidden_states`` of ``hidden_states[-2]``)."""
    shapes: tuple[tuple[int, ...], ...]
    """The learned shape of each tensor the entry holds (one for a tensor field, one per element for a tuple or list
    field; for a ``field[*]`` entry, its first item's, whose last two dimensions are its rows and width)."""
    rows_dims: tuple[int, ...] = ()
    """Per tensor, the dimension that scales with the call's rows; the others keep their learned sizes. Empty for a
    ``field[*]`` entry (each item's rows lie on its second-to-last dimension)."""
    index: int | None = None
    """The position inside the field (``hidden_states[-2]``: -2), or None for the whole field."""
    length: int = 0
    """The field's length when ``index`` is set: the tuple rebuilt holds the graph's rows at ``index`` and None
    elsewhere (the graphs compute nothing else)."""
    is_list: bool = False
    """Whether the whole field is a tuple or list of tensors (rebuilt as a list, one tensor per element)."""
    items: type | None = None
    """For a ``field[*]`` entry, the container of its per-item tensors (tuple or list); None otherwise."""

    @property
    def width(self) -> int:
        """The entry's columns in the combined rows (:func:`combine_output`)."""
        return self.shapes[0][-1] if self.items is not None else sum(shape[-1] for shape in self.shapes)

    def split(self, parts: Sequence[torch.Tensor]) -> Any:
        """A ``field[*]`` value from ``parts``, each item's columns of this entry: one tensor per item, shaped as
        the learned one with the item's rows."""
        shape = self.shapes[0]
        return self.items(part.reshape(*shape[:-2], part.shape[0], shape[-1]) for part in parts)

    def rebuild(self, columns: torch.Tensor) -> Any:
        """The field's value (a tensor, or a list of tensors for ``is_list``) from ``columns``, this entry's columns
        of the combined rows. Raises InputError when the rows do not fit a learned shape."""
        rows, offset, tensors = columns.shape[0], 0, []
        for shape, dim in zip(self.shapes, self.rows_dims):
            flat = columns[:, offset:offset + shape[-1]]
            offset += shape[-1]
            others = 1
            for d, size in enumerate(shape[:-1]):
                others *= size if d != dim else 1
            if rows % others:
                raise InputError(f"{rows} rows do not fit an output of shape {shape}")
            new = list(shape)
            new[dim] = rows // others
            tensors.append(flat.reshape(new))
        return tensors if self.is_list else tensors[0]


@dataclass(frozen=True)
class Layout:
    """How one output of the captured call is rebuilt from the graphs' combined rows: the output type and one
    :class:`LayoutEntry` per ``encoder.outputs`` entry. Learned from one output of the original call
    (:meth:`learn`), then used for every call the graphs answer (:meth:`build`)."""

    kind: type
    """The output's type (a ModelOutput class, dict, ...), called with the rebuilt fields."""
    entries: tuple[LayoutEntry, ...]
    """One per ``encoder.outputs`` entry, in the spec's order (the order of the combined rows' columns)."""

    @classmethod
    def learn(cls, spec: Spec, output: Any, rows: int) -> Layout | None:
        """The layout of ``output`` (a call that produced ``rows`` rows); None while it is ambiguous (one row
        of a packed encoder could scale along any dimension of size 1). Raises SpecRuntimeError when the
        output lacks a field of the spec's ``encoder.outputs``, or a ``field[*]`` field holds no per-item
        tensors."""
        entries = []
        for text in spec.encoder.outputs:
            entry = _learn_entry(spec, output, text, rows)
            if entry is None:
                return None
            entries.append(entry)
        return cls(type(output), tuple(entries))

    def build(self, combined: torch.Tensor, parts: Sequence[torch.Tensor] | None = None) -> Any:
        """The output object for ``combined`` rows (the spec's output fields side by side on the last dim), whose
        item ``i`` owns ``parts[i]`` (needed for ``field[*]`` entries, one tensor per item; without ``parts`` the
        rows are one item). An indexed field (``hidden_states[-2]``) comes back as a tuple of its learned length
        holding the graph's rows at that index and None elsewhere. Raises InputError when the rows do not fit
        the learned shapes."""
        fields: dict[str, Any] = {}
        offset = 0
        for entry in self.entries:
            end = offset + entry.width
            if entry.items is not None:
                value = entry.split([part[:, offset:end] for part in (parts if parts is not None else [combined])])
            else:
                value = entry.rebuild(combined[:, offset:end])
            offset = end
            if entry.index is None:
                fields[entry.field] = value
            else:
                slots = list(fields.get(entry.field) or [None] * entry.length)
                slots[entry.index] = value
                fields[entry.field] = tuple(slots)
        if issubclass(self.kind, Mapping) and not hasattr(self.kind, "__dataclass_fields__"):
            return self.kind(fields)
        return self.kind(**fields)


def _learn_entry(spec: Spec, output: Any, text: str, rows: int) -> LayoutEntry | None:
    """The :class:`LayoutEntry` of the ``encoder.outputs`` entry ``text`` in ``output``, or None while ambiguous."""
    name, index, value, length = output_entry(output, text)
    if value is None:
        raise SpecRuntimeError(f"{spec.name}: the encoder call returned {type(output).__name__} without "
                               f"{text!r} (the spec's encoder.outputs)")
    if per_item(text):
        if not _all_tensors(value, min_dim=2) or not value:
            raise SpecRuntimeError(f"{spec.name}: {text!r} of the encoder call is not a tuple or list of "
                                   "per-item tensors of rows (the spec's encoder.outputs)")
        return LayoutEntry(field=name, shapes=(tuple(value[0].shape),), items=type(value))
    is_list = isinstance(value, (list, tuple))
    tensors = list(value) if is_list else [value]
    if not tensors or not _all_tensors(tensors, min_dim=2):
        return None
    dims = [_rows_dim(spec, tuple(t.shape), rows) for t in tensors]
    if None in dims:
        return None
    return LayoutEntry(field=name, shapes=tuple(tuple(t.shape) for t in tensors), rows_dims=tuple(dims),
                       index=index, length=length, is_list=is_list)


def _rows_dim(spec: Spec, shape: tuple[int, ...], rows: int) -> int | None:
    """The dimension of a tensor of ``shape`` that scales with the call's ``rows``, or None while ambiguous."""
    if not spec.attention_style.segmented:
        return 0  # tiles: the tile batch is dim 0
    if torch.Size(shape).numel() // shape[-1] != rows:
        return None
    matching = [d for d in range(len(shape) - 1) if shape[d] == rows]
    if not matching and shape[0] > 1:
        # no dimension holds the rows: they come in blocks, one block per leading index
        # (Kimi-K2.5's pooler: (tokens, merge**2, hidden), a row per block element)
        matching = [0]
    return matching[0] if len(matching) == 1 else None
