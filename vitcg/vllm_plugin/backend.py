"""vLLM's Transformers backend with encoder CUDA graphs: its multimodal classes, serving vLLM's protocol from a spec.

Where the graphs sit. The backend's ``embed_multimodal`` encodes a batch of one modality through the Hugging
Face model's ``get_image_features`` / ``get_video_features`` (tower, then whatever the VLM does after it:
projector, feature layer, token dropping) and splits the result into one tensor per item. vLLM's
``EncoderCudaGraphManager`` must return exactly those per-item tensors. The spec captures the tower (the call
named by ``encoder.class`` / ``encoder.method`` at ``encoder.vlm_attribute``), so here:

- capture, packing, replay and the eager fallback of the tower are vLLM's manager driving vitcg's spec adapter
  (:class:`~vitcg.runtime.adapter.SpecAdapter`) through the protocol members below;
- ``postprocess_encoder_output`` then runs the backend's own ``embed_multimodal`` on the pack, with the
  tower's call answered from the pack's graph rows (the call is checked against the spec: the same inputs,
  the same rows). What follows the tower runs as the stock backend runs it, so each item is what the stock
  backend would return for it.

The first pack also runs the tower once eagerly, to learn how its output is structured (see
:class:`~vitcg.runtime.accelerate._Layout`). A feature call that the spec does not describe (an argument it
does not capture, another row count, a second tower call) turns the graphs off for that model: one warning,
and every later batch is encoded by the stock path.

A model whose spec cannot be used becomes an instance of the stock class, so vLLM sees no
``SupportsEncoderCudaGraph`` and captures nothing; one INFO line on the ``vitcg`` logger says why. That is
decided right after construction (no spec matches, the installed transformers lacks the spec's code, the spec
is graph-scoped, its encoder is not where the spec says), or at the first batch ``embed_multimodal`` sees,
which in vLLM is the profiling run before graphs are captured (the spec cannot read the backend's batch: a
pixel layout it does not describe).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from vllm.model_executor.models.transformers import (
    TransformersMultiModalForCausalLM,
    TransformersMultiModalMoEForCausalLM,
)

from ..errors import InputError, UsageError
from ..runtime.protocol import DEFAULT_PATH, ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from .bridge import Bridge, Declined, describe, find_spec, select_backend_items

logger = logging.getLogger(__name__)


class _EncoderGraphs:
    """``SupportsEncoderCudaGraph`` for a Transformers backend class, through the spec of the model it wraps.
    Not a base class: :func:`_with_encoder_graphs` copies these members into a direct subclass of the backend
    class (:attr:`_stock`), so that a declined instance can become the stock class (same layout)."""

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
        selected = select_backend_items(mm_kwargs, bridge.modality_of(mm_kwargs), indices)
        graph = bridge.adapter.select_encoder_cudagraph_items(bridge.graph_inputs(mm_kwargs), indices)
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


def _with_encoder_graphs(stock: type, name: str) -> type:
    """A direct subclass of the backend class ``stock`` with :class:`_EncoderGraphs`'s members."""
    members = {k: v for k, v in vars(_EncoderGraphs).items() if k not in ("__dict__", "__weakref__", "__doc__")}
    doc = f"vLLM's ``{stock.__name__}`` with encoder CUDA graphs from vitcg's spec of the model it wraps."
    return type(name, (stock,), {**members, "_stock": stock, "__doc__": doc, "__qualname__": name})


VitcgMultiModalForCausalLM = _with_encoder_graphs(TransformersMultiModalForCausalLM, "VitcgMultiModalForCausalLM")
VitcgMultiModalMoEForCausalLM = _with_encoder_graphs(TransformersMultiModalMoEForCausalLM,
                                                     "VitcgMultiModalMoEForCausalLM")
