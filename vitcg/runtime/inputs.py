"""Runtime input checks: the multimodal kwargs of one call read against what the spec declares, or InputError."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import FormulaError, InputError, SpecRuntimeError, suggest
from ..lang.catalogue import BUFFER_NAMES, GRID_COLUMNS, MERGE_NAME, buffer_names
from ..lang.model import Modality, Spec
from .protocol import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, EncoderItemSpec

BACKEND_ROW_KEYS = {"image": "num_image_patches", "video": "num_video_patches"}
"""By modality, the key under which vLLM's Transformers backend passes the rows of the modality's pixel input
that belong to each item (a CPU integer tensor, one entry per item; the backend splits the encoder's output by
it). The backend puts it in every multimodal call, the encoder graph manager's included. It is bookkeeping,
never an encoder input: the reader accepts it, checks it against the items, and keeps it out of encoder calls."""

INDEX_DTYPES = (torch.int64, torch.int32)
"""The integer dtypes of counts, item values and index inputs: int64 (what processors return) and int32, the two that
torch's indexing, ``embedding`` and ``repeat_interleave`` take. int8, uint8 and int16 grids passed a plain "is it an
integer" check and failed inside transformers on 7 specs."""

ItemSpec = Callable[..., EncoderItemSpec]
"""The item spec of one count row (a grid row or a tile count) of a modality, its non-padding rows (None
without ``items.valid``) and its item-role values (None: the ``per_item`` defaults): the adapter's, cached."""


@dataclass(frozen=True)
class Input:
    """One modality present in the multimodal kwargs, checked."""

    modality: Modality
    pixels: torch.Tensor
    counts: torch.Tensor | None
    """The counts as given (for the eager call); None when every tile is an item."""
    counts_cpu: torch.Tensor
    """The counts on the CPU as int64, one per item (for item formulas): full ``(t, h, w)`` grid rows whatever
    the modality's ``grid_columns``; ones when every tile is an item."""
    encoder_counts: torch.Tensor
    """The count rows the encoder sees, on the CPU as int64 (for providers): ``counts_cpu``, or with a
    ``split`` modality one ``(1, h, w)`` row per frame."""
    extras: dict[str, torch.Tensor]
    """Extra inputs by role, aligned with the pixels on dim 0."""
    valid: tuple[int, ...] | None = None
    """Per item, its rows that are not padding (``items.valid``); None without it."""
    item_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    """Item-aligned inputs by role (``per_item``): one integer per item, as given."""
    item_values: tuple[tuple[tuple[str, int], ...], ...] | None = None
    """Per item, its ``(role, value)`` pairs of the item-aligned inputs; None when the modality has none."""
    backend_rows: torch.Tensor | None = None
    """The backend's rows per item (:data:`BACKEND_ROW_KEYS`) as given, checked against the items; None when
    absent. Selections carry it along; no encoder call sees it."""

    def items(self) -> list[tuple[Any, int | None, tuple[tuple[str, int], ...] | None]]:
        """``(count row, valid rows or None, item-role values or None)`` per item, in input order."""
        rows = self.counts_cpu.tolist()
        none = [None] * len(rows)
        return list(zip(rows, self.valid if self.valid is not None else none,
                        self.item_values if self.item_values is not None else none))


def pixel_row(spec: Spec, geometry: Mapping[str, int]) -> tuple[int | None, ...] | None:
    """The shape of one pixel row (a patch row or a tile) as the graphs hold it: the pixel buffer's shape past
    dim 0, None for a dimension that depends on the capture; None when the spec has no pixel buffer (a graph
    scope captures a submodule's arguments, not the pixels)."""
    buffer = spec.providers().get("pixels")
    if buffer is None or buffer.shape is None:
        return None
    names = {**buffer_names(1, 1, 1), **geometry}
    trail = tuple(None if f.names & set(BUFFER_NAMES) else f.evaluate(names) for f in buffer.shape[buffer.rows_dim + 1:])
    if not buffer.rows_dim:
        return trail
    # the dimensions before the rows belong to each row, as its width does
    return dataclasses.replace(buffer.pixel_layout(names), trail=trail).row


def _meta(value: Any) -> Any:
    """What a read takes from a tensor besides its values: shape, dtype, device, strides (any of which an
    in-place ``resize_`` or ``set_`` may change); None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), value.dtype, value.device, value.stride()


def _content(value: Any) -> torch.Tensor:
    """``value`` as a tensor whose values a read depends on (counts, item values, ...): the tensor itself, or a
    tensor over a list's or a numpy array's values (sharing a numpy array's memory)."""
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _same(saved: torch.Tensor, value: Any) -> bool:
    """Whether ``value`` holds the values of ``saved`` (a copy taken at the last read)."""
    try:
        current = _content(value)
        return (current.shape == saved.shape and current.dtype == saved.dtype and current.device == saved.device
                and bool(torch.equal(current, saved)))
    except (TypeError, ValueError, RuntimeError):
        return False


@dataclass(frozen=True)
class _LastRead:
    """One read kept for the next (:meth:`InputReader.read`)."""

    values: tuple[tuple[str, Any], ...]
    """The kwargs' items: held, so that no new object can take the identity of one of them meanwhile."""
    metas: tuple
    """:func:`_meta` of each value."""
    contents: dict[str, torch.Tensor]
    """Copies of the values read for their contents (counts, item values, valid rows, the backend's rows)."""
    found: list[Input]

    def answers(self, values: tuple[tuple[str, Any], ...], mm_kwargs: Mapping[str, Any]) -> bool:
        """Whether a read of ``values`` would find what this one did: the same keys and very objects, with the same
        metadata, and the contents read equal to the copies taken."""
        return (len(self.values) == len(values)
                and all(k == k2 and v is v2 for (k, v), (k2, v2) in zip(values, self.values))
                and self.metas == tuple(_meta(v) for _, v in values)
                and all(_same(saved, mm_kwargs[k]) for k, saved in self.contents.items()))


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def item_indices(indices: Any) -> list[int]:
    """``indices`` (the items a selection asks for) as Python ints. Raises InputError naming the entry, the
    expected and the actual value for anything but integers: a float (``1.7``), a string (``"1"``), a bool, None,
    NaN or a non-integer tensor is a caller's mistake, never rounded or cast. A 0-d integer tensor or a numpy
    integer counts as an integer."""
    try:
        entries = list(indices)
    except TypeError:
        raise InputError(f"indices: expected a sequence of item indices, got {_type_name(indices)}") from None
    out = []
    for position, value in enumerate(entries):
        if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
            raise InputError(f"indices[{position}]: expected an integer item index, got {value!r}")
        try:
            out.append(operator.index(value))
        except TypeError:
            raise InputError(f"indices[{position}]: expected an integer item index, got {value!r} "
                             f"({_type_name(value)})") from None
    return out


def role_dtypes(spec: Spec) -> dict[str, str]:
    """The dtype declared for each extra input role: ``model`` (the encoder's floating dtype), ``float32``, ``int64``,
    ``int32`` or ``bool``. A buffer's ``params: {role, dtype}`` says it; for a role no buffer holds (a graph scope's
    inputs reach the model's own prologue only), an index dtype (int64, int32) of the spec's example input
    (``tests.inputs``), which ``vitcg check`` proves the model takes. An example's other dtypes say too little:
    siglip2's example mask is bool and its processor's int32. A role none of these declares is absent."""
    examples = getattr(getattr(spec, "tests", None), "inputs", None) or {}
    declared = {role: example.dtype for role, example in examples.items() if example.dtype in ("int64", "int32")}
    declared.update({b.params["role"]: b.params["dtype"] for b in spec.buffers
                     if isinstance(b.params.get("role"), str) and isinstance(b.params.get("dtype"), str)})
    return declared


def role_bounds(spec: Spec, geometry: Mapping[str, int]) -> dict[str, int]:
    """By index role, the rows of the table its values index (an ``aligned`` buffer's ``params.below`` at
    ``geometry``): the Q-Former vocabulary of InstructBLIP's instruction ids, Mllama's aspect-ratio embedding, Gemma
    4's position table. Eagerly a value past it is an IndexError; in a graph replay on a GPU a device-side assert
    that ends the process. Raises SpecRuntimeError for a bound that does not evaluate to a positive integer."""
    bounds = {}
    for buffer in spec.buffers:
        role = buffer.params.get("role")
        try:
            bound = buffer.index_bound(geometry)
        except FormulaError as exc:
            raise SpecRuntimeError(f"{spec.name}: buffer {buffer.name!r}: params.below "
                                   f"{buffer.params['below']!r} does not evaluate: {exc}") from None
        if bound is None or not isinstance(role, str):
            continue
        if bound < 1:
            raise SpecRuntimeError(f"{spec.name}: buffer {buffer.name!r}: params.below {buffer.params['below']!r} "
                                   f"is {bound} for this config; expected a positive number of table rows")
        bounds[role] = bound
    return bounds


def pooled_side(spec: Spec, geometry: Mapping[str, int]) -> int | None:
    """For a tile spec with ``items.valid``: k when a tile without padding (``items.valid.full`` rows) has k*k rows
    per output token, each token pooling a k x k block of patches; None for any other spec or ratio."""
    if spec.valid is None or spec.attention_style.segmented:
        return None
    modality = next((m for m in spec.modalities if spec.valid.role in m.inputs), None)
    if modality is None:
        return None
    try:
        tokens = spec.item_sizes(modality.name, 1, geometry)[1]
        full = spec.valid.full.evaluate({**spec.attention_style.names(1), **geometry, **modality.item_defaults(geometry)})
    except FormulaError:
        return None
    side = math.isqrt(full // tokens) if tokens > 0 and full % tokens == 0 else 0
    return side if side > 1 and side * side * tokens == full else None


def dtype_problem(dtype: torch.dtype, declared: str) -> str | None:
    """What ``dtype`` lacks to be given where a buffer declares ``declared`` (None: nothing): a floating role takes
    any floating dtype (the eager call casts it to the encoder's), an index role int64 or int32 (an ``embedding``
    or an index refuses the rest), a mask role bool (``torch.where`` refuses the rest)."""
    if declared == "bool":
        return None if dtype == torch.bool else "expected torch.bool (a mask)"
    if declared in ("int64", "int32"):
        return None if dtype in INDEX_DTYPES else "expected torch.int64 or torch.int32 (indices)"
    if not dtype.is_floating_point:
        return "expected a floating dtype"
    return None


def _shape(dims: tuple) -> str:
    return "(" + ", ".join("*" if d is None else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _content_keys(spec: Spec) -> frozenset[str]:
    """The input keys whose values a read depends on: counts, per-item roles, and the ``valid`` role's input."""
    keys = [k for m in spec.modalities for k in (m.count_key, *(m.inputs[r] for r in m.item_roles)) if k]
    if spec.valid:
        keys += [m.inputs[spec.valid.role] for m in spec.modalities if spec.valid.role in m.inputs]
    return frozenset(keys)


class InputReader:
    """Reads one call's multimodal kwargs into :class:`Input` records, one per modality present.

    Every protocol entry point of the adapter reads its kwargs here, so a bad input fails once, before any
    tensor work, with an InputError naming the key, what the spec expects and what was given: tensors
    where tensors go, pixels floating on the encoder's device with the row shape of the pixel buffer (and no
    dimension of size 0), counts of int64 or int32 holding positive entries (grid heights and widths multiples
    of the merge size when the spec defines one), item values (``per_item``) of int64 or int32 and not negative,
    extra inputs of the kind their declared dtype names (:func:`role_dtypes`; index inputs not negative), padding
    of ``items.valid`` in one trailing block of each row and in whole output tokens, as many pixel rows as the
    items' ``input_size`` adds up to, and no unknown keys
    (None values are ignored; vLLM's Transformers backend's rows per item, :data:`BACKEND_ROW_KEYS`, are known
    and must match the items)."""

    def __init__(self, spec: Spec, geometry: Mapping[str, int], device: torch.device, item_spec: ItemSpec):
        self.spec = spec
        self.device = device
        self._item_spec = item_spec
        self.known = tuple(dict.fromkeys(k for m in spec.modalities for k in m.inputs.values()))
        self.backend_rows = {name: key for name, key in BACKEND_ROW_KEYS.items() if key not in self.known}
        """The backend's bookkeeping keys by modality (a spec that declares one of them as an input reads it as
        that input instead)."""
        self.pixel_row = pixel_row(spec, geometry)
        self.geometry = dict(geometry)
        self.role_dtypes = role_dtypes(spec)
        self.role_bounds = role_bounds(spec, geometry)
        """By index role, the exclusive upper bound of its values (:func:`role_bounds`)."""
        self.pooled_side = pooled_side(spec, geometry)
        """With ``items.valid``: the side k when an item without padding has k*k rows per output token (Gemma 4's
        pooling kernel, 3); None otherwise."""
        self.merge = geometry.get(MERGE_NAME)
        self.merged = spec.attention_style.merged if self.merge else ()
        """Item names that must be multiples of :attr:`merge`: only where the spec defines a merge size."""
        self.content_keys = _content_keys(spec) | frozenset(self.backend_rows.values())
        """Keys whose values (not only their shapes) a read depends on: small integer tensors, but for ``valid``."""
        self._last: _LastRead | None = None
        """The last read and what it found (see :meth:`read`)."""

    def _error(self, key: str, message: str) -> InputError:
        return InputError(f"{self.spec.name}: {key!r}: {message}")

    def read(self, mm_kwargs: Mapping[str, Any]) -> list[Input]:
        """The modalities present in ``mm_kwargs``, in the spec's order. Raises InputError.

        One call of the manager reads the same kwargs several times (modality, items, frames, selection):
        when the keys and the very objects are those of the last read, with the same shapes, dtypes, devices and
        strides, and the values read for their contents (counts, item values, ``valid`` rows, the backend's
        rows: :attr:`content_keys`) are equal to a copy taken then, the last answer is returned. Values are
        compared, not version counters: a write through a numpy view or DLPack bumps no counter. A tensor read
        only for its shape (pixels) is passed on as the object itself, so its new values are what the caller
        gets anyway."""
        values = tuple(mm_kwargs.items())
        if self._last is not None and self._last.answers(values, mm_kwargs):
            return list(self._last.found)
        found = self._read(mm_kwargs)
        contents = {k: _content(v).clone() for k, v in values if k in self.content_keys and v is not None}
        self._last = _LastRead(values, tuple(_meta(v) for _, v in values), contents, found)
        return list(found)

    def _read(self, mm_kwargs: Mapping[str, Any]) -> list[Input]:
        self._check_keys(mm_kwargs)
        found = [self._read_modality(modality, mm_kwargs) for modality in self.spec.modalities]
        return self._backend_rows(mm_kwargs, [inp for inp in found if inp is not None])

    def _read_modality(self, modality: Modality, mm_kwargs: Mapping[str, Any]) -> Input | None:
        """One modality's input, checked; None when the call has none of its keys."""
        keys = list(modality.inputs.values())
        present = [k for k in keys if mm_kwargs.get(k) is not None]
        if not present:
            return None
        if missing := [k for k in keys if k not in present]:
            raise InputError(f"{self.spec.name}: {present[0]!r} is given without {missing[0]!r}")
        pixels = self._tensor(modality.pixels_key, mm_kwargs[modality.pixels_key])
        self._check_pixels(modality.pixels_key, pixels)
        counts, counts_cpu = self._counts(modality, mm_kwargs, pixels)
        extras = {role: self._aligned(modality, role, mm_kwargs[modality.inputs[role]], pixels)
                  for role in modality.extra_roles}
        item_inputs = {role: self._per_item(modality, role, mm_kwargs[modality.inputs[role]], counts_cpu)
                       for role in modality.item_roles}
        item_values = self._item_values(modality, item_inputs, counts_cpu.shape[0])
        valid = self._check_items(modality, counts_cpu, pixels, self._valid_rows(extras), item_values)
        return Input(modality, pixels, counts, counts_cpu, self._encoder_counts(modality, counts_cpu), extras, valid,
                     item_inputs, item_values)

    def _encoder_counts(self, modality: Modality, counts_cpu: torch.Tensor) -> torch.Tensor:
        """The count rows the encoder sees: a modality split by frames has a row per segment."""
        if modality.split is None or not self.spec.attention_style.segmented:
            return counts_cpu
        rows = [r for row in counts_cpu.tolist() for r in modality.encoder_rows(row)]
        return torch.tensor(rows, dtype=torch.int64).reshape(-1, counts_cpu.shape[1])

    def _item_values(self, modality: Modality, item_inputs: Mapping[str, torch.Tensor],
                     items: int) -> tuple | None:
        """Each item's per-item role values, ``((role, value), ...)``, read in one host read; None without any."""
        if not item_inputs:
            return None
        columns = {role: value.tolist() for role, value in item_inputs.items()}
        self._check_signs(modality, columns)
        return tuple(tuple((role, columns[role][i]) for role in item_inputs) for i in range(items))

    def _backend_rows(self, mm_kwargs: Mapping[str, Any], found: list[Input]) -> list[Input]:
        """``found`` with the backend's rows per item attached where given (:data:`BACKEND_ROW_KEYS`). Raises
        InputError when they are not integers or differ from the items' rows (``items.input_size``): a
        modality absent from the call has no items."""
        for name, key in self.backend_rows.items():
            value = mm_kwargs.get(key)
            if value is None:
                continue
            given = self._integers(key, value)
            index = next((i for i, inp in enumerate(found) if inp.modality.name == name), None)
            actual = given.flatten().tolist()  # on the CPU, where the backend keeps it: no device sync
            if index is None:
                if actual:
                    raise self._error(key, f"expected no entries, as the call has no {name} items; got {actual}")
                continue
            inp = found[index]
            expected = [self._item_spec(inp.modality, *item).input_size for item in inp.items()]
            if actual != expected:
                raise self._error(key, f"expected {expected} (the rows of {inp.modality.pixels_key!r} of each "
                                       f"{name} item, items.input_size: {self.spec.input_size}), got {actual}")
            found[index] = dataclasses.replace(inp, backend_rows=given.reshape(-1))
        return found

    def _integers(self, key: str, value: Any) -> torch.Tensor:
        """``value`` as a tensor of integers with data; InputError naming ``key`` otherwise."""
        try:
            given = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise self._error(key, f"expected a tensor of integers, got {_type_name(value)}") from None
        if given.is_meta or given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
            raise self._error(key, f"expected a tensor of integers with data, got {given.dtype}"
                                   f"{' (meta)' if given.is_meta else ''}")
        return given

    def _check_keys(self, mm_kwargs: Mapping[str, Any]) -> None:
        # the protocol reserves the axis keys' name: a selection carries them for the manager to pop; the
        # backend's bookkeeping keys are checked against the items later
        unknown = [k for k, v in mm_kwargs.items()
                   if v is not None and k not in self.known and k != ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
                   and k not in self.backend_rows.values()]
        if not unknown:
            return
        hint = suggest(str(unknown[0]), self.known)
        hint = f"; {hint}" if hint else ""
        if all(k in unknown for k, v in mm_kwargs.items() if v is not None):
            raise self.no_known_key(unknown, hint)
        raise InputError(f"{self.spec.name}: unknown input key {unknown[0]!r}; the spec's keys are "
                         f"{', '.join(self.known)}{hint}")

    def no_known_key(self, keys: Any, hint: str = "") -> InputError:
        """The error for a call holding none of the spec's input keys (only ``keys``)."""
        expected = "; ".join(f"{m.name}: {', '.join(m.inputs.values())}" for m in self.spec.modalities)
        return InputError(f"{self.spec.name}: no known input key in {sorted(map(str, keys))}; expected "
                          f"{expected}{hint}")

    def _tensor(self, key: str, value: Any) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise self._error(key, f"expected a torch.Tensor, got {_type_name(value)}")
        return value

    def _check_device(self, key: str, value: torch.Tensor) -> None:
        # the eager call would fail on another device, and a meta tensor holds no data to copy
        if value.device != self.device:
            raise self._error(key, f"expected a tensor on the encoder's device {self.device}, got one on "
                                   f"{value.device}")

    def _check_pixels(self, key: str, pixels: torch.Tensor) -> None:
        self._check_device(key, pixels)
        if not pixels.is_floating_point():
            raise self._error(key, f"expected a floating dtype (pixel values), got {pixels.dtype}")
        row = self.pixel_row
        if pixels.ndim == 0 or row is not None and (
                pixels.ndim != len(row) + 1 or any(d is not None and d != n for d, n in zip(row, pixels.shape[1:]))):
            expected = _shape(("rows", *row)) if row is not None else "at least one dimension (rows)"
            raise self._error(key, f"expected shape {expected}, got {_shape(tuple(pixels.shape))}")
        if 0 in pixels.shape[1:]:  # a row without values: the encoder's first matmul or reshape fails on it
            raise self._error(key, f"expected rows with values (no dimension after the first of size 0), got shape "
                                   f"{_shape(tuple(pixels.shape))}")

    def _counts(self, modality: Modality, mm_kwargs: Mapping[str, Any], pixels: torch.Tensor
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
        key = modality.count_key
        if key is None:
            return None, torch.ones(pixels.shape[0], dtype=torch.int64)
        value = mm_kwargs[key]
        try:
            counts = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise self._error(key, f"expected a tensor of integers, got {_type_name(value)}") from None
        if counts.is_meta:
            raise self._error(key, "expected a tensor with data, got a meta tensor")
        style = self.spec.attention_style
        columns = len(modality.grid_columns) if style.segmented else None
        if not style.counts_fit(counts.shape, columns):
            named = f" ({', '.join(modality.grid_columns)})" if style.segmented else ""
            raise InputError(f"{self.spec.name}: {key!r} must have shape {style.count_shape(columns)}{named}, "
                             f"got {tuple(counts.shape)}")
        if counts.dtype not in INDEX_DTYPES:
            raise self._error(key, f"expected an integer dtype (torch.int64 or torch.int32), got {counts.dtype}")
        counts_cpu = counts.detach().to("cpu", torch.int64)
        if style.segmented and modality.grid_columns != GRID_COLUMNS:  # full (t, h, w) rows for the formulas
            full = [modality.item_row(row) for row in counts_cpu.tolist()]
            counts_cpu = torch.tensor(full, dtype=torch.int64).reshape(-1, len(GRID_COLUMNS))
        return counts, counts_cpu

    def _aligned(self, modality: Modality, role: str, value: Any, pixels: torch.Tensor) -> torch.Tensor:
        key = modality.inputs[role]
        value = self._tensor(key, value)
        self._check_device(key, value)
        if value.ndim == 0 or value.shape[0] != pixels.shape[0]:
            raise InputError(f"{self.spec.name}: {key!r} has {value.shape[0] if value.ndim else 'no'} rows on dim "
                             f"0, {modality.pixels_key!r} has {pixels.shape[0]}; they must align")
        declared = self.role_dtypes.get(role)
        problem = dtype_problem(value.dtype, declared) if declared else None
        if problem:
            raise self._error(key, f"{problem}, got {value.dtype}")
        if declared in ("int64", "int32"):
            self._check_indices(key, role, value)
        return value

    def _check_indices(self, key: str, role: str, value: torch.Tensor) -> None:
        """An index input (token ids, aspect ratio ids, patch positions) holds values in ``[0, bound)``, the bound
        being the rows of the table it indexes where the spec says (``params.below``, :attr:`role_bounds`), and
        only a lower bound where it does not: an ``embedding`` raises IndexError on a value outside eagerly, and
        on a GPU a graph replay would hit a device-side assert instead. The ``items.valid`` role's padding patches
        (every field equal to ``items.valid.padding``) are the exception. One host read."""
        bound = self.role_bounds.get(role)
        bad = value < 0 if bound is None else (value < 0) | (value >= bound)
        padded = self.spec.valid is not None and role == self.spec.valid.role
        if padded and value.ndim >= 2:
            patches = value.reshape(value.shape[0], value.shape[1], math.prod(value.shape[2:]))
            padding = (patches == self.spec.valid.padding).all(dim=-1)
            bad = bad.reshape(patches.shape) & ~padding.unsqueeze(-1)
        if not bool(bad.any()):
            return
        flat = bad.reshape(value.shape[0], -1)
        first = flat.any(dim=-1).nonzero()[0, 0].item()
        actual = value.reshape(value.shape[0], -1)[first][flat[first]][0].item()
        expected = "of 0 or more" if bound is None else f"in [0, {bound}) (params.below: {self._below(role)})"
        allowed = f" (a padding patch is {self.spec.valid.padding} in every field)" if padded else ""
        raise self._error(key, f"row {first}: expected indices {expected}{allowed}, got {actual}")

    def _below(self, role: str) -> str:
        return next(str(b.params["below"]) for b in self.spec.buffers
                    if b.params.get("role") == role and "below" in b.params)

    def _per_item(self, modality: Modality, role: str, value: Any, counts_cpu: torch.Tensor) -> torch.Tensor:
        """An item-aligned input (``per_item``): an integer tensor of shape ``(items,)``."""
        key = modality.inputs[role]
        value = self._tensor(key, value)
        self._check_device(key, value)
        if value.dtype not in INDEX_DTYPES:
            raise self._error(key, f"expected an integer dtype (torch.int64 or torch.int32; one value per item, "
                                   f"per_item), got {value.dtype}")
        items = counts_cpu.shape[0]
        if tuple(value.shape) != (items,):
            raise self._error(key, f"expected shape ({items},) (one value per item of "
                                   f"{modality.count_key or modality.pixels_key!r}, per_item), got "
                                   f"{_shape(tuple(value.shape))}")
        return value

    def _check_signs(self, modality: Modality, columns: Mapping[str, list[int]]) -> None:
        """Item values (``per_item``: a merge size, ...) must not be negative: a merge size of -1 passed the item
        formulas (``h // -1`` is negative, and squared positive) and failed inside the encoder's reshape. A zero is
        left to the formulas, whose error names the item (a division by zero)."""
        for role, column in columns.items():
            bad = next((i for i, v in enumerate(column) if v < 0), None)
            if bad is not None:
                raise self._error(modality.inputs[role], f"item {bad}: expected a positive integer (per_item), "
                                                         f"got {column[bad]}")

    def _valid_rows(self, extras: Mapping[str, torch.Tensor]) -> list[int] | None:
        """Per row on dim 0 (a tile or a patch row), its patches that are not padding (``items.valid``): dim 1
        indexes the patches of a row and any later dimensions hold one patch's values (a patch is padding
        when they all equal ``items.valid.padding``); a 1-D role has one patch per row. One host read."""
        if self.spec.valid is None:
            return None
        role = extras[self.spec.valid.role]
        fields = math.prod(role.shape[2:])  # 1 for a 1-D or 2-D role
        patches = role.reshape(role.shape[0], role.shape[1] if role.ndim >= 2 else 1, fields)
        kept = (patches != self.spec.valid.padding).any(dim=-1)
        counts = kept.sum(dim=-1)
        # The graph keeps a row's first `valid` patches: padding anywhere but in one trailing block would be
        # counted right and cut wrong (a processor pads at the end only).
        leading = torch.arange(kept.shape[1], device=kept.device) < counts.unsqueeze(-1)
        scattered = (kept != leading).any(dim=-1)
        values = torch.stack([counts, scattered.to(counts.dtype)]).tolist()  # one host read
        key = next(m.inputs[self.spec.valid.role] for m in self.spec.modalities if self.spec.valid.role in m.inputs)
        if any(values[1]):
            row = values[1].index(1)
            raise self._error(key, f"row {row}: expected its padding ({self.spec.valid.padding}) in one block after "
                                   f"its {values[0][row]} other patches (items.valid), got padding between them")
        if self.pooled_side is not None and role.ndim == 3 and role.shape[-1] == 2:
            self._check_position_grid(key, role, values[0])
        return values[0]

    def _check_position_grid(self, key: str, positions: torch.Tensor, counts: list[int]) -> None:
        """Patch positions ``(x, y)`` of ``items.valid`` whose output tokens each pool a k x k block of patches
        (:attr:`pooled_side`): each row's non-padding patches must be a grid of whole blocks, row by row, as a
        processor lays an image out. The encoder pools by position, so any other layout gives another row count
        than ``items.output_tokens``: 1728 patches 45 wide gave the model 195 rows, the formula 192."""
        k = self.pooled_side
        table = positions.detach().to("cpu")
        for row, count in enumerate(counts):
            if not count:
                continue
            given = table[row, :count]
            width = int(given[:, 0].max()) + 1
            index = torch.arange(count)
            if (count % width or width % k or (count // width) % k
                    or not torch.equal(given, torch.stack([index % width, index // width], dim=-1).to(given.dtype))):
                raise self._error(key, f"row {row}: expected the positions (x, y) of its {count} patches to fill a "
                                       f"grid row by row whose sides are multiples of {k} (one output token pools "
                                       f"{k}x{k} patches, items.valid), got {count} patches up to x = {width - 1}")

    def _check_whole_tokens(self, modality: Modality, index: int, row: Any, values: tuple | None, valid: int,
                            full_tokens: int, tokens: int) -> None:
        """Raise InputError unless the item's ``valid`` rows make whole output tokens, as an item without padding
        does: ``items.valid.full`` rows give ``full_tokens``, so ``valid`` rows must be ``tokens`` times the same
        rows per token. Otherwise the formula rounds (Gemma 4: ``valid // pooling_kernel_size ** 2``) where the
        encoder pools the remainder into a row of its own: 180 rows where the model returned 192."""
        full = self.spec.valid.full.evaluate(_valid_names(self.spec, modality, row, self.geometry, values))
        if valid * full_tokens == tokens * full:
            return
        per = full // full_tokens if full_tokens and full % full_tokens == 0 else None
        expected = (f"a multiple of {per}, the rows of one output token" if per else
                    f"rows in the proportion {full}:{full_tokens} of an item without padding")
        key = modality.inputs[self.spec.valid.role]
        raise self._error(key, f"item {index}: expected its non-padding patches (items.valid) to be {expected} "
                               f"(items.valid.full: {full} rows give {full_tokens} tokens), got {valid}")

    def _check_items(self, modality: Modality, counts_cpu: torch.Tensor, pixels: torch.Tensor,
                     valid_rows: list[int] | None, item_values: tuple | None = None) -> tuple[int, ...] | None:
        """Checks each item's counts and sizes; returns each item's non-padding rows (None without
        ``items.valid``)."""
        key = modality.count_key or modality.pixels_key
        total = 0
        valid: list[int] = []
        for index, row in enumerate(counts_cpu.tolist()):
            values = item_values[index] if item_values is not None else None
            item = self._checked_item(modality, key, index, row, values, valid_rows, total, valid)
            total += item.input_size
        if total != pixels.shape[0]:
            raise InputError(
                f"{self.spec.name}: {modality.pixels_key!r} has {pixels.shape[0]} rows but {key!r} describes "
                f"{total} (items.input_size: {self.spec.input_size})")
        return tuple(valid) if valid_rows is not None else None

    def _checked_item(self, modality: Modality, key: str, index: int, row: Any, values: tuple | None,
                      valid_rows: list[int] | None, start: int, valid: list[int]) -> EncoderItemSpec:
        """Item ``index`` (count row ``row``, pixel rows from ``start``) checked: positive counts, multiples of the
        merge size, formulas that evaluate to a positive size; with ``valid_rows``, its non-padding rows are
        appended to ``valid`` and must make whole output tokens. Raises InputError naming ``key``."""
        names = self.spec.attention_style.item_names
        counted = row if isinstance(row, list) else [row]
        if min(counted) < 1:
            raise self._error(key, f"item {index} is {row}: expected positive {', '.join(names)}")
        if off := [n for n in self.merged if counted[names.index(n)] % self.merge]:
            raise self._error(key, f"item {index} is {row}: expected {' and '.join(self.merged)} to be "
                                   f"multiples of {MERGE_NAME} {self.merge}, {' and '.join(off)} is not")
        try:
            item = self._item_spec(modality, row, None, values)
            if valid_rows is not None:  # input_size never reads valid: it locates the item's rows
                valid.append(sum(valid_rows[start:start + item.input_size]))
                full, item = item, self._item_spec(modality, row, valid[-1], values)
                self._check_whole_tokens(modality, index, row, values, valid[-1], full.output_tokens,
                                         item.output_tokens)
        except FormulaError as exc:
            raise self._error(key, f"item {index} is {row}{_described(values)}: {exc}") from None
        if item.input_size < 1 or item.output_tokens < 1:
            raise self._error(key, f"item {index} is {row}{_described(values)}: expected a positive input_size "
                                   "and output_tokens "
                                   f"(items: {self.spec.input_size}, {self.spec.output_tokens}), got "
                                   f"{item.input_size} and {item.output_tokens}")
        return item


def _valid_names(spec: Spec, modality: Modality, row: Any, geometry: Mapping[str, int],
                 values: tuple[tuple[str, int], ...] | None) -> dict[str, int]:
    return {**spec.attention_style.names(row), **geometry, **modality.item_defaults(geometry), **dict(values or ())}


def _described(values: tuple[tuple[str, int], ...] | None) -> str:
    """An item's item-role values for a message: `` (merge_sizes=2)``, or nothing."""
    return f" ({', '.join(f'{k}={v}' for k, v in values)})" if values else ""
