"""``vitcg plan`` as a user runs it: a table and a compilation config that ``vitcg compile-config`` agrees
with; bad input exits 2 with one line naming the option. The first test runs the console entry point in a
subprocess; the others call the same entry point in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import REPO, vitcg
from support.inprocess import vitcg_inprocess


def test_plan_prints_a_config_compile_config_accepts():
    run = vitcg("plan", "qwen2_vl", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(run.stdout)
    assert document["source"] == "bench workloads" and len(document["requests"]) == 6
    assert document["costs"]["source"].startswith("default")
    assert document["plan"]["expected_ms"] <= document["default"]["expected_ms"]
    assert document["default"]["budgets"] == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    config = document["compilation_config"]
    check = vitcg_inprocess("compile-config", "--modality", "image+video",
                  "--budgets", ",".join(map(str, config["encoder_cudagraph_token_budgets"])),
                  "--max-items", str(config["encoder_cudagraph_max_vision_items_per_batch"]),
                  "--max-frames", str(config["encoder_cudagraph_max_frames_per_batch"]))
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) == config


def test_plan_for_requests_with_measured_costs(tmp_path: Path):
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps([{"images": [[224, 224]]}] * 3 + [{"images": [[480, 640], [448, 448]]}]))
    costs = REPO / "benchmarks" / "results-costs-2026-11-22-h100.json"
    run = vitcg_inprocess("plan", "qwen2_vl", "--requests", str(requests), "--request", "224x224", "--costs", str(costs),
                "--memory-cap-mib", "200")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert f"costs: measured: {costs} (qwen2_vl)" in out and "graph memory cap 200 MiB" in out
    assert "224x224              4" in out and "480x640,448x448" in out
    config = json.loads(out.split("compilation_config:\n")[1])
    assert config["encoder_cudagraph_max_frames_per_batch"] == 0  # images only
    assert config["encoder_cudagraph_token_budgets"][0] == 64


@pytest.mark.parametrize("args, message", [
    (["--request", "22x"], "--request 22x: expected images as HxW"),
    (["--memory-cap-mib", "1"], "--memory-cap-mib 1 is below the smallest graph"),
    (["--requests", "missing.json"], "--requests missing.json: cannot read it"),
    (["--manager", "sglang"], "--manager must be one of vitcg, vllm"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be a positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    run = vitcg_inprocess("plan", "qwen2_vl", *args)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], run.stderr


def test_plan_is_in_the_help():
    run = vitcg_inprocess("--help")
    assert run.returncode == 0 and "plan" in run.stdout
