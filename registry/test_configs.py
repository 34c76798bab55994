# generated from specs/ by vitcg — do not edit
"""ViT CUDA graph test configurations, one per spec, in the shape of vLLM's ``VitCudagraphTestConfig``.

Prompts are the spec's chat template with its placeholder tokens and vLLM's test questions; the token
budgets of each spec are its compilation config overrides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VitCudagraphTestConfig:
    model: str
    """First example checkpoint of the spec."""
    modalities: list[str]
    image_prompt: str | None
    video_prompt: str | None
    num_video_frames: int
    max_model_len: int
    needs_video_metadata: bool
    vllm_runner_kwargs: dict
    compilation_config_overrides: dict
    marks: list[str]
    """pytest mark names: ``pytest.mark.<name>``."""
    dtype: str = "bfloat16"
    max_tokens: int = 64
    max_num_seqs: int = 2


VIT_CUDAGRAPH_TEST_CONFIGS: dict[str, VitCudagraphTestConfig] = {
    "glm_ocr": VitCudagraphTestConfig(
        model="zai-org/GLM-OCR",
        modalities=["image", "video"],
        image_prompt="[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>What is in this image?<|assistant|>\n",
        video_prompt="[gMASK]<sop><|user|>\n<|begin_of_video|><|video|><|end_of_video|>Describe this video in one sentence.<|assistant|>\n",
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=False,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=[],
    ),
    "internvl": VitCudagraphTestConfig(
        model="OpenGVLab/InternVL3-1B-hf",
        modalities=["image", "video"],
        image_prompt="<|im_start|>user\n<image>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt="<|im_start|>user\n<video>Describe this video in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        num_video_frames=8,
        max_model_len=8192,
        needs_video_metadata=False,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=["core_model"],
    ),
    "qwen2_5_vl": VitCudagraphTestConfig(
        model="Qwen/Qwen2.5-VL-3B-Instruct",
        modalities=["image", "video"],
        image_prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt="<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe this video in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=False,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=["core_model"],
    ),
    "qwen2_vl": VitCudagraphTestConfig(
        model="Qwen/Qwen2-VL-2B-Instruct",
        modalities=["image", "video"],
        image_prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt="<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe this video in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=False,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=["core_model"],
    ),
    "qwen3_vl": VitCudagraphTestConfig(
        model="Qwen/Qwen3-VL-2B-Instruct",
        modalities=["image", "video"],
        image_prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt="<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe this video in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=True,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=["core_model"],
    ),
    "qwen3_vl_moe": VitCudagraphTestConfig(
        model="Qwen/Qwen3-VL-30B-A3B-Instruct",
        modalities=["image", "video"],
        image_prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt="<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe this video in one sentence.<|im_end|>\n<|im_start|>assistant\n",
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=True,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=["core_model"],
    ),
    "siglip2": VitCudagraphTestConfig(
        model="google/siglip2-so400m-patch16-naflex",
        modalities=["image"],
        image_prompt="<|im_start|>user\n<image>What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        video_prompt=None,
        num_video_frames=16,
        max_model_len=8192,
        needs_video_metadata=False,
        vllm_runner_kwargs={},
        compilation_config_overrides={"encoder_cudagraph_token_budgets": [1024, 2048, 4096]},
        marks=[],
    ),
}


def params_with_marks(configs: dict[str, VitCudagraphTestConfig] | None = None) -> list:
    """One ``pytest.param(name, marks=...)`` per config (all of them by default), marks looked up by name."""
    import pytest

    configs = VIT_CUDAGRAPH_TEST_CONFIGS if configs is None else configs
    return [pytest.param(name, marks=[getattr(pytest.mark, mark) for mark in config.marks], id=name)
            for name, config in configs.items()]
