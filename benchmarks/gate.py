"""The GPU gate's verdict (``benchmarks/gpu_run.sh gate``): reads what the gate's steps left in ``$OUT`` and prints
one ``GATE`` line per part and a last ``GATE: passed`` or ``GATE: failed``; exits 1 when any part failed.

Parts: every packaged spec at real size (``vitcg check --all --device cuda --size real``: its exit status), the GPU
plugin, regions, packed-attention and cross-process cache tests (pytest's exit status), and the TTFT router rows
(``generate_ttft.py``): each row's routed TTFT must not be slower than the stock model's by more than
:data:`NOISE`, and the first tokens must agree. The steps' statuses come in as ``NAME=STATUS`` arguments.

Usage: python3 benchmarks/gate.py TTFT_JSON check=0 tests=0 ttft=0 (TTFT_JSON ``-``: a call without the TTFT rows)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NOISE = 1.05
"""How much slower than stock a routed TTFT row may measure before the gate fails: the spread of medians of 10
rounds between two runs on one H100 (benchmarks/RESULTS.md, 2026-11-26: 2-4%), plus a margin."""


TIMED_OUT = " (the step's time limit, not a failure it found: on a slower host run gate-a, then gate-b)"
"""Said of a step that ``timeout`` stopped: on 2026-12-02 the check of one call's ``gate`` ran past its 210 s after
54 of 70 specs, all passing, on a slower H200 host."""


def ttft_rows(path: Path) -> list[tuple[str, bool, str]]:
    """(row, passed, what was measured) for each model and workload of a ``generate_ttft.py --json`` file."""
    if not path.is_file():
        return [("ttft", False, f"no {path.name}: generate_ttft.py did not finish")]
    rows = []
    for model, result in json.loads(path.read_text())["models"].items():
        for workload, row in result["workloads"].items():
            slower = row["vitcg_ms"] / row["eager_ms"]
            ok = slower <= NOISE and row.get("same_first_token", True)
            rows.append((f"ttft {model} {workload}", ok,
                         f"vitcg {row['vitcg_ms']:.2f} ms, stock {row['eager_ms']:.2f} ms ({1 / slower:.2f}x), "
                         f"default/best {row.get('default_vs_best', float('nan')):.3f}, "
                         f"same first token {row.get('same_first_token')}"))
    return rows


def main(argv: list[str]) -> int:
    path, statuses = Path(argv[0]), dict(arg.split("=", 1) for arg in argv[1:])
    parts = [(name, status == "0", f"exit {status}{TIMED_OUT if status in ('124', '137') else ''}")
             for name, status in statuses.items()]
    parts += ttft_rows(path) if argv[0] != "-" else []
    for name, ok, what in parts:
        print(f"GATE {'ok    ' if ok else 'FAILED'} {name}: {what}")
    passed = all(ok for _, ok, _ in parts)
    print(f"GATE: {'passed' if passed else 'failed'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
