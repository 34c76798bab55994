"""The generic adapter: one spec plus one transformers encoder module implement the whole protocol.

Nothing here knows a model. Item sizes come from the spec's formulas, buffer shapes from its buffer
formulas, buffer contents from the providers it names, and the encoder call from its ``args``,
``call_kwargs`` and ``outputs``. Items are ordered canonically: the spec's modalities in order
(image, then video), each in input order.

With ``graph_scope`` the graphs capture one submodule call instead of the whole encoder call: the
model's own forward runs eagerly (a prologue that may sync, an epilogue that may select data-dependent
rows) and the scoped call inside it is answered by a graph replay (:meth:`encoder_scoped_forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import metadata
from .attention import ATTENTION_NAME, configs_of, register, use_attention
from .scope import Scope
from .errors import InputError
from .protocol import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)
from .spec.bindings import config_snapshot
from .spec.catalogue import PROVIDERS
from .spec.model import Modality, Spec, thaw

ITEM_CACHE_SIZE = 4096


@dataclass(frozen=True)
class _Input:
    """One modality present in the multimodal kwargs."""

    modality: Modality
    pixels: torch.Tensor
    counts: torch.Tensor | None
    """The counts as given (for the eager call); None when every tile is an item."""
    counts_cpu: torch.Tensor
    """The counts on the CPU as int64 (for formulas and providers); ones when every tile is an item."""
    extras: dict[str, torch.Tensor]
    """Extra inputs by role, aligned with the pixels on dim 0."""


class SpecAdapter:
    """Implements :class:`~vitcg.protocol.SupportsEncoderCudaGraph` for ``module`` as ``spec`` describes it."""

    def __init__(self, spec: Spec, module: nn.Module, *, compile_forward: bool = False):
        """``compile_forward``: run the fixed-shape forward through ``torch.compile`` (inductor kernels, one
        compilation with dynamic shapes for all budgets) before it is captured. Off by default: the first
        capture then takes as long as a compilation."""
        self.spec = spec
        self.module = module
        self.geometry: dict[str, int] = spec.resolve_geometry(config_snapshot(module.config))
        self._call = getattr(module, spec.encoder.method)
        self._scope = Scope(spec, module) if spec.graph_scope else None
        graph_call = self._scope.forward if self._scope is not None else self._call
        self._graph_call = torch.compile(graph_call, dynamic=True) if compile_forward else graph_call
        self._call_kwargs = thaw(spec.encoder.call_kwargs)
        self._configs = configs_of(module)
        self._rows_buffer = next(b for b in spec.buffers if b.padding in ("zeros", "ones"))
        """The buffer whose first dimension is the row (or tile) capacity: where padding segments end."""
        parameter = next(module.parameters())
        self.device: torch.device = parameter.device
        """Where the encoder lives (read once: build the adapter after moving the module)."""
        self.dtype: torch.dtype = parameter.dtype
        self._item_cache: dict[tuple, EncoderItemSpec] = {}
        self._metadata_cache = metadata.RowCache(self.device)
        """Item specs by (modality, grid row): serving sees the same image sizes again and again."""
        register()



    def _inputs(self, mm_kwargs: Mapping[str, Any]) -> list[_Input]:
        found = []
        for modality in self.spec.modalities:
            keys = list(modality.inputs.values())
            present = [k for k in keys if mm_kwargs.get(k) is not None]
            if not present:
                continue
            missing = [k for k in keys if k not in present]
            if missing:
                raise InputError(f"{self.spec.name}: {present[0]!r} is given without {missing[0]!r}")
            pixels = mm_kwargs[modality.pixels_key]
            if modality.count_key is None:
                counts, counts_cpu = None, torch.ones(pixels.shape[0], dtype=torch.int64)
            else:
                counts = torch.as_tensor(mm_kwargs[modality.count_key])
                counts_cpu = counts.detach().to("cpu", torch.int64)
            want = 2 if self.spec.style != "tiles" else 1
            if counts_cpu.dim() != want or (want == 2 and counts_cpu.shape[-1] != 3):
                shape = "(items, 3)" if want == 2 else "(items,)"
                raise InputError(f"{self.spec.name}: {modality.count_key!r} must have shape {shape}, "
                                 f"got {tuple(counts_cpu.shape)}")
            extras = {role: mm_kwargs[modality.inputs[role]] for role in modality.extra_roles}
            for role, value in extras.items():
                if value.shape[0] != pixels.shape[0]:
                    raise InputError(f"{self.spec.name}: {modality.inputs[role]!r} has {value.shape[0]} rows on "
                                     f"dim 0, {modality.pixels_key!r} has {pixels.shape[0]}; they must align")
            found.append(_Input(modality, pixels, counts, counts_cpu, extras))
        if not found and any(v is not None for v in mm_kwargs.values()):
            expected = "; ".join(f"{m.name}: {', '.join(m.inputs.values())}" for m in self.spec.modalities)
            raise InputError(f"{self.spec.name}: no known input key in {sorted(mm_kwargs)}; expected {expected}")
        return found

    def _names(self, row: Sequence[int]) -> dict[str, int]:
        if self.spec.style == "tiles":
            return {"n": int(row), **self.geometry}
        t, h, w = (int(v) for v in row)
        return {"t": t, "h": h, "w": w, **self.geometry}

    def item_spec(self, modality: Modality, row) -> EncoderItemSpec:
        """The item spec of one grid row (or tile count) of ``modality``."""
        key = (modality.name, tuple(row) if isinstance(row, (list, tuple)) else row)
        cached = self._item_cache.get(key)
        if cached is None:
            if len(self._item_cache) >= ITEM_CACHE_SIZE:
                self._item_cache.clear()
            cached = self._item_cache[key] = self._evaluate_item(modality, row)
        return cached

    def _evaluate_item(self, modality: Modality, row) -> EncoderItemSpec:
        names = self._names(row)
        frames = self.spec.frames.evaluate(names) if modality.name == "video" else 0
        segments = {"frame": names.get("t", 1), "clip": 1}.get(self.spec.segments, 0)
        return EncoderItemSpec(self.spec.input_size.evaluate(names), self.spec.output_tokens.evaluate(names),
                               frames, segments)

    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        inputs = self._inputs(mm_kwargs)
        if not inputs:
            expected = "; ".join(f"{m.name}: {', '.join(m.inputs.values())}" for m in self.spec.modalities)
            raise InputError(f"{self.spec.name}: no known input key in {sorted(mm_kwargs)}; expected {expected}")
        return "+".join(i.modality.name for i in inputs)

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[EncoderItemSpec]:
        return [self.item_spec(i.modality, row) for i in self._inputs(mm_kwargs) for row in i.counts_cpu.tolist()]

    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        """The kwargs of the items at ``indices`` (canonical positions); each modality keeps input order."""
        wanted = sorted(set(indices))
        selected: dict[str, Any] = {}
        start = 0
        for inp in self._inputs(mm_kwargs):
            rows = inp.counts_cpu.tolist()
            local = [i - start for i in wanted if start <= i < start + len(rows)]
            start += len(rows)
            if not local:
                continue
            sizes = [self.item_spec(inp.modality, row).input_size for row in rows]
            if sum(sizes) != inp.pixels.shape[0]:
                raise InputError(
                    f"{self.spec.name}: {inp.modality.pixels_key!r} has {inp.pixels.shape[0]} rows but "
                    f"{inp.modality.count_key!r} describes {sum(sizes)} (items.input_size: {self.spec.input_size})")
            offsets = [0]
            for size in sizes:
                offsets.append(offsets[-1] + size)
            everything = local == list(range(len(rows)))
            for role, tensor in (("pixels", inp.pixels), *inp.extras.items()):
                key = inp.modality.inputs[role]
                selected[key] = tensor if everything else torch.cat([tensor[offsets[i]:offsets[i + 1]] for i in local])
            if inp.counts is not None:
                selected[inp.modality.count_key] = inp.counts if everything else inp.counts[local]
        if wanted and (wanted[0] < 0 or wanted[-1] >= start):
            bad = wanted[0] if wanted[0] < 0 else wanted[-1]
            raise InputError(f"{self.spec.name}: item index {bad} out of range ({start} items)")
        return selected


    def get_encoder_cudagraph_budget_range(self, limits: Any) -> tuple[int, int]:
        def limit(name: str) -> int:
            value = limits.get(name) if isinstance(limits, Mapping) else getattr(limits, name, None)
            if value is None:
                raise InputError(f"engine limits lack {name!r}")
            return int(value)

        names = {"max_num_batched_tokens": limit("max_num_batched_tokens"),
                 "max_model_len": limit("max_model_len"), **self.geometry}
        return self.spec.budget_min.evaluate(names), self.spec.budget_max.evaluate(names)

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        video = self.spec.modality("video")
        return EncoderCudaGraphConfig(
            modalities=list(self.spec.modality_names),
            buffer_keys=[b.name for b in self.spec.buffers],
            out_hidden_size=self.geometry["out_hidden_size"],
            padding_logics={b.name: b.padding for b in self.spec.buffers},
            max_frames_per_video=video.max_frames_per_video if video else 1,
            segment_key=self._segment_buffer(),
            scoped=self._scope is not None,
        )


    def _segment_buffer(self) -> str | None:
        """The buffer whose slots bound a pack's segments: cu_seqlens, or a scoped spec's first
        trailing-segment argument."""
        for buffer in self.spec.buffers:
            if buffer.provider == "cu_seqlens" or (buffer.provider == "scope_arg" and buffer.padding == "trailing_segment"):
                return buffer.name
        return None

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget: int, max_batch_size: int, max_frames_per_batch: int,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        device = torch.device(device) if device is not None else self.device
        dtype = dtype or self.dtype
        names = {"budget": token_budget, "max_items": max_batch_size, "max_frames": max_frames_per_batch,
                 **self.geometry}
        values: dict[str, torch.Tensor | int] = {}
        for buffer in self.spec.buffers:
            if buffer.is_host:
                values[buffer.name] = buffer.value.evaluate(names)
                continue
            kind = PROVIDERS[buffer.provider].dtype
            if kind == "param":
                kind = buffer.params.get("dtype", "model")
            shape = tuple(f.evaluate(names) for f in buffer.shape)
            if self._scope is not None:
                shape = self._scope.storage_shape(buffer, shape)
            values[buffer.name] = torch.zeros(shape, dtype=dtype if kind == "model" else metadata.DTYPES[kind],
                                              device=device)
        capacity = self.row_capacity(values)
        for buffer in self.spec.buffers:
            if not buffer.is_host:
                metadata.fill(buffer.padding, values[buffer.name], None, capacity, buffer.name)
        return EncoderCudaGraphCaptureInputs(values)

    def row_capacity(self, values: Mapping[str, torch.Tensor | int]) -> int:
        """Rows (patches or tiles) these capture inputs hold: the first dimension of the row buffer."""
        return values[self._rows_buffer.name].shape[0]

    def _pack(self, mm_kwargs: Mapping[str, Any]) -> tuple[metadata.Pack, list[EncoderItemSpec]]:
        inputs = self._inputs(mm_kwargs)
        items = [self.item_spec(i.modality, row) for i in inputs for row in i.counts_cpu.tolist()]
        def joined(parts: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat(parts) if len(parts) > 1 else parts[0]

        if inputs:
            pixels = joined([i.pixels for i in inputs])
            counts = torch.cat([i.counts_cpu for i in inputs])
            extras = {role: joined([i.extras[role] for i in inputs]) for role in inputs[0].extras}
        else:
            pixels, extras = torch.zeros(0), {}
            counts = torch.zeros((0,) if self.spec.style == "tiles" else (0, 3), dtype=torch.int64)
        pack = metadata.Pack(pixels.to(self.device, self.dtype), counts, self.geometry, self.spec.segments,
                             self._metadata_cache, extras)
        return pack, items

    def prepare_encoder_cudagraph_replay_buffers(
        self, mm_kwargs: Mapping[str, Any], max_batch_size: int, max_frames_per_batch: int,
    ) -> EncoderCudaGraphReplayBuffers:
        pack, items = self._pack(mm_kwargs)
        if len(items) > max_batch_size:
            raise InputError(f"{len(items)} items exceed max_batch_size {max_batch_size}")
        frames = sum(item.frames for item in items)
        if frames > max_frames_per_batch and frames:
            raise InputError(f"{frames} video frames exceed max_frames_per_batch {max_frames_per_batch}")
        return EncoderCudaGraphReplayBuffers({b.name: metadata.compute(b, pack) for b in self.spec.buffers})


    def _combine(self, output: Any) -> torch.Tensor:
        parts = []
        for entry in self.spec.encoder.outputs:
            field_name, _, index = entry.partition("[")
            value = output[field_name] if isinstance(output, Mapping) else getattr(output, field_name, None)
            if value is not None and index:
                position = int(index.rstrip("]"))
                inside = isinstance(value, (list, tuple)) and -len(value) <= position < len(value)
                value = value[position] if inside else None
            if value is None:
                raise InputError(f"{self.spec.name}: the encoder output has no {entry!r} (encoder.outputs); it "
                                 f"returned {type(output).__name__}")
            tensors = list(value) if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(t, torch.Tensor) for t in tensors):
                raise InputError(f"{self.spec.name}: output {entry!r} holds {[type(t).__name__ for t in tensors]}, "
                                 "not tensors; pick one element with field[i]")
            parts.extend(t.reshape(-1, t.shape[-1]) for t in tensors)
        rows = {p.shape[0] for p in parts}
        if len(rows) != 1:
            raise InputError(f"{self.spec.name}: output fields {list(self.spec.encoder.outputs)} have different "
                             f"row counts {sorted(rows)}; they cannot be concatenated")
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def encoder_cudagraph_forward(self, values: Mapping[str, torch.Tensor | int]) -> Any:
        """The fixed-shape forward: the combined output tensor, or with ``graph_scope`` the scoped
        submodule's own output structure."""
        # tensors the model creates without a device (SAM's torch.arange index) must not be host tensors
        # copied in during capture: the encoder's device is the default one here
        with use_attention(self._configs, ATTENTION_NAME), torch.no_grad(), torch.device(self.device):
            if self._scope is not None:
                return self._graph_call(values)
            kwargs = {b.arg: values[b.name] for b in self.spec.buffers}
            return self._combine(self._graph_call(**kwargs, **self._call_kwargs))

    def eager_calls(self, mm_kwargs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The keyword arguments of each encoder call the eager path makes: one per modality present, inputs
        on the encoder's device (``encoder.args`` plus ``call_kwargs``)."""
        calls = []
        for inp in self._inputs(mm_kwargs):
            counts = inp.counts.to(self.device) if inp.counts is not None else None
            by_role = {"pixels": inp.pixels.to(self.device, self.dtype), "grid": counts, "tiles": counts,
                       **{role: value.to(self.device, self.dtype if value.is_floating_point() else value.dtype)
                          for role, value in inp.extras.items()}}
            calls.append({**{arg: by_role[role] for arg, role in self.spec.encoder.args.items()},
                          **self._call_kwargs})
        return calls

    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any]) -> torch.Tensor:
        outputs = []
        for kwargs in self.eager_calls(mm_kwargs):
            with torch.no_grad():
                outputs.append(self._combine(self._call(**kwargs)))
        if not outputs:
            return torch.zeros(0, self.geometry["out_hidden_size"], device=self.device, dtype=self.dtype)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def encoder_scoped_forward(self, mm_kwargs: Mapping[str, Any],
                               replay: Callable[[dict[str, Any]], tuple[Any, Mapping]]) -> torch.Tensor:
        """The model's eager forward with each call of the graph scope answered by ``replay``
        (:class:`vitcg.scope.Scope`): ``replay`` gets the call's arguments as buffer values and returns the
        captured output and the capture values it ran on. Raises InputError when the scope is never called."""
        output, calls = self._scope.run(lambda: self.encoder_eager_forward(mm_kwargs), replay)
        if self._inputs(mm_kwargs) and not calls:
            raise InputError(f"{self.spec.name}: the eager forward never called graph_scope "
                             f"{self.spec.graph_scope!r}; check the module path")
        return output
