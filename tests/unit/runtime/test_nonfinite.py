"""A poisoned item (NaN or inf in its pixels) never changes another item's output on the static CPU path, and
gets exactly what eager gives it. Without isolation, packed attention (SDPA with a block-diagonal mask)
multiplies the zero weights between segments by the poisoned segment's values: 0 * NaN is NaN."""

from __future__ import annotations

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.runtime.manager import ManagerOptions
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()
NAMES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl"]


@pytest.fixture(scope="module")
def adapters():
    return {name: tiny_adapter(SPECS[name]) for name in NAMES}


def poisoned_images(adapter, value: float, seed: int = 0) -> dict:
    """Three images in one call; the middle one's first pixel row holds ``value``."""
    builder = InputBuilder(adapter.spec, adapter, torch.Generator().manual_seed(seed))
    kwargs = builder.inputs("image", [builder.image(2, 4), builder.image(4, 4), builder.image(2, 2)])
    first = adapter.get_encoder_cudagraph_item_specs(kwargs)[0].input_size
    kwargs[adapter.spec.modality("image").pixels_key][first, :7] = value
    return kwargs


def eager_alone(adapter, kwargs, index):
    return adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name", NAMES)
def test_a_poisoned_item_leaves_the_others_as_eager(name, value, adapters):
    adapter = adapters[name]
    kwargs = poisoned_images(adapter, value)
    manager = tiny_manager(adapter, 1024)
    got = manager.execute(kwargs)
    for index in (0, 2):
        assert torch.isfinite(got[index]).all(), f"item {index} was poisoned by item 1"
        torch.testing.assert_close(got[index], eager_alone(adapter, kwargs, index), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], eager_alone(adapter, kwargs, 1), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (manager.stats.nonfinite_items, manager.stats.misses, manager.stats.replays) == (1, 1, 1)


def test_a_poisoned_video_leaves_the_image_of_its_call_as_eager(adapters):
    adapter = adapters["qwen2_vl"]
    builder = InputBuilder(adapter.spec, adapter, torch.Generator().manual_seed(1))
    kwargs = {**builder.inputs("image", [builder.image(2, 4)]), **builder.inputs("video", [builder.video(2, 2, 2)])}
    kwargs["pixel_values_videos"][5] = float("nan")
    manager = tiny_manager(adapter, 1024)
    image, video = manager.execute(kwargs)
    torch.testing.assert_close(image, eager_alone(adapter, kwargs, 0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(video, eager_alone(adapter, kwargs, 1), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert manager.stats.nonfinite_items == 1 and manager.stats.hits == 1


def test_without_isolation_packed_attention_spreads_the_poison(adapters):
    """The root cause the option exists for (packed styles; tiles attend within each tile)."""
    adapter = adapters["qwen2_vl"]
    manager = tiny_manager(adapter, 1024, options=ManagerOptions(isolate_nonfinite=False))
    got = manager.execute(poisoned_images(adapter, float("nan")))
    assert manager.stats.replays == 1 and not torch.isfinite(got[0]).all()


def test_the_quick_check_misses_no_poison_and_flags_no_finite_item(adapters):
    """One float32 sum per tensor answers the common case with one sync; inf and -inf together still sum to NaN;
    huge finite values that overflow the sum are cleared by the exact per-item check, not isolated."""
    from vitcg.runtime.nonfinite import finite as _finite

    values = torch.zeros(6, 4)
    values[1, 0], values[4, 2] = float("inf"), float("-inf")
    assert not _finite({"x": values}) and not _finite({"x": values}, exact=True)
    huge = torch.full((6, 4), 3e38)
    assert not _finite({"x": huge}) and _finite({"x": huge}, exact=True)
    assert _finite({"grid": torch.ones(2, 3, dtype=torch.int64)})  # integer inputs hold no NaN
    adapter = adapters["qwen2_vl"]
    kwargs = poisoned_images(adapter, 3e38)
    manager = tiny_manager(adapter)
    manager.execute(kwargs)
    assert manager.stats.nonfinite_items == 0 and manager.stats.hits == 3
