"""The generic adapter: one spec plus one transformers encoder module implement the whole protocol.

Nothing here knows a model. Item sizes come from the spec's formulas, buffer shapes from its buffer
formulas, buffer contents from the providers it names, and the encoder call from its ``args``,
``call_kwargs`` and ``outputs``. Items are numbered canonically: the spec's modalities in order (image,
then video), each in input order; a selection keeps the order of the indices it is given. Every entry point
reads its multimodal kwargs through :class:`~vitcg.runtime.inputs.InputReader`, which rejects bad inputs
with an InputError before any tensor work.

:class:`SpecAdapter` implements :class:`~vitcg.runtime.protocol.SupportsEncoderCudaGraph` (vLLM's protocol) plus
:mod:`vitcg.runtime.extension`. With ``graph_scope`` the graphs capture one submodule call instead of the whole
encoder call: the model's own forward runs eagerly around it (a prologue that may sync, an epilogue that
may select data-dependent rows) and each scoped call is answered by a graph replay. Such a spec cannot be
driven by a protocol-only manager, so :class:`ScopedSpecAdapter` does not claim the protocol: it offers
what vitcg's manager needs and raises :class:`~vitcg.errors.UnsupportedError` for the rest.
:func:`adapter_for` picks the class; the graph boundary (:class:`WholeCall` or
:class:`~vitcg.runtime.scope.Scope`) is chosen once, when the adapter is built.
"""

from __future__ import annotations

import bisect
import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import InputError, SpecRuntimeError, UnsupportedError
from ..lang.bindings import config_snapshot
from ..lang.catalogue import MERGE_NAME, PROVIDERS, capacity_names
from ..lang.model import Buffer, Modality, PixelLayout, Spec, thaw
from . import providers, replacements
from .attention import ATTENTION_NAME, configs_of, encoder_lock, register, use_attention
from .engine import read_limits
from .epilogue import epilogue
from .extension import MIXED, Replay
from .hf import combine_output, pixels_to_call
from .inputs import BACKEND_ROW_KEYS, Input, InputReader, item_indices
from .layers import LayerCalls
from .padding import BufferPadding, Capacities, fill
from .protocol import (
    DEFAULT_PATH,
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
    postprocess_by_rows,
)
from .regions import AheadOfTime, compile_blocks, compiled_blocks, repeated_blocks
from .scope import Boundary, Scope
from .syncs import tensor_text_without_data

ITEM_CACHE_SIZE = 4096


def adapter_for(spec: Spec, module: nn.Module, **options: Any) -> SpecAdapter | ScopedSpecAdapter:
    """The adapter of ``spec`` over ``module``: :class:`ScopedSpecAdapter` for a graph-scoped spec, else
    :class:`SpecAdapter`. ``options`` as for :class:`SpecAdapter`."""
    return (ScopedSpecAdapter if spec.graph_scope else SpecAdapter)(spec, module, **options)


class WholeCall:
    """The graph boundary of a whole-encoder spec (a :class:`~vitcg.runtime.scope.Boundary`): the encoder method
    called with every buffer as its argument and ``call_kwargs`` beside them, under the spec's ``epilogue``, its
    outputs combined into one tensor."""

    scoped = False

    def __init__(self, spec: Spec, module: nn.Module, combine: Callable[[Any], torch.Tensor],
                 layout: PixelLayout | None):
        """``combine``: the call's output as one tensor of rows; ``layout``: where the call's pixel argument holds
        its rows."""
        self.spec = spec
        self.target = module
        self._call = self._own_call = getattr(module, spec.encoder.method)
        self._call_kwargs = thaw(spec.encoder.call_kwargs)
        self._combine = combine
        self._layout = layout
        self._pixels = spec.providers().get("pixels")
        # arguments the installed transformers takes in another form than the buffer's, chosen once
        self._rebuilds = [(b, r) for b in spec.buffers if (r := providers.argument_rebuild(b)) is not None]
        self._layers = LayerCalls(spec.name, spec.layer_args, module) if spec.layer_args is not None else None
        """The host integers each layer of a stack gets (``layer_args``), or None."""

    def use_forwards(self, forwards: Mapping[nn.Module, Callable[..., Any]]) -> None:
        """Nothing to do: :func:`~vitcg.runtime.regions.compiled_blocks` patches them in around the call."""

    def compile(self) -> None:
        """Run the encoder call through ``torch.compile`` (an encoder without repeated blocks)."""
        self._call = torch.compile(self._call, dynamic=True)

    def plain(self) -> None:
        """Undo :meth:`compile`: the encoder's own call from here on."""
        self._call = self._own_call

    def storage_shape(self, buffer: Buffer, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Pixels with ``rows_dim`` stored rows-first, as the inputs come; every other buffer as the call takes it.
        Raises SpecRuntimeError when the rows dimension is no multiple of one row's entries."""
        if buffer is not self._pixels or not buffer.rows_dim:
            return shape
        if shape[buffer.rows_dim] % self._layout.width:
            raise SpecRuntimeError(f"{self.spec.name}: pixel buffer dimension {buffer.rows_dim} is "
                                   f"{shape[buffer.rows_dim]}, not a multiple of one row's {self._layout.width} "
                                   "entries")
        return (shape[buffer.rows_dim] // self._layout.width, *self._layout.row)

    def forward(self, inputs: Mapping[str, torch.Tensor | int]) -> torch.Tensor:
        kwargs = {b.arg: pixels_to_call(self._layout, inputs[b.name]) if b is self._pixels else inputs[b.name]
                  for b in self.spec.buffers}
        for buffer, rebuild in self._rebuilds:
            kwargs[buffer.arg] = rebuild(inputs[buffer.name], inputs[self._pixels.name].shape[0])
        layers = self._layers.passed(inputs) if self._layers is not None else contextlib.nullcontext()
        with epilogue(self.spec.epilogue), layers:  # a deferred data-dependent end keeps fixed shapes here
            return self._combine(self._call(**kwargs, **self._call_kwargs))


def _check_capture_sizes(token_budget: Any, max_batch_size: Any, max_frames_per_batch: Any) -> None:
    """A capture's sizes are integers: the budget and the item count at least 1, the frame count at least 0.
    Raises InputError naming the argument, what it takes and what it got."""
    for name, value, least in (("token_budget", token_budget, 1), ("max_batch_size", max_batch_size, 1),
                               ("max_frames_per_batch", max_frames_per_batch, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name}: expected an integer >= {least}, got {value!r}")


def _check_path(path: str) -> None:
    if path != DEFAULT_PATH:
        raise InputError(f"encoder path {path!r} is unknown: spec adapters have one path, {DEFAULT_PATH!r}")


class _Adapter:
    """Everything both adapters share: items, selection, capture buffers, forwards."""

    def __init__(self, spec: Spec, module: nn.Module, *, compile_forward: bool = False, compile_eager: bool = False):
        """``compile_forward``: run the encoder's repeated blocks through ``torch.compile`` (inductor kernels,
        one compilation per budget shared by every block, :mod:`vitcg.runtime.regions`) when they are
        captured; an encoder without repeated blocks has its whole fixed-shape forward compiled (once, with
        dynamic shapes). Off by default: the first capture then takes as long as a compilation.
        ``compile_eager``: the eager forward (calls routed away from the graphs) runs the repeated blocks compiled
        with dynamic shapes and vitcg's attention, so that routing never trades inductor's kernels for launch
        overhead (one compilation, at the first eager call); a call where that fails runs the model's own blocks,
        and later calls too (one warning). Off by default: the eager forward is then the model's own, the
        reference every check compares the graphs with."""
        self.spec = spec
        self.module = module
        self.geometry: dict[str, int] = spec.resolve_geometry(config_snapshot(module.config))
        self._call = getattr(module, spec.encoder.method)
        self._call_kwargs = thaw(spec.encoder.call_kwargs)
        self.pixel_layout = spec.pixel_layout(self.geometry)
        """Where the call's pixel argument holds its rows (the graphs and the inputs hold them rows-first)."""
        replacements.install(spec, module)  # before any compilation: the compiled blocks call the forms
        self._boundary: Boundary = Scope(spec, module) if spec.graph_scope else \
            WholeCall(spec, module, self.combine_output, self.pixel_layout)
        """What the graphs capture: the whole encoder call or the scoped submodule call."""
        self._compile_graph_path(compile_forward)
        self._configs = configs_of(module)
        self.eager_ahead = AheadOfTime(dynamic=True) if compile_eager else None
        """The eager forward's block functions, compiled ahead of time with dynamic shapes: the persistent compile
        cache loads them (:func:`~vitcg.runtime.compile_cache.capture_compiled`) and stores those compiled later."""
        self._eager_blocks = compile_blocks(repeated_blocks(module), dynamic=True, ahead=self.eager_ahead) \
            if compile_eager else {}
        """The repeated blocks compiled with dynamic shapes for the eager forward (``compile_eager``)."""
        self.on_eager_compiled: Callable[[], Any] | None = None
        """Called after each eager call with compiled blocks (the compile cache stores what it compiled)."""
        self._splits = any(m.split for m in spec.modalities)
        """Whether the encoder may see more grid rows than items (a modality split by frames)."""
        self._item_roles = frozenset(r for m in spec.modalities for r in m.item_roles)
        """Extra roles aligned with the items (``per_item``): their buffers hold a row per item."""
        self.host_buffers: tuple[str, ...] = tuple(b.name for b in spec.buffers if b.params.get("on_host"))
        """Tensor buffers kept on the host (``on_host``): filled at capture only, and the graph may read them there."""
        self._rows_buffer = spec.rows_buffer
        """The buffer whose first dimension is the row (or tile) capacity: where padding segments end."""
        parameter = next(module.parameters())
        self.device: torch.device = parameter.device
        """Where the encoder lives (read once: build the adapter after moving the module)."""
        self.dtype: torch.dtype = parameter.dtype
        self._item_cache: dict[tuple, tuple[EncoderItemSpec, int]] = {}
        """Item spec and frames by (modality, grid row): serving sees the same image sizes again and again."""
        self._metadata_cache = providers.RowCache(self.device)
        self._capacities = Capacities()
        merge = self.geometry.get(MERGE_NAME, 1)
        self._padding = {b.name: BufferPadding(b.name, b.padding, self._capacities, merge)
                         for b in spec.buffers if not b.is_host}
        self._reader = InputReader(spec, self.geometry, self.device, self.item_spec)
        register()

    def _compile_graph_path(self, compile_forward: bool) -> None:
        """``compile_forward``'s compilations: the repeated blocks (ahead of time where they can be), else the
        whole fixed-shape forward."""
        ahead = AheadOfTime() if compile_forward else None
        self._blocks = compile_blocks(repeated_blocks(self._boundary.target), ahead=ahead) if compile_forward else {}
        """The compiled forward of each repeated block, patched in while the graph path runs."""
        self.ahead = ahead if self._blocks else None
        """The blocks' functions compiled ahead of time, which the persistent compile cache stores and loads."""
        self._boundary.use_forwards(self._blocks)
        self._compiled = compile_forward and not self._blocks
        """Whether the whole fixed-shape forward is compiled (an encoder without repeated blocks)."""
        if self._compiled:
            self._boundary.compile()

    @property
    def compiles(self) -> bool:
        """Whether the graph path runs inductor's code: compiled blocks, or the whole forward compiled."""
        return bool(self._blocks) or self._compiled

    def drop_compiled(self) -> None:
        """The graph path runs the model's own code from here on, not inductor's (after a compiled forward failed
        and a plain one served); graphs already captured keep the kernels they recorded."""
        self._blocks, self.ahead, self._compiled = {}, None, False
        self._boundary.plain()

    def _zeros(self, buffer: Buffer, names: Mapping[str, int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A device buffer of one capture, zeros of its shape (checked against its provider's capacity) and of its
        provider's dtype (``model``: the graphs' dtype)."""
        kind = PROVIDERS[buffer.provider].dtype
        if kind == "param":
            kind = buffer.params.get("dtype", "model")
        shape = tuple(f.evaluate(names) for f in buffer.shape)
        self._check_capacity(buffer, shape[0], names)
        shape = self._boundary.storage_shape(buffer, shape)
        device = torch.device("cpu") if buffer.params.get("on_host") else device  # read on the host only
        return torch.zeros(shape, dtype=dtype if kind == "model" else providers.DTYPES[kind], device=device)

    def _inputs(self, mm_kwargs: Mapping[str, Any]) -> list[Input]:
        return self._reader.read(mm_kwargs)

    def _item(self, modality: Modality, row, valid: int | None = None,
              values: tuple[tuple[str, int], ...] | None = None) -> tuple[EncoderItemSpec, int]:
        key = (modality.name, tuple(row) if isinstance(row, (list, tuple)) else row, valid, values)
        cached = self._item_cache.get(key)
        if cached is None:
            if len(self._item_cache) >= ITEM_CACHE_SIZE:
                self._item_cache.clear()
            input_size, output_tokens, frames = self.spec.item_sizes(modality.name, row, self.geometry, valid,
                                                                     dict(values) if values else None)
            cached = self._item_cache[key] = (EncoderItemSpec(input_size, output_tokens), frames)
        return cached

    def item_spec(self, modality: Modality, row, valid: int | None = None,
                  values: tuple[tuple[str, int], ...] | None = None) -> EncoderItemSpec:
        """The item spec of one grid row (or tile count) of ``modality``; ``valid``: its rows that are not
        padding (``items.valid``; None: an item without padding); ``values``: its ``(role, value)`` pairs of
        the item-aligned inputs (``per_item``; None: their defaults)."""
        return self._item(modality, row, valid, values)[0]

    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        """``image`` or ``video``; ``image+video`` when both are present (vitcg extension)."""
        inputs = self._inputs(mm_kwargs)
        if not inputs:
            raise self._reader.no_known_key(mm_kwargs)
        return MIXED if len(inputs) > 1 else inputs[0].modality.name

    def get_max_frames_per_video(self) -> int:
        video = self.spec.modality("video")
        return video.max_frames_per_video if video else 1

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[EncoderItemSpec]:
        return [self.item_spec(i.modality, *item) for i in self._inputs(mm_kwargs) for item in i.items()]

    def get_encoder_cudagraph_item_frames(self, mm_kwargs: Mapping[str, Any]) -> list[int]:
        """Video frames of each item (0 for images), in item order (vitcg extension)."""
        return [self._item(i.modality, *item)[1] for i in self._inputs(mm_kwargs) for item in i.items()]

    def get_encoder_cudagraph_item_groups(self, mm_kwargs: Mapping[str, Any]) -> list[list[int]]:
        """Item indices (canonical) that may share an encoder call, one list per group: one group per modality
        present when the spec keeps modalities ``separate``, else one group of every item (vitcg extension)."""
        groups, start = [], 0
        for inp in self._inputs(mm_kwargs):
            count = inp.counts_cpu.shape[0]
            groups.append(list(range(start, start + count)))
            start += count
        if not self.spec.separate_modalities:
            return [[i for group in groups for i in group]] if groups else []
        return groups

    def is_encoder_cudagraph_scoped(self) -> bool:
        return self._boundary.scoped

    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        """The kwargs of the items at ``indices`` (canonical positions), in the order of ``indices``.

        With image and video in one call the indices must list images before videos (the eager call
        encodes images first). Raises InputError for an index out of range or a repeated index."""
        indices = item_indices(indices)
        inputs = self._inputs(mm_kwargs)
        starts, owner = self._owners(inputs, indices)
        selected: dict[str, Any] = {}
        for k, inp in enumerate(inputs):
            local = [i - starts[k] for i, o in zip(indices, owner) if o == k]
            if not local and (indices or k):  # no items here; an empty selection keeps the first modality
                continue
            everything = local == list(range(len(inp.counts_cpu)))
            selected.update(self._select_rows(inp, None if everything else local))
            selected.update(_select_per_item(inp, None if everything else local))
            if self.spec.separate_modalities:  # the graphs of this modality (the capture axis)
                # a tuple: vLLM's manager keys its graphs by (budget, axis keys), so they must be hashable
                selected[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] = (inp.modality.name,)
        return selected

    def _select_rows(self, inp: Input, local: list[int] | None) -> dict[str, torch.Tensor]:
        """The pixel rows (and extra row inputs) of one modality's items at ``local`` in that order (None: all)."""
        tensors = {inp.modality.inputs[role]: tensor for role, tensor in (("pixels", inp.pixels), *inp.extras.items())}
        if local is None:
            return tensors
        offsets = [0]
        for row, _, values in inp.items():  # pixel rows match: read checked
            offsets.append(offsets[-1] + self.item_spec(inp.modality, row, None, values).input_size)
        return {key: torch.cat([tensor[offsets[i]:offsets[i + 1]] for i in local]) if local else tensor[:0]
                for key, tensor in tensors.items()}

    def _owners(self, inputs: Sequence[Any], indices: list[int]) -> tuple[list[int], list[int]]:
        """Each modality's first canonical index, and the modality of each of ``indices``; raises InputError for an
        index out of range, a repeated one, modalities the spec keeps apart selected together, or videos listed
        before images."""
        starts, total = [], 0
        for inp in inputs:
            starts.append(total)
            total += inp.counts_cpu.shape[0]
        bad = [i for i in indices if not 0 <= i < total]
        if bad:
            raise InputError(f"{self.spec.name}: item index {bad[0]} out of range ({total} items)")
        if len(set(indices)) != len(indices):
            raise InputError(f"{self.spec.name}: item indices {indices} repeat an item")
        owner = [bisect.bisect_right(starts, i) - 1 for i in indices]
        if self.spec.separate_modalities and len(set(owner)) > 1:
            raise InputError(f"{self.spec.name}: indices {indices} select {' and '.join(i.modality.name for i in inputs)} "
                             "items together, but the spec keeps modalities separate (modalities.*.separate); "
                             "select each modality's items apart")
        if owner != sorted(owner):
            raise InputError(f"{self.spec.name}: indices {indices} interleave modalities; with image and video "
                             "in one call, list the image items first")
        return starts, owner

    def postprocess_encoder_output(
        self, outputs: Mapping[str, torch.Tensor], indices: Sequence[int], per_item_out_tokens: Sequence[int],
        dest: Any, clone: bool = False, batch_mm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """The protocol's default: item ``i``'s rows of ``outputs["default"]`` at ``dest[i]``, ``indices`` order."""
        postprocess_by_rows(outputs, indices, per_item_out_tokens, dest, clone)

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        """Budget range from ``vllm_config.scheduler_config.max_num_batched_tokens`` and
        ``vllm_config.model_config.max_model_len`` (a mapping with those keys works too)."""
        tokens, length = read_limits(vllm_config)
        names = {"max_num_batched_tokens": tokens, "max_model_len": length, **self.geometry}
        return self.spec.budget_min.evaluate(names), self.spec.budget_max.evaluate(names)

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(
            modalities=list(self.spec.modality_names),
            buffer_keys=[b.name for b in self.spec.buffers],
            out_hidden_size=self.geometry["out_hidden_size"],
            padding_logics=dict(self._padding),
            max_frames_per_video=self.get_max_frames_per_video(),
            capture_axes=(self.spec.modality_names,) if self.spec.separate_modalities else (),
        )

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget: int, max_batch_size: int, max_frames_per_batch: int,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
        path: str = DEFAULT_PATH, axis_keys: tuple | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        """Buffers for ``token_budget`` that hold any pack of ``max_batch_size`` items and
        ``max_frames_per_batch`` frames, each of the spec's shape. Shape formulas may read ``max_segments``, the
        most attention segments such a pack has (``min(budget, max_items + max_frames)``: every segment has at
        least one output token). A buffer whose provider states a capacity
        (:attr:`vitcg.lang.catalogue.Provider.capacity`: segment slots, grid rows, a row per item) is never
        made larger than its shape: ``vitcg validate`` holds the shape to the capacity, and limits beyond what it
        checked raise SpecRuntimeError naming the buffer, its rows and the rows a pack can need.
        ``axis_keys``: with ``separate`` modalities, the modality these graphs serve (the capture axis); a
        modality other than video sees ``max_frames`` 0."""
        _check_path(path)
        _check_capture_sizes(token_budget, max_batch_size, max_frames_per_batch)
        device = torch.device(device) if device is not None else self.device
        dtype = dtype or self.dtype
        if axis_keys and self.spec.separate_modalities and axis_keys[0] != "video":
            max_frames_per_batch = 0  # the graphs of a modality kept apart from video never see frames
        names = {**capacity_names(token_budget, max_batch_size, max_frames_per_batch, self._splits), **self.geometry}
        values: dict[str, torch.Tensor | int] = {
            buffer.name: buffer.value.evaluate(names) if buffer.is_host else self._zeros(buffer, names, device, dtype)
            for buffer in self.spec.buffers}
        capacity = self.row_capacity(values)
        for buffer in self.spec.buffers:
            if not buffer.is_host:
                self._capacities.record(values[buffer.name], capacity)
                fill(buffer.padding, values[buffer.name], None, capacity, buffer.name, self._padding[buffer.name].merge)
        return EncoderCudaGraphCaptureInputs(values)

    def _check_capacity(self, buffer: Buffer, rows: int, names: Mapping[str, int]) -> None:
        """Raises SpecRuntimeError when ``rows``, the first dimension of ``buffer``'s shape at a capture's
        ``names``, is fewer than its provider's capacity needs there."""
        provider = PROVIDERS[buffer.provider]
        need = provider.needs(buffer.padding, buffer.params.get("role"), self._item_roles)
        if need is None or rows >= (needed := need.evaluate(names)):
            return
        limits = ", ".join(f"{k}={names[k]}" for k in ("budget", "max_items", "max_frames"))
        raise SpecRuntimeError(f"{self.spec.name}: buffer {buffer.name!r} holds {rows} rows ({buffer.shape[0]}) at "
                               f"{limits}, but a pack can need {needed} ({need}): {provider.capacity.doc}; "
                               f"`vitcg validate` checks the spec's budgets under its default limits, so write "
                               f"the buffer's first dimension to hold these limits too")

    def row_capacity(self, values: Mapping[str, torch.Tensor | int]) -> int:
        """Rows (patches or tiles) these capture inputs hold: the first dimension of the row buffer."""
        return values[self._rows_buffer.name].shape[0]

    def _pack(self, mm_kwargs: Mapping[str, Any]) -> tuple[providers.Pack, list[EncoderItemSpec]]:
        inputs = self._inputs(mm_kwargs)
        items = [self.item_spec(i.modality, *item) for i in inputs for item in i.items()]
        def joined(parts: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat(parts) if len(parts) > 1 else parts[0]

        if inputs:
            pixels = joined([i.pixels for i in inputs])
            counts = torch.cat([i.encoder_counts for i in inputs])
            extras = {role: joined([i.extras[role] for i in inputs]) for role in inputs[0].extras}
            extras.update({role: joined([i.item_inputs[role] for i in inputs]) for role in inputs[0].item_inputs})
        else:
            pixels, extras = torch.zeros(0), {}
            counts = torch.zeros(self.spec.attention_style.empty_counts_shape(), dtype=torch.int64)
        pack = providers.Pack(pixels.to(self.device, self.dtype), counts, self.geometry, self.spec.segments,
                             self._metadata_cache, extras, self.spec.grid_columns)
        return pack, items


    def combine_output(self, output: Any) -> torch.Tensor:
        """One call's output as the graphs give it: the spec's ``encoder.outputs`` fields as one tensor of rows
        (:func:`~vitcg.runtime.hf.combine_output`). Raises SpecRuntimeError when the output does not hold them."""
        return combine_output(self.spec, output, self._no_rows)

    def _no_rows(self) -> torch.Tensor:
        return torch.zeros(0, self.geometry["out_hidden_size"], device=self.device, dtype=self.dtype)

    def encoder_cudagraph_forward(self, inputs: Mapping[str, torch.Tensor | int], path: str = DEFAULT_PATH) -> Any:
        """The fixed-shape forward: the combined output tensor, or with ``graph_scope`` the scoped
        submodule's own output structure. With ``epilogue`` (:mod:`vitcg.runtime.epilogue`) a boolean-mask row
        selection returns every row, the kept ones first; the cut to the items' rows comes after the graph."""
        _check_path(path)
        # tensors the model creates without a device (SAM's torch.arange index) must not be host tensors
        # copied in during capture: the encoder's device is the default one here
        # messages the model formats from tensors (before its checks run) must not read them on the host
        # the attention selection and the compiled blocks are state of the module, which every thread sees: the
        # module's lock keeps vitcg's other calls of it out of this window
        text = contextlib.nullcontext() if self._compiled else tensor_text_without_data()
        with (encoder_lock(self.module), use_attention(self._configs, ATTENTION_NAME), torch.no_grad(),
              torch.device(self.device), text, compiled_blocks(self._blocks)):
            return self._boundary.forward(inputs)

    def eager_calls(self, mm_kwargs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The keyword arguments of each encoder call the eager path makes: one per modality present, inputs
        on the encoder's device (``encoder.args`` plus ``call_kwargs``)."""
        calls = []
        for inp in self._inputs(mm_kwargs):
            counts = inp.counts.to(self.device) if inp.counts is not None else None
            if counts is not None and inp.modality.reshapes_grid:  # the rows the encoder sees (split, columns)
                counts = providers.encoder_grid(inp.encoder_counts, inp.modality.grid_columns).to(
                    self.device, counts.dtype)
            pixels = pixels_to_call(self.pixel_layout, inp.pixels.to(self.device, self.dtype))
            by_role = {"pixels": pixels, self.spec.attention_style.count_role: counts,
                       **{role: value.to(self.device, self.dtype if value.is_floating_point() else value.dtype)
                          for role, value in inp.extras.items()},
                       **{role: value.to(self.device) for role, value in inp.item_inputs.items()}}
            calls.append({**{arg: by_role[role] for arg, role in self.spec.encoder.args.items()},
                          **self._call_kwargs})
        return calls

    @property
    def eager_compiled(self) -> bool:
        """Whether eager calls run compiled blocks (``compile_eager``, and no call has failed with them)."""
        return bool(self._eager_blocks)

    def _eager_call(self, kwargs: Mapping[str, Any]) -> Any:
        """One encoder call of the eager path: with the blocks compiled for it where there are (the lock held)."""
        if not self._eager_blocks:
            return self._call(**kwargs)
        try:
            with use_attention(self._configs, ATTENTION_NAME), compiled_blocks(self._eager_blocks):
                output = self._call(**kwargs)
        except Exception as exc:  # noqa: BLE001  (the model's own blocks decide: an input error raises there too)
            output = self._call(**kwargs)
            self._eager_blocks = {}
            warnings.warn(f"vitcg: {self.spec.name}: the eager forward's compiled blocks failed "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); eager calls run the "
                          "model's own blocks from now on", RuntimeWarning, stacklevel=2)
            return output
        if self.on_eager_compiled is not None:
            self.on_eager_compiled()
        return output

    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        _check_path(path)
        outputs = []
        for kwargs in self.eager_calls(mm_kwargs):
            with encoder_lock(self.module), torch.no_grad():  # never inside another thread's graph-path window
                outputs.append(self.combine_output(self._eager_call(kwargs)))
        if not outputs:
            return torch.zeros(0, self.geometry["out_hidden_size"], device=self.device, dtype=self.dtype)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _select_per_item(inp: Input, local: list[int] | None) -> dict[str, torch.Tensor]:
    """The one-entry-per-item inputs of one modality's items at ``local`` (None: all): counts, per-item roles and
    the backend's bookkeeping, which travels with its items; indexed, not sliced by rows."""
    per_item = [(inp.modality.count_key, inp.counts)] if inp.counts is not None else []
    per_item += [(inp.modality.inputs[role], tensor) for role, tensor in inp.item_inputs.items()]
    if inp.backend_rows is not None:
        per_item.append((BACKEND_ROW_KEYS[inp.modality.name], inp.backend_rows))
    if local is None:
        return dict(per_item)
    return {key: tensor[torch.tensor(local, dtype=torch.long, device=tensor.device)] for key, tensor in per_item}


class SpecAdapter(_Adapter):
    """Implements :class:`~vitcg.runtime.protocol.SupportsEncoderCudaGraph` (and :mod:`vitcg.runtime.extension`) for
    ``module`` as ``spec`` describes it. Raises UnsupportedError for a graph-scoped spec (see
    :class:`ScopedSpecAdapter`)."""

    supports_encoder_cudagraph = True

    def __init__(self, spec: Spec, module: nn.Module, *, compile_forward: bool = False, compile_eager: bool = False):
        """``compile_forward``, ``compile_eager``: as for every adapter (:class:`_Adapter`)."""
        if spec.graph_scope:
            raise UnsupportedError(f"{spec.name}: graph-scoped specs cannot implement the protocol; build "
                                   "ScopedSpecAdapter (vitcg.runtime.adapter.adapter_for picks it)")
        super().__init__(spec, module, compile_forward=compile_forward, compile_eager=compile_eager)

    def prepare_encoder_cudagraph_replay_buffers(
        self, mm_kwargs: Mapping[str, Any], max_batch_size: int, max_frames_per_batch: int,
        path: str = DEFAULT_PATH,
    ) -> EncoderCudaGraphReplayBuffers:
        """Unpadded buffer values for the items of ``mm_kwargs``, in their order; host integers are None.
        Raises InputError when the items exceed ``max_batch_size``, or when their frames exceed
        ``max_frames_per_batch`` by more than the buffers' spare segment slots hold (vLLM packs by items and
        tokens only: buffers captured for ``max_batch_size`` items and ``max_frames_per_batch`` frames hold
        ``max_batch_size + max_frames_per_batch`` attention segments, whatever mix of items fills them)."""
        _check_path(path)
        pack, items = self._pack(mm_kwargs)
        if len(items) > max_batch_size:
            raise InputError(f"{self.spec.name}: {len(items)} items exceed max_batch_size {max_batch_size}")
        frames = sum(self.get_encoder_cudagraph_item_frames(mm_kwargs))
        if frames and len(items) + frames > max_batch_size + max_frames_per_batch:
            raise InputError(
                f"{self.spec.name}: {len(items)} items with {frames} frames exceed what buffers captured for "
                f"max_batch_size {max_batch_size} and max_frames_per_batch {max_frames_per_batch} hold "
                f"({max_batch_size + max_frames_per_batch} segments); raise encoder_cudagraph_max_frames_per_batch "
                f"to at least {len(items) + frames - max_batch_size}, or cut videos to at most "
                f"{self.get_max_frames_per_video()} frames (max_frames_per_video)")
        return EncoderCudaGraphReplayBuffers({b.name: providers.compute(b, pack) for b in self.spec.buffers})


_NOT_FOR_SCOPED = frozenset({"supports_encoder_cudagraph", "prepare_encoder_cudagraph_replay_buffers"})


class ScopedSpecAdapter(_Adapter):
    """A graph-scoped spec's adapter. Its graphs hold one submodule call whose arguments come from the
    model's own eager prologue, so no protocol-only manager can refill them: it does not claim
    :class:`~vitcg.runtime.protocol.SupportsEncoderCudaGraph`, and the members it lacks raise UnsupportedError.
    vitcg's manager drives it through :meth:`encoder_scoped_forward` (:mod:`vitcg.runtime.extension`)."""

    def __getattr__(self, name: str) -> Any:
        if name in _NOT_FOR_SCOPED:
            raise UnsupportedError(
                f"{self.spec.name} is graph-scoped ({self.spec.graph_scope!r}): its graph inputs come from the "
                f"model's own eager forward, so it has no {name!r} and cannot run under a protocol-only "
                "manager such as vLLM's; use vitcg's EncoderCudaGraphManager")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def encoder_scoped_forward(self, mm_kwargs: Mapping[str, Any], replay: Replay) -> torch.Tensor:
        """The model's eager forward with each call of the graph scope answered by ``replay``
        (:class:`vitcg.runtime.scope.Scope`): ``replay`` gets the call's arguments as buffer values and returns the
        captured output and the capture values it ran on. Raises SpecRuntimeError when the scope is never
        called."""
        output, calls = self._boundary.run(lambda: self.encoder_eager_forward(mm_kwargs), replay)
        if self._inputs(mm_kwargs) and not calls:
            raise SpecRuntimeError(f"{self.spec.name}: the eager forward never called graph_scope "
                                   f"{self.spec.graph_scope!r}; check the module path")
        return output
