"""Every test double of vLLM code that tests/vllm use, in this one place: each replaces the least it can.

What runs here is vLLM 0.33.0's own code on a CPU-only machine with a CPU build of torch; a double exists only
where that code cannot run without an accelerator or a package this machine cannot install. Everything else
(configs, registry, model loader, the encoder graph manager's packing, budgets, replay buffers, padding logics,
postprocessing, hit and miss counts) is vLLM's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from vllm.v1.worker.encoder_cudagraph import BudgetGraphMetadata, EncoderCudaGraphManager


@contextlib.contextmanager
def no_accelerator_empty_cache() -> Iterator[None]:
    """Replaces ``torch.accelerator.empty_cache`` with a no-op while no accelerator is present.

    Why: vLLM's model loader frees the accelerator's cache after loading, and on a CPU build of torch (2.13)
    that call raises "Cannot access accelerator device when none is available" instead of doing nothing. With
    an accelerator present nothing is replaced."""
    if torch.accelerator.is_available():
        yield
        return
    with mock.patch.object(torch.accelerator, "empty_cache", lambda: None):
        yield


@contextlib.contextmanager
def modalities_from_model(spec: Any) -> Iterator[None]:
    """Makes the Transformers backend report the modalities the model has (``spec.modality_names``) instead of
    asking the Hugging Face processor for them.

    Why: vLLM's Transformers backend (``MultiModalProcessingInfo._get_supported_modalities``) instantiates the
    model's HF processor to learn its modalities, when its config is built and again when its model is; some
    processors (Qwen2-VL's video processor) import torchvision, which has no CPU build on PyPI. Nothing else
    about the processor or the backend is replaced."""
    from vllm.model_executor.models.transformers.multimodal import MultiModalProcessingInfo

    modalities = list(spec.modality_names)
    with mock.patch.object(MultiModalProcessingInfo, "_get_supported_modalities", lambda self: list(modalities)):
        yield


class CpuReplay:
    """Stands in for the ``torch.cuda.CUDAGraph`` of one budget: :meth:`replay` runs the model's
    ``encoder_cudagraph_forward`` again on the very input buffers the graph was captured on and copies its
    output into the captured output buffer, which is what a CUDA graph replay computes."""

    def __init__(self, model: Any, input_buffers: dict[str, Any], output_buffer: torch.Tensor, path: str):
        self.model, self.input_buffers, self.output_buffer, self.path = model, input_buffers, output_buffer, path

    def replay(self) -> None:
        with torch.inference_mode():  # as the capture ran; the output buffer is an inference tensor
            self.output_buffer.copy_(self.model.encoder_cudagraph_forward({**self.input_buffers}, path=self.path))


class CpuCaptureManager(EncoderCudaGraphManager):
    """vLLM's real ``EncoderCudaGraphManager`` with one method replaced: ``_capture_budget_graph``.

    Why: the real method records the forward under ``torch.cuda.graph``, which cannot run without CUDA. This
    one calls the model as the real one does, in the same order (``prepare_encoder_cudagraph_capture_inputs``
    with the same arguments, then one ``encoder_cudagraph_forward`` under inference mode whose output sizes the
    output buffer), keeps a :class:`CpuReplay` as the graph, and records the same ``BudgetGraphMetadata``
    under the same key. The real capture's second forward (the one recorded into the graph) is what
    :meth:`CpuReplay.replay` runs on each replay. Everything else is the real manager's."""

    def _capture_budget_graph(self, token_budget: int, path: str = "default", axis_keys: tuple = ()) -> None:
        capture_inputs = self.model.prepare_encoder_cudagraph_capture_inputs(
            token_budget, self.max_batch_size, self.max_frames_per_batch, self.device, self.dtype, path, axis_keys)
        buffers = capture_inputs.values
        with torch.inference_mode():
            output_buffer = torch.empty_like(self.model.encoder_cudagraph_forward({**buffers}, path=path))
        key = (token_budget, axis_keys) if axis_keys else token_budget
        self._get_graph_set(path)[key] = BudgetGraphMetadata(
            token_budget=token_budget, max_batch_size=self.max_batch_size,
            max_frames_per_batch=self.max_frames_per_batch,
            graph=CpuReplay(self.model, buffers, output_buffer, path),
            input_buffers=buffers, output_buffer=output_buffer, axis_keys=axis_keys)
