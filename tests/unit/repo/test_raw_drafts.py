"""``benchmarks/raw_drafts.py`` groups the failed raw drafts by reason, first matching pattern first."""

from __future__ import annotations

from support.scripts import benchmark


def _module():
    return benchmark("raw_drafts")


def test_failures_are_grouped_by_the_first_reason_that_matches_in_the_order_of_reasons():
    raw = _module()
    results = [
        {"model_type": "vit", "verdict": "failed",
         "detail": "one small image: VitcgError: item 0: manager output (16, 64) but eager output (17, 64)"},
        {"model_type": "beit", "verdict": "failed",
         "detail": "end-to-end stage: BeitModel has no get_image_features, which the stage compares"},
        {"model_type": "dinat", "verdict": "failed",
         "detail": "before any case: building the tiny encoder failed: ImportError: DinatModel requires the natten "
                   "library but it was not found"},
        {"model_type": "odd", "verdict": "failed", "detail": "one small image: max rel err 9.44e-01"},
        {"model_type": "clip_like", "verdict": "proven with guesses", "detail": ""},
    ]
    grouped = raw.reasons(results)
    assert list(grouped.values()) == [["vit"], ["dinat"], ["beit"], ["odd"]]
    labels = [label for label, _ in raw.REASONS]
    assert list(grouped) == sorted(grouped, key=labels.index)
    assert sum(map(len, grouped.values())) == 4  # the proven draft is no failure
