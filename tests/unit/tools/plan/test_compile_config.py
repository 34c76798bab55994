"""The compilation config helper: vLLM's --enable-vit-cuda-graph rules plus the budget invariants."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from support import REPO
from vitcg.errors import BudgetError, UsageError
from vitcg.tools.plan.compile_config import compile_config, parse_base, parse_budgets, serve_command


@pytest.mark.parametrize("modality, items", [("image", 1), ("video", 1), ("image+video", 2)])
def test_items_per_batch_follow_the_modality(modality, items):
    assert compile_config(modality) == {
        "cudagraph_mm_encoder": True, "encoder_cudagraph_max_vision_items_per_batch": items}


@pytest.mark.parametrize("modality", ["audio", "", "image,video", "Image", "video+image", "images"])
def test_other_modalities_are_usage_errors(modality):
    with pytest.raises(UsageError, match="image, video, image\\+video"):
        compile_config(modality)


def test_merges_into_an_existing_config_without_changing_it():
    base = {"mode": 3, "cudagraph_mode": "FULL", "cudagraph_mm_encoder": False}
    config = compile_config("image+video", base)
    assert config == {"mode": 3, "cudagraph_mode": "FULL", "cudagraph_mm_encoder": True,
                      "encoder_cudagraph_max_vision_items_per_batch": 2}
    assert list(config)[:2] == ["mode", "cudagraph_mode"]
    assert base == {"mode": 3, "cudagraph_mode": "FULL", "cudagraph_mm_encoder": False}


def test_budgets_items_and_frames_are_written():
    config = compile_config("video", budgets=[4096, 1024, 2048, 1024], max_items=4, max_frames=64)
    assert config == {"cudagraph_mm_encoder": True, "encoder_cudagraph_max_vision_items_per_batch": 4,
                      "encoder_cudagraph_token_budgets": [1024, 2048, 4096],
                      "encoder_cudagraph_max_frames_per_batch": 64}


def test_zero_items_means_auto():
    assert compile_config("image", budgets=[64], max_items=0)["encoder_cudagraph_max_vision_items_per_batch"] == 0


@pytest.mark.parametrize("budgets", [[], [0], [1024, -1], ["1024"], [True], [1.5]])
def test_invalid_budgets(budgets):
    with pytest.raises(BudgetError, match="encoder_cudagraph_token_budgets"):
        compile_config("image", budgets=budgets)


def test_items_larger_than_the_smallest_budget():
    with pytest.raises(BudgetError) as info:
        compile_config("image", budgets=[2048, 4], max_items=8)
    message = str(info.value)
    assert "max_vision_items_per_batch=8" in message and "smallest token budget 4" in message
    assert "max items <= 4" in message


def test_budgets_of_the_base_config_are_checked_too():
    with pytest.raises(BudgetError, match="smallest token budget 1"):
        compile_config("image+video", {"encoder_cudagraph_token_budgets": [1, 1024]})
    with pytest.raises(BudgetError, match="positive integers"):
        compile_config("image", {"encoder_cudagraph_token_budgets": [0]})
    kept = compile_config("image+video", {"encoder_cudagraph_token_budgets": [512]})
    assert kept["encoder_cudagraph_token_budgets"] == [512]


def test_items_and_frames_must_not_be_negative():
    with pytest.raises(BudgetError, match=">= 0"):
        compile_config("image", max_items=-1)
    with pytest.raises(BudgetError, match="max_frames_per_batch must be an integer >= 0"):
        compile_config("video", max_frames=-2)


def test_frames_need_video():
    with pytest.raises(UsageError, match="applies to video"):
        compile_config("image", max_frames=8)
    assert compile_config("image+video", max_frames=8)["encoder_cudagraph_max_frames_per_batch"] == 8


def test_parse_base():
    assert parse_base(None) == {}
    assert parse_base('{"mode": 3}') == {"mode": 3}
    for text, kind in (("[1, 2]", "an array"), ('"x"', "a string"), ("3", "a number"), ("null", "null")):
        with pytest.raises(UsageError, match=f"must be a JSON object.*got {kind}"):
            parse_base(text)
    with pytest.raises(UsageError, match="not valid JSON"):
        parse_base("{mode: 3}")


def test_parse_budgets():
    assert parse_budgets(None) is None
    assert parse_budgets("1024, 2048,4096") == [1024, 2048, 4096]
    for text in ("1024,x", "", "1024,,2048", "1e3"):
        with pytest.raises(UsageError, match="comma-separated integers"):
            parse_budgets(text)


def test_does_not_import_torch():
    code = "import sys, vitcg.tools.plan.compile_config; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "False", run.stderr


def test_serve_command_quotes_the_config_for_a_shell():
    config = compile_config("image", {"note": "it's"}, budgets=[1024, 4096])
    words = shlex.split(serve_command("/models/my vlm", config))
    assert words[:6] == ["vllm", "serve", "/models/my vlm", "--model-impl", "transformers", "--compilation-config"]
    assert json.loads(words[6]) == config and len(words) == 7
    with pytest.raises(UsageError, match="--serve needs a model"):
        serve_command("  ", config)


@pytest.mark.parametrize("model", ["--trust-remote-code", "-h", "-", "--host=0.0.0.0"])
def test_a_model_name_that_vllm_would_read_as_an_option_is_refused(model: str):
    """issue 37, item 8: ``vllm serve --trust-remote-code --model-impl ...`` turned the model name into an option."""
    with pytest.raises(UsageError) as caught:
        serve_command(model, compile_config("image"))
    message = str(caught.value)
    assert f"--serve {shlex.quote(model)}" in message and "starts with '-'" in message and "./" in message


def test_the_cli_refuses_a_model_name_starting_with_a_dash():
    run = subprocess.run([sys.executable, "-m", "vitcg", "compile-config", "--modality", "image",
                          "--serve=--trust-remote-code"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert run.stderr.startswith("error: --serve --trust-remote-code: ") and "Traceback" not in run.stderr
    ok = subprocess.run([sys.executable, "-m", "vitcg", "compile-config", "--modality", "image",
                         "--serve=./--trust-remote-code"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and shlex.split(ok.stdout)[:3] == ["vllm", "serve", "./--trust-remote-code"]


def test_a_base_nested_too_deeply_is_a_usage_error():
    """Was RecursionError from json.loads on about 60k nested brackets."""
    from vitcg.errors import UsageError
    from vitcg.tools.plan.compile_config import parse_base

    with pytest.raises(UsageError, match="--base is nested too deeply"):
        parse_base("[" * 100_000 + "]" * 100_000)
