"""Epilogues: the data-dependent end of a forward, moved after the graph (``epilogue`` in a spec).

``masked_rows``: a forward that ends by keeping the rows of a boolean mask (``hidden_states[pooler_mask]``)
has an output length that depends on the data, which no graph can capture. Inside the fixed-shape forward,
:func:`masked_rows` answers each such selection with every row, reordered by a stable partition: the rows
the mask keeps come first, in their order, then the others. The shape stays fixed, and row-wise steps after
the selection (a scale, a cast) run on all rows. After the graph, eagerly, the output is cut to the rows the
items keep: ``items.output_tokens`` per item (with ``items.valid`` where the count depends on padding), which
the protocol's ``postprocess_encoder_output`` already does. The output is one tensor, so a protocol-only
manager (vLLM's) drives such a spec unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from ..errors import SpecRuntimeError

EPILOGUES = ("masked_rows",)
"""The values of ``epilogue.select`` this runtime implements (the schema's enum lists the same)."""


def kept_first(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``rows[mask]`` with a fixed shape: every row of ``rows`` flattened over the mask's dimensions, those the
    mask keeps first (in order), the others after them. Raises SpecRuntimeError when the mask does not cover
    the leading dimensions of ``rows``."""
    if mask.ndim == 0 or tuple(mask.shape) != tuple(rows.shape[:mask.ndim]):
        raise SpecRuntimeError(f"epilogue masked_rows: a boolean mask of shape {tuple(mask.shape)} selects from a "
                               f"tensor of shape {tuple(rows.shape)}; only masks over whole leading dimensions "
                               "(rows) can be deferred")
    order = torch.argsort(torch.logical_not(mask.reshape(-1)).to(torch.uint8), stable=True)
    return rows.reshape(-1, *rows.shape[mask.ndim:]).index_select(0, order)


def _mask_index(func, args) -> torch.Tensor | None:
    if func is not torch.Tensor.__getitem__ or len(args) < 2:
        return None
    index = args[1]
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        return index
    if isinstance(index, tuple) and any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in index):
        raise SpecRuntimeError("epilogue masked_rows: a boolean mask inside a tuple index cannot be deferred; only "
                               "x[mask] over whole leading dimensions can")
    return None


class _MaskedRows(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        mask = _mask_index(func, args)
        if mask is not None:
            return kept_first(args[0], mask)
        return func(*args, **(kwargs or {}))


@contextmanager
def masked_rows() -> Iterator[None]:
    """Inside the block, ``x[mask]`` (a boolean mask over leading dimensions) returns :func:`kept_first`."""
    with _MaskedRows():
        yield


@contextmanager
def epilogue(select: str | None) -> Iterator[None]:
    """The fixed-shape side of ``epilogue.select`` (None: nothing). Raises SpecRuntimeError for an unknown one."""
    if select is None:
        yield
        return
    if select not in EPILOGUES:
        raise SpecRuntimeError(f"epilogue {select!r} is unknown; this runtime implements {', '.join(EPILOGUES)}")
    with masked_rows():
        yield
