"""Graph scope: capture one submodule call, or a stack of layers, inside the model's own eager forward.

:class:`Boundary` is what an adapter asks of the part its graphs capture, chosen once: :class:`Scope` here, or
the whole encoder call (:class:`vitcg.runtime.adapter.WholeCall`).

``graph_scope.module`` names a submodule. If it is a module, each of its calls is answered by a replay.
If it is an ``nn.ModuleList`` the parent loops over, the whole loop is one graph: the call of layer 0
replays the captured stack and returns its final output, and layers 1..L-1 pass that output through,
after checking that each gets exactly the previous layer's output and the same other arguments (a
parent that changes anything between layers cannot be one graph, and is told so).

The call's arguments are matched to ``scope_arg`` buffers by name; ``name.0``, ``name.1`` address the
elements of a tuple argument (rotary ``(cos, sin)``), and ``params.rows_dim`` puts the rows on another
dimension (``(1, rows, hidden)`` tensors). Buffers are stored rows-first whatever the call's layout, so
padding rules stay one-dimensional. Any argument that no buffer carries must be None or its default.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import SpecRuntimeError
from ..lang.model import Buffer, Spec
from .extension import Replay
from .padding import ABSENT_VALUES, EMPTY


@runtime_checkable
class Boundary(Protocol):
    """The part of the encoder's forward a graph captures."""

    scoped: bool
    """Whether it is one submodule call inside the model's eager forward (then the model's forward serves
    packs, :meth:`Scope.run`)."""
    target: nn.Module
    """The module whose repeated blocks may be compiled (:mod:`vitcg.runtime.regions`)."""

    def use_forwards(self, forwards: Mapping[nn.Module, Callable[..., Any]]) -> None:
        """Run those blocks with ``forwards`` (compiled ones) inside :meth:`forward`."""

    def compile(self) -> None:
        """Run the captured computation through ``torch.compile`` (one compilation, dynamic shapes)."""

    def plain(self) -> None:
        """Undo :meth:`compile` and :meth:`use_forwards`: the model's own code from here on."""

    def storage_shape(self, buffer: Buffer, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The call's shape of ``buffer`` as it is stored: rows first, as the inputs come."""

    def forward(self, inputs: Mapping[str, Any]) -> Any:
        """The captured computation on capture buffer values."""


def submodule(module: nn.Module, path: str) -> nn.Module:
    """``module.get_submodule(path)``. Raises SpecRuntimeError with a close match when the path is wrong."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        from ..errors import suggest

        names = [name for name, _ in module.named_modules() if name]
        hint = suggest(path, names)
        raise SpecRuntimeError(f"graph_scope module {path!r} is not in {type(module).__name__}"
                         + (f"; {hint}" if hint else "")) from None


class Scope:
    """The captured part of a graph-scoped spec, and the interception of its calls (a :class:`Boundary`)."""

    scoped = True

    def __init__(self, spec: Spec, module: nn.Module):
        self.spec = spec
        self.target = submodule(module, spec.graph_scope)
        self.layers = list(self.target) if isinstance(self.target, nn.ModuleList) else [self.target]
        self.stack = isinstance(self.target, nn.ModuleList)
        if not self.layers:
            raise SpecRuntimeError(f"{spec.name}: graph_scope {spec.graph_scope!r} is an empty ModuleList")
        self.signature = inspect.signature(self.layers[0].forward)
        self._forwards = [layer.forward for layer in self.layers]
        """The original bound forwards: the captured computation calls these, never the interceptors."""
        self._own_forwards = list(self._forwards)
        self.rows = spec.rows_buffer
        """The buffer whose rows are the call's rows: it sets the capacity and how outputs are cut."""

    def use_forwards(self, forwards: Mapping[nn.Module, Callable[..., Any]]) -> None:
        """Run the layers in :meth:`forward` with ``forwards`` (compiled ones, :mod:`vitcg.runtime.regions`)
        where given: the captured computation calls these, not whatever ``layer.forward`` is at the time."""
        self._forwards = [forwards.get(layer, forward) for layer, forward in zip(self.layers, self._forwards)]

    def compile(self) -> None:
        """Run :meth:`forward` through ``torch.compile`` (a scope without repeated blocks)."""
        self.forward = torch.compile(self.forward, dynamic=True)

    def plain(self) -> None:
        """Undo :meth:`compile` and :meth:`use_forwards`: the layers' own forwards from here on."""
        self._forwards = list(self._own_forwards)
        vars(self).pop("forward", None)

    def storage_shape(self, buffer: Buffer, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The call's shape of ``buffer`` with its rows moved first (how the buffer is stored)."""
        d = buffer.rows_dim
        return (shape[d], *shape[:d], *shape[d + 1:]) if d else shape

    def call_kwargs(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Stored buffer values -> the call's keyword arguments (rows back in place, tuples rebuilt)."""
        kwargs: dict[str, Any] = {}
        tuples: dict[str, dict[int, Any]] = {}
        for buffer in self.spec.buffers:
            value = values[buffer.name]
            if isinstance(value, torch.Tensor) and buffer.rows_dim:
                value = value.movedim(0, buffer.rows_dim)
            name, _, index = buffer.arg.partition(".")
            if index:
                tuples.setdefault(name, {})[int(index)] = value
            else:
                kwargs[name] = value
        for name, parts in tuples.items():
            kwargs[name] = tuple(parts[i] for i in range(len(parts)))
        for name, param in self.signature.parameters.items():
            # a required argument no buffer carries can only ever be None (see _values)
            if (name not in kwargs and param.default is param.empty
                    and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)):
                kwargs[name] = None
        return kwargs

    def forward(self, values: Mapping[str, Any]) -> Any:
        """The captured computation: the scoped call, or every layer of the stack in turn."""
        kwargs = self.call_kwargs(values)
        if not self.stack:
            return self._forwards[0](**kwargs)
        hidden = kwargs.pop(self.rows.arg)
        for forward in self._forwards:
            hidden = forward(**{self.rows.arg: hidden}, **kwargs)
            if not isinstance(hidden, torch.Tensor):
                raise SpecRuntimeError(f"{self.spec.name}: a layer of graph_scope {self.spec.graph_scope!r} returned "
                                 f"{type(hidden).__name__}; a stack scope needs layers that return the hidden tensor")
        return hidden

    def _arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        for name, param in self.signature.parameters.items():
            if param.kind is param.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        flat = {}
        for name, value in arguments.items():
            if isinstance(value, (tuple, list)) and any(f"{name}.{i}" == b.arg for b in self.spec.buffers
                                                        for i in range(len(value))):
                flat.update({f"{name}.{i}": v for i, v in enumerate(value)})
            else:
                flat[name] = value
        return flat

    def _values(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments as buffer values; anything no buffer carries must be None or its default."""
        covered = {b.arg for b in self.spec.buffers}
        for name, value in arguments.items():
            if name not in covered and value is not None:
                self._check_uncarried(name, value)
        return {buffer.name: self._value(buffer, arguments) for buffer in self.spec.buffers}

    def _check_uncarried(self, name: str, value: Any) -> None:
        """An argument no buffer carries is fine only as its default (or, for a stack, the last layer's hidden
        states); SpecRuntimeError naming it otherwise: the graph would silently ignore it."""
        if name == HIDDEN_STATES_FLAG and self.stack:
            if _last_layer_only(value):
                return
            raise SpecRuntimeError(f"{self.spec.name}: the scoped call passes {name}={value!r}, but graph_scope "
                                   f"{self.spec.graph_scope!r} is one graph for the whole stack: only the last "
                                   "layer's output exists, so only -1 can be asked for")
        param = self.signature.parameters.get(name)
        default = param.default if param is not None else inspect.Parameter.empty
        if not isinstance(value, torch.Tensor) and default is not inspect.Parameter.empty and value == default:
            return
        raise SpecRuntimeError(f"{self.spec.name}: the scoped call passes {name}={_described(value)}, which no "
                               f"buffer carries (the graph would silently ignore it); {_carry(name, value)}")

    def _value(self, buffer: Buffer, arguments: Mapping[str, Any]) -> Any:
        """One buffer's value from the call's arguments (rows first), None for a host buffer."""
        value = arguments.get(buffer.arg)
        if buffer.is_host:
            return None
        if value is None:
            return self._absent(buffer, arguments)
        if not isinstance(value, torch.Tensor):
            raise SpecRuntimeError(f"{self.spec.name}: buffer {buffer.name!r} (arg: {buffer.arg}) expects a tensor, "
                                   f"but the scoped call passes {buffer.arg}={_described(value)}; "
                                   f"{_carry(buffer.arg, value)}")
        return value.movedim(buffer.rows_dim, 0) if buffer.rows_dim else value

    def _absent(self, buffer: Buffer, arguments: Mapping[str, Any]) -> Any:
        """The value of ``buffer`` for a call that passes None for it: its ``absent`` value (from the call's rows),
        or for a mask (padding: ones) EMPTY, all ones. Raises SpecRuntimeError for any other buffer, naming the
        key that would make a segment buffer absent."""
        if buffer.absent is not None:
            rows = arguments.get(self.rows.arg)
            if not isinstance(rows, torch.Tensor):
                raise SpecRuntimeError(f"{self.spec.name}: buffer {buffer.name!r} (absent: {buffer.absent}) takes its "
                                       f"rows from {self.rows.arg!r}, which the scoped call passes as "
                                       f"{_described(rows)}")
            return ABSENT_VALUES[buffer.absent](rows.shape[self.rows.rows_dim])
        if buffer.padding == "ones":
            return EMPTY  # no mask: attend to everything
        fix = (f"; if the model leaves it out for a call of one segment, add absent: one_segment to buffer "
               f"{buffer.name!r}" if buffer.padding == "trailing_segment" else "")
        raise SpecRuntimeError(f"{self.spec.name}: the scoped call passes no {buffer.arg!r}, but the graph was captured "
                               f"with one; only a mask (padding: ones) or a buffer with an absent key may be absent"
                               + fix)

    def run(self, forward: Callable[[], Any], replay: Replay) -> Any:
        """``forward()`` with every call of the scope answered by ``replay``. Raises SpecRuntimeError when the scope
        is never called, or a stack's layers are not chained with the same arguments."""
        state: dict[str, Any] = {"calls": 0, "first": None, "last": None, "next": 0}
        rows_dim = self.rows.rows_dim

        def answer(args, kwargs):
            if state["calls"] and state["next"] != len(self.layers):
                raise SpecRuntimeError(f"{self.spec.name}: only {state['next']} of the {len(self.layers)} layers of "
                                 f"graph_scope {self.spec.graph_scope!r} ran; the stack cannot be one graph")
            arguments = self._arguments(args, kwargs)
            rows = arguments.get(self.rows.arg)
            captured, capture_values = replay(self._values(arguments))
            capacity = capture_values[self.rows.name].shape[0]
            out = _slice_rows(captured, capacity, rows.shape[rows_dim] if rows is not None else None, rows_dim)
            state.update(calls=state["calls"] + 1, first=arguments, last=out, next=1)
            return out

        def layer(index: int):
            def intercept(*args, **kwargs):
                if index == 0:
                    return answer(args, kwargs)
                arguments = self._arguments(args, kwargs)
                if state["next"] != index or arguments.get(self.rows.arg) is not state["last"]:
                    raise SpecRuntimeError(f"{self.spec.name}: layer {index} of graph_scope {self.spec.graph_scope!r} does "
                                     "not receive the previous layer's output; the stack cannot be one graph")
                changed = [k for k, v in arguments.items() if k != self.rows.arg
                           and not _same(v, state["first"].get(k))]
                if changed:
                    raise SpecRuntimeError(f"{self.spec.name}: layer {index} of graph_scope {self.spec.graph_scope!r} gets "
                                     f"other {', '.join(changed)} than layer 0; the stack cannot be one graph")
                state["next"] = index + 1
                return state["last"]
            return intercept

        saved = [vars(m).get("forward") for m in self.layers]
        for index, module in enumerate(self.layers):
            module.forward = layer(index)
        try:
            output = forward()
        finally:
            for module, previous in zip(self.layers, saved):
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous
        if state["calls"] and state["next"] != len(self.layers):
            raise SpecRuntimeError(f"{self.spec.name}: only {state['next']} of the {len(self.layers)} layers of graph_scope "
                             f"{self.spec.graph_scope!r} ran; the stack cannot be one graph")
        return output, state["calls"]


HIDDEN_STATES_FLAG = "output_hidden_states"
"""transformers' request for layer outputs, which reaches every layer through ``**kwargs`` although output
capture reads them with hooks on the layers: the layers compute the same either way. A stack's graph has only
its last layer's output (every layer's hook sees that), so the flag passes when it asks for the last alone."""


def _last_layer_only(value: Any) -> bool:
    """Whether an ``output_hidden_states`` value selects the last layer's output and nothing else."""
    if isinstance(value, (list, tuple)):
        return len(value) == 1 and _last_layer_only(value[0])
    return not isinstance(value, bool) and value == -1


def _described(value: Any) -> str:
    """A call argument for a message: its type, and its length when it is a list or tuple."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} elements"
    return type(value).__name__


def _carry(name: str, value: Any) -> str:
    """What the spec needs to carry argument ``name`` into the graph: one scope_arg buffer per element of a list
    or tuple (``arg: NAME.0`` ...), else one buffer."""
    if isinstance(value, (list, tuple)) and value:
        last = len(value) - 1
        each = f"arg: {name}.0" if not last else f"arg: {name}.0 ... {name}.{last}"
        return f"add one scope_arg buffer per element ({each})"
    return f"add a scope_arg buffer for it (arg: {name})"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _slice_rows(value: Any, capacity: int, rows: int | None, dim: int) -> Any:
    """``value`` with every tensor whose ``dim`` is the capacity cut to ``rows`` there, cloned; same structure."""
    if isinstance(value, torch.Tensor):
        if rows is not None and value.dim() > dim and value.shape[dim] == capacity:
            return value.narrow(dim, 0, rows).clone()
        return value.clone()
    if isinstance(value, Mapping):
        return type(value)(**{k: _slice_rows(v, capacity, rows, dim) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_slice_rows(v, capacity, rows, dim) for v in value)
    return value
