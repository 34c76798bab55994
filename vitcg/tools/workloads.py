"""How ``vitcg check`` and ``vitcg bench`` feed an encoder: multimodal kwargs of given item sizes
(:class:`InputBuilder`), the bench workloads shaped as the model's processor would shape them (the spec's
``tests.shaping``), and the relative error that judges a graph output against eager."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..lang.catalogue import GRID_COLUMNS, buffer_names
from ..lang.model import Modality, Spec
from ..runtime.adapter import SpecAdapter
from .sizes import MIXED_SIZES, WORKLOADS, Workload

__all__ = ["MIXED_SIZES", "WORKLOADS", "Workload", "InputBuilder", "make_inputs", "on_device", "relative_error"]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` (Frobenius norms, float64): the error relative to the output's size.

    A max-abs ratio would judge a 32-layer bf16 network by its single worst element; the norm ratio is
    the usual "relative error" of a tensor and is what DESIGN.md's figures report.
    """
    if not want.numel():
        return 0.0
    want64 = want.double()
    scale = torch.linalg.vector_norm(want64).item()
    diff = torch.linalg.vector_norm(got.double() - want64).item()
    return diff / scale if scale > 0 else diff


Inputs = dict[str, torch.Tensor]


class InputBuilder:
    """Builds multimodal kwargs of given item sizes for one spec: seeded random pixels, and every other
    input role as the spec's ``tests.inputs`` describes it."""

    def __init__(self, spec: Spec, adapter: SpecAdapter, generator: torch.Generator):
        self.spec, self.adapter, self.generator = spec, adapter, generator
        self.geometry = adapter.geometry

    def row_shape(self, role: str = "pixels") -> tuple[int, ...]:
        """Shape of one row (a patch row or a tile) of ``role``: from ``tests.inputs``, or for pixels from the
        pixel buffer's shape formula."""
        example = self.spec.tests.inputs.get(role)
        if example is not None:
            return tuple(f.evaluate(self.geometry) for f in example.shape)
        pixels = self.spec.providers()["pixels"]
        budget = self.spec.budget_min.evaluate({**self.geometry, "max_num_batched_tokens": 1 << 20,
                                                "max_model_len": 1 << 20})
        names = {**buffer_names(budget, 1, 1), **self.geometry}
        return pixels.pixel_layout(names).row if pixels.rows_dim else tuple(f.evaluate(names) for f in pixels.shape[1:])

    def _fill(self, role: str, rows: int) -> torch.Tensor:
        example = self.spec.tests.inputs.get(role)
        shape = (rows, *self.row_shape(role))
        fill = example.fill if example is not None else "randn"
        dtype = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64}.get(
            example.dtype if example is not None else "model", torch.float32)
        if not isinstance(fill, str):  # one formula per element of the last dimension, `i` the index before it
            count = shape[-2] if len(shape) > 2 else 1
            row = torch.tensor([[f.evaluate({**self.geometry, "i": i}) for f in fill] for i in range(count)],
                               dtype=dtype)
            return (row.reshape(()) if len(shape) == 1 else row).expand(shape).clone()
        if fill == "randn":
            return torch.randn(shape, generator=self.generator).to(dtype)
        return (torch.ones if fill == "ones" else torch.zeros)(shape, dtype=dtype)

    def inputs(self, modality: str, sizes: list) -> Inputs:
        m = self.spec.modality(modality)
        style = self.spec.attention_style
        if m.count_key is None:
            counts = torch.ones(len(sizes), dtype=torch.int64)  # every tile is an item
        else:
            counts = torch.tensor(sizes, dtype=torch.int64).reshape(-1, *style.empty_counts_shape()[1:])
        rows = sum(self.adapter.item_spec(m, row).input_size for row in counts.tolist())
        if style.segmented and m.grid_columns != GRID_COLUMNS:  # the grid as the model gives it: its own columns
            counts = torch.tensor([m.encoder_grid(row) for row in counts.tolist()],
                                  dtype=torch.int64).reshape(-1, len(m.grid_columns))
        kwargs = {key: self._fill(role, rows) for role, key in m.inputs.items()
                  if key != m.count_key and role not in m.per_item}
        for role, value in m.item_defaults(self.geometry).items():  # one value per item: its per_item value
            kwargs[m.inputs[role]] = torch.full((counts.shape[0],), value, dtype=torch.int64)
        if m.count_key is not None:
            kwargs[m.count_key] = counts
        return kwargs

    def image(self, a: int, b: int) -> int | list[int]:
        """A grid of ``a x b`` merged tokens, or ``a`` tiles."""
        return self.spec.attention_style.check_item(0, a, b, self.geometry)

    def video(self, frames: int, a: int, b: int) -> int | list[int]:
        """``frames`` frames of ``a x b`` merged tokens, or one tile per frame."""
        return self.spec.attention_style.check_item(frames, a, b, self.geometry)


def _item_size(adapter: SpecAdapter, modality: Modality, entry: tuple[int, ...]) -> int | list[int]:
    """The count row of one image ``(height, width)`` or video ``(frames, height, width)``, as the model's
    processor would shape it (:meth:`Spec.shape_item`)."""
    return adapter.spec.shape_item(modality.name, entry, adapter.geometry)


def make_inputs(adapter: SpecAdapter, workload: Workload, generator: torch.Generator) -> dict[str, torch.Tensor] | None:
    """Encoder inputs for ``workload`` as the model's processor would shape them (on the host); None when the
    spec lacks one of its modalities.

    Count rows come from the spec's ``tests.shaping`` (packed encoders: patch grids rounded to the merge
    unit by default; InternVL: its dynamic tiling); tile encoders without counts get one resized tile (or
    clip) per item. Inputs beyond pixels and grids (masks, per-image shapes, instructions) are filled as
    the spec's ``tests.inputs`` describe them, exactly as ``vitcg check`` fills them."""
    builder = InputBuilder(adapter.spec, adapter, generator)
    kwargs: dict[str, torch.Tensor] = {}
    for name, entries in (("image", workload.images), ("video", workload.videos)):
        if not entries:
            continue
        modality = adapter.spec.modality(name)
        if modality is None:
            return None
        kwargs.update(builder.inputs(name, [_item_size(adapter, modality, e) for e in entries]))
    return kwargs


def on_device(adapter: SpecAdapter, kwargs: Mapping[str, torch.Tensor],
              dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Inputs on the encoder's device (where the adapter requires them), floating ones in ``dtype`` (None: as
    they are); grids and tile counts stay on the host, as processors emit them (reading them on the device
    would cost a sync per call)."""
    counts = {m.count_key for m in adapter.spec.modalities}
    return {k: v if k in counts else v.to(adapter.device, dtype if dtype and v.is_floating_point() else v.dtype)
            for k, v in kwargs.items()}
