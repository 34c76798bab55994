"""Host integers a whole-encoder graph passes to the layers of a stack (``layer_args`` in a spec).

Some towers loop over their layers passing each one boundaries alone: MuseGlimmer's forward calls every layer
with ``cu_seqlens`` set to the full-attention or the window boundaries, by ``config.layer_types[i]``, and no
``max_seqlen``, so attention reads the longest segment with ``.item()``, a host sync no graph captures. The
boundaries themselves are replay buffers the forward pops from its kwargs; only the bound is missing. While the
fixed-shape forward runs, :func:`passed` adds each layer's host integers (``max_seqlen`` for full-attention
layers, ``max_window_seqlen`` for window layers) to its call through a forward pre-hook, and removes the hooks
after it, so the eager forward stays the model's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

from ..errors import SpecRuntimeError
from ..lang.model import LayerArgs
from .scope import submodule


class LayerCalls:
    """Each layer of ``layer_args.module`` with the buffer names of its arguments, read once from the config."""

    def __init__(self, name: str, args: LayerArgs, module: nn.Module):
        """Raises SpecRuntimeError when the module is no ModuleList, or the config's layer types do not list one
        type per layer, each with an entry in ``by_type``."""
        layers = submodule(module, args.module)
        if not isinstance(layers, nn.ModuleList):
            raise SpecRuntimeError(f"{name}: layer_args.module {args.module!r} is a {type(layers).__name__}, "
                                   "not the nn.ModuleList of layers the forward loops over")
        types = getattr(module.config, args.types, None)
        if not isinstance(types, (list, tuple)) or len(types) != len(layers):
            raise SpecRuntimeError(f"{name}: config.{args.types} = {types!r} does not give a type to each of the "
                                   f"{len(layers)} layers of {args.module!r}")
        unknown = sorted(set(types) - set(args.by_type))
        if unknown:
            raise SpecRuntimeError(f"{name}: config.{args.types} lists layer types {', '.join(unknown)} that "
                                   "layer_args.by_type leaves out")
        self.plan = [(layer, dict(args.by_type[kind])) for layer, kind in zip(layers, types)]
        """(layer, {argument: buffer name}) per layer, in order."""

    @contextmanager
    def passed(self, inputs: Mapping[str, Any]) -> Iterator[None]:
        """Inside the block, each layer's call gets its arguments' values from ``inputs`` (by buffer name), where
        the forward passes none of its own."""
        handles = [layer.register_forward_pre_hook(_adding({arg: inputs[b] for arg, b in names.items()}),
                                                   with_kwargs=True) for layer, names in self.plan]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _adding(values: Mapping[str, Any]):
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, **{k: v for k, v in values.items() if kwargs.get(k) is None}}
    return hook
