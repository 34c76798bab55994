"""Run one spec's end-to-end (vlm) stage with the full traceback (debugging aid; GPU or CPU).
Usage: python benchmarks/debug_vlm_stage.py SPEC [DEVICE]"""

from __future__ import annotations

import sys
import traceback

from vitcg.lang import SpecSource
from vitcg.tools.check.vlm import check_vlm

spec = SpecSource(bindings=False)[sys.argv[1]]
try:
    print(check_vlm(spec, sys.argv[2] if len(sys.argv) > 2 else "cpu"))
except Exception:  # noqa: BLE001 - the point is the traceback
    traceback.print_exc()
