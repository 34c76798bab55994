"""Conformance over every spec: manager output equals eager output per item (float32, CPU).

The spec list and marks come from the generated test configurations (registry/test_configs.py), the one
source of truth shared with the docs. Tolerance: relative error ||graph - eager|| / ||eager|| per item
<= 1e-5, every output finite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.specs import load_test_configs, packaged
from support.tiny import tiny_adapter
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.check.cases import check_spec
from vitcg.tools.workloads import relative_error

REPO = Path(__file__).resolve().parents[2]
REGISTRY = packaged()
CONFIGS = load_test_configs(REPO / "registry")


def test_generated_configs_cover_every_spec():
    assert sorted(CONFIGS) == REGISTRY.names


@pytest.mark.parametrize("name", [pytest.param(name, marks=[getattr(pytest.mark, m) for m in config.marks])
                                  for name, config in sorted(CONFIGS.items())])
def test_spec_conforms(name):
    report = check_spec(REGISTRY[name], device="cpu", dtype=torch.float32)
    assert report.error is None, report.error
    ran = [c for c in report.cases if not c.skipped]
    assert len(ran) >= 3
    for case in ran:
        assert case.error is None, f"{case.name}: {case.error}"
        assert case.finite, case.name
        assert case.max_error <= 1e-5, f"{case.name}: {case.max_error:.2e}"
    routes = " ".join(c.route for c in ran)
    assert "graph" in routes
    if any(c.name.startswith("item larger") for c in ran):
        assert "eager" in routes  # the fallback was exercised too


STYLES = {"packed": REGISTRY["qwen2_vl"], "windowed": REGISTRY["qwen2_5_vl"], "tiles": REGISTRY["internvl"]}
"""One spec per attention style for the property test (the per-spec cases above cover every spec)."""
_MANAGERS: dict[str, tuple] = {}


def manager_for(style: str):
    if style not in _MANAGERS:
        spec = STYLES[style]
        adapter = tiny_adapter(spec, seed=1)
        low, _ = adapter.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 1 << 20, "max_model_len": 1 << 20})
        _MANAGERS[style] = adapter, EncoderCudaGraphManager(adapter, max_num_batched_tokens=8 * low)
    return _MANAGERS[style]


GRID = st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 7))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(style=st.sampled_from(sorted(STYLES)), images=st.lists(GRID, max_size=6), videos=st.lists(GRID, max_size=3),
       seed=st.integers(0, 2**16))
def test_random_batches_match_eager(style, images, videos, seed):
    adapter, manager = manager_for(style)
    spec, g = adapter.spec, adapter.geometry
    generator = torch.Generator().manual_seed(seed)
    kwargs = {}
    for name, entries in (("image", images), ("video", videos)):
        modality = spec.modality(name)
        if not entries or modality is None:
            continue
        if spec.style == "tiles":
            counts = torch.tensor([t * h for t, h, _ in entries])  # 1..21 tiles: some exceed the largest budget
            rows = (int(counts.sum()), 3, g["image_size"], g["image_size"])
        else:
            m = g["spatial_merge_size"]
            ts = [1 if name == "image" else t for t, _, _ in entries]
            hw = [(h * m * (3 if h == 7 else 1), w * m * (3 if w == 7 else 1)) for _, h, w in entries]  # 7 -> oversized
            counts = torch.tensor([[t, h, w] for t, (h, w) in zip(ts, hw)])
            rows = (int(counts.prod(-1).sum()), g["in_channels"] * g["temporal_patch_size"] * g["patch_size"] ** 2)
        kwargs[modality.pixels_key] = torch.randn(rows, generator=generator)
        kwargs[modality.count_key] = counts
    before = manager.stats.items, manager.stats.hits, manager.stats.misses
    outputs = manager.execute(kwargs)
    items = adapter.get_encoder_cudagraph_item_specs(kwargs) if kwargs else []
    assert len(outputs) == len(items)
    for index, (item, got) in enumerate(zip(items, outputs)):
        want = adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
        assert got.shape == (item.output_tokens, g["out_hidden_size"]) == want.shape
        assert torch.isfinite(got).all()
        assert relative_error(got, want) <= 1e-5
    stats = manager.stats
    assert stats.items - before[0] == len(items)
    assert (stats.hits - before[1]) + (stats.misses - before[2]) == len(items)
