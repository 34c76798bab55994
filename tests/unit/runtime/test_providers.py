"""Providers composed per item (and cached) equal the transformers helpers called on the whole batch."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import vision_utils

from vitcg.lang.model import Buffer
from vitcg.runtime.providers import Pack, RowCache, compute

GEOMETRY = {"spatial_merge_size": 2, "window_size": 112, "patch_size": 14, "num_grid_per_side": 8}
ROWS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=5)


def buffer(provider: str, **params) -> Buffer:
    return Buffer(provider, provider, provider, (), None, "zeros", params)


def pack_of(rows, segments="frame", cache=None) -> Pack:
    grid = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in rows])
    return Pack(torch.zeros(0), grid, GEOMETRY, segments, RowCache() if cache is None else cache)


@settings(max_examples=40, deadline=None)
@given(rows=ROWS, clip=st.booleans())
def test_cu_seqlens(rows, clip):
    pack = pack_of(rows, "clip" if clip else "frame")
    want = vision_utils.get_vision_cu_seqlens(pack.counts, merge_temporal=clip)
    assert torch.equal(compute(buffer("cu_seqlens"), pack), want)


@settings(max_examples=40, deadline=None)
@given(rows=ROWS, temporal=st.booleans())
def test_position_ids(rows, temporal):
    cache = RowCache()
    for _ in range(2):  # the second round is served from the cache
        pack = pack_of(rows, cache=cache)
        want = vision_utils.get_vision_position_ids(pack.counts, 2, include_temporal=temporal)
        assert torch.equal(compute(buffer("position_ids", include_temporal=temporal), pack), want)


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_window_index_and_bounds(rows):
    cache = RowCache()
    for _ in range(2):
        pack = pack_of(rows, cache=cache)
        index, bounds = vision_utils.get_vision_window_index(pack.counts, 2, 112, 14)
        assert torch.equal(compute(buffer("window_index"), pack), index)
        assert torch.equal(compute(buffer("cu_window_seqlens"), pack), bounds)


@settings(max_examples=40, deadline=None)
@given(rows=ROWS, mode=st.sampled_from(["bilinear", "bicubic"]), corners=st.booleans())
def test_interpolation(rows, mode, corners):
    pack = pack_of(rows)
    indices, weights = vision_utils.get_vision_interpolation_indices_and_weights(
        pack.counts, 8, mode=mode, align_corners=corners, spatial_merge_size=2)
    params = {"mode": mode, "align_corners": corners}
    assert torch.equal(compute(buffer("interp_indices", **params), pack), indices)
    assert torch.equal(compute(buffer("interp_weights", **params), pack), weights)


def test_host_providers_have_no_value():
    assert compute(buffer("max_seqlen"), pack_of([(1, 1, 1)])) is None


def test_row_cache_is_bounded_by_bytes():
    cache = RowCache(max_bytes=100)
    calls = []
    for i in range(5):
        cache.get(("k", i), lambda i=i: calls.append(i) or torch.zeros(8, dtype=torch.int64), on_device=True)
    assert cache._bytes <= 100
    cache.get(("k", 4), lambda: calls.append("again") or torch.zeros(8), on_device=True)
    assert "again" not in calls  # the newest entry survived the last clear


@settings(max_examples=30, deadline=None)
@given(rows=ROWS, merge=st.sampled_from([1, 2]))
def test_a_provider_merge_size_overrides_the_geometry(rows, merge):
    """``params.spatial_merge_size`` orders rows by its own block size (PaddleOCR-VL's tower: raster, 1) while
    the geometry keeps the model's merge (2, which its projector applies)."""
    pack = pack_of(rows)
    want = vision_utils.get_vision_position_ids(pack.counts, merge)
    assert torch.equal(compute(buffer("position_ids", spatial_merge_size=merge), pack), want)
    indices, weights = vision_utils.get_vision_interpolation_indices_and_weights(pack.counts, 8,
                                                                                 spatial_merge_size=merge)
    assert torch.equal(compute(buffer("interp_indices", spatial_merge_size=merge), pack), indices)
    assert torch.equal(compute(buffer("interp_weights", spatial_merge_size=merge), pack), weights)


def test_raster_and_merged_orders_differ():
    pack = pack_of([(1, 2, 2)])  # a 4x4 grid: merge-block order is not raster order
    raster = compute(buffer("position_ids", spatial_merge_size=1), pack)
    assert not torch.equal(raster, compute(buffer("position_ids"), pack))
    assert raster[:5].tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0]]


@settings(max_examples=30, deadline=None)
@given(rows=ROWS)
def test_nearest_position_ids(rows):
    """Per (h, w) item, once per frame: the helper's nearest buckets into the num_grid_per_side ** 2 table."""
    cache = RowCache()
    for _ in range(2):
        pack = pack_of(rows, cache=cache)
        want = torch.cat([vision_utils.get_vision_nearest_position_ids(torch.tensor([[h, w]]), 8).repeat(t)
                          for t, h, w in pack.counts.tolist()])
        assert torch.equal(compute(buffer("nearest_position_ids"), pack), want)


def test_nearest_position_ids_stretch_a_small_grid_over_the_table():
    pack = pack_of([(1, 1, 2)])  # a 2x4 grid over an 8x8 table
    assert compute(buffer("nearest_position_ids"), pack).tolist() == [0, 2, 4, 6, 32, 34, 36, 38]


@settings(max_examples=30, deadline=None)
@given(rows=ROWS)
def test_window_providers_take_their_own_merge_size(rows):
    """MiniCPM-V's window merger calls the helper on raster patches (merge 1, a window of 2 patches)."""
    grid = pack_of(rows).counts
    pack = Pack(torch.zeros(0), grid, {**GEOMETRY, "window_size": 28}, "clip", RowCache())
    index, bounds = vision_utils.get_vision_window_index(grid, 1, 28, 14)
    assert torch.equal(compute(buffer("window_index", spatial_merge_size=1), pack), index)
    assert torch.equal(compute(buffer("cu_window_seqlens", spatial_merge_size=1), pack), bounds)
