"""Blocks compiled ahead of time (:class:`vitcg.runtime.regions.AheadOfTime`) and their persistent store
(``KEY.aot`` in :mod:`vitcg.runtime.compile_cache`): a loaded function serves its calls without dynamo tracing
anything, every call's output equals the block's own forward, and a stored file is handed to torch only when vitcg
can vouch for it. dynamo's eager backend keeps these fast; tests/gpu/test_regions_gpu.py runs inductor on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from vitcg.runtime import compile_cache, regions


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: float = 1.0, extra: object = None) -> torch.Tensor:
        return torch.relu(self.linear(x)) * scale


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x: torch.Tensor, scale: float = 0.5, extra: object = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, scale=scale, extra=extra)
        return x


def _run(tower: Tower, ahead: regions.AheadOfTime, *inputs: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    with regions.compiled_blocks(regions.compile_blocks(regions.repeated_blocks(tower), ahead=ahead)), \
            torch.no_grad():
        return [tower(x, **kwargs) for x in inputs]


def _expected(tower: Tower, *inputs: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    with torch.no_grad():
        return [tower(x, **kwargs) for x in inputs]


def test_one_function_per_signature_serves_every_block_and_loads_without_tracing(eager_backend):
    torch.manual_seed(0)
    tower = Tower().eval()
    inputs = (torch.randn(5, 8), torch.randn(9, 8), torch.randn(5, 8))
    expected = _expected(tower, *inputs)
    ahead = regions.AheadOfTime()
    for got, want in zip(_run(tower, ahead, *inputs), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert ahead.disabled is None and ahead.compiled == 2 and len(ahead.blobs) == 2 and ahead.fallbacks == 0

    traced = counters["stats"]["unique_graphs"]
    loaded = regions.AheadOfTime()
    loaded.load(ahead.blobs)
    for got, want in zip(_run(tower, loaded, *inputs), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert loaded.compiled == 0 and loaded.fallbacks == 0 and len(loaded.load_seconds) == 2
    assert counters["stats"]["unique_graphs"] == traced  # nothing traced again


def _run_any_shape(tower: Tower, ahead: regions.AheadOfTime, *inputs: torch.Tensor) -> list[torch.Tensor]:
    blocks = regions.compile_blocks(regions.repeated_blocks(tower), dynamic=True, ahead=ahead)
    with regions.compiled_blocks(blocks), torch.no_grad():
        return [tower(x) for x in inputs]


def test_functions_with_dynamic_shapes_serve_every_size_and_load_without_tracing(eager_backend):
    """The eager forward's functions (``dynamic``): one serves calls of 5, 9 and 300 rows; a call of one row, which
    dynamo specializes, gets a second function under the same signature; stored and loaded, they serve the same
    calls without compiling or tracing anything."""
    torch.manual_seed(0)
    tower = Tower().eval()
    inputs = (torch.randn(5, 8), torch.randn(9, 8), torch.randn(300, 8), torch.randn(1, 8))
    expected = _expected(tower, *inputs)
    ahead = regions.AheadOfTime(dynamic=True)
    for got, want in zip(_run_any_shape(tower, ahead, *inputs[:3]), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert ahead.disabled is None and ahead.compiled == 1 and len(ahead.blobs) == 1 and ahead.fallbacks == 0
    (got,) = _run_any_shape(tower, ahead, inputs[3])
    torch.testing.assert_close(got, expected[3], rtol=1e-5, atol=1e-6)
    assert ahead.compiled == 2 and len(ahead.blobs) == 2 and ahead.fallbacks == 0

    traced = counters["stats"]["unique_graphs"]
    loaded = regions.AheadOfTime(dynamic=True)
    loaded.load(ahead.blobs)
    for got, want in zip(_run_any_shape(tower, loaded, *inputs), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert loaded.compiled == 0 and loaded.fallbacks == 0
    assert counters["stats"]["unique_graphs"] == traced


def test_calls_it_cannot_describe_or_compile_fall_back_to_the_plain_compilation(eager_backend):
    torch.manual_seed(0)
    tower = Tower().eval()
    x = torch.randn(5, 8)
    ahead = regions.AheadOfTime()
    (got,) = _run(tower, ahead, x, extra=object())  # an argument of a kind no signature describes
    torch.testing.assert_close(got, _expected(tower, x)[0])
    assert ahead.compiled == 0 and not ahead.blobs and ahead.fallbacks == 3

    class Breaking:  # what a block dynamo cannot trace as one graph does to aot_compile
        @staticmethod
        def aot_compile(inputs):
            raise RuntimeError("graph break in the block")
    failing = regions.AheadOfTime()
    failing._compiler = Breaking()
    (got,) = _run(tower, failing, x)
    torch.testing.assert_close(got, _expected(tower, x)[0])
    assert failing.disabled == "RuntimeError: graph break in the block" and failing.fallbacks == 3


def test_signatures_tell_shapes_dtypes_values_and_block_classes_apart():
    block, x = Block(), torch.randn(4, 8)
    base = regions.call_signature(block, (x,), {"scale": 0.5})
    assert base == regions.call_signature(Block(), (torch.randn(4, 8),), {"scale": 0.5})  # values do not matter
    others = [regions.call_signature(block, (torch.randn(5, 8),), {"scale": 0.5}),
              regions.call_signature(block, (x.double(),), {"scale": 0.5}),
              regions.call_signature(block, (x.t().contiguous().t(),), {"scale": 0.5}),
              regions.call_signature(block, (x,), {"scale": 0.25}),
              regions.call_signature(block, (x,), {"scale": 0.5, "extra": None}),
              regions.call_signature(Tower(), (x,), {"scale": 0.5})]
    assert len({base, *others}) == 1 + len(others)
    assert regions.call_signature(block, (x,), {"extra": object()}) is None
    assert regions.call_signature(block, (torch.randn(7, 8),), {"scale": 0.5}, sizes=False) == \
        regions.call_signature(block, (x,), {"scale": 0.5}, sizes=False) != \
        regions.call_signature(block, (torch.randn(7, 8, 1),), {"scale": 0.5}, sizes=False)
    windowed = Block()
    windowed.window = 4  # a plain attribute the traced graph may be specialized on
    wider = Block()
    wider.linear = nn.Linear(8, 8, bias=False)
    evaluated = Block().eval()
    assert len({base, *(regions.call_signature(b, (x,), {"scale": 0.5}) for b in (windowed, wider, evaluated))}) == 4


def _stored(tmp_path, monkeypatch) -> tuple[regions.AheadOfTime, str, object]:
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    tower = Tower().eval()
    ahead = regions.AheadOfTime()
    _run(tower, ahead, torch.randn(5, 8))
    path = tmp_path / "compile" / "k.aot"
    assert compile_cache._store_ahead(path, "k", ahead) > 0
    return ahead, path, tower


def test_a_stored_file_round_trips_and_a_changed_one_is_never_unpickled(eager_backend, tmp_path, monkeypatch):
    ahead, path, tower = _stored(tmp_path, monkeypatch)
    loaded = regions.AheadOfTime()
    assert compile_cache._load_ahead(path, "k", loaded) == (True, None) and loaded.blobs == ahead.blobs
    assert compile_cache._load_ahead(tmp_path / "compile" / "other.aot", "other", regions.AheadOfTime()) == \
        (False, None)  # no file

    def refuse(*args, **kwargs):
        raise AssertionError("torch was handed a file vitcg cannot vouch for")
    monkeypatch.setattr(torch.compiler, "load_compiled_function", refuse)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    changed = regions.AheadOfTime()
    with pytest.warns(UserWarning, match="fails its integrity check"):
        loaded_changed, why = compile_cache._load_ahead(path, "k", changed)
        assert not loaded_changed and "integrity" in str(why) and why.replace
    assert not changed.blobs
    with pytest.warns(UserWarning, match="fails its integrity check"):  # another key's tag does not fit either
        assert compile_cache._load_ahead(path, "other-key", regions.AheadOfTime())[1]


@pytest.mark.parametrize("payload", [
    b"", b"vitcgcc1 not this layout", compile_cache.AOT_MAGIC + b'{"functions": [["s", 5]]}\nabc',
    compile_cache.AOT_MAGIC + b'{"functions": [["s", -1]]}\n', compile_cache.AOT_MAGIC + b"[1, 2]\n",
    compile_cache.AOT_MAGIC + b'{"functions": [["s", 3]]}'])
def test_a_payload_whose_index_does_not_match_is_refused(payload):
    with pytest.raises(compile_cache.UntrustedCacheFile):
        compile_cache.aot_index(payload)
    assert compile_cache.aot_index(compile_cache._aot_payload({"a": b"xyz", "b": b""})) == [("a", 3), ("b", 0)]


def test_output_capturing_hooks_inside_a_block_are_left_out_of_its_compiled_call(eager_backend):
    """transformers hooks the modules whose outputs ``output_attentions`` collects with a function that reads a
    ContextVar, which dynamo cannot trace in one graph (InternVL's attention): the compiled call leaves such
    hooks out, and they are back on their modules, in order, after it; the block's own hooks still run."""
    from contextvars import ContextVar

    collector: ContextVar = ContextVar("collector", default=None)

    def output_capturing_hook(module, args, output):  # transformers' name, and what it reads
        collected = collector.get()
        if collected is not None:
            collected.append(output)

    def other_hook(module, args, output):
        return None

    torch.manual_seed(0)
    tower = Tower().eval()
    for block in tower.blocks:
        block.linear.register_forward_hook(output_capturing_hook)
        block.linear.register_forward_hook(other_hook)
    own = []
    tower.blocks[0].register_forward_hook(lambda module, args, output: own.append(output.shape))
    before = [list(block.linear._forward_hooks.values()) for block in tower.blocks]
    x = torch.randn(5, 8)
    expected = _expected(tower, x)[0]
    own.clear()
    ahead = regions.AheadOfTime()
    (got,) = _run(tower, ahead, x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert ahead.disabled is None and ahead.compiled == 1 and ahead.fallbacks == 0
    assert own == [torch.Size([5, 8])]
    assert [list(block.linear._forward_hooks.values()) for block in tower.blocks] == before
    collected: list = []
    token = collector.set(collected)
    try:
        _expected(tower, x)  # the eager path still collects
    finally:
        collector.reset(token)
    assert len(collected) == 3
