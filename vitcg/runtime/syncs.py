"""Host syncs and data-dependent shapes, made to fail loudly where a CUDA graph would not capture them.

On CPU nothing is captured, so a fixed-shape forward that reads a tensor on the host (``.item()``,
``.tolist()``, ``bool(t)``), picks a shape from data (``nonzero``, boolean indexing, ``repeat_interleave``
without ``output_size``) or copies host data in (``torch.tensor``) would pass a CPU check and then fail
(or silently bake in one input) on the GPU. :func:`no_host_syncs` raises at the first such call instead.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from ..errors import HostSyncError

__all__ = ["HostSyncError", "no_host_syncs", "tensor_text_without_data"]


_ALWAYS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
                     "unique", "unique_consecutive", "masked_select", "cpu", "numpy", "tensor", "as_tensor"})


_TEXT = frozenset({"__format__", "__repr__", "__str__"})
"""The calls that turn a tensor into text."""


def _offending(func, args, kwargs) -> str | None:
    """What about this call a CUDA graph cannot capture, or None."""
    name = getattr(func, "__name__", str(func))
    if name in _ALWAYS:
        return name
    if name in _TEXT:  # printing reads the values on the host
        return f"{name} (a tensor formatted into text)"
    check = _BY_ARGUMENTS.get(name)
    return check(args, kwargs or {}) if check is not None else None


def _repeats_without_size(args: tuple, kwargs: dict) -> str | None:
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
    if "output_size" not in kwargs and isinstance(repeats, torch.Tensor) and repeats.numel() > 1:
        return "repeat_interleave without output_size"
    return None


def _mask_index(args: tuple, kwargs: dict) -> str | None:
    parts = (args[1] if isinstance(args[1], tuple) else (args[1],)) if len(args) > 1 else ()
    if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
        return "boolean-mask indexing"
    if any(isinstance(p, list) for p in parts):  # torch builds a host index tensor and copies it in
        return "indexing with a Python list (a host index copied to the device)"
    return None


def _where_condition(args: tuple, kwargs: dict) -> str | None:
    return "where(condition)" if len(args) == 1 and not kwargs else None


_BY_ARGUMENTS = {"repeat_interleave": _repeats_without_size, "__getitem__": _mask_index, "where": _where_condition}
"""Calls a graph cannot capture with some arguments only: the check of each, by name."""


def _caller() -> str:
    """Where the model made the call: the innermost frame in a transformers model file, else the innermost
    frame outside torch and vitcg."""
    paths = [(f.filename.replace("\\", "/"), f.lineno) for f in reversed(traceback.extract_stack())]
    outside = [(p, n) for p, n in paths if "/torch/" not in p and "/vitcg/" not in p]
    chosen = next(((p, n) for p, n in outside if "/transformers/models/" in p), outside[0] if outside else None)
    return f"{chosen[0].rsplit('/', 1)[-1]}:{chosen[1]}" if chosen else "unknown location"


class _NoHostSyncs(TorchFunctionMode):
    def __init__(self, host: tuple[torch.Tensor, ...] = ()):
        super().__init__()
        self._host = host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        what = _offending(func, args, kwargs)
        if what is not None and not (args and any(args[0] is t for t in self._host)):
            raise HostSyncError(
                f"the fixed-shape forward calls {what} at {_caller()}: a CUDA graph cannot capture it. Precompute "
                "what it computes as a buffer, or leave that step outside the graph with graph_scope")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_syncs(host: tuple[torch.Tensor, ...] = ()) -> Iterator[None]:
    """Inside the block, host syncs and data-dependent shapes raise :class:`HostSyncError`, except reads of the
    ``host`` tensors themselves (buffers kept on the host, whose capture values a graph bakes in)."""
    with _NoHostSyncs(host):
        yield


class _TensorText(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in _TEXT and args and isinstance(args[0], torch.Tensor):
            tensor = args[0]
            return f"tensor(shape={tuple(tensor.shape)}, dtype={tensor.dtype}, device={tensor.device})"
        return func(*args, **(kwargs or {}))


@contextmanager
def tensor_text_without_data() -> Iterator[None]:
    """Inside the block, a tensor turned into text (``f"{t}"``, ``str(t)``, ``repr(t)``) reads no data: it reads
    as its shape, dtype and device. Models build check messages before the check runs (MiniCPM-V's window merger
    formats ``f"Patch grids {target_sizes} ..."`` on every call), and printing a tensor copies it to the host: a
    sync no CUDA graph captures, and one that :func:`no_host_syncs` cannot see, since the copy happens inside
    ``Tensor.__format__``. Only such messages lose their values: a graph forward computes nothing from text."""
    with _TensorText():
        yield
