"""Captures run with automatic garbage collection paused (:func:`vitcg.runtime.graphs.gc_paused`): a collection
inside a capture could tear down an unreachable earlier graph, which the capturing stream forbids. The capture
itself needs CUDA (tests/gpu); this checks the pause on the CPU."""

from __future__ import annotations

import gc
import weakref

import pytest

from vitcg.runtime.graphs import gc_paused


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_no_automatic_collection_runs_inside_and_garbage_is_collected_after():
    assert gc.isenabled()
    collected = []
    cycle = Cycle()
    weakref.finalize(cycle, collected.append, "cycle")
    del cycle  # unreachable, freed only by a collection
    with gc_paused():
        assert not gc.isenabled()
        churn = [[] for _ in range(50 * gc.get_threshold()[0])]  # many times what triggers a collection
        del churn
        assert collected == []
    assert gc.isenabled()
    gc.collect()
    assert collected == ["cycle"]


def test_collection_is_restored_after_an_error_and_left_off_if_it_was_off():
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_turn_collection_back_on_only_when_the_last_ends():
    first, second = gc_paused(), gc_paused()  # two threads' captures, the first ending before the second
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second capture is still running
    second.__exit__(None, None, None)
    assert gc.isenabled()
