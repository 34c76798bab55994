"""A compile cache written by one command loads and runs in a fresh process (skipped without CUDA; issue 36).

``vitcg bench`` stores the blocks it compiled ahead of time; a fresh process that builds the same encoder inside
a VLM and calls ``vitcg.accelerate`` loads them and runs them, without the attention code that chose the custom op
they call ever running there. On 2026-11-28 that process failed with ``'_OpNamespace' 'vitcg' object has no
attribute 'packed_attention'``.

The spec is qwen2_vl with a tiny tower of head dim 64 (written beside the test, ``extends: qwen2_vl``): the Triton
packed kernel serves it on sm90, and both processes compile in seconds. Both use the same engine limits, so the
cache key is the same. Tolerance: bf16 relative error ||routed - original|| / ||original|| <= 1e-2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
SPEC = """extends: qwen2_vl
name: qwen2_vl_wide
tests:
  tiny_config: {embed_dim: 128, num_heads: 2}   # head dim 64: the Triton packed kernel's range
"""
LIMITS = {"max_num_batched_tokens": 1024, "max_model_len": 32768, "token_budgets": [256, 1024]}

LOADER = """
import json, sys, warnings
import torch
import vitcg
from vitcg.runtime.accelerate import source_for
from vitcg.tools.check.vlm import build_vlm
from vitcg.tools.workloads import relative_error

folder, limits = sys.argv[1], json.loads(sys.argv[2])
spec = source_for(folder)["qwen2_vl_wide"]
vlm = build_vlm(spec, device="cuda").to(torch.bfloat16)
pixels = torch.randn(256, 1176, device="cuda", dtype=torch.bfloat16)  # one 224x224 image: 16x16 patches
grid = torch.tensor([[1, 16, 16]], device="cuda")

def features():
    with torch.no_grad():
        out = vlm.model.get_image_features(pixels, grid)
    out = getattr(out, "pooler_output", out)
    return torch.cat(list(out)) if isinstance(out, (list, tuple)) else out

want = features()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    handle = vitcg.accelerate(vlm, spec=spec, compile=True, **limits)
    features()  # the first call runs the original and learns the output layout
    got = features()
ahead = handle.adapter.ahead
print("RESULT " + json.dumps({
    "routed": handle.stats.routed, "replays": handle.stats.manager.replays,
    "cache_loaded": handle.compile_cache.loaded, "cache_path": str(handle.compile_cache.path),
    "ahead_loaded": len(ahead.load_seconds), "ahead_compiled": ahead.compiled, "ahead_fallbacks": ahead.fallbacks,
    "ahead_disabled": ahead.disabled, "error": relative_error(got, want),
    "warnings": [str(w.message)[:300] for w in caught if "vitcg" in str(w.message)]}))
"""


def run(args, env, timeout):
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_blocks_bench_stored_load_and_run_in_a_fresh_accelerate_process(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "qwen2_vl_wide.yaml").write_text(SPEC)
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # the device's carried wheels follow
    env = {**os.environ, "VITCG_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": path,
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    bench = run(["-m", "vitcg", "bench", str(folder / "qwen2_vl_wide.yaml"), "--device", "cuda", "--size", "tiny",
                 "--workload", "1x224", "--iters", "1", "--warmup", "0",
                 "--max-num-batched-tokens", str(LIMITS["max_num_batched_tokens"]),
                 "--budgets", ",".join(map(str, LIMITS["token_budgets"]))], env, 300)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
    stored = sorted((tmp_path / "cache" / "compile").glob("*.aot"))
    assert stored, f"vitcg bench stored no ahead-of-time blocks:\n{bench.stdout[-2000:]}"

    load = run(["-c", LOADER, str(folder), json.dumps(LIMITS)], env, 300)
    assert load.returncode == 0, load.stderr[-4000:]
    assert "packed_attention" not in load.stderr, load.stderr[-4000:]
    line = next(x for x in load.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["cache_loaded"] and Path(result["cache_path"]).name == stored[0].name, result
    assert result["ahead_loaded"] > 0 and result["ahead_compiled"] == 0, result  # loaded, nothing compiled again
    assert result["routed"] >= 1 and result["replays"] > 0, result
    assert result["error"] <= 1e-2, result
    assert not [w for w in result["warnings"] if "could not be loaded" in w or "not loading" in w], result
