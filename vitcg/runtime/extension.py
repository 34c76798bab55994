"""vitcg's extension of the vLLM protocol: what vitcg's manager uses when a model offers it, and never needs.

A vLLM-style consumer knows only :mod:`vitcg.runtime.protocol`. vitcg's own manager also looks for these
members, each optional and looked up by name on its own (:meth:`Extension.of`, once per manager): a model
offering only some of them (a whole-encoder adapter has frames but no scoped forward) gets those used:

- frames per item, so a pack never holds more video frames than ``max_frames_per_batch`` and a video
  longer than that runs eagerly (vLLM packs by items and tokens only);
- image and video in one call: ``get_input_modality`` may answer ``image+video``; selections are then
  asked for in ascending index order (images first). A model whose encoder must not see both in one call
  offers ``get_encoder_cudagraph_item_groups(mm_kwargs) -> list[list[int]]`` (looked up by name, optional):
  the manager encodes each group apart, packs and eager calls alike (a spec's ``separate``);
- graph scope: the graphs capture one submodule call and the model's own forward runs eagerly around it
  (:meth:`encoder_scoped_forward`). A scoped model cannot be driven by a protocol-only manager, so a
  scoped adapter does not claim :class:`~vitcg.runtime.protocol.SupportsEncoderCudaGraph`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

Replay = Callable[[dict[str, Any]], tuple[Any, Mapping[str, Any]]]
"""Given new buffer values (rows-first tensors, None for host integers, ``padding.EMPTY`` for an absent mask),
refills one budget's capture buffers through the padding logics, replays its graph, and returns the graph's
output and the capture values it ran on."""

MIXED = "image+video"
"""What ``get_input_modality`` answers for a call holding both modalities (vitcg extension)."""


@runtime_checkable
class SupportsVitcgExtension(Protocol):
    """Members vitcg's manager uses beyond the protocol."""

    def get_encoder_cudagraph_item_frames(self, mm_kwargs: Mapping[str, Any]) -> list[int]:
        """Video frames each item counts against ``max_frames_per_batch`` (0 for images), in item order."""

    def is_encoder_cudagraph_scoped(self) -> bool:
        """Whether graphs hold a submodule call (then :meth:`encoder_scoped_forward` serves packs)."""

    def encoder_scoped_forward(self, mm_kwargs: Mapping[str, Any], replay: Replay) -> torch.Tensor:
        """The model's eager forward with each call of the graph scope answered by ``replay``; rows of all
        items of ``mm_kwargs`` in ascending index order."""


@dataclass(frozen=True)
class Extension:
    """The extension members one model offers, each found on its own; what it lacks is None (or not scoped)."""

    item_frames: Callable[[Mapping[str, Any]], list[int]] | None
    """``get_encoder_cudagraph_item_frames``: frames per item, so packs respect the frame cap and a video longer
    than a pack runs eagerly; None: the manager packs by items and tokens only, as vLLM does."""
    item_groups: Callable[[Mapping[str, Any]], list[list[int]]] | None
    """``get_encoder_cudagraph_item_groups``: items that may share an encoder call (mixed calls only)."""
    scoped: bool
    """``is_encoder_cudagraph_scoped()``: the graphs hold a submodule call (:meth:`encoder_scoped_forward`)."""

    @classmethod
    def of(cls, model: Any) -> Extension:
        def member(name: str) -> Callable | None:
            found = getattr(model, name, None)
            return found if callable(found) else None
        scoped = member("is_encoder_cudagraph_scoped")
        return cls(member("get_encoder_cudagraph_item_frames"), member("get_encoder_cudagraph_item_groups"),
                   bool(scoped()) if scoped is not None else False)
