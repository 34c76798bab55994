"""Run a vitcg command with the candidate packed attention kernel (``benchmarks/candidates/varlen_segments.py``) in
place of the runtime's: ``vitcg.runtime.varlen_triton.varlen_attention``, which the ``vitcg::packed_attention``
op calls, becomes the candidate's, in this process only. Nothing is written; the runtime's files stay as they are.

Usage (GPU machine, repository root): python benchmarks/with_candidate.py -m vitcg check qwen2_vl --device cuda
--size real   (or: python benchmarks/with_candidate.py SCRIPT.py ARGS...)
"""

from __future__ import annotations

import atexit
import collections
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager

CALLS: collections.Counter = collections.Counter()
"""Launches through the candidate's entry point: "candidate", or "runtime" for calls past its scan."""


@contextmanager
def candidate_in_place() -> Iterator[None]:
    """The candidate's ``varlen_attention`` in the runtime kernel module's place for the block, counting its
    calls; the runtime's own is back when the block ends."""
    from candidates import varlen_segments

    from vitcg.runtime import varlen_triton

    def counted(q, k, v, cu, *args, **kwargs):
        CALLS["runtime" if cu.shape[0] - 1 > varlen_segments.SCAN_SEGMENTS else "candidate"] += 1
        return varlen_segments.varlen_attention(q, k, v, cu, *args, **kwargs)

    runtime = varlen_triton.varlen_attention
    varlen_triton.varlen_attention = counted
    try:
        yield
    finally:
        varlen_triton.varlen_attention = runtime


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    atexit.register(lambda: print(f"with_candidate: {CALLS['candidate']} calls of the candidate kernel, "
                                  f"{CALLS['runtime']} past its scan to the runtime's", flush=True))
    with candidate_in_place():
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
