"""Time ``vitcg validate`` over 100 spec files (20 renamed copies of each spec in vitcg/specs/).

Usage: python benchmarks/validate_100.py [--runs N]
Prints the wall time of the whole command (process start included), with a cold bindings cache
(first run: transformers is imported once) and with a warm cache (what a user sees afterwards).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_specs(folder: Path, count: int) -> None:
    sources = sorted((REPO / "vitcg" / "specs").glob("*.yaml"))
    for i in range(count):
        src = sources[i % len(sources)]
        text = re.sub(r"^name: (\w+)$", rf"name: \1_copy{i}", src.read_text(), count=1, flags=re.M)
        (folder / f"{src.stem}_copy{i}.yaml").write_text(text)


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(f"validate failed:\n{run.stdout}{run.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    exe = shutil.which("vitcg")
    command = [exe] if exe else [sys.executable, "-m", "vitcg"]
    with tempfile.TemporaryDirectory() as tmp:
        specs, cache = Path(tmp) / "specs", Path(tmp) / "cache"
        specs.mkdir()
        make_specs(specs, args.count)
        env = {**os.environ, "VITCG_CACHE_DIR": str(cache)}
        cold = timed([*command, "validate", str(specs)], env)
        warm = [timed([*command, "validate", str(specs)], env) for _ in range(args.runs)]
    print(f"vitcg validate over {args.count} specs ({os.cpu_count()} cores)")
    print(f"  cold cache (imports transformers once): {cold:.2f} s")
    print(f"  warm cache, median of {args.runs}:        {statistics.median(warm):.2f} s "
          f"(min {min(warm):.2f}, max {max(warm):.2f})")


if __name__ == "__main__":
    main()
