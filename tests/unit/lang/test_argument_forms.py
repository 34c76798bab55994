"""Arguments a later transformers release takes in another form than the buffer stores (catalogue
``Provider.forms``, runtime ``REBUILDS``): one record each, chosen by release, rebuilt in the graph without host
syncs. The one such form: transformers 5.24's Kimi-K2.5 merger pops ``temporal_merge_index`` as
``(destination, weight, tokens)`` for an ``index_add_``, where 5.23 took the gather index vitcg stores."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitcg.lang import catalogue as cat
from vitcg.lang.bindings import release, transformers_version
from vitcg.lang.model import Buffer
from vitcg.runtime.padding import fill
from vitcg.runtime.providers import REBUILDS, Pack, RowCache, argument_rebuild, compute
from vitcg.runtime.syncs import no_host_syncs

MERGE = Buffer("temporal_merge_index", "temporal_merge_index", "temporal_merge_index", (), None, "repeat", {})
SCATTER = REBUILDS[("temporal_merge_index", "5.24")]
# (t, h, w) in merged units: chunks of 1 to 4 frames, as Kimi-K2.5's video processor cuts them
ROWS = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=0, max_size=4)


def test_every_form_of_the_catalogue_has_exactly_one_rebuild():
    forms = {(p.name, f.since) for p in cat.PROVIDERS.values() for f in p.forms}
    assert set(REBUILDS) == forms
    for provider in cat.PROVIDERS.values():
        releases = [release(f.since) for f in provider.forms]
        assert releases == sorted(set(releases)), provider.name  # oldest first, one form per release
        assert all(f.doc for f in provider.forms)


@pytest.mark.parametrize(("version", "form"), [("5.17.0", None), ("5.23.0", None), ("5.24.0rc1", SCATTER),
                                               ("5.24.0", SCATTER), ("5.31.2", SCATTER)])
def test_the_release_chooses_the_form(version, form):
    assert argument_rebuild(MERGE, version) is form


def test_the_installed_release_chooses_by_default():
    want = SCATTER if release(transformers_version()) >= release("5.24") else None
    assert argument_rebuild(MERGE) is want


def captured(rows, spare_tokens: int, spare_rows: int) -> tuple[torch.Tensor, int, int]:
    """A video graph's temporal_merge_index buffer (12 frame slots) filled for ``rows`` as replay fills it, with
    ``spare_tokens`` padding tokens; the pack's real rows and the call's rows (``spare_rows`` more)."""
    grid = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in rows], dtype=torch.int64).view(-1, 3)
    index = compute(MERGE, Pack(torch.zeros(0), grid, {"spatial_merge_size": 2}, "clip", RowCache()))
    stored = torch.full((index.shape[0] + spare_tokens, 12, 4), -1, dtype=torch.int64)
    fill("repeat", stored, index, None, MERGE.name)
    real = int(grid.prod(-1).sum())
    return stored, real, real + spare_rows


@settings(max_examples=60, deadline=None)
@given(rows=ROWS.filter(bool), spare_tokens=st.integers(0, 3), spare_rows=st.integers(0, 9))
def test_the_scatter_form_pools_like_the_gather_index(rows, spare_tokens, spare_rows):
    """An ``index_add_`` as 5.24's merger makes it, fed the rebuilt form, gives the stored index's mean over its
    frame slots for every real token, whatever the padding tokens and rows hold; padding rows add nothing."""
    stored, real, total = captured(rows, spare_tokens, spare_rows)
    hidden = torch.randn(total, 3)
    hidden[real:] = 1e6  # padding rows: weight 0, so they add nothing
    destination, weight, tokens = SCATTER(stored, total)
    assert destination.shape == weight.shape == (total,) and tokens == stored.shape[0]
    assert destination.dtype == torch.int64 and weight.dtype == torch.float32
    pooled = torch.zeros(tokens * 4, 3).index_add_(0, destination, hidden * weight[:, None]).view(tokens, 4, 3)
    real_tokens = sum(h * w for _, h, w in rows)
    assert torch.allclose(pooled[:real_tokens], hidden[stored[:real_tokens]].mean(dim=1), atol=1e-6)
    assert not weight[real:].any()


def test_an_empty_pack_has_a_scatter_form_of_the_buffers_shape():
    """Every token is padding (all point at row 0, which token 0 claims): shapes hold, nothing is kept."""
    stored, _, total = captured([], 3, 8)
    destination, weight, tokens = SCATTER(stored, total)
    assert destination.shape == weight.shape == (8,) and tokens == 3 and not destination.any()


def test_the_scatter_form_is_rebuilt_without_host_syncs():
    stored, _, total = captured([(4, 2, 2), (1, 1, 3)], 2, 5)
    with no_host_syncs():
        SCATTER(stored, total)


kimi = pytest.importorskip("transformers.models.kimi_k25.modeling_kimi_k25")  # transformers >= 5.23


@pytest.mark.skipif(not hasattr(kimi.Kimi_K25VisionModel, "temporal_merge"),
                    reason="the scatter form is transformers 5.24's; older model code takes the gather index")
@settings(max_examples=60, deadline=None)
@given(rows=ROWS.filter(bool), spare_tokens=st.integers(0, 3), spare_rows=st.integers(0, 9))
def test_the_scatter_form_is_the_models_own(rows, spare_tokens, spare_rows):
    """The model's helper takes a pack of mixed frame counts in this form: the rebuild equals it on the real rows,
    with a token count of the buffer's (padding tokens are cut after the graph)."""
    stored, real, total = captured(rows, spare_tokens, spare_rows)
    grid = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in rows])
    want_destination, want_weight, want_tokens = kimi.get_vision_temporal_merge_index(grid, 2, 2)
    destination, weight, tokens = SCATTER(stored, total)
    assert torch.equal(destination[:real], want_destination) and torch.equal(weight[:real], want_weight)
    assert tokens == want_tokens + spare_tokens
