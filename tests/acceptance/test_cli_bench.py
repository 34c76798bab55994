"""``vitcg bench`` as a user runs it. On CPU it is a smoke run (tiny encoders, no timing claims): results
are written per spec, a failing spec is reported and the others still run. The first test runs the console
entry point in a subprocess; the others call the same entry point in this process."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import REPO, vitcg
from support.inprocess import vitcg_inprocess

SMOKE = ("--device", "cpu", "--size", "tiny", "--dtype", "float32", "--iters", "1", "--warmup", "0", "--no-compile")


def test_bench_smoke_writes_every_spec(tmp_path: Path):
    out = tmp_path / "bench.json"
    run = vitcg("bench", "qwen2_vl", "siglip", *SMOKE, "--workload", "8x224", "--workload", "image+video",
                "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[2/2] siglip" in run.stdout and "image+video  skipped: siglip has no video modality" in run.stdout
    document = json.loads(out.read_text())
    assert document["environment"]["device"].startswith("cpu")
    by_spec = {s["spec"]: s for s in document["specs"]}
    assert [w["workload"] for w in by_spec["qwen2_vl"]["workloads"]] == ["8x224", "image+video"]
    assert by_spec["siglip"]["skipped"] == ["image+video"]
    siglip = by_spec["siglip"]["workloads"][0]
    assert siglip["items"] == 8 and siglip["tokens"] == 8 * 16  # eight tiles of 4x4 patches (tiny config)
    for spec in by_spec.values():
        for row in spec["workloads"]:
            assert row["max_rel_error"] <= 1e-5, (spec["spec"], row)
            assert {"eager", "vitcg_tight", "vitcg_greedy"} <= set(row["ms"])


def test_a_failing_spec_is_reported_and_the_others_still_run(tmp_path: Path):
    out = tmp_path / "bench.json"
    broken = REPO / "tests" / "specs" / "check_fails" / "wrong_tokens.yaml"
    run = vitcg_inprocess("bench", str(broken), "siglip", *SMOKE, "--workload", "1x224", "--json", str(out))
    assert run.returncode == 1
    assert "Traceback" not in run.stdout + run.stderr
    assert "items.output_tokens" in run.stderr and "1 of 2 specs failed" in run.stderr
    document = json.loads(out.read_text())
    assert "items.output_tokens" in document["specs"][0]["error"]
    assert document["specs"][1]["workloads"][0]["workload"] == "1x224"


def test_bench_usage_errors():
    assert vitcg_inprocess("bench", "qwen2_vl", "--workload", "1x999", *SMOKE).returncode == 2
    assert vitcg_inprocess("bench", "qwen2_vl", "--device", "cpu", "--iters", "0").returncode == 2
    run = vitcg_inprocess("bench", "qwen2_vl", "--budgets", "64,x", *SMOKE)
    assert run.returncode == 2 and "--budgets must be comma-separated integers" in run.stderr


def test_bench_budgets_replace_the_default_ladder(tmp_path: Path):
    out = tmp_path / "bench.json"
    run = vitcg_inprocess("bench", "siglip", *SMOKE, "--workload", "8x224", "--budgets", "16,64", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    spec = json.loads(out.read_text())["specs"][0]
    assert spec["budgets"] == [16, 64]
    assert spec["workloads"][0]["max_rel_error"] <= 1e-5
