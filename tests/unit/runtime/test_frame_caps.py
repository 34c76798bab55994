"""Frame caps hold for every spec (issue 27, item 2): a video longer than a pack allows, or a call holding more
frames than one pack takes, runs eagerly or in several packs through vitcg's manager, and the protocol's
replay buffers refuse with a named InputError a pack they cannot hold, never a padding error deep inside."""

from __future__ import annotations

import pytest
import torch

from support.eager import assert_matches_eager
from support.inputs import qwen2_videos
from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.errors import InputError, VitcgError
from vitcg.runtime.extension import Extension
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()


@pytest.fixture(scope="module")
def qwen2():
    return tiny_adapter(SPECS["qwen2_vl"])


def test_every_adapter_offers_its_frames_to_the_manager(qwen2):
    """A whole-encoder adapter is no full extension (it has no scoped forward), yet the manager reads its frames."""
    manager = tiny_manager(qwen2, 1024)
    assert manager.extension.item_frames is not None and not manager.extension.scoped
    assert Extension.of(object()) == Extension(item_frames=None, item_groups=None, scoped=False)


def test_a_video_longer_than_a_pack_runs_eagerly(qwen2):
    """40 frames (max_frames_per_video 32) with one item per pack: the buffers hold 33 segments."""
    manager = EncoderCudaGraphManager(qwen2, max_num_batched_tokens=8192, max_items_per_batch=1)
    kwargs = qwen2_videos([40, 4, 4])
    assert_matches_eager(qwen2, kwargs, manager.execute(kwargs))
    assert manager.stats.misses == 1 and manager.stats.replays == 0


def test_a_frame_heavy_call_is_split_into_packs(qwen2):
    """Five 32-frame videos (16 temporal patches each) where a pack holds 32 frames: packs of two, no error."""
    manager = EncoderCudaGraphManager(qwen2, max_num_batched_tokens=8192)
    kwargs = qwen2_videos(*[[16, 4, 4]] * 5)
    assert_matches_eager(qwen2, kwargs, manager.execute(kwargs))
    assert manager.stats.replays == 3 and manager.stats.misses == 0


def test_the_protocol_refuses_by_name_a_pack_its_buffers_cannot_hold(qwen2):
    """An engine packing by items and tokens only (vLLM) asks for more frames than the buffers were captured for:
    a named InputError with the numbers and the remedies, raised before any buffer is filled."""
    with pytest.raises(InputError) as caught:
        qwen2.prepare_encoder_cudagraph_replay_buffers(qwen2_videos([40, 4, 4]), 1, 32)
    message = str(caught.value)
    assert "40 frames" in message and "max_frames_per_batch 32" in message
    assert "encoder_cudagraph_max_frames_per_batch" in message
    # a pack within the buffers' segments is served even when its frames exceed max_frames_per_batch
    values = qwen2.prepare_encoder_cudagraph_replay_buffers(qwen2_videos([40, 4, 4]), 16, 32).values
    assert values["cu_seqlens"].shape[0] == 41


@pytest.mark.skipif(bool(SPECS["kimi_k25"].unavailable), reason=str(SPECS["kimi_k25"].unavailable))
def test_kimi_chunk_longer_than_a_pack_meets_the_models_own_answer():
    """A 5-frame Kimi-K2.5 chunk (chunks hold 4): it runs eagerly, so the caller gets the tower's own answer (its
    temporal table has no row for frame 5), never a vitcg padding error."""
    spec = SPECS["kimi_k25"]
    adapter = tiny_adapter(spec)
    kwargs = InputBuilder(spec, adapter, torch.Generator().manual_seed(0)).inputs("video", [[5, 4, 4]])
    with pytest.raises(Exception) as own:
        adapter.encoder_eager_forward(kwargs)
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=2048, max_model_len=8192)
    with pytest.raises(Exception) as served:
        manager.execute(kwargs)
    assert type(served.value) is type(own.value) and not isinstance(served.value, VitcgError)
    assert manager.stats.replays == 0
