"""``vitcg.accelerate`` handles shared (issue 27): by threads, by other handles, by videos longer than a pack.

A tiny Qwen2-VL (tests/hf/test_accelerate.py builds the same one) on the CPU's static path: every output is
compared with the original model's, float32, 1e-5 relative per item."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import vitcg
from vitcg.runtime.attention import ATTENTION_NAME, configs_of
from vitcg.tools.workloads import relative_error

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

from test_accelerate import TEXT, VISION, features, images  # noqa: E402

THREADS, CALLS = 4, 8


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.Qwen2VLConfig(vision_config=VISION, text_config=TEXT)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def untouched(model) -> bool:
    """Nothing of vitcg is left on the model: no routed call, no patch stack, the original attention."""
    visual, inner = model.model.visual, model.model
    return ("forward" not in vars(visual) and "get_image_features" not in vars(inner)
            and "_vitcg_slots" not in vars(visual) and "_vitcg_slots" not in vars(inner)
            and not hasattr(model, "_vitcg")
            and all(c._attn_implementation != ATTENTION_NAME for c in configs_of(visual)))


def workloads():
    """Per thread its own image sizes, so a thread served another's rows (or a half-refilled buffer) shows."""
    sizes = [((56, 84),), ((112, 56), (56, 56)), ((84, 84), (56, 112)), ((56, 56), (84, 56), (56, 84))]
    return [images(*sizes[t % len(sizes)], seed=t) for t in range(THREADS)]


def assert_close(got, want):
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1e-5


def test_threads_sharing_one_handle_get_the_original_features(model):
    inputs = workloads()
    want = [features(model, x) for x in inputs]
    attention = [c._attn_implementation for c in configs_of(model.model.visual)]
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        features(model, inputs[0])  # learns the output layout
        start = threading.Barrier(THREADS)

        def work(t):
            start.wait()
            return [features(model, inputs[t]) for _ in range(CALLS)]
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(work, range(THREADS)))
        assert handle.stats.routed == THREADS * CALLS
    for t, got in enumerate(results):
        for each in got:
            assert_close(each, want[t])
    assert untouched(model)
    assert [c._attn_implementation for c in configs_of(model.model.visual)] == attention


def test_restore_under_threads_is_exact(model):
    """restore() while threads call the model: each call gets the original features (routed or not), and the
    model is left exactly as it was, attention implementation included."""
    inputs = workloads()
    want = [features(model, x) for x in inputs]
    for _ in range(3):
        handle = vitcg.accelerate(model, max_num_batched_tokens=1024)
        features(model, inputs[0])
        start = threading.Barrier(THREADS + 1)

        def work(t, start=start):
            start.wait()
            return [features(model, inputs[t]) for _ in range(CALLS)]
        with ThreadPoolExecutor(THREADS) as pool:
            running = [pool.submit(work, t) for t in range(THREADS)]
            start.wait()
            handle.restore()
            results = [r.result() for r in running]
        for t, got in enumerate(results):
            for each in got:
                assert_close(each, want[t])
        assert untouched(model)


@pytest.mark.parametrize("first", ["outer", "inner"])
def test_handles_restored_in_any_order_leave_the_model_untouched(model, first):
    """accelerate inside another handle's paused(), then both restored, in either order (issue 27, item 5)."""
    inputs = images((56, 84), (84, 56))
    want = features(model, inputs)
    outer = vitcg.accelerate(model, max_num_batched_tokens=1024)
    with outer.paused():
        inner = vitcg.accelerate(model, max_num_batched_tokens=1024)
        assert model._vitcg is inner
    assert model._vitcg is outer
    features(model, inputs)  # the outer router is on top: it learns its layout
    assert_close(features(model, inputs), want)
    assert outer.stats.routed == 1 and inner.stats.calls == 0
    (outer if first == "outer" else inner).restore()
    remaining = inner if first == "outer" else outer
    assert model._vitcg is remaining and remaining.active
    assert_close(features(model, inputs), want)
    assert_close(features(model, inputs), want)
    assert remaining.stats.routed >= 1
    remaining.restore()
    assert untouched(model)
    assert_close(features(model, inputs), want)


def test_a_video_longer_than_a_pack_runs_eagerly(model):
    """64 frames (max_frames_per_video 32): the original model serves it, so the accelerated one must too."""
    grid = torch.tensor([[64, 2, 2]])
    pixels = torch.randn(256, 1176, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model.model.get_video_features(pixels, grid).pooler_output
    with torch.no_grad(), vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        model.model.get_video_features(pixels, grid)  # learns the output layout
        got = model.model.get_video_features(pixels, grid).pooler_output
        assert handle.stats.routed == 1 and handle.stats.manager.misses == 1
    assert_close(got, want)
