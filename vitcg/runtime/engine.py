"""A ``vllm_config``-shaped object: the engine limits and options a protocol model and a manager read.

vLLM passes its whole ``VllmConfig``; models read ``scheduler_config.max_num_batched_tokens`` and
``model_config.max_model_len``, the manager reads ``compilation_config``. :func:`engine_config` builds
an object with just those attributes, so vitcg's manager and tests speak to models exactly as vLLM does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int


@dataclass
class ModelConfig:
    max_model_len: int


@dataclass
class CompilationConfig:
    cudagraph_mm_encoder: bool = True
    encoder_cudagraph_token_budgets: list[int] | None = None
    encoder_cudagraph_max_vision_items_per_batch: int = 0
    """0: inferred from the budget range."""
    encoder_cudagraph_max_frames_per_batch: int | None = None
    """None: items per batch times the model's frames per video (0 when video is disabled)."""


@dataclass
class EngineConfig:
    scheduler_config: SchedulerConfig
    model_config: ModelConfig
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    video_limit_per_prompt: int | None = None
    """Videos allowed per prompt; 0 disables video (and with it frame capacity)."""


def engine_config(max_num_batched_tokens: int = 8192, max_model_len: int = 32768, *,
                  token_budgets: list[int] | None = None, max_items_per_batch: int = 0,
                  max_frames_per_batch: int | None = None, video: bool = True) -> EngineConfig:
    """An :class:`EngineConfig` from plain values (vLLM's defaults where vLLM has one)."""
    return EngineConfig(SchedulerConfig(max_num_batched_tokens), ModelConfig(max_model_len),
                        CompilationConfig(True, token_budgets, max_items_per_batch, max_frames_per_batch),
                        None if video else 0)


def read_limits(vllm_config: Any) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_model_len)`` from a ``vllm_config``-shaped object (or a mapping with
    those two keys). Raises InputError naming what is missing or not a positive integer."""
    def one(section: str, name: str) -> int:
        if isinstance(vllm_config, Mapping):
            value, where = vllm_config.get(name), f"limits[{name!r}]"
        else:
            value, where = getattr(getattr(vllm_config, section, None), name, None), f"vllm_config.{section}.{name}"
        if value is None:
            raise InputError(f"{where} is missing: the budget range needs max_num_batched_tokens and max_model_len "
                             f"(got {type(vllm_config).__name__}); build one with vitcg.runtime.engine.engine_config()")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{where} must be a positive integer, got {value!r}")
        return value

    return one("scheduler_config", "max_num_batched_tokens"), one("model_config", "max_model_len")
