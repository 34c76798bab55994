"""Regional compilation: inductor kernels for an encoder's repeated blocks, compiled once for all of them.

A ViT is a stack of identical blocks. Compiling the whole fixed-shape forward makes dynamo trace every block
again and inductor generate (or, from a cache, reload) kernels for each; on qwen2_vl's 32 blocks that took
60-90 s at every process start. Here every block runs through one compiled function that takes the block as an
input (its weights are graph inputs), so dynamo traces one block per budget and every block reuses that graph:
qwen2_vl's 8 budgets compile and capture in 22 s from nothing and in 10 s from the caches. Inside a CUDA graph
the parts left eager (patch embedding, rotary tables, merger) cost no launch overhead; they lose only the
fusion across their few ops.

The compiled forwards are used only while the graph path runs (:func:`compiled_blocks` patches them in for the
call); the eager path, the reference of every check, keeps the model's own forwards.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn


def repeated_blocks(root: nn.Module) -> list[nn.Module]:
    """The blocks of every ``nn.ModuleList`` under ``root`` (``root`` itself included) whose two or more
    children share one class, outermost lists first; a list inside a block already found is left to it."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for module in root.modules():
        if id(module) in inside or not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        blocks.extend(module)
        inside.update(id(sub) for child in module for sub in child.modules())
    return blocks


RECOMPILE_LIMIT = 64
"""Compilations one block's code may hold while the graph path runs: one per budget and per distinct set of
constant arguments (Qwen2.5-VL's window and full-attention blocks pass different ``max_seqlen`` ints), above
dynamo's default of 8, past which it would silently run the block uncompiled."""


def _run_block(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """One block's own forward (its class's, not the instance attribute :func:`compiled_blocks` patches in).
    Dynamo keys its cache on this function's code, which is vitcg's alone: transformers wraps every layer's
    forward in one shared function, and compiling that would spend the recompile budget a user's own
    ``torch.compile`` of the language model's layers needs."""
    return type(block).forward(block, *args, **kwargs)


def compile_blocks(blocks: list[nn.Module], *, dynamic: bool = False) -> dict[nn.Module, Callable[..., Any]]:
    """Each block's forward through one ``torch.compile`` of :func:`_run_block` (the block is an input, its
    weights graph inputs, so the first block's compilation serves the rest). Static shapes by default: each
    budget gets kernels for its own token count, and integer arguments stay constants (with ``dynamic=True``
    they become symbolic inputs, which inductor 2.11 fails to compile for Qwen2.5-VL's and Pixtral's blocks on
    CUDA). A block whose instance carries a forward of its own (a hook that wraps it, as accelerate's device
    hooks do) is left out: its class's forward would skip the wrapper."""
    blocks = [block for block in blocks if "forward" not in vars(block)]
    if not blocks:
        return {}
    compiled = _calling(torch.compile(_run_block, dynamic=dynamic))
    return {block: functools.partial(compiled, block) for block in blocks}


def _calling(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` called with torch function modes off and room for a compilation per budget. vitcg's checking
    modes (:mod:`vitcg.runtime.syncs`) are for the model's eager code: inside a compiled call dynamo would trace
    them, or they would judge its calling machinery (with dynamic shapes it passes ints to the graph through
    ``torch.as_tensor``). On CUDA the capture itself still refuses whatever a graph cannot hold."""
    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch._C.DisableTorchFunction(), torch._dynamo.config.patch(**{name: RECOMPILE_LIMIT}):
            return compiled(*args, **kwargs)
    return forward


@contextlib.contextmanager
def compiled_blocks(compiled: Mapping[nn.Module, Callable[..., Any]]) -> Iterator[None]:
    """Inside the block, each module of ``compiled`` runs its compiled forward (an instance attribute, removed
    or restored on exit, so the class and the eager path are untouched)."""
    saved = {block: vars(block).get("forward") for block in compiled}
    for block, forward in compiled.items():
        block.forward = forward
    try:
        yield
    finally:
        for block, previous in saved.items():
            if previous is None:
                vars(block).pop("forward", None)
            else:
                block.forward = previous
