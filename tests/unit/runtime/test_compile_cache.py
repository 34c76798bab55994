"""The persistent compile cache: its key follows what compiled kernels depend on, its file round-trips through
torch.compiler's artifact functions (a double here: compiling takes minutes; the GPU run times the real thing), and a
corrupt file is replaced, never fatal. What the cache refuses to trust: test_compile_cache_trust.py."""

import warnings

import pytest
import torch
from torch.utils._appending_byte_serializer import BytesWriter

from support.specs import packaged, spec_text
from vitcg.lang import SpecSource
from vitcg.runtime import compile_cache
from vitcg.runtime.compile_cache import compile_key, persistent_compile_cache


def container(content: bytes) -> bytes:
    """One inductor artifact in torch's own artifact container, written with torch's writer."""
    writer = BytesWriter()
    writer.write_uint64(1)
    writer.write_str("inductor")
    writer.write_uint64(1)
    writer.write_str("fkernelkey")
    writer.write_bytes(content)
    return writer.to_bytes()


KERNELS = container(b"kernels-v1")


@pytest.fixture
def artifacts(monkeypatch):
    """A test double of torch.compiler's save/load, recorded: ``saved`` is what a compile would have produced."""
    calls = {"loaded": [], "saved": KERNELS, "fail": None}

    def load(data):
        if calls["fail"]:
            raise RuntimeError(calls["fail"])
        calls["loaded"].append(data)
        return object()  # torch returns a CacheInfo, or None when it cannot read the artifacts

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (calls["saved"], None) if calls["saved"] else None)
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", load)
    return calls


def test_the_key_follows_spec_shapes_dtype_and_file(repo, tmp_path):
    registry = packaged()
    spec = registry.get("qwen2_vl")
    key = compile_key(spec, torch.device("cpu"), torch.float32, budgets=[64, 128])
    assert key == compile_key(spec, torch.device("cpu"), torch.float32, budgets=[64, 128])
    assert key != compile_key(spec, torch.device("cpu"), torch.bfloat16, budgets=[64, 128])
    assert key != compile_key(spec, torch.device("cpu"), torch.float32, budgets=[64, 256])
    assert key != compile_key(registry.get("qwen2_5_vl"), torch.device("cpu"), torch.float32, budgets=[64, 128])
    copy = tmp_path / "qwen2_vl.yaml"
    copy.write_text(spec_text("qwen2_vl").replace("\nbuffers:\n", "\nbudget: {min: 128}\n\nbuffers:\n"))
    edited = SpecSource([copy]).get("qwen2_vl")
    assert compile_key(edited, torch.device("cpu"), torch.float32, budgets=[64, 128]) != key


def test_a_second_start_loads_what_the_first_stored(artifacts, tmp_path):
    with persistent_compile_cache("k1", tmp_path) as first:
        pass
    assert not first.loaded and first.saved_bytes == len(KERNELS)
    assert (tmp_path / "compile" / "k1.bin").read_bytes().endswith(KERNELS)
    with persistent_compile_cache("k1", tmp_path) as second:
        pass
    assert second.loaded and artifacts["loaded"] == [KERNELS] and second.saved_bytes == 0
    with persistent_compile_cache("k2", tmp_path) as other:  # another key starts cold
        pass
    assert not other.loaded and len(artifacts["loaded"]) == 1
    assert sorted(p.name for p in (tmp_path / "compile").iterdir()) == ["k1.bin", "k2.bin", "key"]  # no partial files


def test_a_corrupt_file_is_ignored_and_replaced(artifacts, tmp_path):
    (tmp_path / "compile").mkdir(mode=0o700)
    (tmp_path / "compile" / "k.bin").write_bytes(b"garbage")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with persistent_compile_cache("k", tmp_path) as use:
            pass
    assert not use.loaded and artifacts["loaded"] == []
    assert any("not one vitcg wrote" in str(w.message) for w in caught)
    assert (tmp_path / "compile" / "k.bin").read_bytes().endswith(KERNELS)


def test_a_file_torch_cannot_load_is_ignored_and_replaced(artifacts, tmp_path):
    with persistent_compile_cache("k", tmp_path):
        pass
    artifacts["fail"], artifacts["saved"] = "bad magic", container(b"kernels-v2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with persistent_compile_cache("k", tmp_path) as use:
            pass
    assert not use.loaded and any("bad magic" in str(w.message) for w in caught)
    assert (tmp_path / "compile" / "k.bin").read_bytes().endswith(container(b"kernels-v2"))


def test_nothing_compiled_writes_nothing(artifacts, tmp_path):
    artifacts["saved"] = None
    with persistent_compile_cache("k", tmp_path) as use:
        pass
    assert use.saved_bytes == 0 and not (tmp_path / "compile").exists()


def test_the_cache_folder_follows_vitcg_cache_dir(artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("VITCG_CACHE_DIR", str(tmp_path / "elsewhere"))
    with persistent_compile_cache("k") as use:
        pass
    assert use.path == tmp_path / "elsewhere" / "compile" / "k.bin" and use.path.exists()
    assert compile_cache.cache_root() == tmp_path / "elsewhere"
