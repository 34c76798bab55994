"""Real CUDA graphs (skipped without CUDA): capture/replay equals eager, buffer identity, shared-pool safety.

Tolerance: bf16 relative error ||graph - eager|| / ||eager|| per item <= 1e-2; float32 <= 1e-5.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from support.specs import packaged
from support.tiny import tiny_adapter
from vitcg.runtime.graphs import capture_graph
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools.check.cases import check_spec
from vitcg.tools.workloads import InputBuilder, on_device, relative_error

pytestmark = pytest.mark.gpu
REGISTRY = packaged()


@pytest.mark.parametrize("name", REGISTRY.names)
def test_capture_and_replay_match_eager_bf16(name):
    report = check_spec(REGISTRY[name], device="cuda", dtype=torch.bfloat16)
    assert report.error is None, report.error
    for case in report.cases:
        assert case.ok, f"{case.name}: {case.error or case.max_error}"


@pytest.mark.parametrize("name", ["qwen2_vl", "internvl"])
def test_capture_and_replay_match_eager_float32(name, no_tf32):
    report = check_spec(REGISTRY[name], device="cuda", dtype=torch.float32)
    assert report.ok, [(c.name, c.error, c.max_error) for c in report.cases]


def _images(adapter, grids, seed):
    g = adapter.geometry
    grid = torch.tensor(grids)
    dim = g["in_channels"] * g["temporal_patch_size"] * g["patch_size"] ** 2
    pixels = torch.randn(int(grid.prod(-1).sum()), dim, generator=torch.Generator().manual_seed(seed))
    return {"pixel_values": pixels.cuda().bfloat16(), "image_grid_thw": grid.cuda()}


@pytest.fixture(scope="module")
def qwen2():
    spec = REGISTRY["qwen2_vl"]
    adapter = tiny_adapter(spec, device="cuda", dtype=torch.bfloat16)
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=1024, device="cuda", dtype=torch.bfloat16)
    manager.capture()
    return adapter, manager


def test_replay_costs_are_measured_for_every_budget(qwen2):
    _, manager = qwen2
    assert sorted(manager.costs.replay) == sorted(manager.budgets)
    assert all(ms > 0 for ms in manager.costs.replay.values())
    # the largest budget computes 16x the rows of the smallest: it cannot replay faster
    assert manager.costs.replay[manager.budgets[-1]] > manager.costs.replay[manager.budgets[0]]


def test_buffer_identity_and_earlier_outputs_survive_later_replays(qwen2):
    adapter, manager = qwen2
    pointers = {b: {k: v.data_ptr() for k, v in e.inputs.values.items() if isinstance(v, torch.Tensor)}
                for b, e in manager.graphs.items()}
    first = manager.execute(_images(adapter, [[1, 8, 8], [1, 4, 12]], seed=1))
    kept = [t.clone() for t in first]
    for seed in range(2, 8):  # same and other budgets, overwriting the graph outputs
        manager.execute(_images(adapter, [[1, 8 + 2 * seed, 8], [1, 4, 4 * seed]], seed=seed))
    for a, b in zip(first, kept):
        assert torch.equal(a, b)
    for budget, entry in manager.graphs.items():
        now = {k: v.data_ptr() for k, v in entry.inputs.values.items() if isinstance(v, torch.Tensor)}
        assert now == pointers[budget]


def test_many_random_batches_share_one_pool_without_nan(qwen2):
    adapter, manager = qwen2
    rng = random.Random(0)
    used = set()
    for seed in range(40):
        grids = [[1, 2 * rng.randint(1, 16), 2 * rng.randint(1, 16)] for _ in range(rng.randint(1, 6))]
        kwargs = _images(adapter, grids, seed)
        before = dict(manager.stats.replays_per_budget)
        outputs = manager.execute(kwargs)
        used |= {b for b, n in manager.stats.replays_per_budget.items() if n > before.get(b, 0)}
        for index, got in enumerate(outputs):
            assert torch.isfinite(got).all(), f"batch {seed} item {index} has non-finite values"
            want = adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
            assert relative_error(got, want) <= 1e-2
    assert len(used) >= 3  # several budgets' graphs interleaved in the shared pool


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl"])
def test_a_poisoned_item_leaves_the_others_as_eager_float32(name, no_tf32):
    """Under real CUDA graphs (varlen flash attention): three images in one pack, the middle one NaN; the
    others match eager alone, the poisoned one is exactly eager's."""
    spec = REGISTRY[name]
    adapter = tiny_adapter(spec, device="cuda", dtype=torch.float32)
    manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=1024, device="cuda", dtype=torch.float32)
    manager.capture()
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
    kwargs = on_device(adapter, builder.inputs("image", [builder.image(2, 4), builder.image(4, 4), builder.image(2, 2)]))
    first = adapter.get_encoder_cudagraph_item_specs(kwargs)[0].input_size
    kwargs[spec.modality("image").pixels_key][first, :7] = float("nan")
    got = manager.execute(kwargs)
    assert manager.use_cuda_graphs and manager.stats.replays == 1 and manager.stats.nonfinite_items == 1
    for index, out in enumerate(got):
        want = adapter.encoder_eager_forward(adapter.select_encoder_cudagraph_items(kwargs, [index]))
        if index == 1:
            torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)  # the same eager call
        else:
            assert torch.isfinite(out).all() and relative_error(out, want) <= 1e-5


def test_a_collection_during_capture_cannot_destroy_an_earlier_graph():
    """torch no longer collects garbage before a capture: an earlier graph that only a reference cycle holds is
    torn down by whichever collection comes first, and inside a capture that invalidates it
    (:func:`vitcg.runtime.graphs.gc_paused`). The warm-up leaves such a graph in a fresh cycle; the captured call
    allocates enough Python objects to trigger collections."""
    earlier, _ = capture_graph(lambda: torch.zeros(4, device="cuda").add_(1), torch.device("cuda"))
    orphan, calls = [earlier], []
    del earlier

    class Cycle:
        def __init__(self, graph) -> None:
            self.graph, self.me = graph, self

    def fn():
        out = torch.ones(8, device="cuda") * 2
        if not calls:  # the warm-up: the earlier graph becomes unreachable, held only by a young cycle
            Cycle(orphan.pop())
        else:  # the capture: many more allocations than a collection needs
            churn = [[] for _ in range(20 * gc.get_threshold()[0])]
            del churn
        calls.append(1)
        return out

    graph, output = capture_graph(fn, torch.device("cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(output, torch.full((8,), 2.0, device="cuda"))
    gc.collect()  # the earlier graph goes now, outside any capture
    torch.ones(1, device="cuda").bernoulli_(0.5)  # the CUDA RNG is out of capture state
