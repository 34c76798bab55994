"""The encoder CUDA graph protocol, with vLLM's names so the methods stay drop-in.

Dataclasses only, plus the runtime-checkable :class:`SupportsEncoderCudaGraph`. The generic adapter
(:mod:`vitcg.adapter`) implements the protocol from a spec; the manager (:mod:`vitcg.manager`) drives it.

Named invariants:
- *buffer identity*: every tensor in :class:`EncoderCudaGraphCaptureInputs` is allocated once, recorded
  into the graph, and refilled in place on each replay; its storage never changes.
- *host scalars*: an ``int`` value (``max_seqlen``) is fixed at capture and never replayed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class EncoderItemSpec:
    """One image or video as the budget packer sees it."""

    input_size: int
    """Input rows of the item: patches (packed encoders) or tiles (tile encoders). Provided by the model."""
    output_tokens: int
    """Tokens the item produces after merging; what budgets are measured in. Provided by the model."""
    frames: int = 0
    """Frames the item counts against ``max_frames_per_batch`` (0 for images). vitcg extension, defaulted."""
    segments: int = 0
    """Attention segments the item occupies in the segment buffer (``segment_key``): frames for per-frame
    attention, 1 per clip, 0 for tiles. vitcg extension, defaulted."""


@dataclass(frozen=True)
class EncoderCudaGraphConfig:
    """What a model tells the manager about its graph inputs and outputs."""

    modalities: list[str]
    """Modalities the graphs serve (``image``, ``video``)."""
    buffer_keys: list[str]
    """Keys of the capture inputs, in the order the model declares them."""
    out_hidden_size: int
    """Hidden size of the graph output rows (all output fields concatenated)."""
    padding_logics: dict[str, str] = field(default_factory=dict)
    """Buffer key -> padding rule the manager applies when refilling it: ``zeros``, ``trailing_segment``,
    ``identity`` or ``fixed`` (a host scalar that is never refilled)."""
    max_frames_per_video: int = 1
    """Largest frame count of one video item; the default ``max_frames_per_batch`` is items times this."""
    segment_key: str | None = None
    """Buffer of segment boundaries (``cu_seqlens``) whose length bounds the segments of one pack: its
    slots minus the leading zero and one padding segment. vitcg extension; None: no such bound."""
    scoped: bool = False
    """The graphs capture one submodule call and the model's forward runs eagerly around it: the manager
    calls ``encoder_scoped_forward(mm_kwargs, replay)`` instead of refilling and replaying itself.
    vitcg extension."""


@dataclass
class EncoderCudaGraphCaptureInputs:
    """The exact objects recorded into one budget's graph (buffer identity: refilled, never replaced)."""

    values: dict[str, torch.Tensor | int]
    """Buffer key -> tensor (refilled per replay) or host ``int`` (fixed at capture)."""


@dataclass
class EncoderCudaGraphReplayBuffers:
    """New contents for one replay, unpadded; the manager pads them into the capture buffers."""

    values: dict[str, torch.Tensor | None]
    """Buffer key -> new leading rows, or None to leave the buffer as captured."""


@runtime_checkable
class SupportsEncoderCudaGraph(Protocol):
    """What a model implements so its encoder can be captured at token budgets and replayed."""

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        """Modalities, buffer keys, output width and padding rules."""

    def get_input_modality(self, mm_kwargs: Mapping[str, Any]) -> str:
        """``image``, ``video`` or ``image+video``; raises ValueError when no known input key is present."""

    def get_encoder_cudagraph_budget_range(self, limits: Any) -> tuple[int, int]:
        """``(min_budget, max_budget)`` in output tokens for the engine ``limits``."""

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: Mapping[str, Any]) -> list[EncoderItemSpec]:
        """One spec per item, images first then videos, each in input order."""

    def select_encoder_cudagraph_items(self, mm_kwargs: Mapping[str, Any], indices: list[int]) -> dict[str, Any]:
        """The multimodal kwargs of the items at ``indices`` (in the order of the item specs)."""

    def prepare_encoder_cudagraph_capture_inputs(
        self, token_budget: int, max_batch_size: int, max_frames_per_batch: int,
        device: torch.device, dtype: torch.dtype,
    ) -> EncoderCudaGraphCaptureInputs:
        """Buffers for one budget, filled with valid all-padding contents."""

    def prepare_encoder_cudagraph_replay_buffers(
        self, mm_kwargs: Mapping[str, Any], max_batch_size: int, max_frames_per_batch: int,
    ) -> EncoderCudaGraphReplayBuffers:
        """Unpadded new buffer contents for the items in ``mm_kwargs``."""

    def encoder_cudagraph_forward(self, values: Mapping[str, torch.Tensor | int]) -> torch.Tensor:
        """The fixed-shape forward recorded into graphs: no host syncs, rows = the buffers' capacity."""

    def encoder_eager_forward(self, mm_kwargs: Mapping[str, Any]) -> torch.Tensor:
        """The model's own forward (its own attention): the fallback and the reference."""
