"""Regional compilation (``compile_forward``): the repeated blocks are found, compiled once for all of them, used
only while the graph path runs, and the graph path still matches eager. Dynamo runs with its ``eager`` backend
here (the tracing and caching are what is tested; inductor's kernels are timed on the GPU)."""


import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from support.specs import packaged
from vitcg.runtime import adapter as adapter_module
from vitcg.runtime import regions
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.tools import encoders
from vitcg.tools.workloads import WORKLOADS, make_inputs


class Block(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.inner = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) + self.inner[1](self.inner[0](x))


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.heads = nn.ModuleList([nn.Linear(8, 8), nn.LayerNorm(8)])  # two classes: no stack
        self.single = nn.ModuleList([nn.Linear(8, 8)])  # one child: no stack

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_repeated_blocks_are_the_same_class_stacks_outermost_first():
    tower = Tower()
    assert regions.repeated_blocks(tower) == list(tower.blocks)  # not the lists inside a block, nor heads
    assert regions.repeated_blocks(tower.blocks[0]) == list(tower.blocks[0].inner)  # a block alone: its own list
    assert regions.repeated_blocks(tower.blocks) == list(tower.blocks)  # the stack itself as root


def test_compiled_blocks_are_patched_in_for_the_block_only():
    tower = Tower()
    marker = tower.blocks[1].forward
    tower.blocks[1].forward = marker  # an instance attribute of its own, restored on exit
    compiled = {block: (lambda x, i=i: x + i) for i, block in enumerate(tower.blocks)}
    with regions.compiled_blocks(compiled):
        assert torch.equal(tower(torch.zeros(2, 8)), torch.full((2, 8), 3.0))
    assert "forward" not in vars(tower.blocks[0]) and vars(tower.blocks[1])["forward"] is marker
    with pytest.raises(RuntimeError), regions.compiled_blocks(compiled):
        raise RuntimeError  # restored on errors too
    assert "forward" not in vars(tower.blocks[2])


def test_a_block_with_a_forward_of_its_own_is_not_compiled(eager_backend):
    """A hook that wraps one instance's forward (accelerate's device hooks do) must keep running."""
    tower = Tower().eval()
    calls = []
    original = tower.blocks[1].forward
    tower.blocks[1].forward = lambda x: calls.append(1) or original(x)
    compiled = regions.compile_blocks(regions.repeated_blocks(tower))
    assert set(compiled) == {tower.blocks[0], tower.blocks[2]}
    with regions.compiled_blocks(compiled), torch.no_grad():
        tower(torch.randn(5, 8))
    assert calls == [1]


def test_one_compilation_serves_every_block(eager_backend):
    """Under no_grad, as the graph path runs (with grad on, block 0's input differs from the others')."""
    tower = Tower().eval()
    x = torch.randn(5, 8)
    expected = tower(x)
    with regions.compiled_blocks(regions.compile_blocks(regions.repeated_blocks(tower))), torch.no_grad():
        got = tower(x)
        assert counters["stats"]["unique_graphs"] == 1  # three blocks, one graph
        tower(torch.randn(9, 8))  # another budget: static shapes compile once more, for all blocks
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 2


def _manager(spec_name: str, **config):
    spec = packaged().get(spec_name)
    config_obj = encoders.build_config(spec, "tiny")
    for key, value in config.items():
        setattr(config_obj, key, value)
    torch.manual_seed(0)
    module = encoders.import_object(spec.encoder.class_path)(config_obj).eval()
    adapter = adapter_for(spec, module, compile_forward=True)
    return adapter, EncoderCudaGraphManager(adapter, device="cpu", dtype=torch.float32)


def _run(spec_name: str, depth_key: str, depth: int, stack: str, **config) -> int:
    """Execute two workloads through a ``compile_forward`` manager with ``depth`` blocks, checking each call
    against eager; returns how many dynamo graphs the compiled blocks needed."""
    torch._dynamo.reset()
    counters.clear()
    adapter, manager = _manager(spec_name, **{depth_key: depth}, **config)
    layers = list(adapter.module.get_submodule(stack))
    assert len(layers) == depth and set(adapter._blocks) == set(layers)
    assert not adapter._compiled  # the whole forward is not compiled when blocks are
    manager.capture()
    for workload in ("1x224", "mixed"):
        inputs = make_inputs(adapter, WORKLOADS[workload], torch.Generator().manual_seed(1))
        got = manager.execute(inputs)
        assert counters["stats"]["unique_graphs"] >= 1  # the compiled blocks ran
        assert all("forward" not in vars(layer) for layer in layers)
        graphs = counters["stats"]["unique_graphs"]
        reference = adapter.encoder_eager_forward(inputs)
        assert counters["stats"]["unique_graphs"] == graphs  # eager compiled nothing
        torch.testing.assert_close(torch.cat(got), reference, rtol=1e-5, atol=1e-5)
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize(("name", "depth_key", "stack", "config"), [
    ("qwen2_vl", "depth", "blocks", {}),
    ("pixtral", "num_hidden_layers", "transformer.layers", {}),
    # the merger right after layer 0: two and four layers both see two token counts
    ("minicpmv4_6", "num_hidden_layers", "encoder.layers", {"insert_layer_id": 0})])
def test_compile_forward_compiles_the_blocks_and_matches_eager(eager_backend, name, depth_key, stack, config):
    """A whole-tower spec, a graph-scoped layer stack, and MiniCPM-V (a window merger between its layers, which
    formats a tensor into text on every call: the text mode stays on around the compiled blocks): per-item
    outputs equal to eager (float32, 1e-5 relative), the eager path left on the model's own forwards (the
    reference must not run the compiled blocks), and as many dynamo graphs for four blocks as for two: one
    compilation serves every block."""
    assert _run(name, depth_key, 4, stack, **config) == _run(name, depth_key, 2, stack, **config)


@pytest.mark.parametrize("name", ["qwen2_vl", "pixtral"])
def test_drop_compiled_returns_the_graph_path_to_the_models_own_blocks(eager_backend, name):
    """After a compiled forward failed, the plugin drops the compiled blocks (``drop_compiled``): a whole-tower
    spec and a graph-scoped one then capture and replay the model's own blocks (no dynamo graph), equal to eager
    (float32, 1e-5 relative)."""
    torch._dynamo.reset()
    counters.clear()
    adapter, manager = _manager(name)
    assert adapter.compiles
    adapter.drop_compiled()
    assert not adapter.compiles and adapter.ahead is None
    manager.capture()
    inputs = make_inputs(adapter, WORKLOADS["mixed"], torch.Generator().manual_seed(2))
    got = manager.execute(inputs)
    assert counters["stats"]["unique_graphs"] == 0
    torch.testing.assert_close(torch.cat(got), adapter.encoder_eager_forward(inputs), rtol=1e-5, atol=1e-5)


def test_an_encoder_without_repeated_blocks_compiles_its_whole_forward(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled.append(kwargs) or fn)
    monkeypatch.setattr(adapter_module, "repeated_blocks", lambda root: [])
    spec = packaged().get("qwen2_vl")
    adapter = adapter_for(spec, encoders.build_encoder(spec, "tiny"), compile_forward=True)
    assert adapter._compiled and not adapter._blocks and compiled == [{"dynamic": True}]


def test_compiled_blocks_leave_the_model_classes_code_uncompiled(eager_backend):
    """Dynamo caches compilations on code objects, and transformers wraps every layer's forward in one shared
    function: vitcg's compilations sit on its own function, so a user's torch.compile of other layers keeps
    its whole recompile budget."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    tower = Tower().eval()
    with regions.compiled_blocks(regions.compile_blocks(regions.repeated_blocks(tower))), torch.no_grad():
        tower(torch.randn(5, 8))
    assert len(_debug_get_cache_entry_list(regions._run_block.__code__)) == 1
    assert _debug_get_cache_entry_list(Block.forward.__code__) == []


def _eager_adapters(name: str = "qwen2_vl"):
    """A ``compile_eager`` adapter and a plain one on the same tiny encoder (the plain one is the reference)."""
    spec = packaged().get(name)
    module = encoders.build_encoder(spec, "tiny")
    return adapter_for(spec, module, compile_eager=True), adapter_for(spec, module)


def test_compile_eager_runs_blocks_compiled_for_any_shape_and_matches_the_models_own(eager_backend):
    """Calls routed away from the graphs run the repeated blocks through compilations with dynamic shapes: after
    the first call of several items, calls of other token and item counts (the mixed batch's eight sizes, eight
    224 px images, two images and a video) compile nothing more, and each equals the model's own forward
    (float32, 1e-5 relative); the blocks are the model's own again after each call."""
    compiled, plain = _eager_adapters()
    layers = list(compiled.module.blocks)
    assert compiled.eager_compiled and set(compiled._eager_blocks) == set(layers)
    graphs = []
    for workload in ("mixed", "8x224", "image+video"):
        inputs = make_inputs(compiled, WORKLOADS[workload], torch.Generator().manual_seed(2))
        got = compiled.encoder_eager_forward(inputs)
        graphs.append(counters["stats"]["unique_graphs"])
        assert all("forward" not in vars(layer) for layer in layers)
        torch.testing.assert_close(got, plain.encoder_eager_forward(inputs), rtol=1e-5, atol=1e-5)
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3, graphs
    assert compiled.eager_compiled


def test_compile_eager_falls_back_to_the_models_blocks_with_one_warning(eager_backend):
    """A compiled block that fails (a compiler error) costs one warning: that call and every later one run the
    model's own blocks, and their rows are the model's."""
    compiled, plain = _eager_adapters()

    def broken(*args, **kwargs):
        raise RuntimeError("inductor failed")
    compiled._eager_blocks = dict.fromkeys(compiled._eager_blocks, broken)
    inputs = make_inputs(compiled, WORKLOADS["1x224"], torch.Generator().manual_seed(3))
    with pytest.warns(RuntimeWarning, match="compiled blocks failed .RuntimeError: inductor failed"):
        got = compiled.encoder_eager_forward(inputs)
    assert not compiled.eager_compiled
    torch.testing.assert_close(got, plain.encoder_eager_forward(inputs), rtol=1e-5, atol=1e-5)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled.encoder_eager_forward(inputs)


def test_compile_eager_keeps_its_blocks_when_the_models_own_forward_fails_too(eager_backend):
    """An input the model itself refuses is the input's fault, not the compiler's: the model's error is raised,
    and the compiled blocks stay on for the next call."""
    compiled, _ = _eager_adapters()

    def refuses(**kwargs):
        raise ValueError("the model refuses this input")
    compiled._call = refuses
    inputs = make_inputs(compiled, WORKLOADS["1x224"], torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="the model refuses"):
        compiled.encoder_eager_forward(inputs)
    assert compiled.eager_compiled


def test_compile_eager_functions_are_stored_at_the_first_eager_call_and_loaded_by_a_later_process(
        eager_backend, tmp_path, monkeypatch):
    """The eager side's functions (dynamic shapes) are compiled at the first eager call, not at capture, and stored
    beside the graphs' (``KEY.eager.aot``); a later adapter loads them at capture and its eager calls compile
    nothing, with the model's own rows (float32, 1e-5)."""
    from vitcg.runtime.compile_cache import capture_compiled

    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path))
    spec = packaged().get("qwen2_vl")
    module = encoders.build_encoder(spec, "tiny")
    inputs = make_inputs(adapter_for(spec, module), WORKLOADS["8x224"], torch.Generator().manual_seed(5))
    want = adapter_for(spec, module).encoder_eager_forward(inputs)

    def captured():
        adapter = adapter_for(spec, module, compile_forward=True, compile_eager=True)
        manager = EncoderCudaGraphManager(adapter, device="cpu", dtype=torch.float32, token_budgets=[256, 1024])
        capture_compiled(manager, spec)
        return adapter
    first = captured()
    assert first.eager_ahead.compiled == 0 and not list(tmp_path.rglob("*.eager.aot"))
    torch.testing.assert_close(first.encoder_eager_forward(inputs), want, rtol=1e-5, atol=1e-5)
    assert first.eager_ahead.compiled >= 1 and len(list(tmp_path.rglob("*.eager.aot"))) == 1

    torch._dynamo.reset()
    later = captured()
    assert later.eager_ahead.blobs.keys() == first.eager_ahead.blobs.keys()
    torch.testing.assert_close(later.encoder_eager_forward(inputs), want, rtol=1e-5, atol=1e-5)
    assert later.eager_ahead.compiled == 0 and later.eager_ahead.fallbacks == 0 and later.eager_compiled
