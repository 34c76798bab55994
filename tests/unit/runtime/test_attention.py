"""Graph-safe attention: equals per-segment attention, ignores unknown kwargs, registers a mask function."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitcg.runtime.attention import ATTENTION_NAME, configs_of, graph_safe_attention, register, use_attention


def test_name_contains_flash():
    assert "flash" in ATTENTION_NAME  # how HF vision encoders decide to pass packed boundaries


def test_block_diagonal_equals_per_segment_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 10, 8) for _ in range(3))
    cu = torch.tensor([0, 3, 3, 7, 10, 10], dtype=torch.int32)  # includes zero-length segments
    out, _ = graph_safe_attention(nn.Module(), q, k, v, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=10,
                                  max_length_k=10, scaling=0.3, position_ids=object(), window_index=None)
    pieces = []
    for a, b in ((0, 3), (3, 7), (7, 10)):
        pieces.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale=0.3))
    torch.testing.assert_close(out, torch.cat(pieces, dim=2).transpose(1, 2))


def test_grouped_query_heads_are_repeated():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    out, _ = graph_safe_attention(nn.Module(), q, k, v)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(out, want.transpose(1, 2))


def test_registration_with_transformers():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert register() == ATTENTION_NAME
    assert AttentionInterface._global_mapping[ATTENTION_NAME] is graph_safe_attention
    assert ATTENTION_NAME in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[ATTENTION_NAME](
        batch_size=1, q_length=3, kv_length=3, mask_function=lambda b, h, q, kv: kv <= q, device="cpu")
    assert mask is not None and mask.shape == (1, 1, 3, 3)  # never the "skip" None


def test_use_attention_restores_every_config():
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    config = Qwen2VLVisionConfig(depth=1, embed_dim=32, hidden_size=32, num_heads=2)
    config._attn_implementation = "sdpa"
    model = Qwen2VisionTransformerPretrainedModel(config)
    configs = configs_of(model)
    assert configs and all(c._attn_implementation == "sdpa" for c in configs)
    register()
    with use_attention(configs, ATTENTION_NAME):
        assert all(c._attn_implementation == ATTENTION_NAME for c in configs)
    assert all(c._attn_implementation == "sdpa" for c in configs)


class Config:
    _attn_implementation = "sdpa"


def test_interleaved_attention_blocks_restore_the_value_found_first():
    """Two threads' blocks on one config, left in the order they were entered: the second saw vitcg's name when
    it entered, and restoring that left it on the model (2 of 3 runs of the hostile test; issue 27, item 3)."""
    config = Config()
    first, second = use_attention([config], "vitcg"), use_attention([config], "vitcg")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert config._attn_implementation == "vitcg"  # the second block is still inside
    second.__exit__(None, None, None)
    assert config._attn_implementation == "sdpa"


def test_the_cpu_path_never_loads_the_triton_kernel():
    import sys

    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    graph_safe_attention(nn.Module(), q, k, v, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6, max_length_k=6)
    assert "vitcg.runtime.varlen_triton" not in sys.modules
