"""The vLLM plugin without vLLM: the spec of a model, the backend's batches read as the spec's inputs and cut into
items, the tower's call answered from graph rows inside the feature call, and :class:`EncoderGraphs`, the
protocol members that :mod:`vitcg.vllm_plugin.backend` puts on vLLM's backend classes. The GPU tests, where vLLM
cannot be installed, put them on a stand-in for the backend.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch

from ..errors import InputError, UsageError, VitcgError
from ..lang import load_registry
from ..lang.model import Spec
from ..runtime.accelerate import _Layout, call_inputs, encoder_of
from ..runtime.adapter import SpecAdapter, adapter_for, pixels_to_rows
from ..runtime.inputs import BACKEND_ROW_KEYS, item_indices
from ..runtime.protocol import DEFAULT_PATH, ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG

logger = logging.getLogger(__name__)

ALL_LAYERS = "output_hidden_states"
"""The tower argument asking for layer outputs: an index (the spec's ``call_kwargs``) or True for all."""

BACKEND_PIXELS = {"image": "pixel_values", "video": "pixel_values_videos"}
"""The keys under which the backend hands over each modality's pixels (the HF processor's names)."""


class Declined(VitcgError):
    """The spec cannot serve this model: it runs as the stock backend."""


class BoundaryMismatch(VitcgError):
    """The model's feature call asked its encoder for something the spec's graphs do not compute."""


def describe(value: Any) -> str:
    """A short description of a batch entry for log lines: a tensor's shape, a list's length, else the type."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} entries]"
    return type(value).__name__


def find_spec(hf_config: Any) -> Spec:
    """The spec for a Hugging Face config (its ``model_type`` and ``architectures``), from the packaged specs
    and ``$VITCG_SPECS_DIR``. Raises Declined saying why none can be used."""
    registry = load_registry(bindings=False)
    model_type = getattr(hf_config, "model_type", None)
    architectures = list(getattr(hf_config, "architectures", None) or ())
    spec = registry.find(model_type, architectures)
    if spec is None:
        raise Declined(f"no vitcg spec for model_type {model_type!r} ({', '.join(architectures) or 'no architectures'})")
    if spec.unavailable:
        raise Declined(f"spec {spec.name}: {spec.unavailable}")
    if spec.graph_scope:
        raise Declined(f"spec {spec.name} is graph-scoped (prologue or epilogue run outside the graph), which "
                       "vLLM's manager cannot drive")
    return spec


def item_counts(mm_kwargs: Mapping[str, Any], modality: str) -> list[int]:
    """The backend's rows per item of ``modality`` (``num_image_patches`` / ``num_video_patches``). Raises
    InputError when the key is missing."""
    counts = mm_kwargs.get(BACKEND_ROW_KEYS[modality])
    if counts is None:
        raise InputError(f"{BACKEND_ROW_KEYS[modality]!r}: expected the backend's per-item row counts, got none "
                         f"(keys: {', '.join(sorted(mm_kwargs))})")
    return [int(c) for c in torch.as_tensor(counts).flatten().tolist()]


def select_backend_items(mm_kwargs: Mapping[str, Any], modality: str, indices: Sequence[int]) -> dict[str, Any]:
    """The backend's kwargs of the items at ``indices``, in that order, laid out as the backend lays them out:
    a field flattened over items (``pixel_values``: the rows of each item, on dim 0, or dim 1 under a leading
    batch dimension) is cut by the per-item counts, a field with one entry per item is indexed, anything else
    is kept."""
    counts = item_counts(mm_kwargs, modality)
    total, n = sum(counts), len(counts)
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    chosen = item_indices(indices)
    selected: dict[str, Any] = {}
    for key, value in mm_kwargs.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            dim = 1 if value.dim() >= 2 and value.shape[0] != total and value.shape[1] == total else 0
            if value.shape[dim] == total and total != n:
                selected[key] = torch.cat([value.narrow(dim, offsets[i], counts[i]) for i in chosen], dim=dim)
            elif value.shape[0] == n:
                selected[key] = value[torch.tensor(chosen, dtype=torch.long, device=value.device)]
            else:
                selected[key] = value
        elif isinstance(value, list) and len(value) == n:
            selected[key] = [value[i] for i in chosen]
        else:
            selected[key] = value
    return selected


class Bridge:
    """The spec, the tower it captures, and the adapter on it (built on first use: vLLM builds the model on
    the meta device and loads its weights afterwards)."""

    def __init__(self, spec: Spec, model: torch.nn.Module):
        self.spec = spec
        _, self.encoder = encoder_of(model, spec)
        self.method = spec.encoder.method
        self._adapter: SpecAdapter | None = None
        self.layout: _Layout | None = None
        self.broken: str | None = None
        """Why the graphs stopped serving this model (a feature call the spec does not describe), or None."""
        self.probed = False
        """Whether a batch of the backend's was tried against the spec before the graphs were built."""

    @property
    def adapter(self) -> SpecAdapter:
        if self._adapter is None:
            self._adapter = adapter_for(self.spec, self.encoder)
        return self._adapter

    def _modality(self, mm_kwargs: Mapping[str, Any]) -> Any:
        """The spec's modality of a backend batch: the one whose pixel key, or the backend's pixel key for it
        (:data:`BACKEND_PIXELS`), the batch holds. Raises InputError when none is there."""
        for modality in self.spec.modalities:
            if modality.pixels_key in mm_kwargs or BACKEND_PIXELS.get(modality.name) in mm_kwargs:
                return modality
        keys = sorted({m.pixels_key for m in self.spec.modalities} | set(BACKEND_PIXELS.values()))
        raise InputError(f"{self.spec.name}: expected one of {keys} in the batch, got {sorted(mm_kwargs)}")

    def graph_inputs(self, mm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The adapter's kwargs for a batch of the backend's. Each input of the batch's modality is read under
        the spec's key, else, for the pixels, under the backend's pixel key and, for a tile count, from the
        backend's per-item row counts; pixels rows first; a tile count of one per tile where the spec's style
        allows it."""
        modality = self._modality(mm_kwargs)
        style = self.spec.attention_style
        backend = {"pixels": BACKEND_PIXELS.get(modality.name),
                   style.count_role: BACKEND_ROW_KEYS.get(modality.name) if not style.segmented else None}
        inputs = {}
        for role, key in modality.inputs.items():
            if key in mm_kwargs:
                inputs[key] = mm_kwargs[key]
            elif backend.get(role) in mm_kwargs:
                inputs[key] = mm_kwargs[backend[role]]
        pixels = inputs[modality.pixels_key]
        if self.spec.pixels_rows_dim:
            rows = pixels_to_rows(self.adapter.pixel_layout, pixels)
            if rows is None:
                raise InputError(f"{modality.pixels_key!r}: shape {tuple(pixels.shape)} does not hold the rows the "
                                 f"spec {self.spec.name} expects (rows on dim {self.spec.pixels_rows_dim})")
            pixels = inputs[modality.pixels_key] = rows
        counts = mm_kwargs.get(BACKEND_ROW_KEYS.get(modality.name, ""))
        if not style.segmented and style.count_role not in modality.inputs and counts is not None \
                and bool((torch.as_tensor(counts) != 1).any()):
            # the spec makes every tile an item of its own, the backend's items hold several tiles each
            raise InputError(f"{BACKEND_ROW_KEYS[modality.name]!r}: expected one tile per item (the spec {self.spec.name} "
                             f"has no {style.count_role!r} input), got {torch.as_tensor(counts).tolist()}")
        for role, key in modality.inputs.items():
            if key not in inputs and role == style.count_role and not style.count_required:
                inputs[key] = torch.ones(pixels.shape[0], dtype=torch.int64)
        return inputs

    def modality_of(self, mm_kwargs: Mapping[str, Any]) -> str:
        return self.adapter.get_input_modality(self.graph_inputs(mm_kwargs))

    @contextlib.contextmanager
    def answering(self, modality: str, parts: list[torch.Tensor]) -> Iterator[None]:
        """The tower's call answered from ``parts`` (the pack's rows per item) for the duration of the block:
        once, and only for the inputs of those items. Raises BoundaryMismatch otherwise."""
        original = getattr(self.encoder, self.method)
        signature = inspect.signature(original)
        combined = torch.cat(parts)
        calls = 0

        def answer(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise BoundaryMismatch(f"the feature call runs {type(self.encoder).__name__} more than once per batch")
            wanted = self.spec.encoder.call_kwargs.get(ALL_LAYERS)
            if kwargs.get(ALL_LAYERS) is True and isinstance(wanted, int) and not isinstance(wanted, bool):
                # every layer's output asked for (older transformers' LLaVA): the answer holds the spec's layer
                # and None for the others; a feature call that reads another one fails, and postprocess falls back
                kwargs = {**kwargs, ALL_LAYERS: wanted}
            mm, reason = call_inputs(self.spec, self.adapter, signature, modality, args, kwargs)
            if mm is None:
                raise BoundaryMismatch(reason)
            rows = sum(item.output_tokens for item in self.adapter.get_encoder_cudagraph_item_specs(mm))
            if rows != combined.shape[0]:
                raise BoundaryMismatch(f"the feature call asks {type(self.encoder).__name__} for {rows} rows where "
                                       f"the pack's items have {combined.shape[0]}")
            if self.layout is None:  # learn how the tower's output is laid out from one real call
                output = original(*args, **kwargs)
                try:
                    self.layout = _Layout.learn(self.spec, output, rows)
                except VitcgError as exc:
                    raise BoundaryMismatch(str(exc)) from exc
                return output
            return self.layout.build(combined, parts)

        setattr(self.encoder, self.method, answer)
        try:
            yield
        finally:
            delattr(self.encoder, self.method)

    def features(self, embed: Callable[..., Sequence[torch.Tensor]], batch: Mapping[str, Any],
                 outputs: Mapping[str, torch.Tensor], indices: Sequence[int],
                 per_item_out_tokens: Sequence[int]) -> list[torch.Tensor]:
        """Each item of a pack (``indices`` order) as ``embed(**batch)`` gives it (the backend's
        ``embed_multimodal`` on the pack's kwargs), with the tower's call answered from the pack's rows in
        ``outputs`` (a graph's output or the eager forward's). When the feature call does something the spec
        does not describe, the rest of this model's life runs ``embed`` as it is (one warning says why), which
        either serves the batch or raises what the stock backend raises. Raises InputError when ``embed`` gives
        another number of items."""
        features = None
        if self.broken is None:
            rows: dict[int, torch.Tensor] = {}
            self.adapter.postprocess_encoder_output(outputs, indices, per_item_out_tokens, rows)
            try:
                with self.answering(self.modality_of(batch), [rows[i] for i in indices]):
                    features = embed(**batch)
            except (BoundaryMismatch, TypeError, IndexError, ValueError, RuntimeError) as exc:
                # an answer the feature call did not take as the tower's output: the stock path decides
                self.broken = str(exc) if isinstance(exc, BoundaryMismatch) else f"{type(exc).__name__}: {exc}"
                logger.warning("vitcg: spec %s does not describe the feature call of %s (%s); its encoder CUDA "
                               "graphs are off from now on", self.spec.name, type(self.encoder).__name__, self.broken)
        if features is None:
            features = embed(**batch)
        if len(features) != len(indices):
            raise InputError(f"embed_multimodal: expected {len(indices)} items, got {len(features)}")
        return list(features)


class EncoderGraphs:
    """``SupportsEncoderCudaGraph`` for a Transformers backend class, through the spec of the model it wraps.
    Not a base class: :mod:`vitcg.vllm_plugin.backend` copies these members into a direct subclass of each
    backend class (:attr:`_stock`), so that a declined instance can become the stock class (same layout). Of
    the stock class it uses ``__init__(vllm_config=, prefix=)``, ``self.model`` (the Hugging Face model) and
    ``embed_multimodal``."""

    supports_encoder_cudagraph: ClassVar[Literal[True]] = True
    _stock: ClassVar[type]

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self._stock.__init__(self, vllm_config=vllm_config, prefix=prefix)
        hf_config = vllm_config.model_config.hf_config
        name = ", ".join(getattr(hf_config, "architectures", None) or ()) or type(self.model).__name__
        try:
            spec = find_spec(hf_config)
            try:
                bridge = Bridge(spec, self.model)
            except UsageError as exc:
                raise Declined(f"spec {spec.name} does not describe this model: {exc}") from exc
        except Declined as exc:
            self._decline(f"{name} runs without encoder CUDA graphs: {exc}")
            return
        self._vitcg = bridge
        logger.info("vitcg: %s gets encoder CUDA graphs from spec %s (%s)", name, spec.name,
                    type(bridge.encoder).__name__)

    def _decline(self, why: str) -> None:
        """From here on exactly the stock backend: vLLM's ``isinstance`` check finds no protocol."""
        logger.info("vitcg: %s", why)
        self.__dict__.pop("_vitcg", None)
        self.__class__ = self._stock

    def embed_multimodal(self, **kwargs: Any) -> Any:
        """The stock backend's; the first batch it sees (vLLM's profiling run, before any graph is captured) also
        proves that the spec reads the backend's batches: if it cannot, the model declines the graphs."""
        bridge, stock = self._vitcg, self._stock
        if not bridge.probed and bridge._adapter is None:
            bridge.probed = True
            try:
                bridge.adapter.get_encoder_cudagraph_item_specs(bridge.graph_inputs(kwargs))
            except (InputError, ValueError, TypeError) as exc:
                self._decline(f"spec {bridge.spec.name} cannot read the backend's batches "
                              f"({', '.join(f'{k} {describe(v)}' for k, v in kwargs.items())}): {exc}; "
                              "the model runs without encoder CUDA graphs")
        return stock.embed_multimodal(self, **kwargs)

    # the protocol: everything but postprocess is the spec adapter's, on the spec's keys of the backend's batch

    def get_encoder_cudagraph_config(self) -> Any:
        return self._vitcg.adapter.get_encoder_cudagraph_config()

    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        return self._vitcg.modality_of(mm_kwargs)

    def get_max_frames_per_video(self) -> int:
        return self._vitcg.adapter.get_max_frames_per_video()

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        return self._vitcg.adapter.get_encoder_cudagraph_budget_range(vllm_config)

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[Any]:
        return self._vitcg.adapter.get_encoder_cudagraph_item_specs(self._vitcg.graph_inputs(mm_kwargs))

    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        """The backend's kwargs of those items (what ``embed_multimodal`` needs in ``postprocess``), plus the
        capture axis keys the adapter resolves."""
        bridge = self._vitcg
        inputs = bridge.graph_inputs(mm_kwargs)
        selected = select_backend_items(mm_kwargs, bridge.adapter.get_input_modality(inputs), indices)
        graph = bridge.adapter.select_encoder_cudagraph_items(inputs, indices)
        if ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG in graph:
            selected[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] = tuple(graph[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG])
        return selected

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget: int, max_batch_size: int,
                                                 max_frames_per_batch: int, device: torch.device,
                                                 dtype: torch.dtype, path: str = DEFAULT_PATH,
                                                 axis_keys: Any = None) -> Any:
        return self._vitcg.adapter.prepare_encoder_cudagraph_capture_inputs(
            token_budget, max_batch_size, max_frames_per_batch, device, dtype, path, axis_keys)

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs: Mapping[str, Any], max_batch_size: int,
                                                 max_frames_per_batch: int, path: str = DEFAULT_PATH) -> Any:
        return self._vitcg.adapter.prepare_encoder_cudagraph_replay_buffers(
            self._vitcg.graph_inputs(mm_kwargs), max_batch_size, max_frames_per_batch, path)

    def encoder_cudagraph_forward(self, inputs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        return self._vitcg.adapter.encoder_cudagraph_forward(inputs, path)

    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        return self._vitcg.adapter.encoder_eager_forward(self._vitcg.graph_inputs(mm_kwargs), path)

    def postprocess_encoder_output(self, outputs: Mapping[str, torch.Tensor], indices: Sequence[int],
                                   per_item_out_tokens: Sequence[int], dest: Any, clone: bool = False,
                                   batch_mm_kwargs: Mapping[str, Any] | None = None) -> None:
        """Each item's features as the backend's ``embed_multimodal`` gives them, with the tower's call
        answered from the pack's rows; ``dest[i]`` for item ``i``, cloned when asked."""
        if batch_mm_kwargs is None:
            raise InputError("postprocess_encoder_output: expected the pack's batch_mm_kwargs, got None")
        features = self._vitcg.features(functools.partial(self._stock.embed_multimodal, self), batch_mm_kwargs,
                                        outputs, indices, per_item_out_tokens)
        for index, feature in zip(indices, features):
            dest[index] = feature.clone() if clone else feature
