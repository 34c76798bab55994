"""A stand-in for vLLM's Transformers backend, for the GPU machine, where vLLM cannot be installed (its torch
differs, and a carried wheel would exceed the 64 MiB limit). tests/vllm drive the real backend on the CPU.

It keeps what the vLLM plugin relies on, written from the facts in shared/VLLM_TRANSFORMERS_BACKEND.md: the
wrapped Hugging Face model is ``self.model``, and ``embed_multimodal(**batch)`` encodes one modality through that
model's ``get_image_features`` / ``get_video_features`` (``return_dict=True``, the CPU-kept fields moved to the
pixels' device, ``pooler_output``) and splits the result into one tensor per item by the backend's row counts
(``num_image_patches`` / ``num_video_patches``): as given when the model returns one entry per item, else
the rows are cut by the counts (or by a whole multiple of them: tokens per row).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

PIXELS = {"image": "pixel_values", "video": "pixel_values_videos"}


class BackendStandIn:
    """What the plugin's members use of the backend class: ``__init__(vllm_config=, prefix=)``, ``model``,
    ``embed_multimodal``."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.model = vllm_config.vlm.model  # the backend wraps the base model (``AutoModel``), not the LM head

    def embed_multimodal(self, **batch: Any) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for modality, key in PIXELS.items():
            if key not in batch:
                continue
            kwargs = {k: v for k, v in batch.items() if k not in (*PIXELS.values(), *(f"num_{m}_patches" for m in PIXELS))}
            out.extend(self._process_vision_input(modality, batch[key], batch[f"num_{modality}_patches"], **kwargs))
        return out

    def _process_vision_input(self, modality: str, pixel_values: torch.Tensor, num_patches: torch.Tensor,
                              **kwargs: Any) -> list[torch.Tensor]:
        # the backend's own method and parameter names: a processor output named num_patches collides with the
        # counts here as it does in vLLM (TypeError: multiple values), unless the plugin's override takes it
        sizes = [int(n) for n in num_patches.flatten().tolist()]
        features = self._get_features(modality, pixel_values, **kwargs)
        if not isinstance(features, torch.Tensor) and len(features) == len(sizes):
            return list(features)
        rows = features if isinstance(features, torch.Tensor) else torch.cat(list(features))
        rows = rows.reshape(-1, rows.shape[-1])
        scale = rows.shape[0] // sum(sizes)
        return list(torch.split(rows, [n * scale for n in sizes]))

    def _get_features(self, modality: str, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        kwargs = {k: v.to(pixel_values.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        method = getattr(self.model, f"get_{modality}_features")
        return method(pixel_values, return_dict=True, **kwargs).pooler_output


def plugged(vlm: torch.nn.Module) -> Any:
    """The vLLM plugin's protocol members on the stand-in, built as the plugin builds its classes on vLLM's."""
    from vitcg.vllm_plugin.bridge import EncoderGraphs

    members = {k: v for k, v in vars(EncoderGraphs).items() if k not in ("__dict__", "__weakref__", "__doc__")}
    cls = type("PluggedStandIn", (BackendStandIn,), {**members, "_stock": BackendStandIn})
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=vlm.config), vlm=vlm)
    return cls(vllm_config=config)
