# generated from specs/ by vitcg — do not edit
"""Model types whose vision encoder vitcg captures as CUDA graphs (``MODELS_SUPPORT_VIT_CUDA_GRAPH`` of vLLM's
offline vision-language example, which asserts the model type is listed before enabling ViT CUDA graphs)."""

MODELS_SUPPORT_VIT_CUDA_GRAPH = [
    "glm_ocr",
    "internvl",
    "lfm2_vl",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "siglip2",
]
