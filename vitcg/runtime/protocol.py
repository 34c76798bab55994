"""vLLM's encoder CUDA graph protocol, member for member, so an adapter runs under vLLM's own manager.

Tracks the vLLM release named in :data:`VLLM_VERSION` (``encoder_cudagraph_defs.py`` and the
``SupportsEncoderCudaGraph`` interface): the data objects and the runtime-checkable protocol, with the
same names, parameters and defaults. Nothing here is vitcg's own; vitcg's additions live in
:mod:`vitcg.runtime.extension`, which a vLLM-style consumer never needs.

Named invariants:
- *buffer identity*: every tensor in :class:`EncoderCudaGraphCaptureInputs` is allocated once, recorded
  into the graph, and refilled in place on each replay; its storage never changes.
- *indices order*: ``select_encoder_cudagraph_items(mm_kwargs, indices)`` returns the items in the order
  of ``indices``, and forwards return their rows in that order; the manager scatters outputs assuming it.
- *any pack fits*: capture inputs hold every pack the manager may form: up to ``max_batch_size`` items,
  ``max_frames_per_batch`` frames, and output tokens up to the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import torch

VLLM_VERSION = "0.33.0"
"""The vLLM release whose protocol this module reproduces (the one place that names it)."""

DEFAULT_PATH = "default"
"""The encoder path every model has; multi-path models add others in ``EncoderCudaGraphConfig.paths``."""

ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG = "encoder_cudagraph_axis_keys"
"""Reserved key: a model with ``capture_axes`` puts the resolved axis keys of a selection under it in the
dict ``select_encoder_cudagraph_items`` returns; the manager pops it before anything else sees the dict."""

PaddingLogic = Callable[[torch.Tensor, torch.Tensor], None]
"""``(captured_buffer, new_value) -> None``: writes ``new_value`` into the captured buffer in place."""


@dataclass
class EncoderItemSpec:
    """One image or video as the budget packer sees it. Provided by the model."""

    input_size: int
    """Input rows of the item: patches (packed encoders) or tiles (tile encoders)."""
    output_tokens: int
    """Tokens the item produces after merging; what budgets are measured in."""
    path_output_tokens: dict[str, int] = field(default_factory=dict)
    """Output tokens per encoder path, for multi-path models; empty: ``output_tokens`` on ``default``."""

    def get_path_output_tokens(self, path: str) -> int:
        """Output tokens of this item on ``path`` (``output_tokens`` for ``default`` when no paths are given)."""
        if not self.path_output_tokens:
            return self.output_tokens if path == DEFAULT_PATH else 0
        return self.path_output_tokens.get(path, 0)


@dataclass(frozen=True)
class EncoderCudaGraphPathConfig:
    """How the manager captures one encoder path."""

    min_token_budget: int | None = None
    """Smallest budget of this path's own ladder; None: the manager's ladder."""
    allow_zero_tokens: bool = False
    """Whether a pack may produce no tokens on this path (the path is then skipped for it)."""


def _default_paths() -> dict[str, EncoderCudaGraphPathConfig]:
    return {DEFAULT_PATH: EncoderCudaGraphPathConfig()}


@dataclass
class EncoderCudaGraphConfig:
    """What a model tells the manager about its graph inputs and outputs. Provided by the model."""

    modalities: list[str]
    """Modalities the graphs serve (``image``, ``video``)."""
    buffer_keys: list[str]
    """Keys of the capture inputs."""
    out_hidden_size: int
    """Width of the graph output rows."""
    padding_logics: dict[str, PaddingLogic] = field(default_factory=dict)
    """Buffer key -> how a new value is written into its captured buffer. A key without one gets
    "zero the buffer, then copy the new rows into its leading rows"."""
    max_frames_per_video: int = 1
    """Largest frame count of one video item; the default ``max_frames_per_batch`` is items times this."""
    paths: dict[str, EncoderCudaGraphPathConfig] = field(default_factory=_default_paths)
    """Encoder paths and their budget rules; ``default`` for single-path models."""
    capture_axes: tuple[tuple[Hashable, ...], ...] = ()
    """Extra capture dimensions: one graph per budget and per combination of axis keys."""


@dataclass
class EncoderCudaGraphCaptureInputs:
    """The exact objects recorded into one budget's graph (buffer identity: refilled, never replaced)."""

    values: dict[str, torch.Tensor]
    """Buffer key -> tensor refilled per replay. (vitcg adapters may also hold a host ``int`` fixed at
    capture, such as ``max_seqlen``; a manager passes it through and never refills it.)"""


@dataclass
class EncoderCudaGraphReplayBuffers:
    """New contents for one replay, unpadded; the manager writes them into the capture buffers."""

    values: dict[str, torch.Tensor | None]
    """Buffer key -> new leading rows; None leaves the buffer as captured; a 0-d tensor is copied whole."""


@runtime_checkable
class SupportsEncoderCudaGraph(Protocol):
    """What a model implements so its encoder can be captured at token budgets and replayed."""

    supports_encoder_cudagraph: ClassVar[Literal[True]] = True

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        """Modalities, buffer keys, output width, padding logics, paths and capture axes."""

    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        """``image`` or ``video``: the modality of one call's inputs."""

    def get_max_frames_per_video(self) -> int:
        """Largest frame count of one video item."""

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        """``(min_budget, max_budget)`` in output tokens; reads ``vllm_config.scheduler_config
        .max_num_batched_tokens`` and ``vllm_config.model_config.max_model_len``."""

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[EncoderItemSpec]:
        """One spec per item, in input order."""

    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
        """The multimodal kwargs of the items at ``indices``, in the order of ``indices``."""

    def postprocess_encoder_output(
        self, outputs: Mapping[str, torch.Tensor], indices: Sequence[int], per_item_out_tokens: Sequence[int],
        dest: MutableMapping[int, torch.Tensor], clone: bool = False, batch_mm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Cut ``outputs["default"]`` into items in ``indices`` order and store item ``i`` at ``dest[i]``."""

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget: int, max_batch_size: int, max_frames_per_batch: int,
        device: torch.device, dtype: torch.dtype, path: str = DEFAULT_PATH,
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        """Buffers for one budget (and axis keys), filled with valid all-padding contents."""

    def prepare_encoder_cudagraph_replay_buffers(
        self, mm_kwargs: Mapping[str, Any], max_batch_size: int, max_frames_per_batch: int,
        path: str = DEFAULT_PATH,
    ) -> EncoderCudaGraphReplayBuffers:
        """Unpadded new buffer contents for the items in ``mm_kwargs``."""

    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = DEFAULT_PATH) -> torch.Tensor:
        """The fixed-shape forward recorded into graphs: no host syncs; rows = the buffers' capacity."""

    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any], path: str = DEFAULT_PATH) -> torch.Tensor:
        """The model's own forward: every item's rows concatenated on dim 0 (the fallback and the reference)."""


def postprocess_by_rows(
    outputs: Mapping[str, torch.Tensor], indices: Sequence[int], per_item_out_tokens: Sequence[int],
    dest: MutableMapping[int, torch.Tensor], clone: bool = False,
) -> None:
    """The protocol's default ``postprocess_encoder_output``: ``per_item_out_tokens[i]`` rows of
    ``outputs["default"]`` per item, in ``indices`` order, stored (cloned if asked) at ``dest[i]``. A clone
    copies the items' rows once, and each item gets its own rows of that copy: one copy kernel per call, not
    one per item."""
    output = outputs[DEFAULT_PATH]
    if clone:
        output = output[:sum(per_item_out_tokens[i] for i in indices)].clone()
    offset = 0
    for i in indices:
        n = per_item_out_tokens[i]
        dest[i] = output[offset:offset + n]
        offset += n
