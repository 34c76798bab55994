"""``vitcg.accelerate(model)``: a loaded transformers VLM runs its vision encoder through budget graphs.

The spec of the model (found by architecture or ``model_type``) names the encoder module inside the VLM
(``encoder.vlm_attribute``) and the call that is captured (``encoder.method``). :func:`accelerate` builds the
adapter on that very module (its real weights), captures the budget graphs, and replaces the call on that
module instance with a router: the VLM's ``get_image_features`` / ``get_video_features`` (and so ``forward``
and ``generate``) reach the manager without any other change. What the graphs cannot serve runs the
original call: autograd on, arguments the spec did not capture, a modality the spec lacks, an item larger
than every budget (the manager's own eager fallback). :meth:`Accelerated.restore` puts the original calls
back.

Threads: a handle serves one call at a time. Its router holds the handle's lock for the whole call (graphs,
eager fallback, learning the output layout, capturing again), so threads sharing an accelerated model get the
results the original model gives, one call after another, never in parallel. Patches live in one stack per
patched attribute (:class:`_Slot`): :meth:`Accelerated.restore` takes out its own layers and leaves every other
handle's in place, in any order and from any thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError, SpecRuntimeError, UsageError
from ..lang import SpecSource, spec_folders
from ..lang.bindings import import_object
from ..lang.model import Modality, Spec
from .adapter import adapter_for, output_entry, per_item, pixels_to_rows
from .attention import encoder_lock
from .compile_cache import CompileCacheUse, capture_compiled
from .manager import EncoderCudaGraphManager, ManagerOptions, ManagerStats

_MODALITY: contextvars.ContextVar[str | None] = contextvars.ContextVar("vitcg_modality", default=None)
FEATURE_METHODS = {"get_image_features": "image", "get_video_features": "video"}
"""VLM methods whose calls say which modality the encoder is asked for."""
IGNORED_ARGS = {"return_dict", "use_cache"}
"""Arguments of the captured call that change nothing a graph computes (a structured output is returned; a
vision encoder keeps no cache, though older transformers pass ``generate``'s ``use_cache`` down to it)."""


SpecFolders = str | Path | Sequence[str | Path]
"""What ``specs=`` takes besides a SpecSource: one folder of the user's, or several in override order."""


def source_for(specs: SpecSource | SpecFolders | None = None) -> SpecSource:
    """``specs`` if it is a SpecSource; else the packaged specs, then ``$VITCG_SPECS_DIR``, then the folder or folders
    ``specs`` names, a later folder's spec replacing an earlier one of the same name
    (:mod:`vitcg.lang.folders`). This is a host's source (``SpecSource(host=True)``): a spec file that does not
    validate, or a ``$VITCG_SPECS_DIR`` entry that is not a folder, is logged at WARNING and makes only its own
    spec unusable (asking the source for that name raises SpecError). Raises UsageError for a
    folder of ``specs`` that does not exist."""
    if isinstance(specs, SpecSource):
        return specs
    extra = [] if specs is None else [specs] if isinstance(specs, (str, Path)) else list(specs)
    return SpecSource(spec_folders(extra, skip_missing=True), host=True, bindings=False)


@dataclass
class AccelerateStats:
    """What the router did since :func:`accelerate`: encoder calls served by the manager or by the original
    call (with why), plus the manager's own counters (items, graph hits and eager misses, replays)."""

    calls: int = 0
    routed: int = 0
    """Calls served by the manager (its items may still run eagerly when larger than every budget)."""
    original: int = 0
    """Calls that ran the original encoder call."""
    reasons: Counter = field(default_factory=Counter)
    """Why calls ran the original call, by reason."""
    recaptures: int = 0
    """Times the graphs were captured again because the encoder moved to another device or dtype."""
    manager: ManagerStats | None = None


@dataclass
class _Slot:
    """One patched attribute of one object: what it held before any handle patched it, and each handle's
    replacement in install order, the last one in place."""

    had_own: bool
    """Whether the object's own ``__dict__`` held the attribute (else the class provides it)."""
    previous: Any
    layers: list[tuple[Any, Callable]]

    def unpatched(self, owner: Any, name: str) -> Any:
        """The attribute as it was before any handle patched it."""
        if self.had_own:
            return self.previous
        found = getattr(type(owner), name)
        return found.__get__(owner, type(owner)) if hasattr(found, "__get__") else found


SLOTS = "_vitcg_slots"
"""Where a patched object keeps its stacks (attribute name -> :class:`_Slot`), removed with the last one: held by
the object itself, so a model nobody restores is freed with its patches."""
_PATCH_LOCK = threading.RLock()
"""Held while any handle changes patches: installs and restores of several threads never interleave."""


def _slots(owner: Any) -> dict[str, _Slot]:
    return vars(owner).get(SLOTS, {})


def _unpatched(owner: Any, name: str) -> Any:
    slot = _slots(owner).get(name)
    return slot.unpatched(owner, name) if slot is not None else getattr(owner, name, None)


class _Layout:
    """How one output of the captured call is rebuilt from the manager's combined rows: the output type and,
    per ``encoder.outputs`` entry, the shapes of its tensors. Learned from the first original call."""

    def __init__(self, kind: type, entries: list[tuple[str, int | None, int, bool, list[tuple[int, ...]], list[int]]],
                 items: Mapping[str, type] | None = None):
        self.kind = kind
        self.entries = entries
        """(field, index inside the field or None, the field's length when indexed, is a list, shapes, dim that
        scales with the rows per tensor). A ``field[*]`` entry has one shape, of its first item's tensor."""
        self.items = dict(items or {})
        """``field[*]`` entries: field -> the container of its per-item tensors (tuple or list)."""

    @classmethod
    def learn(cls, spec: Spec, output: Any, rows: int) -> _Layout | None:
        """The layout of ``output`` (a call that produced ``rows`` rows); None while it is ambiguous (one row
        of a packed encoder could scale along any dimension of size 1). Raises SpecRuntimeError when the
        output lacks a field of the spec's ``encoder.outputs``."""
        entries, items = [], {}
        for entry in spec.encoder.outputs:
            name, index, value, length = output_entry(output, entry)
            if value is None:
                raise SpecRuntimeError(f"{spec.name}: the encoder call returned {type(output).__name__} without "
                                       f"{entry!r} (the spec's encoder.outputs)")
            if per_item(entry):
                if not isinstance(value, (list, tuple)) or not value or not all(
                        isinstance(t, torch.Tensor) and t.dim() >= 2 for t in value):
                    raise SpecRuntimeError(f"{spec.name}: {entry!r} of the encoder call is not a tuple or list of "
                                           "per-item tensors of rows (the spec's encoder.outputs)")
                items[name] = type(value)
                # each item's rows lie on its second-to-last dimension
                entries.append((name, None, 0, False, [tuple(value[0].shape)], [value[0].dim() - 2]))
                continue
            tensors = list(value) if isinstance(value, (list, tuple)) else [value]
            if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in tensors):
                return None
            dims = []
            for t in tensors:
                shape = tuple(t.shape)
                if not spec.attention_style.segmented:
                    dims.append(0)  # tiles: the tile batch is dim 0
                    continue
                if t.numel() // shape[-1] != rows:
                    return None
                matching = [d for d in range(len(shape) - 1) if shape[d] == rows]
                if not matching and shape[0] > 1:
                    # no dimension holds the rows: they come in blocks, one block per leading index
                    # (Kimi-K2.5's pooler: (tokens, merge**2, hidden), a row per block element)
                    matching = [0]
                if len(matching) != 1:
                    return None
                dims.append(matching[0])
            entries.append((name, index, length, isinstance(value, (list, tuple)), [tuple(t.shape) for t in tensors],
                            dims))
        return cls(type(output), entries, items)

    def build(self, combined: torch.Tensor, parts: list[torch.Tensor] | None = None) -> Any:
        """The output object for ``combined`` rows (the spec's output fields concatenated on the last dim), whose
        item ``i`` owns ``parts[i]`` (needed for ``field[*]`` entries: one tensor per item). An indexed field
        (``hidden_states[-2]``) comes back as a tuple of its learned length holding the graph's rows at that
        index and None elsewhere: the graphs compute nothing else. Raises InputError when the rows do not fit
        the learned shapes."""
        fields: dict[str, Any] = {}
        offset, rows = 0, combined.shape[0]
        for name, index, length, is_list, shapes, dims in self.entries:
            if name in self.items:
                shape, width = shapes[0], shapes[0][-1]
                fields[name] = self.items[name](
                    part[:, offset:offset + width].reshape(*shape[:-2], part.shape[0], width)
                    for part in (parts if parts is not None else [combined]))
                offset += width
                continue
            parts = []
            for shape, dim in zip(shapes, dims):
                width = shape[-1]
                flat = combined[:, offset:offset + width]
                offset += width
                others = 1
                for d, size in enumerate(shape[:-1]):
                    others *= size if d != dim else 1
                if rows % others:
                    raise InputError(f"{rows} rows do not fit an output of shape {shape}")
                new = list(shape)
                new[dim] = rows // others
                parts.append(flat.reshape(new))
            value = parts if is_list else parts[0]
            if index is None:
                fields[name] = value
            else:
                slots = list(fields.get(name) or [None] * length)
                slots[index] = value
                fields[name] = tuple(slots)
        if issubclass(self.kind, Mapping) and not hasattr(self.kind, "__dataclass_fields__"):
            return self.kind(fields)
        return self.kind(**fields)


def _resolve(root: nn.Module, path: str) -> tuple[list[Any], Any]:
    """The objects along ``path`` from ``root`` (root first) and the object at its end; a leading part the
    root does not have is dropped, so the inner model of a VLM works as well as the VLM."""
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
    owners, encoder = ([], model) if isinstance(model, expected) else _resolve(model, spec.encoder.vlm_attribute)
    if not isinstance(encoder, expected):
        raise UsageError(f"{spec.name}: {spec.encoder.vlm_attribute} of {type(model).__name__} is a "
                         f"{type(encoder).__name__}, not the spec's {expected.__name__}")
    return owners, encoder


def _spec_for(model: nn.Module, spec: Spec | str | None, specs: SpecSource | SpecFolders | None) -> Spec:
    if isinstance(spec, Spec):
        return spec
    source = source_for(specs)
    if isinstance(spec, str):
        return source[spec]
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    found = source.find(model_type, [type(model).__name__, *(getattr(config, "architectures", None) or ())])
    if found is None:
        known = sorted({t for s in source for t in s.model_types})
        broken = "".join(f"; {entry.file} does not validate (spec={entry.name!r} says why)" for entry in source.invalid)
        raise UsageError(f"no spec for {type(model).__name__} (model_type {model_type!r}); supported model types: "
                         f"{', '.join(known)}{broken}")
    return found


def call_inputs(spec: Spec, adapter: Any, signature: inspect.Signature, modality_name: str, args: tuple,
                kwargs: dict) -> tuple[dict[str, Any] | None, str | None]:
    """The adapter's multimodal kwargs for one call of the spec's encoder call (``args`` and ``kwargs`` bound to
    ``signature``), for the modality ``modality_name``; or None and why the graphs cannot serve that call (an
    argument the spec does not capture, a ``call_kwargs`` value it differs from, a pixel layout it does not
    describe, an empty batch, a missing input)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return None, f"arguments do not bind: {exc}"
    given = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            given.update(given.pop(name, {}))
    modality = spec.modality(modality_name)
    if modality is None:
        return None, f"the spec has no {modality_name} modality"
    roles = spec.encoder.args
    mm = {modality.inputs[role]: given[arg] for arg, role in roles.items() if given.get(arg) is not None}
    why = _uncaptured_argument(spec, adapter, given) or _rows_first(spec, adapter, mm, modality.pixels_key)
    return (None, why) if why else _missing_inputs(spec, mm, modality)


def _uncaptured_argument(spec: Spec, adapter: Any, given: Mapping[str, Any]) -> str | None:
    """Why an argument of the call keeps it from the graphs (one the spec does not capture, or a ``call_kwargs``
    value the spec differs from), or None."""
    roles, call_kwargs = spec.encoder.args, spec.encoder.call_kwargs
    for arg, value in given.items():
        if arg in roles or arg in IGNORED_ARGS and value is not False:
            continue
        if arg in call_kwargs:
            # None asks the model for its config's value (older transformers pass their defaults as None)
            default = getattr(getattr(adapter.module, "config", None), arg, None) if value is None else value
            if default != call_kwargs[arg]:
                return f"{arg}={value!r} differs from the spec's call_kwargs ({call_kwargs[arg]!r})"
        elif value is not None and value is not False:
            return f"argument {arg}={_short(value)} is not captured by the spec"
    return None


def _rows_first(spec: Spec, adapter: Any, mm: dict[str, Any], pixels_key: str) -> str | None:
    """Puts the call's pixels in ``mm`` rows first (the graphs' layout), or says why they cannot be served: no pixel
    tensor, a layout the spec does not describe, an empty batch."""
    pixels = mm.get(pixels_key)
    if not isinstance(pixels, torch.Tensor):
        return "no pixel tensor"
    if spec.pixels_rows_dim:  # the call's own pixel layout: the graphs take rows first
        layout = adapter.pixel_layout
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


def compiles_by_default(encoder: nn.Module) -> bool:
    """Whether ``accelerate`` compiles ``encoder``'s blocks unasked: on CUDA, where graphs replay the kernels (on the
    CPU's static path inductor would only add compile time)."""
    return any(p.device.type == "cuda" for p in itertools.islice(encoder.parameters(), 1))


class Accelerated:
    """The handle :func:`accelerate` returns: statistics, :meth:`restore` (also on leaving a ``with``)."""

    def __init__(self, model: nn.Module, spec: Spec, owners: list[Any], encoder: nn.Module,
                 limits: Mapping[str, Any], progress: bool, compile: bool | None = None,
                 options: ManagerOptions | None = None):
        self.model, self.spec, self.encoder = model, spec, encoder
        self.limits = dict(limits)
        self.options = options or ManagerOptions()
        self.progress = progress
        self.compile = compile
        """Compiled blocks asked for (True), refused (False), or wherever they pay (None: on CUDA)."""
        self.compile_forward = False
        """Whether the graphs of the last capture hold inductor-compiled blocks."""
        self.compile_cache: CompileCacheUse | None = None
        """How the last capture used the persistent compile cache (compiled blocks only)."""
        self.stats = AccelerateStats()
        self.adapter: Any = None
        self.manager: EncoderCudaGraphManager | None = None
        self._owners = owners
        self._patched: list[tuple[Any, str]] = []
        """The ``(object, attribute)`` pairs where this handle has a layer (:class:`_Slot`)."""
        self._lock = threading.RLock()
        """Held by every routed call and by restore and pause: one call at a time uses the manager."""
        self._layout: _Layout | None = None
        self._broken: str | None = None
        """Why routing stopped for good (the spec does not describe the model's output), or None."""
        self._original = getattr(encoder, spec.encoder.method)
        self._signature = inspect.signature(self._original)
        self._capture()
        self._install()

    def _capture(self) -> None:
        """Adapter and manager on the encoder as it is now (its device and dtype), graphs captured: with compiled
        blocks when asked, or by default on CUDA (where the graphs replay their kernels); when the default's
        compilation fails, without them and a warning saying why."""
        self.compile_forward = self.compile if self.compile is not None else compiles_by_default(self.encoder)
        try:
            self._capture_graphs()
        except SpecRuntimeError as exc:
            if self.compile is not None or not self.compile_forward:
                raise
            warnings.warn(f"vitcg.accelerate: {exc}; capturing without compiled blocks (accelerate(..., "
                          "compile=False) skips the attempt)", RuntimeWarning, stacklevel=4)
            self.compile_forward, self.compile_cache = False, None
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        with _PATCH_LOCK:  # the adapter must bind the original call, not a router in place
            router = vars(self.encoder).pop(self.spec.encoder.method, None)
            try:
                self.adapter = adapter_for(self.spec, self.encoder, compile_forward=self.compile_forward)
            finally:
                if router is not None:
                    setattr(self.encoder, self.spec.encoder.method, router)
        self.manager = EncoderCudaGraphManager(self.adapter, device=self.adapter.device, dtype=self.adapter.dtype,
                                               options=replace(self.options, progress=self.progress), **self.limits)
        try:
            if self.compile_forward:
                _, self.compile_cache = capture_compiled(self.manager, self.spec)
            else:
                self.manager.capture()
        except (RuntimeError, ValueError, TypeError) as exc:
            # the encoder inside this model cannot be captured (a host sync, a CPU copy): say so by name; the
            # model itself is untouched until _install
            raise SpecRuntimeError(f"{self.spec.name}: capturing {type(self.encoder).__name__} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
        self.stats.manager = self.manager.stats

    def _patch(self, owner: Any, name: str, replacement: Callable) -> None:
        """A layer of this handle on top of ``owner.name``'s stack (under :data:`_PATCH_LOCK`)."""
        slots = vars(owner).setdefault(SLOTS, {})
        if name not in slots:
            slots[name] = _Slot(name in vars(owner), vars(owner).get(name), [])
        slots[name].layers.append((self, replacement))
        self._patched.append((owner, name))
        setattr(owner, name, replacement)

    def _install(self) -> None:
        method = self.spec.encoder.method
        # the router shows the original signature: generate() binds model kwargs to it by name
        route = self._route

        @functools.wraps(self._original)
        def router(*args: Any, **kwargs: Any) -> Any:
            return route(*args, **kwargs)

        with _PATCH_LOCK:
            self._patch(self.encoder, method, router)
            for owner in self._owners:
                for name, modality in FEATURE_METHODS.items():
                    if owner is self.encoder and name == method:
                        continue
                    original = _unpatched(owner, name)  # never another handle's layer, which may leave first
                    if callable(original):
                        self._patch(owner, name, _with_modality(original, modality, self.spec.modality_names))
            self.model._vitcg = self

    @property
    def active(self) -> bool:
        return bool(self._patched)

    def restore(self) -> None:
        """Take this handle's calls out; the model is as it was before :func:`accelerate`, or, where other
        handles still route it, as they left it. Exact in any order of handles and from any thread; waits for a
        call in flight on this handle. Safe to repeat."""
        with self._lock, _PATCH_LOCK:
            for owner, name in dict.fromkeys(self._patched):
                slots = _slots(owner)
                slot = slots[name]
                slot.layers = [(h, r) for h, r in slot.layers if h is not self]
                if slot.layers:
                    setattr(owner, name, slot.layers[-1][1])
                    continue
                del slots[name]
                if not slots:
                    del vars(owner)[SLOTS]
                if slot.had_own:
                    setattr(owner, name, slot.previous)
                else:
                    delattr(owner, name)
            self._patched.clear()
            # the model's last installed handle that is still in place, if any, is the one it names
            slot = _slots(self.encoder).get(self.spec.encoder.method)
            others = [h for h, _ in slot.layers if h.model is self.model] if slot is not None else []
            if others:
                self.model._vitcg = others[-1]
            elif getattr(self.model, "_vitcg", None) is self:
                del self.model._vitcg

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The model's original calls for the duration of the block, the graphs again after it (nothing is
        captured again): for A/B measurements in one process, or a call that must not use graphs. Other
        handles routing the model keep their layers."""
        with self._lock:
            active = self.active
            self.restore()
        try:
            yield
        finally:
            if active:
                with self._lock:
                    self._install()

    def __enter__(self) -> Accelerated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _fallback(self, reason: str, args: tuple, kwargs: dict) -> Any:
        self.stats.original += 1
        self.stats.reasons[reason] += 1
        with encoder_lock(self.encoder):  # never inside another handle's or manager's graph-path window
            return self._original(*args, **kwargs)

    def _mm_kwargs(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any] | None, str | None]:
        """The multimodal kwargs of this call, or None and why the graphs cannot serve it."""
        name = _MODALITY.get() or FEATURE_METHODS.get(self.spec.encoder.method) or self.spec.modality_names[0]
        return call_inputs(self.spec, self.adapter, self._signature, name, args, kwargs)

    def _route(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._serve(args, kwargs)

    def _serve(self, args: tuple, kwargs: dict) -> Any:
        """The call through the graphs, or the original call where they cannot serve it. A failure on the graph
        path (capture again, read the inputs, replay, rebuild the output) turns routing off for good with one
        warning, and the original call answers; what the original call raises is the caller's to see."""
        self.stats.calls += 1
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.encoder.parameters()):
            return self._fallback("autograd is on (graphs serve inference: use torch.no_grad())", args, kwargs)
        if self._broken is None:
            try:
                routed = self._through_graphs(args, kwargs)
            except Exception as exc:  # noqa: BLE001  (vitcg's own path failed: the original call answers)
                self._broken = f"the graph path failed: {type(exc).__name__}: {exc}"
                warnings.warn(f"vitcg.accelerate: {self._broken}; the encoder runs without graphs from now on",
                              RuntimeWarning, stacklevel=4)
                routed = self._broken
        else:
            routed = self._broken
        if not isinstance(routed, (str, _Learn)):
            return routed.value
        output = self._fallback(routed.reason if isinstance(routed, _Learn) else routed, args, kwargs)
        if isinstance(routed, _Learn):
            try:
                self._layout = _Layout.learn(self.spec, output, routed.rows)
            except SpecRuntimeError as exc:
                # the spec does not describe this model's output: every later call runs the original, saying why
                self._broken = f"the spec does not fit this model: {exc}"
                warnings.warn(f"vitcg.accelerate: {self._broken}; the encoder runs without graphs", RuntimeWarning,
                              stacklevel=4)
        return output

    def _through_graphs(self, args: tuple, kwargs: dict) -> _Routed | _Learn | str:
        """The call's output from the graphs, or why the original call must answer it (with :class:`_Learn`: to
        learn the output layout from it)."""
        mm, reason = self._mm_kwargs(args, kwargs)
        if mm is None:
            return reason
        parameter = next(self.encoder.parameters())
        if (parameter.device, parameter.dtype) != (self.manager.device, self.manager.dtype):
            self.stats.recaptures += 1
            self._layout = None
            self._capture()
        try:
            rows = sum(i.output_tokens for i in self.adapter.get_encoder_cudagraph_item_specs(mm))
        except InputError as exc:
            return f"inputs the spec does not describe: {exc}"
        if self._layout is None:
            return _Learn(rows)
        self.stats.routed += 1
        parts = self.manager.execute(mm)
        combined = torch.cat(parts) if parts else torch.zeros(0, self.adapter.geometry["out_hidden_size"])
        return _Routed(self._layout.build(combined, parts))


@dataclass(frozen=True)
class _Routed:
    """A call the graphs answered."""

    value: Any


@dataclass(frozen=True)
class _Learn:
    """A call the original answers, its output teaching the layout of the graphs' answers."""

    rows: int
    reason: str = "first call: learning the output layout"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _with_modality(method: Callable, modality: str, known: tuple[str, ...]) -> Callable:
    """``method`` telling the router which modality it asks for. Inside an outer call of a modality in ``known``
    (the spec's), the outer one stays: Kimi-K2.5's ``get_video_features`` encodes through
    ``get_image_features``, and its videos must reach the video graphs."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        outer = _MODALITY.get()
        token = _MODALITY.set(outer if outer in known else modality)
        try:
            return method(*args, **kwargs)
        finally:
            _MODALITY.reset(token)
    return call


def accelerate(model: nn.Module, *, spec: Spec | str | None = None, specs: SpecSource | SpecFolders | None = None,
               progress: bool | None = None, compile: bool | None = None, options: ManagerOptions | None = None,
               **engine_limits: Any) -> Accelerated:
    """Route ``model``'s vision encoder through budget CUDA graphs (on CUDA; the static path elsewhere).

    ``model``: a loaded transformers VLM (a class in a spec's ``architectures``, or its inner model).
    ``spec``: a spec or spec name; by default the spec whose architectures or model types match the model,
    from :func:`source_for` ``specs``: the packaged specs, then ``$VITCG_SPECS_DIR``, then ``specs`` (a folder
    or a list of folders, whose specs replace packaged ones of the same name), or a :class:`~vitcg.lang.SpecSource`.
    ``engine_limits``: the manager's engine options (``max_num_batched_tokens``, ``token_budgets``,
    ``max_items_per_batch``...); ``options``: the manager's packing and routing
    (:class:`~vitcg.runtime.manager.ManagerOptions`). ``progress``: a capture progress bar (default: when stderr is a terminal).
    ``compile``: compile the encoder's repeated blocks with inductor before capture (faster replays; the first
    capture compiles one block per budget, later processes load its kernels from vitcg's persistent compile cache,
    see :mod:`vitcg.runtime.regions` and :mod:`vitcg.runtime.compile_cache`). None (default): on CUDA, and
    without them (with a warning) when their compilation fails; off on the CPU's static path. False: never.

    Build it after moving the model to its device and dtype; if the encoder moves later, the next call
    captures again. Calling it again on the same model restores the first routing and starts over.
    A spec file that does not validate makes only its own spec unusable (logged once at WARNING): every
    other spec, and the lookup by model type, work as without it.
    Raises UsageError when no spec matches (listing the supported model types) or the spec's encoder is
    not where the spec says; SpecError, with its diagnostics, when ``spec`` names a spec whose file does not
    validate."""
    previous = getattr(model, "_vitcg", None)
    if isinstance(previous, Accelerated):
        previous.restore()
    chosen = _spec_for(model, spec, specs)
    if chosen.unavailable:
        raise UsageError(f"{chosen.name}: {chosen.unavailable}")
    owners, encoder = encoder_of(model, chosen)
    if progress is None:
        progress = sys.stderr.isatty()
    return Accelerated(model, chosen, [*owners, encoder], encoder, engine_limits, progress, compile, options)
