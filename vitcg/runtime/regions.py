"""Regional compilation: inductor kernels for an encoder's repeated blocks, compiled once for all of them.

A ViT is a stack of identical blocks. Compiling the whole fixed-shape forward makes dynamo trace every block
again and inductor generate (or, from a cache, reload) kernels for each; on qwen2_vl's 32 blocks that took
60-90 s at every process start. Here every block runs through one compiled function that takes the block as an
input (its weights are graph inputs), so dynamo traces one block per budget and every block reuses that graph.
Compiled ahead of time (:class:`AheadOfTime`) and stored, those functions load in a later process without a trace:
on an H100, qwen2_vl's 8 budgets compile and capture in 19 s from nothing and in 3.0 s from the cache (4.1 s where
torch's modules have no bytecode). Inside a CUDA graph the parts left eager (patch embedding, rotary tables, merger)
cost no launch overhead; they lose only the fusion across their few ops.

The compiled forwards are used only while the graph path runs (:func:`compiled_blocks` patches them in for the
call), and on an adapter's compiled eager side (``compile_eager``: functions with dynamic shapes); the eager path
of every check's reference keeps the model's own forwards.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from . import ops  # noqa: F401  (the custom ops stored block functions call, registered before one is loaded)

log = logging.getLogger(__name__)


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


def _run_block_any_shape(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """:func:`_run_block` for the compilation with dynamic shapes (the eager forward's): a code object of its own,
    so its compilations never count against the budgets' recompile limit, nor theirs against it."""
    return type(block).forward(block, *args, **kwargs)


def compile_blocks(blocks: list[nn.Module], *, dynamic: bool = False,
                   ahead: AheadOfTime | None = None) -> dict[nn.Module, Callable[..., Any]]:
    """Each block's forward through one ``torch.compile`` of :func:`_run_block` (the block is an input, its
    weights graph inputs, so the first block's compilation serves the rest). Static shapes by default: each
    budget gets kernels for its own token count, and integer arguments stay constants (with ``dynamic=True``
    they become symbolic inputs, which inductor 2.11 fails to compile for Qwen2.5-VL's and Pixtral's blocks on
    CUDA). With ``ahead``, each distinct call is compiled ahead of time instead (:class:`AheadOfTime`), and the
    plain compilation serves only the calls it cannot. A block whose instance carries a forward of its own (a
    hook that wraps it, as accelerate's device hooks do) is left out: its class's forward would skip the
    wrapper."""
    blocks = [block for block in blocks if "forward" not in vars(block)]
    if not blocks:
        return {}
    run = _run_block_any_shape if dynamic else _run_block

    def make() -> Callable[..., Any]:  # at the first call that needs it: this imports inductor's compiler (~1 s)
        return _calling(torch.compile(run, dynamic=dynamic), per_budget=not dynamic)
    compiled = _lazily(make) if ahead is None else functools.partial(ahead, _lazily(make))
    return {block: functools.partial(_without_capturing_hooks, compiled, block) for block in blocks}


def _lazily(make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """A function that calls ``make()``'s result, made at its first call."""
    made: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not made:
            made.append(make())
        return made[0](*args, **kwargs)
    return call


def call_signature(block: nn.Module, args: tuple, kwargs: Mapping[str, Any], *, sizes: bool = True) -> str | None:
    """What a compiled block function is specialized on: the block's class and structure (see
    :func:`_structure`), each tensor argument's shape, strides, dtype and device, and every other argument's value
    (without ``sizes``, for a function compiled with dynamic shapes: a tensor's count of dimensions instead of its
    shape and strides, and no integer's value). None when an argument is of a kind this cannot describe (its
    compilation is then not stored)."""
    def describe(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            shape = f"{tuple(value.shape)}{value.stride()}" if sizes else f"{value.dim()}d"
            return f"T{shape}{value.dtype}:{value.device.type}{'g' if value.requires_grad else ''}"
        if isinstance(value, (tuple, list)):
            return f"{type(value).__name__}(" + ",".join(describe(v) for v in value) + ")"
        if isinstance(value, dict):
            return "{" + ",".join(f"{k!r}:{describe(v)}" for k, v in sorted(value.items(), key=lambda item: str(item[0]))) + "}"
        if type(value) is int and not sizes:  # a symbolic size to dynamo: the functions' guards judge it
            return "int"
        if value is None or type(value) in (bool, int, float, str):
            return repr(value)
        raise TypeError(type(value).__name__)
    try:
        parts = [describe(args), describe(dict(kwargs))]
    except TypeError:
        return None
    return f"{type(block).__module__}.{type(block).__qualname__}:{_structure(block)}:" + ";".join(parts)


def _structure(block: nn.Module) -> str:
    """A digest of what else a block's traced graph may be specialized on: each submodule's class and plain
    attribute values (mode, a window size, a layer type), each parameter's and buffer's shape, dtype and device.
    Blocks of one class that differ there (a window block beside a full-attention one) get functions of their own;
    the functions' guards would refuse the wrong one anyway, but not every guard survives serialization."""
    parts = []
    for name, module in block.named_modules():
        plain = sorted((k, v) for k, v in vars(module).items()
                       if not k.startswith("_") and (v is None or type(v) in (bool, int, float, str)))
        parts.append(f"{name}={type(module).__module__}.{type(module).__qualname__}{plain}")
    for name, tensor in (*block.named_parameters(), *block.named_buffers()):
        parts.append(f"{name}:{tuple(tensor.shape)}{tensor.dtype}:{tensor.device.type}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


VARIANTS = 4
"""Functions one signature may hold when compiled with dynamic shapes (:class:`AheadOfTime`); calls their guards
all refuse run the plain compilation."""


class AheadOfTime:
    """Block functions compiled ahead of time (``torch.compile(...).aot_compile``), one per call signature
    (:func:`call_signature`), which serialize to bytes and load in a later process without dynamo tracing
    anything: a warm start then costs loading them, not a trace and a cache lookup per budget.

    Called as ``ahead(fallback, block, *args, **kwargs)``: a stored or loaded function for the call's signature
    runs it (its own guards checked first); a new signature is compiled ahead of time and kept in :attr:`blobs`
    (for the persistent cache, :mod:`vitcg.runtime.compile_cache`). Where that cannot be done (a torch without
    ``aot_compile``, a block dynamo cannot trace in one graph, an argument of an unknown kind), ``fallback`` (the
    plain compiled function) runs, and :attr:`disabled` says why once a compilation failed.

    ``dynamic``: the functions are compiled with dynamic shapes (the eager forward's blocks, any token count), their
    signatures name no sizes, and a signature holds up to :data:`VARIANTS` functions: a call whose sizes the
    functions' guards refuse (dynamo specializes on sizes 0 and 1: a call of one item) gets one of its own."""

    def __init__(self, dynamic: bool = False) -> None:
        self.dynamic = dynamic
        self.blobs: dict[str, bytes] = {}
        """Serialized functions by call signature: those loaded, and those compiled in this process."""
        self.compiled = 0
        """Functions compiled (not loaded) in this process."""
        self.fallbacks = 0
        """Calls the plain compilation served (no function of their signature, or its guards failed)."""
        self.disabled: str | None = None
        self.load_seconds: list[float] = []
        """Seconds each deserialization took, in order (the first holds the imports it triggers)."""
        self._functions: dict[str, Callable[..., Any]] = {}
        self._compiler: Any = None

    def __reduce__(self) -> tuple[type, tuple]:
        """An empty store: dynamo pickles the state of a block it compiles, which reaches this object through the
        block's patched-in forward; the compiled functions (and their guards) are not part of that state."""
        return AheadOfTime, (self.dynamic,)

    def load(self, blobs: Mapping[str, bytes]) -> None:
        """Serialized functions (from a file vitcg vouched for) to use for their signatures; each is
        deserialized when a call first needs it."""
        self.blobs.update(blobs)

    def __call__(self, fallback: Callable[..., Any], block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # compiled, guarded and called with torch function modes off, as the plain compilation is (_calling)
        with torch._C.DisableTorchFunction():
            function = None if self.disabled else self._function(block, args, kwargs)
            if function is not None:
                return function(block, *args, **kwargs)
        self.fallbacks += 1
        return fallback(block, *args, **kwargs)

    def _function(self, block: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Callable[..., Any] | None:
        signature = call_signature(block, args, kwargs, sizes=not self.dynamic)
        if signature is None:
            return None
        for key in [signature, *(f"{signature}#{n}" for n in range(1, VARIANTS if self.dynamic else 1))]:
            function = self._functions.get(key)
            if function is None and key in self.blobs:
                function = self._deserialize(key)
            if function is None:  # the signature's functions so far all refused this call: compile one for it
                function = self._compile(key, block, args, kwargs)
                return function if function is not None and function.guard_check(block, *args, **kwargs) else None
            if function.guard_check(block, *args, **kwargs):
                return function
        return None

    def _deserialize(self, signature: str) -> Callable[..., Any] | None:
        start = time.perf_counter()
        try:
            function = torch.compiler.load_compiled_function(io.BytesIO(self.blobs[signature]),
                                                             f_globals=_run_block.__globals__)
        except Exception as exc:  # another torch build's bytes: compile this signature again
            log.warning("vitcg: a stored block function could not be loaded (%s: %s); compiling it again",
                        type(exc).__name__, str(exc)[:200])
            del self.blobs[signature]
            return None
        self._functions[signature] = function
        self.load_seconds.append(time.perf_counter() - start)
        return function

    def _compile(self, signature: str, block: nn.Module, args: tuple,
                 kwargs: Mapping[str, Any]) -> Callable[..., Any] | None:
        # with dynamic shapes dynamo turns float arguments into tensors by restarting its analysis, which aot_compile
        # does not survive (TensorifyScalarRestartAnalysis, torch 2.11 on CUDA): floats stay guarded constants there
        floats = {"specialize_float": True} if self.dynamic and hasattr(torch._dynamo.config, "specialize_float") \
            else {}
        if self._compiler is None:
            # torch 2.11 gives the compiled function its aot_compile only under this flag; later releases always
            aot = {"enable_aot_compile": True} if hasattr(torch._dynamo.config, "enable_aot_compile") else {}
            with torch._dynamo.config.patch(**aot, **floats):
                self._compiler = torch.compile(_run_block_any_shape if self.dynamic else _run_block, fullgraph=True,
                                               dynamic=self.dynamic)
        try:
            with torch._dynamo.config.patch(**floats):
                function = self._compiler.aot_compile(((block, *args), dict(kwargs)))
            blob = type(function).serialize(function).serialized_data
        except Exception as exc:  # a graph break or an unserializable graph: the plain compilation serves
            self.disabled = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            log.info("vitcg: blocks of %s are not compiled ahead of time (%s)", type(block).__name__,
                     self.disabled)
            return None
        self._functions[signature], self.blobs[signature] = function, blob
        self.compiled += 1
        return function


def _calling(compiled: Callable[..., Any], *, per_budget: bool = True) -> Callable[..., Any]:
    """``compiled`` called with torch function modes off and, with ``per_budget``, room for a compilation per
    budget. vitcg's checking modes (:mod:`vitcg.runtime.syncs`) are for the model's eager code: inside a compiled
    call dynamo would trace them, or they would judge its calling machinery (with dynamic shapes it passes ints to
    the graph through ``torch.as_tensor``). On CUDA the capture itself still refuses whatever a graph cannot hold.
    Without ``per_budget`` (the eager forward's blocks, whose dynamic shapes need a few compilations in all) dynamo's
    own limit holds: patching its config costs more host time than a block's compiled call (~2 ms against ~0.1 ms
    on a busy 2-core machine), which a call outside a graph pays at every block."""
    if not per_budget:
        def plain(*args: Any, **kwargs: Any) -> Any:
            with torch._C.DisableTorchFunction():
                return compiled(*args, **kwargs)
        return plain
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


CAPTURING_HOOK = "output_capturing_hook"
"""The name of the forward hook transformers puts on the modules whose outputs ``output_attentions`` and friends
collect (``transformers.utils.output_capturing``, installed at a model's first call). It reads a ``ContextVar``,
which dynamo cannot trace: a block with one on a submodule (InternVL's attention) breaks its graph there."""


def _without_capturing_hooks(forward: Callable[..., Any], block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``forward(block, ...)`` with the output-capturing hooks of the block's submodules (not the block's own)
    left out for the call. A graph's outputs are the spec's, so the attention weights such a hook collects are
    never asked of it; the block's own hooks, which collect its hidden states, run around this call and stay."""
    saved = []
    for module in block.modules():
        capturing = [hook_id for hook_id, hook in module._forward_hooks.items()
                     if getattr(hook, "__name__", None) == CAPTURING_HOOK]
        if capturing and module is not block:
            saved.append((module, dict(module._forward_hooks)))
            for hook_id in capturing:
                del module._forward_hooks[hook_id]
    try:
        return forward(block, *args, **kwargs)
    finally:
        for module, hooks in saved:
            module._forward_hooks.clear()
            module._forward_hooks.update(hooks)
