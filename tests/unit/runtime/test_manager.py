"""The manager against a minimal protocol implementation: packing, routing, order, clones, stats.

``ToyEncoder`` is a real :class:`SupportsEncoderCudaGraph` built through its constructor: each output row
is its input row plus the sum of its segment, so a wrong segment boundary changes the numbers.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vitcg.errors import InputError
from vitcg.runtime.manager import EncoderCudaGraphManager, ManagerOptions
from vitcg.runtime.protocol import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
    SupportsEncoderCudaGraph,
)


def segment_sums(x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    seg = torch.searchsorted(cu[1:].contiguous(), torch.arange(x.shape[0], dtype=cu.dtype), right=True)
    mask = (seg[:, None] == seg[None, :]).to(x.dtype)
    return x + mask @ x


class ToyEncoder:
    """A hand-written model implementing vLLM's protocol and nothing else (no vitcg import but the data
    objects): vitcg's manager must drive it as vLLM's would."""

    supports_encoder_cudagraph = True

    def __init__(self, min_budget: int = 4):
        self.min_budget = min_budget
        self.forward_calls = 0

    def get_encoder_cudagraph_config(self):
        return EncoderCudaGraphConfig(["image"], ["x", "cu"], 2, {"cu": self._pad_cu})

    @staticmethod
    def _pad_cu(buffer, value):
        """Boundaries first; padding rows form one trailing segment that ends at the buffer set's rows."""
        end = int(buffer[-1])  # captured with the row count last
        buffer.fill_(end)
        buffer[:value.shape[0]].copy_(value)

    def get_input_modality(self, mm_kwargs):
        if "x" not in mm_kwargs:
            raise InputError("no x")
        return "image"

    def get_max_frames_per_video(self):
        return 1

    def get_encoder_cudagraph_budget_range(self, vllm_config):
        return self.min_budget, min(vllm_config.scheduler_config.max_num_batched_tokens,
                                    vllm_config.model_config.max_model_len)

    def get_encoder_cudagraph_item_specs(self, mm_kwargs):
        return [EncoderItemSpec(int(n), int(n)) for n in mm_kwargs["sizes"]]

    def select_encoder_cudagraph_items(self, mm_kwargs, indices):
        sizes = mm_kwargs["sizes"].tolist()
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        rows = [mm_kwargs["x"][offsets[i]:offsets[i + 1]] for i in indices]
        return {"x": torch.cat(rows) if rows else mm_kwargs["x"][:0],
                "sizes": mm_kwargs["sizes"][list(indices)]}

    def postprocess_encoder_output(self, outputs, indices, per_item_out_tokens, dest, clone=False,
                                   batch_mm_kwargs=None):
        offset = 0
        for i in indices:
            piece = outputs["default"][offset:offset + per_item_out_tokens[i]]
            dest[i] = piece.clone() if clone else piece
            offset += per_item_out_tokens[i]

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch,
                                                 device, dtype, path="default", axis_keys=None):
        cu = torch.full((max_batch_size + 2,), token_budget, dtype=torch.int32)
        cu[0] = 0
        return EncoderCudaGraphCaptureInputs({"x": torch.zeros(token_budget, 2, dtype=dtype), "cu": cu})

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path="default"):
        cu = torch.nn.functional.pad(mm_kwargs["sizes"].cumsum(0), (1, 0)).to(torch.int32)
        return EncoderCudaGraphReplayBuffers({"x": mm_kwargs["x"], "cu": cu})

    def encoder_cudagraph_forward(self, inputs, path="default"):
        self.forward_calls += 1
        return segment_sums(inputs["x"], inputs["cu"])

    def encoder_eager_forward(self, mm_kwargs, path="default"):
        cu = torch.nn.functional.pad(mm_kwargs["sizes"].cumsum(0), (1, 0))
        return segment_sums(mm_kwargs["x"], cu)


def batch(*sizes: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(sum(sizes), 2, generator=g, dtype=torch.float64),
            "sizes": torch.tensor(sizes, dtype=torch.int64)}


def reference(kwargs: dict, toy: ToyEncoder) -> list[torch.Tensor]:
    return [toy.encoder_eager_forward(toy.select_encoder_cudagraph_items(kwargs, [i]))
            for i in range(len(kwargs["sizes"]))]


@pytest.fixture
def toy():
    return ToyEncoder()


def make(toy, **kwargs) -> EncoderCudaGraphManager:
    """A manager on ``toy``: keywords are ManagerOptions fields or engine limits."""
    kwargs.setdefault("max_num_batched_tokens", 32)
    fields = {f.name for f in dataclasses.fields(ManagerOptions)}
    options = ManagerOptions(**{k: kwargs.pop(k) for k in list(kwargs) if k in fields})
    return EncoderCudaGraphManager(toy, dtype=torch.float64, options=options, **kwargs)


def test_toy_satisfies_protocol_and_not_the_extension(toy):
    from vitcg.runtime.extension import SupportsVitcgExtension

    assert isinstance(toy, SupportsEncoderCudaGraph)
    assert not isinstance(toy, SupportsVitcgExtension)


def test_manager_reads_only_the_protocol(toy):
    """The manager gets no device or dtype from the model: it uses what it is given, as vLLM does."""
    manager = make(toy)
    assert manager.device == torch.device("cpu") and manager.dtype == torch.float64
    assert manager.extension.item_frames is None and not manager.extension.scoped
    assert type(manager.boundary).__name__ == "WholeReplay"


def test_select_follows_indices_order(toy):
    manager = make(toy, max_items_per_batch=3, packing="greedy")
    kwargs = batch(5, 1, 9, 3, 2)
    packs = manager.route([5, 1, 9, 3, 2]).packs
    assert [p.indices for p in packs] == [(1, 4, 3), (0, 2)]  # packing order, not sorted
    for got, want in zip(manager.execute(kwargs), reference(kwargs, toy)):
        torch.testing.assert_close(got, want)


def test_results_match_eager_in_caller_order(toy):
    manager = make(toy)
    kwargs = batch(5, 1, 9, 3, 40, 2)
    got = manager.execute(kwargs)
    want = reference(kwargs, toy)
    assert [g.shape[0] for g in got] == [5, 1, 9, 3, 40, 2]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_stats_add_up(toy):
    manager = make(toy, max_items_per_batch=3, packing="greedy")
    manager.execute(batch(5, 1, 9, 3, 40, 2))
    stats = manager.stats
    assert stats.items == 6 and stats.hits + stats.misses == stats.items
    assert stats.misses == 1 and stats.eager_calls == 1 and stats.replays == 2
    assert stats.used_tokens == 20 and stats.padded_tokens == (8 - 6) + (16 - 14)
    assert stats.replays_per_budget == {8: 1, 16: 1}
    assert 0 < stats.padding_waste < 1


def test_outputs_are_cloned_before_the_next_replay(toy):
    manager = make(toy)
    first = manager.execute(batch(3, 2, seed=1))
    kept = [t.clone() for t in first]
    manager.execute(batch(3, 2, seed=2))  # same budget, same buffers
    for a, b in zip(first, kept):
        torch.testing.assert_close(a, b)


def test_empty_inputs(toy):
    manager = make(toy)
    assert manager.execute({}) == []
    assert manager.execute({"x": None}) == []
    assert manager.execute(batch()) == []
    assert manager.stats.items == 0


def test_unknown_keys_are_a_clear_error(toy):
    with pytest.raises(InputError, match="no x"):
        make(toy).execute({"y": torch.zeros(1)})


def test_capture_is_lazy_and_once(toy):
    manager = make(toy)
    assert not manager.graphs
    manager.execute(batch(2))
    assert sorted(manager.graphs) == [4, 8, 16, 32]
    report = manager.capture()
    assert report.seconds == 0.0  # already captured


def test_buffer_identity_is_enforced(toy):
    manager = make(toy)
    manager.execute(batch(2))
    entry = manager.graphs[4]
    entry.inputs.values["x"] = entry.inputs.values["x"].clone()  # replace the recorded buffer
    with pytest.raises(RuntimeError, match="buffer identity broken"):
        manager.execute(batch(2))


def test_padding_logics_are_called_and_keys_without_one_are_zeroed(toy):
    manager = make(toy, max_items_per_batch=2, packing="greedy")
    manager.execute(batch(3, 2, seed=1))
    x = manager.graphs[8].inputs.values["x"]
    assert x[5:].abs().sum() == 0  # the default: zeroed, then the rows copied first
    assert manager.graphs[8].inputs.values["cu"].tolist() == [0, 2, 5, 8]  # packing order; the toy's logic


def test_cuda_graphs_need_cuda(toy):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="need a CUDA device"):
        EncoderCudaGraphManager(toy, options=ManagerOptions(use_cuda_graphs=True))


def test_static_path_measures_nothing(toy):
    report = make(toy).capture()
    assert report.replay_ms == {}


def test_unknown_packing_is_rejected(toy):
    from vitcg.errors import BudgetError

    with pytest.raises(BudgetError, match="packing must be one of tight, greedy"):
        make(toy, packing="best")


def test_lean_caps_apply_only_to_inferred_limits(toy):
    from vitcg.runtime.budgets import LEAN_ITEMS

    lean = make(toy, max_num_batched_tokens=1024)  # vLLM would infer 1024 // 4 = 256, capped by min budget 4
    vllm = make(toy, max_num_batched_tokens=1024, lean=False)
    assert vllm.plan.max_items == 4 and lean.plan.max_items == min(4, LEAN_ITEMS)
    toy64 = ToyEncoder(min_budget=64)
    assert make(toy64, max_num_batched_tokens=8192, lean=False).plan.max_items == 64
    assert make(toy64, max_num_batched_tokens=8192).plan.max_items == LEAN_ITEMS
    assert make(toy64, max_num_batched_tokens=8192, max_items_per_batch=40).plan.max_items == 40  # given: kept
    assert lean.budgets == vllm.budgets  # budgets are vLLM's either way


def test_a_poisoned_item_runs_eagerly_alone_and_leaves_its_pack_intact(toy):
    """The toy's segment sums multiply by a 0/1 mask, as packed attention multiplies by zero weights: one NaN
    row makes every row of its pack NaN. Isolated, the others come out of the graph exactly as eager."""
    kwargs = batch(3, 2, 4, seed=5)
    kwargs["x"][3, 1] = float("nan")  # item 1
    kwargs["x"][4, 0] = float("inf")
    want = reference(kwargs, toy)
    manager = make(toy)
    got = manager.execute(kwargs)
    for index in (0, 2):
        torch.testing.assert_close(got[index], want[index])
    torch.testing.assert_close(got[1], want[1], equal_nan=True)
    stats = manager.stats
    assert (stats.nonfinite_items, stats.misses, stats.hits, stats.replays) == (1, 1, 2, 1)
    assert stats.as_dict()["nonfinite_items"] == 1

    unguarded = make(toy, isolate_nonfinite=False)
    assert not any(torch.isfinite(out).all() for out in unguarded.execute(kwargs))  # the root cause


def test_finite_inputs_take_the_usual_path(toy):
    kwargs = batch(3, 2, 4, seed=6)
    manager = make(toy)
    got = manager.execute(kwargs)
    for g, w in zip(got, reference(kwargs, toy), strict=True):
        torch.testing.assert_close(g, w)
    assert manager.stats.nonfinite_items == 0 and manager.stats.misses == 0 and manager.stats.replays == 1



@pytest.mark.parametrize("eager_ms, served", [(31.0, "graphs"), (12.0, "eager")])
def test_the_router_explores_then_keeps_the_side_measured_faster(toy, monkeypatch, eager_ms, served):
    """Timings injected as the H100 gave them (a budget-32 replay 21 ms; eager calls of this size 31 ms, or 12):
    the first calls of the size run eagerly, timed; then every call takes the faster side, and outputs stay
    those of eager throughout."""
    manager = make(toy, max_num_batched_tokens=32)
    manager.capture()
    manager.costs.learn = True  # as on CUDA with routing on; the timings below stand in for the device's
    manager.costs.replay.update({b: 21.0 * b / 32 for b in manager.budgets})

    def synced_ms(fn):
        replays = toy.forward_calls  # the static forward stands in for a replay
        result = fn()
        return result, 21.0 if toy.forward_calls > replays else eager_ms
    monkeypatch.setattr(manager, "_synced_ms", synced_ms)
    for seed in range(6):
        kwargs = batch(10, 12, seed=seed)
        for got, want in zip(manager.execute(kwargs), reference(kwargs, toy), strict=True):
            torch.testing.assert_close(got, want)
    stats = manager.stats
    explored = 2  # OBSERVED calls, each wholly eager
    assert stats.eager_calls >= explored and stats.routed_eager >= 2 * explored
    if served == "graphs":
        assert stats.replays == 6 - explored and stats.eager_calls == explored
    else:
        assert stats.replays == 0 and stats.eager_calls == 6


def test_routing_is_logged_at_debug_and_capture_at_info(toy, caplog):
    manager = make(toy)
    with caplog.at_level("DEBUG", logger="vitcg.runtime"):
        manager.execute(batch(3, 2))
    messages = [r.getMessage() for r in caplog.records if r.name == "vitcg.runtime"]
    assert any(m.startswith("allocated 4 graphs at budgets 4,8,16,32") for m in messages)
    assert any("call of 2 items, 5 tokens: 1 replays, 0 items eager (nothing measured)" in m for m in messages)


def test_options_and_limits_are_checked(toy):
    from vitcg.errors import BudgetError, UsageError

    with pytest.raises(BudgetError, match="packing must be one of tight, greedy"):
        ManagerOptions(packing="best")
    with pytest.raises(UsageError, match=r"unknown engine limits \['route_eager'\].*ManagerOptions"):
        EncoderCudaGraphManager(toy, route_eager=False)
