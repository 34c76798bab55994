"""Host bounds proven on the CPU (issue 26, item 5): ``max_seqlen`` / ``max_window_seqlen`` are read only by the
CUDA varlen kernel, so ``vitcg check`` compares them with the boundaries the adapter builds, at capture and at
every replay."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support.specs import packaged
from vitcg.lang.formulas import parse
from vitcg.tools.check import cases
from vitcg.tools.check.bounds import Bound, Overrun, audit, bounds_of, longest
from vitcg.tools.check.report import Verdict, verdict

MERGED_WINDOW = "(window_size // patch_size // spatial_merge_size) ** 2"
"""qwen2_5_vl's max_window_seqlen counted in merged tokens: one 112 px window is 4 x 4 merged tokens, but the
window boundaries count its 64 patch rows."""


def _qwen2_5_vl(buffer: str = "", value: str = ""):
    """The packaged qwen2_5_vl spec, with ``buffer``'s value formula replaced by ``value``."""
    spec = packaged().get("qwen2_5_vl")
    if not buffer:
        return spec
    names = {"budget", "window_size", "patch_size", "spatial_merge_size"}
    assert any(b.name == buffer and b.is_host for b in spec.buffers), f"qwen2_5_vl has no host buffer {buffer!r}"
    buffers = tuple(dataclasses.replace(b, value=parse(value, names)) if b.name == buffer else b for b in spec.buffers)
    return dataclasses.replace(spec, buffers=buffers)


def test_the_real_windowed_spec_holds_its_bounds():
    report = cases.check_spec(_qwen2_5_vl(), size="tiny")
    assert report.error is None, report.error
    assert all(case.ok for case in report.cases if case.stage == "spec"), [c.error for c in report.cases]


def test_a_window_bound_counted_in_merged_tokens_fails_check_at_capture():
    """The spec that passed every CPU check before: max_window_seqlen as 4 x 4 merged tokens (16), where the
    window boundaries count 64 patch rows."""
    report = cases.check_spec(_qwen2_5_vl("max_window_seqlen", MERGED_WINDOW))
    kind, reason = verdict(report)
    assert kind is Verdict.FAILED
    assert "buffer 'max_window_seqlen' holds 16 for budget 64" in reason
    assert "'cu_window_seqlens' at capture" in reason and "a segment of 64 rows" in reason
    assert "multiply it by spatial_merge_size ** 2 (16 * 4 = 64)" in report.error


def test_a_segment_bound_of_budget_tokens_fails_check():
    report = cases.check_spec(_qwen2_5_vl("max_seqlen", "budget"))
    assert verdict(report)[0] is Verdict.FAILED
    assert "buffer 'max_seqlen' holds 64 for budget 64, but 'cu_seqlens'" in report.error


def test_a_replay_beyond_the_bound_fails_its_case(monkeypatch: pytest.MonkeyPatch):
    """Without the capture probe, the replays themselves catch it: the case whose pack overruns fails."""
    monkeypatch.setattr(cases, "capture_overruns", lambda *args: [])
    report = cases.check_spec(_qwen2_5_vl("max_window_seqlen", "8"))
    failed = [c for c in report.cases if c.error and "max_window_seqlen" in c.error]
    assert failed, [(c.name, c.error) for c in report.cases]
    assert "holds 8" in failed[0].error and "at replay" in failed[0].error
    assert verdict(report)[0] is Verdict.FAILED


def test_bounds_pair_each_host_value_with_its_boundaries():
    assert [(b.host, b.boundaries) for b in bounds_of(_qwen2_5_vl())] == [
        ("max_seqlen", ("cu_seqlens",)), ("max_window_seqlen", ("cu_window_seqlens",))]


def test_longest_segment_and_padding():
    assert longest(torch.tensor([0, 4, 20, 22])) == (16, 4)
    assert longest(torch.tensor([0])) == (0, 0)
    bound = Bound("max_seqlen", ("cu_seqlens",))
    values = {"cu_seqlens": torch.tensor([0, 8, 12, 40], dtype=torch.int32)}
    (real,) = audit([bound], values, {"max_seqlen": 20}, 64, "at replay", {"cu_seqlens": 12})
    assert real.padding and real.needed == 28 and "more slots" in real.message(2)
    assert not audit([bound], values, {"max_seqlen": 28}, 64, "at replay")
    over = Overrun(bound, "cu_seqlens", 10, 100, 64, "at replay")
    assert "longest segment any pack of the budget can hold" in over.message(2)  # not a merge factor: 10 * 4 < 100
