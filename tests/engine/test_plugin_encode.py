"""benchmarks/plugin_encode.py end to end on the CPU (tiny towers, float32, gloo): not its timings, its structure.

One process: the stock backend against the plugin's path on tiny Qwen2-VL, every item equal, every item replayed,
and a model the plugin declines (Pixtral's spec is graph-scoped) measured as stock alone, with the reason. Two
ranks: replicated against data-parallel encoding, every gathered item equal to the replicated one, the shares
covering each item once. The bfloat16 rule: an item is judged against the float32 reference by the baseline's
own error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
TINY = ["--device", "cpu", "--size", "tiny", "--dtype", "float32", "--iters", "1"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the ranks' processes find the module there too
    import plugin_encode

    return plugin_encode


def test_one_process_stock_against_the_plugin(bench, tmp_path):
    out = tmp_path / "gain.json"
    assert bench.main(["qwen2_vl", "pixtral", "--workload", "1x224", *TINY, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert (results["dtype"], results["size"], results["ranks"]) == ("float32", "tiny", 1)
    qwen = results["models"]["qwen2_vl"]
    assert qwen["budgets"] and qwen["capture_s"] >= 0
    row = qwen["workloads"]["1x224"]
    assert row["items"] == 1 and row["plugin_equal"] is True
    assert row["plugin_max_rel_err"] <= 1e-5
    assert (row["plugin_hits"], row["plugin_misses"]) == (1, 0)
    assert row["stock_ms"] > 0 and row["plugin_ms"] > 0
    assert row["plugin_gain"] == pytest.approx(row["stock_ms"] / row["plugin_ms"])
    pixtral = results["models"]["pixtral"]
    if "skipped" not in pixtral:  # a transformers too old for the spec
        assert "graph-scoped" in pixtral["declined"]
        assert pixtral["workloads"]["1x224"]["stock_ms"] > 0


def test_two_ranks_replicated_against_data_parallel(bench, tmp_path):
    out = tmp_path / "dp.json"
    assert bench.main(["qwen2_vl", "--ranks", "2", "--workload", "8x224", *TINY, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["ranks"] == 2
    row = results["models"]["qwen2_vl"]["workloads"]["8x224"]
    assert row["items"] == 8 and row["equal"] is True and row["max_rel_err"] <= 1e-5
    assert row["replicated_ms"] > 0 and row["dp_ms"] > 0
    shares = row["shares"]["image"]
    assert len(shares) == 2 and all(shares) and sorted(i for share in shares for i in share) == list(range(8))


def test_bfloat16_items_are_judged_by_the_baselines_own_error(bench):
    reference = [torch.ones(4, 2), torch.ones(3, 2)]
    baseline = [r + 0.01 for r in reference]
    assert bench.judge([r + 0.015 for r in reference], baseline, reference)[0]
    assert not bench.judge([r + 0.03 for r in reference], baseline, reference)[0]
    assert not bench.judge([reference[0]], baseline, reference)[0]  # an item missing
    equal, error, theirs = bench.judge(baseline, baseline, None)
    assert equal and error == 0.0 and theirs is None
