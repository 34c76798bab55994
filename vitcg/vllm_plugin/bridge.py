"""The vLLM plugin without vLLM: the spec of a model, the backend's batches read as the spec's inputs and cut into
items, the tower's call answered from graph rows inside the feature call, and :class:`EncoderGraphs`, the
protocol members that :mod:`vitcg.vllm_plugin.backend` puts on vLLM's backend classes. The GPU tests, where vLLM
cannot be installed, put them on a stand-in for the backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch

from ..errors import InputError, UsageError, VitcgError
from ..lang import SpecSource
from ..lang.model import Spec
from ..runtime.accelerate import compiles_by_default
from ..runtime.adapter import SpecAdapter, adapter_for
from ..runtime.compile_cache import hosted_compiled
from ..runtime.hf import Layout, call_inputs, encoder_of, pixels_to_rows
from ..runtime.inputs import BACKEND_ROW_KEYS, item_indices
from ..runtime.protocol import (
    DEFAULT_PATH,
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)
from .routing import Router

logger = logging.getLogger(__name__)

ALL_LAYERS = "output_hidden_states"
"""The tower argument asking for layer outputs: an index (the spec's ``call_kwargs``) or True for all."""

OFF_BUFFER = "vitcg_off"
"""The one capture input of a budget captured after the graphs were turned off: a placeholder graph that
computes nothing and is never replayed for a real item."""

OFF_TOKENS = 1 << 62
"""The packing size of an item while the graphs are off: beyond every budget, so the manager runs it "eagerly"
(the off path's answer) and no graph replays."""

COMPILE_BLOCKS = "VITCG_COMPILE_BLOCKS"
"""The environment variable that decides whether the plugin's graphs hold the tower's repeated blocks compiled by
inductor: ``0`` never, ``1`` on any device; unset, where the tower is on CUDA (as ``vitcg.accelerate``)."""

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


def compiles_blocks(encoder: torch.nn.Module) -> bool:
    """Whether the plugin compiles ``encoder``'s repeated blocks: :data:`COMPILE_BLOCKS` decides, else the device.
    Any other value than ``0`` or ``1`` is one warning and the default."""
    value = os.environ.get(COMPILE_BLOCKS, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        logger.warning("vitcg: %s: expected 0 or 1, got %r; compiling the blocks where the tower is on CUDA",
                       COMPILE_BLOCKS, value)
    return compiles_by_default(encoder)


def find_spec(hf_config: Any) -> Spec:
    """The spec for a Hugging Face config (its ``model_type`` and ``architectures``), from the packaged specs
    and ``$VITCG_SPECS_DIR``. Raises Declined saying why none can be used."""
    source = SpecSource(host=True, bindings=False)
    model_type = getattr(hf_config, "model_type", None)
    architectures = list(getattr(hf_config, "architectures", None) or ())
    spec = source.find(model_type, architectures)
    if spec is None:
        raise Declined(f"no vitcg spec for model_type {model_type!r} ({', '.join(architectures) or 'no architectures'})")
    if spec.unavailable:
        raise Declined(f"spec {spec.name}: {spec.unavailable}")
    if spec.graph_scope:
        raise Declined(f"spec {spec.name} is graph-scoped (prologue or epilogue run outside the graph), which "
                       "vLLM's manager cannot drive")
    return spec


BATCHED_KEYS = frozenset({"image_grid_thw", "video_grid_thw", "second_per_grid_ts", *BACKEND_ROW_KEYS.values()})
"""Backend fields that hold one row per item whatever their length (the backend registers them so)."""


def item_counts(mm_kwargs: Mapping[str, Any], modality: str) -> list[int]:
    """The backend's rows per item of ``modality`` (``num_image_patches`` / ``num_video_patches``). Raises
    InputError, naming the key, the expected and the actual value, for an unknown modality, missing counts, or
    counts that are not non-negative integers (floats, bools, NaN, a meta tensor)."""
    key = BACKEND_ROW_KEYS.get(modality)
    if key is None:
        raise InputError(f"modality: expected one of {sorted(BACKEND_ROW_KEYS)}, got {modality!r}")
    counts = mm_kwargs.get(key)
    if counts is None:
        raise InputError(f"{key!r}: expected the backend's per-item row counts, got none "
                         f"(keys: {', '.join(sorted(mm_kwargs))})")
    out = []
    for position, value in enumerate(_count_values(key, counts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{key}[{position}]: expected a non-negative integer row count, got {value!r}")
        out.append(value)
    return out


def _count_values(key: str, counts: Any) -> list:
    """The values of the counts field ``key``: a tensor's, flattened (integers only), or a list's or tuple's.
    Raises InputError otherwise."""
    if isinstance(counts, torch.Tensor):
        if counts.is_meta or counts.dtype == torch.bool or counts.is_floating_point() or counts.is_complex():
            raise InputError(f"{key!r}: expected a tensor of integer row counts, got {counts.dtype} on "
                             f"{counts.device.type}")
        return counts.flatten().tolist()
    if isinstance(counts, (list, tuple)):
        return list(counts)
    raise InputError(f"{key!r}: expected the backend's per-item row counts, got {type(counts).__name__}")


def _rows_dim(value: torch.Tensor, total: int) -> int | None:
    """The dimension of ``value`` that holds a field's rows flattened over items (``total`` of them): 0, or 1
    under a leading batch dimension; None when neither does."""
    if value.dim() >= 1 and value.shape[0] == total:
        return 0
    if value.dim() >= 2 and value.shape[1] == total:
        return 1
    return None


def _per_item(key: str, value: torch.Tensor, modality: str, total: int, n: int) -> bool:
    """Whether a tensor field holds one row per item (indexed) rather than rows flattened over the items (cut by
    the counts), as the backend registers its fields: grid and count keys per item; other image fields flattened;
    a video field per item when it has one row per item."""
    if key in BATCHED_KEYS:
        return True
    if modality == "video" and value.shape[0] == n:
        return True
    return _rows_dim(value, total) is None and value.shape[0] == n


def backend_counts(mm_kwargs: Mapping[str, Any], modality: str) -> list[int]:
    """:func:`item_counts`, checked against the modality's pixels: the counts must add up to their rows (on dim
    0, or dim 1 under a leading batch dimension), or to a list's items. Raises InputError otherwise."""
    counts = item_counts(mm_kwargs, modality)
    total, n = sum(counts), len(counts)
    pixels_key = BACKEND_PIXELS[modality]
    pixels = mm_kwargs.get(pixels_key)
    if isinstance(pixels, torch.Tensor) and _rows_dim(pixels, total) is None:
        raise InputError(f"{pixels_key!r}: expected {total} rows (the sum of {BACKEND_ROW_KEYS[modality]!r} "
                         f"{counts}) on dim 0 or 1, got shape {tuple(pixels.shape)}")
    if isinstance(pixels, list) and len(pixels) != n:
        raise InputError(f"{pixels_key!r}: expected {n} items (the length of {BACKEND_ROW_KEYS[modality]!r}), "
                         f"got a list of {len(pixels)}")
    return counts


def select_backend_items(mm_kwargs: Mapping[str, Any], modality: str, indices: Sequence[int]) -> dict[str, Any]:
    """The backend's kwargs of the items at ``indices``, in that order, laid out as the backend lays them out:
    a field flattened over items (``pixel_values``: the rows of each item, on dim 0, or dim 1 under a leading
    batch dimension) is cut by the per-item counts, a field with one entry per item is indexed, anything else
    is kept. Checked before any row is taken (:func:`backend_counts`; the indices must be integers naming items
    of the batch): InputError otherwise."""
    counts = backend_counts(mm_kwargs, modality)
    n = len(counts)
    chosen = item_indices(indices)
    outside = [i for i in chosen if not 0 <= i < n]
    if outside:
        raise InputError(f"indices: expected item indices in 0..{n - 1} (the batch has {n} items), got {outside[0]}")
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    selected: dict[str, Any] = {}
    for key, value in mm_kwargs.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            selected[key] = _select_tensor(key, value, modality, counts, offsets, chosen)
        elif isinstance(value, list) and len(value) == n:
            selected[key] = [value[i] for i in chosen]
        else:
            selected[key] = value
    return selected


def _select_tensor(key: str, value: torch.Tensor, modality: str, counts: list[int], offsets: list[int],
                   chosen: list[int]) -> torch.Tensor:
    """The ``chosen`` items of a tensor field: indexed where it holds one row per item, cut at ``offsets`` by
    ``counts`` where it holds rows flattened over the items, else the whole tensor."""
    total, n = sum(counts), len(counts)
    if _per_item(key, value, modality, total, n):
        return value[torch.tensor(chosen, dtype=torch.long, device=value.device)]
    dim = _rows_dim(value, total)
    if dim is None:
        return value
    return torch.cat([value.narrow(dim, offsets[i], counts[i]) for i in chosen] or [value.narrow(dim, 0, 0)], dim=dim)


class Pack(dict):
    """What ``select_encoder_cudagraph_items`` returns: the backend's kwargs of some items of a batch, and which
    items of which batch they are (:attr:`root`, :attr:`indices`), so that the stock path can answer for them
    from the batch the engine gave."""

    def __init__(self, kwargs: Mapping[str, Any], root: Mapping[str, Any], indices: Sequence[int]):
        super().__init__(kwargs)
        self.root = root
        """The batch vLLM's runner handed to the manager."""
        self.indices = tuple(indices)
        """The items of :attr:`root` that this selection holds, in its order."""

    @staticmethod
    def of(mm_kwargs: Mapping[str, Any], kwargs: Mapping[str, Any], indices: Sequence[int]) -> Pack:
        """The selection ``kwargs`` of ``indices`` of ``mm_kwargs`` (a batch, or a selection of one)."""
        if isinstance(mm_kwargs, Pack):
            return Pack(kwargs, mm_kwargs.root, [mm_kwargs.indices[i] for i in indices])
        return Pack(kwargs, mm_kwargs, indices)


class Bridge:
    """The spec, the tower it captures, and the adapter on it (built on first use: vLLM builds the model on
    the meta device and loads its weights afterwards)."""

    def __init__(self, spec: Spec, model: torch.nn.Module):
        self.spec = spec
        _, self.encoder = encoder_of(model, spec)
        self.method = spec.encoder.method
        self._adapter: SpecAdapter | None = None
        self.compile_forward: bool | None = None
        """Whether the adapter, when it is built, runs the tower's repeated blocks compiled by inductor inside the
        graphs (:mod:`vitcg.runtime.regions`): None decides by :func:`compiles_blocks` (on CUDA, unless
        :data:`COMPILE_BLOCKS` says otherwise); benchmarks/plugin_encode.py sets it to compare both."""
        self._store_compiled: Callable[[], int] = lambda: 0
        """Stores the block functions compiled since its last call in the persistent compile cache."""
        self.routes: bool | None = None
        """Whether a call may run wholly on the eager forward where that is cheaper than vLLM's replays
        (:mod:`vitcg.vllm_plugin.routing`): None decides by the device (on CUDA, where calls are timed); tests set
        it, with prices of their own."""
        self._router: Router | None = None
        self.layout: Layout | None = None
        self.off: str | None = None
        """Why the graphs stopped serving this model (:meth:`turn_off`), or None while they serve it."""
        self.served: list[str] = []
        """The modalities the graphs serve: the very list in every config handed to a manager, so that emptying
        it (:meth:`turn_off`) sends each later batch to the stock path (vLLM's runner asks the manager's
        ``supports_modality`` before every call)."""
        self.capture_axes: tuple[tuple[Any, ...], ...] = ()
        """The capture axes of the config handed out (the off path names a key of each in its selections)."""
        self.config_given = False
        """Whether a manager holds a config of this model: its class must then keep the protocol members."""
        self.probed = False
        """Whether a batch of the backend's was tried against the spec before the graphs were built."""
        self.reruns = 0
        """Packs whose tower ran eagerly after their replay, because the graph rows could not yet be shaped as
        the tower's output (:class:`Layout` still unknown); the first pack's is expected."""
        self._stock: tuple[Mapping[str, Any], list[torch.Tensor]] | None = None
        """The batch the stock path answered last, and its answer per item."""
        self.gather_width: int | None = None
        """Under data-parallel encoding (:func:`data_parallel`), the width of the rows vLLM's manager gathers
        across ranks: the language model's input embedding size, which every item of ``embed_multimodal`` has.
        None without it."""
        self.gather_checked: set[str] = set()
        """The modalities whose items were found to be gathered right (:meth:`check_gather`)."""

    def turn_off(self, why: str) -> None:
        """From here on the stock path answers every batch of this model; one warning says why. Without
        data-parallel encoding, vLLM's runner then sends each batch to the stock path itself (:attr:`served`
        emptied). With it, every rank must keep calling the manager, whose gather is a collective of all ranks
        (a rank that alone left it would leave the others waiting), so the modalities stay and the off path
        answers each of this rank's selections from the stock path."""
        if self.off is None:
            self.off = why
            logger.warning("vitcg: spec %s: %s; the model's encoder CUDA graphs are off, vLLM's stock path "
                           "serves this batch and every later one", self.spec.name, why)
        if self.gather_width is None:
            self.served.clear()

    def check_gather(self, mm_kwargs: Mapping[str, Any], features: Sequence[torch.Tensor]) -> None:
        """Under data-parallel encoding, checks that vLLM's manager can gather the items of a whole batch:
        it concatenates each rank's items and cuts the gathered rows by the spec's output tokens per item, at the
        width :attr:`gather_width`, so each of the backend's items (``features``, the stock answer) must be a
        matrix of exactly that many rows and that width. Checked once per modality (the relation is the model's,
        not the batch's); every rank sees the same batch, so every rank decides alike. Raises BoundaryMismatch."""
        modality = self.modality_of(mm_kwargs)
        if self.gather_width is None or modality in self.gather_checked:
            return
        items = self.adapter.get_encoder_cudagraph_item_specs(self.graph_inputs(mm_kwargs))
        for index, (item, feature) in enumerate(zip(items, features, strict=True)):
            if tuple(feature.shape) != (item.output_tokens, self.gather_width):
                raise BoundaryMismatch(
                    f"--mm-encoder-tp-mode data: vLLM gathers {modality} item {index} as {item.output_tokens} rows "
                    f"of {self.gather_width} (the tower's output tokens, the language model's width), and the "
                    f"backend's item is {tuple(feature.shape)}")
        self.gather_checked.add(modality)

    def stock_answer(self, mm_kwargs: Mapping[str, Any], embed: Callable[..., Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """The stock path's items for the batch that ``mm_kwargs`` is (or was selected from: a :class:`Pack`),
        encoded once per batch by ``embed`` (the backend's own ``embed_multimodal``) on the batch as the engine
        gave it, so they are exactly what the stock backend returns."""
        root = mm_kwargs.root if isinstance(mm_kwargs, Pack) else mm_kwargs
        if self._stock is None or self._stock[0] is not root:
            self._stock = (root, list(embed(**root)))
        return self._stock[1]

    @property
    def adapter(self) -> SpecAdapter:
        if self._adapter is None:
            self._adapter = self._build_adapter()
        return self._adapter

    @property
    def router(self) -> Router:
        if self._router is None:
            self._router = Router(self.adapter.device)
        return self._router

    @property
    def routing(self) -> bool:
        """Whether calls are routed (:attr:`routes`, else on CUDA)."""
        return self.routes if self.routes is not None else self.adapter.device.type == "cuda"

    def route_items(self, items: list[EncoderItemSpec]) -> list[EncoderItemSpec]:
        """``items``, each with no tokens on the default path when the router sends the whole call to the eager
        forward (vLLM then runs no graph for them, and :meth:`features` runs their eager forward)."""
        if not self.routing or not self.router.wholly_eager([item.output_tokens for item in items]):
            return items
        return [dataclasses.replace(item, path_output_tokens={DEFAULT_PATH: 0}) for item in items]

    def eager_outputs(self, batch: Mapping[str, Any], indices: Sequence[int],
                      per_item_out_tokens: Sequence[int]) -> dict[str, torch.Tensor]:
        """The eager forward of a pack that vLLM ran no graph for (its items routed, :meth:`route_items`), as the
        outputs of the default path."""
        tokens = sum(per_item_out_tokens[i] for i in indices)
        inputs = self.graph_inputs(batch)
        with torch.inference_mode():
            rows = self.router.eager(tokens, lambda: self.adapter.encoder_eager_forward(inputs, DEFAULT_PATH))
        return {DEFAULT_PATH: rows}

    def _build_adapter(self) -> SpecAdapter:
        """The spec's adapter on the tower: with compiled blocks where :attr:`compile_forward` (or its default)
        says so, their functions loaded from the persistent compile cache; without them, and one warning, when
        that fails and the plain adapter builds."""
        compiled = self.compile_forward if self.compile_forward is not None else compiles_blocks(self.encoder)
        if not compiled:
            return adapter_for(self.spec, self.encoder)
        try:
            adapter = adapter_for(self.spec, self.encoder, compile_forward=True, compile_eager=True)
            self._store_compiled = hosted_compiled(adapter, self.spec, "vllm")
            return adapter
        except Exception as exc:  # noqa: BLE001  (the plain adapter serves; if it fails too, that error is raised)
            adapter = adapter_for(self.spec, self.encoder)
            self._plain_blocks(f"setting up its compiled blocks failed: {type(exc).__name__}: {exc}")
            return adapter

    def _plain_blocks(self, why: str) -> None:
        logger.warning("vitcg: spec %s: %s; its graphs hold the tower's own blocks from here on", self.spec.name,
                       " ".join(why.split())[:500])

    def graph_forward(self, inputs: Mapping[str, Any], path: str) -> torch.Tensor:
        """The adapter's fixed-shape forward. Outside a stream capture (vLLM's warm-up call before each budget's
        capture, where the budget's blocks compile), a forward with compiled blocks that fails is run again with
        the tower's own blocks, which serve from then on (one warning): a compilation that fails costs the
        graphs inductor's kernels, not the graphs. What the forward compiled is stored in the compile cache."""
        adapter = self.adapter
        capturing = adapter.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing or not adapter.compiles:
            return adapter.encoder_cudagraph_forward(inputs, path)
        try:
            output = adapter.encoder_cudagraph_forward(inputs, path)
        except Exception as exc:  # noqa: BLE001  (the plain forward decides: an error of the spec's fails there too)
            adapter.drop_compiled()
            output = adapter.encoder_cudagraph_forward(inputs, path)
            self._plain_blocks(f"a forward with compiled blocks failed: {type(exc).__name__}: {exc}")
            return output
        try:
            self._store_compiled()
        except Exception as exc:  # noqa: BLE001  (a store that fails costs a later start its compile time)
            logger.warning("vitcg: spec %s: storing its compiled blocks failed: %s: %s", self.spec.name,
                           type(exc).__name__, exc)
        return output

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
        inputs = self._read_inputs(mm_kwargs, modality)
        pixels = inputs[modality.pixels_key] = self._pixel_rows(modality, inputs[modality.pixels_key])
        self._check_one_tile_per_item(mm_kwargs, modality)
        for role, key in modality.inputs.items():
            if key not in inputs and role == style.count_role and not style.count_required:
                inputs[key] = torch.ones(pixels.shape[0], dtype=torch.int64)
        return inputs

    def _read_inputs(self, mm_kwargs: Mapping[str, Any], modality: Any) -> dict[str, Any]:
        """The modality's inputs the batch holds under the spec's key, else under the backend's (the pixels, and
        a tile count from the per-item row counts)."""
        style = self.spec.attention_style
        backend = {"pixels": BACKEND_PIXELS.get(modality.name),
                   style.count_role: BACKEND_ROW_KEYS.get(modality.name) if not style.segmented else None}
        inputs = {}
        for role, key in modality.inputs.items():
            if key in mm_kwargs:
                inputs[key] = mm_kwargs[key]
            elif backend.get(role) in mm_kwargs:
                inputs[key] = mm_kwargs[backend[role]]
        return inputs

    def _pixel_rows(self, modality: Any, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels`` with their rows first where the spec's pixels hold them on another dimension. Raises
        InputError when the shape does not hold them."""
        if not self.spec.pixels_rows_dim:
            return pixels
        rows = pixels_to_rows(self.adapter.pixel_layout, pixels)
        if rows is None:
            raise InputError(f"{modality.pixels_key!r}: shape {tuple(pixels.shape)} does not hold the rows the "
                             f"spec {self.spec.name} expects (rows on dim {self.spec.pixels_rows_dim})")
        return rows

    def _check_one_tile_per_item(self, mm_kwargs: Mapping[str, Any], modality: Any) -> None:
        """Raise InputError when the spec makes every tile an item of its own (a tile style without a tile count
        input) and the backend's items hold several tiles each."""
        style = self.spec.attention_style
        counts = mm_kwargs.get(BACKEND_ROW_KEYS.get(modality.name, ""))
        if not style.segmented and style.count_role not in modality.inputs and counts is not None \
                and bool((torch.as_tensor(counts) != 1).any()):
            raise InputError(f"{BACKEND_ROW_KEYS[modality.name]!r}: expected one tile per item (the spec {self.spec.name} "
                             f"has no {style.count_role!r} input), got {torch.as_tensor(counts).tolist()}")

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
                self.reruns += 1
                try:
                    self.layout = Layout.learn(self.spec, output, rows)
                except VitcgError as exc:
                    raise BoundaryMismatch(str(exc)) from exc
                if self.layout is None and rows > 1:
                    raise BoundaryMismatch(f"the graph rows cannot be shaped as the output of "
                                           f"{type(self.encoder).__name__} (the spec's encoder.outputs "
                                           f"{list(self.spec.encoder.outputs)}), so every pack would run the tower "
                                           "again after its replay")
                if self.reruns == 2:
                    logger.warning("vitcg: spec %s: a pack ran %s again after its replay (its output layout is "
                                   "still unknown); counted in the bridge's reruns", self.spec.name,
                                   type(self.encoder).__name__)
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
        ``outputs`` (a graph's output or the eager forward's). Raises BoundaryMismatch when the feature call
        does something the spec does not describe, InputError when ``embed`` gives another number of items."""
        rows: dict[int, torch.Tensor] = {}
        self.adapter.postprocess_encoder_output(outputs, indices, per_item_out_tokens, rows)
        with self.answering(self.modality_of(batch), [rows[i] for i in indices]):
            features = embed(**batch)
        if len(features) != len(indices):
            raise InputError(f"embed_multimodal: expected {len(indices)} items, got {len(features)}")
        return list(features)


def data_parallel(vllm_config: Any) -> bool:
    """Whether vLLM's encoder graph manager will split each batch's items across tensor parallel ranks: mode
    ``data`` (``--mm-encoder-tp-mode``) under a tensor parallel size above 1, as the manager decides it."""
    multimodal = getattr(vllm_config.model_config, "multimodal_config", None)
    return (getattr(multimodal, "mm_encoder_tp_mode", None) == "data"
            and vllm_config.parallel_config.tensor_parallel_size > 1)


def replicated(encoder: torch.nn.Module, sharded: Callable[[torch.nn.Module], bool]) -> None:
    """Checks that every rank holds the whole tower: no module under ``encoder`` is ``sharded``. Raises Declined
    naming the first sharded one and how many there are: under data-parallel encoding each rank runs the tower
    alone on its own items, and a sharded layer would need the other ranks' halves."""
    found = [(name, module) for name, module in encoder.named_modules() if sharded(module)]
    if found:
        name, module = found[0]
        raise Declined(f"--mm-encoder-tp-mode data needs the whole tower on every rank, and {len(found)} of "
                       f"{type(encoder).__name__}'s layers hold a shard of their weight ({name or 'the tower'}: "
                       f"{type(module).__name__}); every rank encodes every item, as the stock backend does")


def _guarded(off: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A protocol member that never raises into vLLM: while the graphs serve the model it runs the member, and
    any exception from it turns them off (:meth:`Bridge.turn_off`); once they are off, ``off`` (same arguments)
    answers instead, with what keeps vLLM's manager consistent while the stock path encodes the batch."""
    def wrap(member: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(member)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            bridge = self._vitcg
            if bridge.off is None:
                try:
                    return member(self, *args, **kwargs)
                except Exception as exc:  # noqa: BLE001  (any failure of vitcg's path: the stock path answers)
                    bridge.turn_off(f"{member.__name__} failed: {type(exc).__name__}: {exc}")
            return off(self, *args, **kwargs)
        return guarded
    return wrap


def _first_tensor(values: Any) -> torch.Tensor | None:
    tensors = [v for v in (values.values() if isinstance(values, Mapping) else ()) if isinstance(v, torch.Tensor)]
    return tensors[0] if tensors else None


class EncoderGraphs:
    """``SupportsEncoderCudaGraph`` for a Transformers backend class, through the spec of the model it wraps.
    Not a base class: :mod:`vitcg.vllm_plugin.backend` copies these members into a direct subclass of each
    backend class (:attr:`_stock`), so that a declined instance can become the stock class (same layout). Of
    the stock class it uses ``__init__(vllm_config=, prefix=)``, ``self.model`` (the Hugging Face model) and
    ``embed_multimodal``.

    Fail-safe: no member raises into vLLM (:func:`_guarded`). Whatever fails on vitcg's path (the spec, a batch
    it cannot read, capture, replay, the feature call) turns the graphs off for the model with one warning: the
    config's modalities (:attr:`Bridge.served`) are emptied, so vLLM's runner sends every later batch to the
    stock ``embed_multimodal``; the members then answer the batch in flight from the stock path (each item as
    the stock backend encodes the whole batch) and capture placeholders that compute nothing. One limit: a
    failure inside a CUDA stream capture, after the same call succeeded in the warm-up just before it, can leave
    the stream unusable, which no guest can undo."""

    supports_encoder_cudagraph: ClassVar[Literal[True]] = True
    supports_encoder_tp_data: ClassVar[bool] = True
    """Under tensor parallelism, vLLM may split each batch's items across the ranks (``--mm-encoder-tp-mode
    data``): its manager then gives each rank a selection of the batch, and each rank captures and replays its
    own budgets. That needs the tower replicated on every rank, which the backend does (its tensor parallel
    plans name no tower layer); :meth:`__init__` checks it and declines where a tower weight is sharded."""
    _stock: ClassVar[type]
    _sharded: ClassVar[Callable[[torch.nn.Module], bool]] = staticmethod(lambda module: False)
    """Whether a module holds only its rank's shard of a weight (vLLM's column and row parallel linears): given
    by :mod:`vitcg.vllm_plugin.backend`, which imports vLLM; this module does not."""

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
            if data_parallel(vllm_config):
                replicated(bridge.encoder, type(self)._sharded)
                bridge.gather_width = vllm_config.model_config.get_inputs_embeds_size()
        except Declined as exc:
            self._decline(f"{name} runs without encoder CUDA graphs: {exc}")
            return
        except Exception as exc:  # noqa: BLE001  (a failure of vitcg's own: the model loads as stock)
            self._decline(f"{name} runs without encoder CUDA graphs: vitcg failed while choosing its spec: "
                          f"{type(exc).__name__}: {exc}", logging.WARNING)
            return
        self._vitcg = bridge
        logger.info("vitcg: %s gets encoder CUDA graphs from spec %s (%s)", name, spec.name,
                    type(bridge.encoder).__name__)

    def _decline(self, why: str, level: int = logging.INFO) -> None:
        """From here on exactly the stock backend: vLLM's ``isinstance`` check finds no protocol. Once a manager
        holds the model's config the class stays, and the graphs are turned off instead."""
        bridge = self.__dict__.get("_vitcg")
        if bridge is not None and bridge.config_given:
            bridge.turn_off(why)
            return
        logger.log(level, "vitcg: %s", why)
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
            except Exception as exc:  # noqa: BLE001  (whatever it is, the spec cannot serve these batches)
                self._decline(f"spec {bridge.spec.name} cannot read the backend's batches "
                              f"({', '.join(f'{k} {describe(v)}' for k, v in kwargs.items())}): {exc}; "
                              "the model runs without encoder CUDA graphs")
                return stock.embed_multimodal(self, **kwargs)
        features = stock.embed_multimodal(self, **kwargs)
        if bridge.off is None and bridge.gather_width is not None and not bridge.config_given:
            try:  # the profiling batch, on every rank alike: a model vLLM cannot gather declines here
                bridge.check_gather(kwargs, features)
            except Exception as exc:  # noqa: BLE001
                self._decline(f"spec {bridge.spec.name}: {exc}; the model runs without encoder CUDA graphs")
        return features

    def _process_vision_input(self, modality: str, pixel_values: Any, counts: Any, /, **kwargs: Any) -> Any:
        """The stock backend's, except for a processor output named like one of that method's own parameters
        (InternVL's, Aya Vision's and GOT-OCR2's ``num_patches``: tiles per image), where the stock backend raises
        ``TypeError: got multiple values for argument 'num_patches'``: it reaches the model's feature call
        (:meth:`_get_features`) where that call names it as a parameter, and is left out where it does not (the
        call's typed ``**kwargs`` take no such key: those three models' do not). Items handed over as a list
        (encoded one at a time) keep the stock behaviour."""
        stock = self._stock._process_vision_input
        own = {name for name, p in inspect.signature(stock).parameters.items() if p.kind is not p.VAR_KEYWORD}
        clash = {key: kwargs.pop(key) for key in own & set(kwargs)}
        if clash and not isinstance(pixel_values, torch.Tensor):
            kwargs.update(clash)  # as the stock backend (which raises its TypeError)
            clash = {}
        feature_call = inspect.signature(getattr(self.model, f"get_{modality}_features")).parameters
        taken = {key: value for key, value in clash.items()
                 if key in feature_call and feature_call[key].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                            inspect.Parameter.VAR_KEYWORD)}
        if not taken:
            return stock(self, modality, pixel_values, counts, **kwargs)
        self.__dict__["_vitcg_feature_kwargs"] = taken
        try:
            return stock(self, modality, pixel_values, counts, **kwargs)
        finally:
            del self.__dict__["_vitcg_feature_kwargs"]

    def _get_features(self, modality: str, pixel_values: Any, **kwargs: Any) -> Any:
        """The stock backend's, with the processor outputs :meth:`_process_vision_input` set aside."""
        return self._stock._get_features(self, modality, pixel_values, **kwargs,
                                         **self.__dict__.get("_vitcg_feature_kwargs", {}))

    def _stock_items(self, mm_kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The stock path's answer for the items of ``mm_kwargs`` (a batch or a :class:`Pack`), in its order."""
        answer = self._vitcg.stock_answer(mm_kwargs, functools.partial(self._stock.embed_multimodal, self))
        return [answer[i] for i in mm_kwargs.indices] if isinstance(mm_kwargs, Pack) else answer

    # off-mode answers (the graphs are off; the stock path encodes the batch in flight)

    def _off_config(self) -> Any:
        self._vitcg.config_given = True
        return EncoderCudaGraphConfig(modalities=self._vitcg.served, buffer_keys=[OFF_BUFFER],
                                      out_hidden_size=self._vitcg.gather_width or 1)

    def _off_items(self, mm_kwargs: Mapping[str, Any]) -> list[Any]:
        # Each item's real row count as its output tokens (what vLLM cuts and gathers rows by), tokens beyond
        # every budget for packing (so that no graph replays for nothing: each item "runs eagerly", which the
        # off path answers from the stock path), and, where the spec still reads the batch, its own input sizes,
        # by which a data-parallel manager assigns items to ranks: a rank that is off then splits the batch as
        # the ranks that are not.
        answer = self._stock_items(mm_kwargs)
        try:
            sizes = [item.input_size for item in self._vitcg.adapter.get_encoder_cudagraph_item_specs(
                self._vitcg.graph_inputs(mm_kwargs))]
        except Exception:  # noqa: BLE001  (the spec cannot read it on any rank: every rank uses the row counts)
            sizes = []
        if len(sizes) != len(answer):
            sizes = [len(item) for item in answer]
        return [EncoderItemSpec(input_size=max(1, size), output_tokens=max(1, len(item)),
                                path_output_tokens={DEFAULT_PATH: OFF_TOKENS})
                for size, item in zip(sizes, answer)]

    def _off_select(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        pack = Pack.of(mm_kwargs, {}, list(indices))
        axes = self._vitcg.capture_axes
        if axes:
            pack[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] = tuple(axis[0] for axis in axes)
        return pack

    def _off_capture(self, token_budget: int, max_batch_size: int, max_frames_per_batch: int,
                     device: torch.device, *rest: Any, **kwargs: Any) -> Any:
        return EncoderCudaGraphCaptureInputs(values={OFF_BUFFER: torch.zeros(1, device=device)})

    def _off_forward(self, inputs: Mapping[str, Any], *rest: Any, **kwargs: Any) -> torch.Tensor:
        tensor = _first_tensor(inputs)
        return torch.zeros(1, device=tensor.device if tensor is not None else None)

    def _off_postprocess(self, outputs: Any, indices: Sequence[int], per_item_out_tokens: Any, dest: Any,
                         clone: bool = False, batch_mm_kwargs: Mapping[str, Any] | None = None) -> None:
        if batch_mm_kwargs is None:
            raise InputError("postprocess_encoder_output: expected the pack's batch_mm_kwargs, got None")
        for index, feature in zip(indices, self._stock_items(batch_mm_kwargs)):
            dest[index] = feature

    # the protocol: everything but postprocess is the spec adapter's, on the spec's keys of the backend's batch

    @_guarded(_off_config)
    def get_encoder_cudagraph_config(self) -> Any:
        bridge = self._vitcg
        bridge.config_given = True
        config = bridge.adapter.get_encoder_cudagraph_config()
        bridge.capture_axes = tuple(tuple(axis) for axis in config.capture_axes)
        bridge.served[:] = config.modalities
        if bridge.routing:  # a call routed to the eager forward leaves the path out (vitcg.vllm_plugin.routing)
            config = dataclasses.replace(config, paths={
                DEFAULT_PATH: dataclasses.replace(config.paths[DEFAULT_PATH], allow_zero_tokens=True)})
        if bridge.gather_width is not None:  # vLLM's gather pads each rank's items at this width
            return dataclasses.replace(config, modalities=bridge.served, out_hidden_size=bridge.gather_width)
        return dataclasses.replace(config, modalities=bridge.served)

    @_guarded(lambda self, mm_kwargs: "video" if BACKEND_PIXELS["video"] in mm_kwargs else "image")
    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        return self._vitcg.modality_of(mm_kwargs)

    @_guarded(lambda self: 1)
    def get_max_frames_per_video(self) -> int:
        return self._vitcg.adapter.get_max_frames_per_video()

    @_guarded(lambda self, vllm_config: (1, 1))
    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        return self._vitcg.adapter.get_encoder_cudagraph_budget_range(vllm_config)

    @_guarded(_off_items)
    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[Any]:
        """The spec's items of the batch, after the backend's counts are checked against its pixel rows."""
        bridge = self._vitcg
        inputs = bridge.graph_inputs(mm_kwargs)
        modality = bridge.adapter.get_input_modality(inputs)
        if modality in BACKEND_ROW_KEYS and BACKEND_ROW_KEYS[modality] in mm_kwargs:
            backend_counts(mm_kwargs, modality)  # the counts describe the rows, or InputError
        if bridge.gather_width is not None and not isinstance(mm_kwargs, Pack) and modality not in bridge.gather_checked:
            # a whole batch before vLLM shards it, with no profiling run: the stock answer, which the off path
            # reuses if the rows cannot be gathered
            bridge.check_gather(mm_kwargs, self._stock_items(mm_kwargs))
        return bridge.route_items(bridge.adapter.get_encoder_cudagraph_item_specs(inputs))

    @_guarded(_off_select)
    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        """The backend's kwargs of those items (what ``embed_multimodal`` needs in ``postprocess``), plus the
        capture axis keys the adapter resolves, as a :class:`Pack`."""
        bridge = self._vitcg
        inputs = bridge.graph_inputs(mm_kwargs)
        selected = Pack.of(mm_kwargs, select_backend_items(mm_kwargs, bridge.adapter.get_input_modality(inputs),
                                                           indices), indices)
        graph = bridge.adapter.select_encoder_cudagraph_items(inputs, indices)
        if ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG in graph:
            selected[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] = tuple(graph[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG])
        return selected

    @_guarded(_off_capture)
    def prepare_encoder_cudagraph_capture_inputs(self, token_budget: int, max_batch_size: int,
                                                 max_frames_per_batch: int, device: torch.device,
                                                 dtype: torch.dtype, path: str = DEFAULT_PATH,
                                                 axis_keys: Any = None) -> Any:
        self._vitcg.router.note_capture(token_budget, max_batch_size, max_frames_per_batch)
        return self._vitcg.adapter.prepare_encoder_cudagraph_capture_inputs(
            token_budget, max_batch_size, max_frames_per_batch, device, dtype, path, axis_keys)

    @_guarded(lambda self, *args, **kwargs: EncoderCudaGraphReplayBuffers(values={}))
    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs: Mapping[str, Any], max_batch_size: int,
                                                 max_frames_per_batch: int, path: str = DEFAULT_PATH) -> Any:
        bridge = self._vitcg
        inputs = bridge.graph_inputs(mm_kwargs)
        if bridge.routing and bridge.router.times_replays():  # the replay that follows is timed, to postprocess
            bridge.router.replay_starts(sum(item.output_tokens for item in
                                            bridge.adapter.get_encoder_cudagraph_item_specs(inputs)))
        return bridge.adapter.prepare_encoder_cudagraph_replay_buffers(inputs, max_batch_size, max_frames_per_batch,
                                                                        path)

    @_guarded(_off_forward)
    def encoder_cudagraph_forward(self, inputs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        return self._vitcg.graph_forward(inputs, path)

    @_guarded(lambda self, *args, **kwargs: torch.zeros(0))
    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        return self._vitcg.adapter.encoder_eager_forward(self._vitcg.graph_inputs(mm_kwargs), path)

    @_guarded(_off_postprocess)
    def postprocess_encoder_output(self, outputs: Mapping[str, torch.Tensor], indices: Sequence[int],
                                   per_item_out_tokens: Sequence[int], dest: Any, clone: bool = False,
                                   batch_mm_kwargs: Mapping[str, Any] | None = None) -> None:
        """Each item's features as the backend's ``embed_multimodal`` gives them, with the tower's call
        answered from the pack's rows; ``dest[i]`` for item ``i``, cloned when asked."""
        if batch_mm_kwargs is None:
            raise InputError("postprocess_encoder_output: expected the pack's batch_mm_kwargs, got None")
        bridge = self._vitcg
        if DEFAULT_PATH in outputs:
            bridge.router.replay_ended()
        else:  # no graph ran: a call routed to the eager forward (its items have no tokens on the path)
            outputs = bridge.eager_outputs(batch_mm_kwargs, indices, per_item_out_tokens)
        features = self._vitcg.features(functools.partial(self._stock.embed_multimodal, self), batch_mm_kwargs,
                                        outputs, indices, per_item_out_tokens)
        for index, feature in zip(indices, features):
            dest[index] = feature.clone() if clone else feature
