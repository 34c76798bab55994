"""The pixel-shuffle index and the interpolation axis order against MuseGlimmer's own code: the helper its tower
calls when nothing is precomputed, and its patch embedder fed the providers' values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import vision_utils

from vitcg.lang.bindings import release, transformers_version
from vitcg.lang.model import Buffer
from vitcg.runtime.padding import PADDING_RULES
from vitcg.runtime.providers import Pack, RowCache, compute

muse = pytest.importorskip("transformers.models.muse_glimmer.modeling_muse_glimmer",
                           reason="transformers without muse_glimmer (5.24 has it)")

MERGE = 2
GEOMETRY = {"spatial_merge_size": MERGE, "num_grid_per_side": 4}
# (frames, h blocks, w blocks): video items with t > 1, grids of unequal sides
ROWS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=4)


def buffer(provider: str, rule: str = "zeros", **params) -> Buffer:
    return Buffer(provider, provider, provider, (), None, rule, params)


def pack_of(rows) -> Pack:
    grid = torch.tensor([[t, MERGE * h, MERGE * w] for t, h, w in rows])
    return Pack(torch.zeros(0), grid, GEOMETRY, "frame", RowCache())


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_pixel_shuffle_index_is_the_models(rows):
    pack = pack_of(rows)
    want = muse.get_vision_pixel_shuffle_index(pack.counts, MERGE)
    assert torch.equal(compute(buffer("pixel_shuffle_index", "identity"), pack), want)


@settings(max_examples=25, deadline=None)
@given(rows=ROWS, extra_tokens=st.integers(0, 5))
def test_padded_pixel_shuffle_index_keeps_real_tokens_and_whole_padding_blocks(rows, extra_tokens):
    """Identity padding: every index stays inside the buffer's rows, each padding row gathers itself, and the
    model's pixel shuffle of the padded rows gives the real tokens first, exactly as on the unpadded rows."""
    pack = pack_of(rows)
    real = int(pack.counts.prod(-1).sum())
    capacity = real + extra_tokens * MERGE ** 2  # a budget in merged tokens: whole blocks of padding rows
    dest = torch.full((capacity,), -1, dtype=torch.int64)
    PADDING_RULES["identity"].fill(dest, compute(buffer("pixel_shuffle_index", "identity"), pack), capacity, "k")
    assert torch.equal(dest.sort().values, torch.arange(capacity))  # a permutation of the rows: all in range
    assert torch.equal(dest[real:], torch.arange(real, capacity))

    tower = muse.MuseGlimmerVisionModel.__new__(muse.MuseGlimmerVisionModel)
    torch.nn.Module.__init__(tower)
    tower.merge_size = MERGE
    hidden = torch.randn(capacity, 3)
    padded = tower.pixel_shuffle(hidden, pack.counts, pixel_shuffle_index=dest)
    unpadded = tower.pixel_shuffle(hidden[:real], pack.counts)
    assert padded.shape == (capacity // MERGE ** 2, 3 * MERGE ** 2)
    assert torch.equal(padded[:real // MERGE ** 2], unpadded)


INTERP = {"mode": "bilinear", "align_corners": False, "padding": "zeros", "spatial_merge_size": 1}


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_interpolation_axes_twh_is_the_helper_on_the_swapped_grid(rows):
    pack = pack_of(rows)
    indices, weights = vision_utils.get_vision_interpolation_indices_and_weights(
        pack.counts[:, [0, 2, 1]], 4, mode="bilinear", align_corners=False, spatial_merge_size=1, padding="zeros")
    assert torch.equal(compute(buffer("interp_indices", axes="twh", **INTERP), pack), indices)
    assert torch.equal(compute(buffer("interp_weights", axes="twh", **INTERP), pack), weights)


def test_interpolation_axes_change_the_taps_of_an_unequal_grid():
    pack = pack_of([(1, 1, 3)])
    thw = compute(buffer("interp_indices", axes="thw", **INTERP), pack)
    assert torch.equal(compute(buffer("interp_indices", **INTERP), pack), thw)  # thw is the default
    assert not torch.equal(compute(buffer("interp_indices", axes="twh", **INTERP), pack), thw)


@pytest.mark.skipif(release(transformers_version()) < release("5.24"),
                    reason="MuseGlimmer's embedder reads its table at (w, h) from transformers 5.24 on")
@pytest.mark.parametrize("axes", ["twh", "thw"])
def test_the_patch_embedder_agrees_only_with_twh(axes):
    """MuseGlimmer's patch (h, w) reads its position table at (w, h): its own embedder, given the providers'
    taps, equals its eager result with axes: twh, and differs with the default order on grids of unequal sides."""
    torch.manual_seed(0)
    config = muse.MuseGlimmerVisionConfig(hidden_size=16, pos_emb_height=4, pos_emb_width=4, patch_size=2,
                                          patch_temporal=1)
    embedder = muse.MuseGlimmerVisionPatchEmbedder(config).eval()
    pack = Pack(torch.zeros(0), torch.tensor([[1, 4, 6], [2, 6, 2]]), GEOMETRY, "frame", RowCache())
    pixels = torch.randn(int(pack.counts.prod(-1).sum()), 3 * 2 * 2)
    with torch.no_grad():
        eager = embedder(pixels, pack.counts)
        given_taps = embedder(pixels, pack.counts,
                              interp_indices=compute(buffer("interp_indices", axes=axes, **INTERP), pack),
                              interp_weights=compute(buffer("interp_weights", axes=axes, **INTERP), pack))
    assert torch.equal(given_taps, eager) == (axes == "twh")
