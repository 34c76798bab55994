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
from ..lang.model import Spec
from .adapter import adapter_for
from .attention import encoder_lock
from .compile_cache import CompileCacheUse, capture_compiled
from .hf import Layout, call_inputs, encoder_of
from .manager import EncoderCudaGraphManager, ManagerOptions, ManagerStats

_MODALITY: contextvars.ContextVar[str | None] = contextvars.ContextVar("vitcg_modality", default=None)
FEATURE_METHODS = {"get_image_features": "image", "get_video_features": "video"}
"""VLM methods whose calls say which modality the encoder is asked for."""


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
        self._layout: Layout | None = None
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
                self.adapter = adapter_for(self.spec, self.encoder, compile_forward=self.compile_forward,
                                           compile_eager=self.compile_forward)
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
                self._layout = Layout.learn(self.spec, output, routed.rows)
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
    see :mod:`vitcg.runtime.regions` and :mod:`vitcg.runtime.compile_cache`), and for the calls routed away from
    the graphs, with dynamic shapes (compiled at the first such call of a size the cache does not serve, and
    stored for later processes). None (default): on CUDA, and
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
