"""A spec's tiny encoder behind its adapter (:func:`tiny_adapter`), and vitcg's manager over it
(:func:`tiny_manager`)."""

from __future__ import annotations

from typing import Any

import torch

from support.specs import packaged
from vitcg.lang import Spec
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.encoders import build_encoder


def tiny_adapter(spec: Spec | str, size: str = "tiny", *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, **options: Any):
    """The adapter of ``spec`` (a :class:`Spec` or a packaged spec's name) over its encoder built at ``size`` with
    seeded random weights; ``options`` go to the adapter (``compile_forward=True``)."""
    if isinstance(spec, str):
        spec = packaged()[spec]
    return adapter_for(spec, build_encoder(spec, size, device=device, dtype=dtype, seed=seed), **options)


def tiny_manager(adapter, max_num_batched_tokens: int = 256, **options: Any) -> EncoderCudaGraphManager:
    """vitcg's manager over ``adapter`` with a small token budget (256 by default), on the CPU path."""
    return EncoderCudaGraphManager(adapter, max_num_batched_tokens=max_num_batched_tokens, **options)
