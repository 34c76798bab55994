"""Graph-safe forms of modules whose own forward builds per-item structure on the host (a spec's ``replace``).

LFM-VL's convolution layers reshape each item's rows to its grid in a Python loop over ``grid_thw.tolist()``: a
graph of that code would bake in the grids of its capture. A replacement computes the same thing from a buffer
the providers fill on the host at every replay (:data:`vitcg.lang.catalogue.REPLACEMENTS` names each form and
the provider of the buffer it reads). The encoder call passes that buffer as a keyword argument, which the model
hands down to the module with its other keyword arguments; where it is absent, in every call that is not
vitcg's (the model's own eager forward, a check's reference), the module's own forward runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import SpecRuntimeError
from ..lang.catalogue import REPLACEMENTS
from ..lang.model import Spec

Forward = Callable[..., Any]
"""A form's forward: ``(module, own_forward, argument, *args, **kwargs)``."""
Fits = Callable[[nn.Module], "str | None"]
"""What a module that holds the form's parts (:attr:`~vitcg.lang.catalogue.Replacement.attributes`) still lacks
for its forward, in words, or None."""
FORMS: dict[str, tuple[Forward, Fits]] = {}
"""Replacement name (:data:`vitcg.lang.catalogue.REPLACEMENTS`) -> its forward and its check of a module."""
MARK = "_vitcg_replaced"
"""The class attribute of a replaced module: the name of its form (a module is replaced once)."""


def form(name: str, fits: Fits) -> Callable[[Forward], Forward]:
    def register(fn: Forward) -> Forward:
        FORMS[name] = (fn, fits)
        return fn
    return register


def grid_conv(values: torch.Tensor, conv: nn.Conv2d, neighbours: torch.Tensor) -> torch.Tensor:
    """A depthwise 'same' convolution of ``values`` (rows, channels) over each frame's grid, as a gather:
    ``neighbours`` (rows, k * k) holds the rows each output row reads (-1: outside its frame, zero). Raises
    SpecRuntimeError when its taps are not the kernel's (shapes only: no sync)."""
    channels = values.shape[-1]
    weight = conv.weight.reshape(channels, -1).to(values.dtype)
    if neighbours.shape[-1] != weight.shape[1]:
        raise SpecRuntimeError(f"grid_neighbours holds {neighbours.shape[-1]} cells per row, but the convolution's "
                               f"kernel has {weight.shape[1]}: check geometry conv_kernel_size")
    padded = torch.cat([values, values.new_zeros(1, channels)])  # row -1: the zeros outside every frame
    out = padded[neighbours[:, 0]] * weight[:, 0]
    for tap in range(1, weight.shape[1]):
        out = out + padded[neighbours[:, tap]] * weight[:, tap]
    return out if conv.bias is None else out + conv.bias.to(values.dtype)


def _depthwise_conv(module: nn.Module) -> str | None:
    conv = module.spatial_conv
    depthwise = (isinstance(conv, nn.Conv2d) and conv.groups == conv.in_channels == conv.out_channels
                 and conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.kernel_size[0] == conv.kernel_size[1]
                 and conv.padding == (conv.kernel_size[0] // 2,) * 2)
    return None if depthwise else "has no depthwise 'same' spatial_conv"


@form("gated_grid_conv", _depthwise_conv)
def _gated_grid_conv(module: nn.Module, own: Callable[..., Any], argument: str, hidden_states: torch.Tensor,
                     *args: Any, **kwargs: Any) -> torch.Tensor:
    neighbours = kwargs.get(argument)
    if neighbours is None:
        return own(hidden_states, *args, **kwargs)
    input_gate, output_gate, values = module.in_proj(hidden_states).chunk(3, dim=-1)
    return module.out_proj(output_gate * grid_conv(input_gate * values, module.spatial_conv, neighbours))


_CLASSES: dict[tuple[type, str], type] = {}
"""(a module class, a form) -> the subclass whose forward is the form: one class for every module replaced, so that
the compiled blocks the layers share trace it once (a forward set per instance would be a guard per layer)."""
ARGUMENT = "_vitcg_argument"
"""The attribute of a replaced module naming the keyword argument its form reads."""


def _replaced(cls: type, name: str) -> type:
    key = (cls, name)
    if key not in _CLASSES:
        run = FORMS[name][0]

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return run(self, super(subclass, self).forward, getattr(self, ARGUMENT), *args, **kwargs)

        subclass = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                               "__qualname__": cls.__qualname__, MARK: name})
        _CLASSES[key] = subclass
    return _CLASSES[key]


def install(spec: Spec, encoder: nn.Module) -> None:
    """Put each of ``spec.replace``'s forms in place of every module of its class inside ``encoder``: the module
    becomes an instance of a subclass whose forward is the form (:func:`_replaced`; once: a module already
    replaced keeps its form). Raises SpecRuntimeError naming the class when the encoder holds no such module, or
    one lacks what the form reads."""
    for entry in spec.replace:
        record = REPLACEMENTS[entry.form]
        targets = [m for m in encoder.modules() if type(m).__name__ == entry.module]
        if not targets:
            raise SpecRuntimeError(f"{spec.name}: replace: {type(encoder).__name__} holds no module of class "
                                   f"{entry.module!r}")
        for target in targets:
            missing = [name for name in record.attributes if not isinstance(getattr(target, name, None), nn.Module)]
            lack = f"lacks {', '.join(missing)}" if missing else FORMS[entry.form][1](target)
            if lack is not None:
                raise SpecRuntimeError(f"{spec.name}: replace: a {entry.module} {lack}, which {entry.form!r} reads "
                                       f"({record.doc})")
            if getattr(target, MARK, None) is None:
                setattr(target, ARGUMENT, entry.argument)
                target.__class__ = _replaced(type(target), entry.form)
