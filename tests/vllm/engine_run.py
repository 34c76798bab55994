"""One whole-engine run for tests/vllm/test_engine.py, in a process of its own (vLLM's global state stays there):
``LLM.generate`` on the tiny LLaVA in the folder given (made on the first run), greedy, three prompts with an
image each, through vLLM's Transformers backend with encoder graphs asked for. Prints one JSON line: the tokens,
the model class the engine built, and whether it built an encoder graph manager.

Usage: python engine_run.py FOLDER   (VLLM_PLUGINS="" turns vitcg's plugin off, as for any vLLM plugin)
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np
from PIL import Image


def make_folder(folder: str) -> None:
    """A tiny LLaVA with random weights, a word-level tokenizer holding its special tokens, the CLIP image
    processor and a chat template, saved as a model folder (test_real_manager.py's too). The text head
    dimension is 32, one that vLLM's CPU attention supports."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=28, patch_size=14)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=64, max_position_embeddings=1 << 16)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_index=3))
    model.config.architectures = ["LlavaForConditionalGeneration"]
    model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 3, **{f"w{i}": 4 + i for i in range(60)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        extra_special_tokens={"image_token": "<image>"})
    images = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
                   chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}").save_pretrained(folder)


def main(folder: str) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so its model can be inspected
    logger = logging.getLogger("vitcg")  # the plugin's lines on stderr, as a serving process would log them
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    if not os.path.exists(os.path.join(folder, "config.json")):
        make_folder(folder)
    from vllm import LLM, SamplingParams

    # an explicit KV cache: by a fraction (gpu_memory_utilization=0.05), vLLM's CPU worker asks for 5% of NUMA node
    # 0's memory less the process's RSS, which went below zero where node 0 reports 12 of the machine's 24 GiB
    # (2026-12-01: "requested memory for kv (-0.06/0.59 GiB)"); 256 MiB holds 256 tokens of the tiny LLaVA many times
    llm = LLM(model=folder, model_impl="transformers", dtype="float32", enforce_eager=True, max_model_len=256,
              kv_cache_memory_bytes=256 << 20, seed=0,
              compilation_config={"cudagraph_mm_encoder": True, "encoder_cudagraph_max_vision_items_per_batch": 1})
    rng = np.random.default_rng(0)
    prompts = [{"prompt": "w1 <image> w2 w3",
                "multi_modal_data": {"image": Image.fromarray(rng.integers(0, 255, (40 + 8 * i, 30, 3), dtype=np.uint8))}}
               for i in range(3)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    print(json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "model": type(runner.model).__name__,
                      "manager": getattr(runner, "encoder_cudagraph_manager", None) is not None}))


if __name__ == "__main__":
    main(sys.argv[1])
