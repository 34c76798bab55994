"""Build an encoder from its spec with random weights: tiny (CPU checks) or real dimensions (GPU).

Weights are random on purpose: checkpoints cannot be downloaded here, and whether a graph replays the
eager computation correctly does not depend on the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ..lang.bindings import import_object
from ..lang.model import Spec, thaw

SIZES = ("tiny", "real")


def build_config(spec: Spec, size: str = "tiny"):
    """The HF config instance for ``size``: the spec's ``tiny_config`` or ``real_config`` overrides, with the
    reference attention the encoder class supports (sdpa, else eager)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    overrides = spec.tests.tiny_config if size == "tiny" else spec.tests.real_config
    config = import_object(spec.encoder.config_class)(**thaw(overrides))
    cls = import_object(spec.encoder.class_path)
    # the eager reference keeps the model's own attention; some classes (GIT, GOT-OCR2) have no sdpa
    config._attn_implementation = "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"
    return config


def build_encoder(spec: Spec, size: str = "tiny", *, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """The spec's encoder module with seeded random weights, in eval mode, on ``device`` in ``dtype``."""
    config = build_config(spec, size)
    cls = import_object(spec.encoder.class_path)
    torch.manual_seed(seed)
    with torch.device(device):
        module = cls(config)
    # only floating tensors change dtype: Module.to(dtype) would also cast complex buffers (rotary tables
    # such as Llama 4's freqs_ci) to real and drop their imaginary part
    return module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t).eval()


def release(device: str) -> None:
    """Free one spec's encoder, graphs and pool before the next spec is built (a real-size run over every
    spec would otherwise hold them all)."""
    if str(device).startswith("cuda"):
        import gc

        gc.collect()
        torch.cuda.empty_cache()
