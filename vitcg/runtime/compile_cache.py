"""A persistent cache for the inductor kernels of ``compile_forward`` adapters.

Inductor's own caches live under ``/tmp`` and key on graphs that dynamo must first trace again. vitcg keeps what
``torch.compiler.save_cache_artifacts`` returns after a capture in one file per key, and hands it back to
``torch.compiler.load_cache_artifacts`` before the next capture with the same key, in any later process. With the
repeated blocks compiled once per budget (:mod:`vitcg.runtime.regions`), qwen2_vl's 8 budgets compile and
capture in 22 s on an H100 from nothing and in 10 s from this cache. The key covers what the kernels depend
on: the spec's file, the budgets and capture limits, dtype, device model, the torch, transformers and triton
versions, and how the forward is compiled (:data:`COMPILE_FORMAT`). The file lives under ``compile/`` in
vitcg's cache folder (``VITCG_CACHE_DIR``); a file that cannot be read or loaded is ignored (and replaced),
never fatal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..lang.bindings import cache_root, transformers_version, write_cache_file
from ..lang.model import Spec

COMPILE_FORMAT = "blocks-static-1"
"""What is compiled (the repeated blocks, per budget): artifacts of another strategy are not reused."""


def compile_key(spec: Spec, device: torch.device, dtype: torch.dtype, **shapes: Any) -> str:
    """A digest of everything the compiled kernels depend on; ``shapes``: budgets and capture limits."""
    try:
        source = hashlib.sha256(Path(spec.file).read_bytes()).hexdigest()
    except OSError:  # a spec built in memory: its parsed form stands for its text
        source = hashlib.sha256(repr(spec).encode()).hexdigest()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    device = torch.device(device)
    parts = {"spec": spec.name, "source": source, "dtype": str(dtype), "device": device.type,
             "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
             "torch": torch.__version__, "transformers": transformers_version(), "triton": triton_version,
             "shapes": shapes, "format": COMPILE_FORMAT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class CompileCacheUse:
    path: Path
    loaded: bool = False
    """Whether artifacts were found and loaded before the capture."""
    saved_bytes: int = 0
    """Bytes written after the capture (0 when nothing new was compiled)."""


@contextlib.contextmanager
def persistent_compile_cache(key: str, root: str | os.PathLike | None = None) -> Iterator[CompileCacheUse]:
    """Load the artifacts stored under ``key`` (if any) on entry; on a clean exit, store what was compiled."""
    path = Path(root or cache_root()) / "compile" / f"{key}.bin"
    use = CompileCacheUse(path)
    try:
        data = path.read_bytes()
    except OSError:
        data = None
    if data:
        try:
            torch.compiler.load_cache_artifacts(data)
            use.loaded = True
        except Exception as exc:  # a stale or corrupt file: compile as if it were absent, then replace it
            warnings.warn(f"vitcg: ignoring the compile cache {path}: {type(exc).__name__}: {exc}", stacklevel=3)
    yield use
    if use.loaded:
        return
    artifacts = torch.compiler.save_cache_artifacts()
    if not artifacts:
        return
    blob = artifacts[0]
    try:
        write_cache_file(path, blob)
        use.saved_bytes = len(blob)
    except OSError as exc:  # a read-only cache folder costs the next start its compile time, nothing else
        warnings.warn(f"vitcg: could not store the compile cache {path}: {exc}", stacklevel=3)


def capture_compiled(manager: Any, spec: Spec) -> tuple[Any, CompileCacheUse]:
    """``manager.capture()`` (its adapter built with ``compile_forward``) inside the persistent cache of its spec,
    budgets, capture limits, device and dtype. Returns the capture report and how the cache was used."""
    key = compile_key(spec, manager.device, manager.dtype, budgets=list(manager.budgets),
                      max_items=manager.plan.max_items, max_frames=manager.plan.max_frames)
    with persistent_compile_cache(key) as use:
        report = manager.capture()
    return report, use
