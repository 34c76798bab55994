"""What the compile cache refuses to hand to torch (issue 27, item 1): a planted file never runs, a file vitcg cannot
vouch for is reported as not loaded, warned about once and replaced; a file vitcg wrote itself loads. What it never
writes (issue 37, item 1): nothing through a link it did not make, and no entry that is not a regular file or is over
its cap (vitcg never wrote it): such an entry is left alone and the cache is not used for that key.

Most tests use ``PicklingCompiler``, a test double of the load/save boundary only (``torch.compiler.load_cache_artifacts``
and ``save_cache_artifacts``): its load unpickles every artifact as torch does with inductor artifacts on CUDA
(``FxGraphCache._emit_triton_bundle``), so a payload that reaches it runs. The tests named ``real_torch`` hand files
to torch's own functions."""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import threading
import tracemalloc
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._appending_byte_serializer import BytesReader, BytesWriter

from vitcg.runtime import compile_cache
from vitcg.runtime.compile_cache import MAGIC, TAG_BYTES, persistent_compile_cache

KEY = "0123456789abcdef0123456789abcdef"


def container(*artifacts: tuple[str, str, bytes]) -> bytes:
    """``(kind, key, content)`` artifacts in torch's artifact container, written with torch's own writer."""
    writer = BytesWriter()
    writer.write_uint64(1)
    for kind, key, content in artifacts:
        writer.write_str(kind)
        writer.write_uint64(1)
        writer.write_str(key)
        writer.write_bytes(content)
    return writer.to_bytes()


class Payload:
    """Unpickling it creates ``marker``: what a planted artifact does in place of arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


class PicklingCompiler:
    """A test double of torch.compiler's load/save: ``save`` returns ``saved``; ``load`` unpickles a raw pickle or
    the content of every artifact in a container, as torch's inductor artifacts are unpickled on load."""

    def __init__(self):
        self.saved = container(("inductor", "fkernels", pickle.dumps({"kernels": 1})))
        self.loaded: list[bytes] = []

    def load(self, data: bytes):
        self.loaded.append(data)
        if data.startswith(b"\x80"):
            return pickle.loads(data)
        reader = BytesReader(data)
        reader.read_uint64()
        while not reader.is_finished():
            reader.read_str()
            for _ in range(reader.read_uint64()):
                reader.read_str()
                pickle.loads(reader.read_bytes())
        return object()  # torch returns a CacheInfo

    def save(self):
        return (self.saved, None) if self.saved else None


@pytest.fixture
def compiler(monkeypatch):
    double = PicklingCompiler()
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", double.load)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", double.save)
    return double


def cached(root: Path, key: str = KEY) -> tuple:
    """Run one capture in the cache; returns how it was used and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with persistent_compile_cache(key, root) as use:
            pass
    return use, [str(w.message) for w in caught]


def written_by_vitcg(root: Path, compiler: PicklingCompiler) -> Path:
    use, messages = cached(root)
    assert not use.loaded and use.saved_bytes and messages == []
    return use.path


def assert_refused_then_replaced(root: Path, compiler: PicklingCompiler, reason: str) -> None:
    """The file is not loaded (nothing reaches torch), one warning says ``reason``, and after the capture the file is
    one vitcg wrote, which the next start loads."""
    compiler.saved = container(("inductor", "fkernels", pickle.dumps({"kernels": 2})))
    use, messages = cached(root)
    assert not use.loaded and compiler.loaded == []
    assert use.refused and reason in use.refused
    assert len(messages) == 1 and reason in messages[0] and "compiling instead" in messages[0]
    path = root / "compile" / f"{KEY}.bin"
    assert stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes().endswith(compiler.saved)
    again, messages = cached(root)
    assert again.loaded and compiler.loaded == [compiler.saved] and messages == []


def test_a_file_vitcg_wrote_loads(compiler, tmp_path):
    path = written_by_vitcg(tmp_path, compiler)
    use, messages = cached(tmp_path)
    assert use.loaded and use.refused is None and messages == [] and compiler.loaded == [compiler.saved]
    folder = tmp_path / "compile"
    if hasattr(os, "getuid"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(folder / "key").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_planted_pickle_never_runs(compiler, tmp_path):
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "compile"
    folder.mkdir(mode=0o700)
    (folder / f"{KEY}.bin").write_bytes(pickle.dumps(Payload(marker)))
    assert_refused_then_replaced(tmp_path, compiler, "not one vitcg wrote")
    assert not marker.exists()


def test_a_planted_pickle_with_a_forged_header_never_runs(compiler, tmp_path):
    written_by_vitcg(tmp_path, compiler)  # the folder and this user's key exist: only the tag stands in the way
    marker = tmp_path / "payload-ran"
    planted = container(("inductor", "fkernels", pickle.dumps(Payload(marker))))
    (tmp_path / "compile" / f"{KEY}.bin").write_bytes(MAGIC + b"\0" * TAG_BYTES + planted)
    assert_refused_then_replaced(tmp_path, compiler, "fails its integrity check")
    assert not marker.exists()


def test_a_changed_payload_fails_its_tag(compiler, tmp_path):
    path = written_by_vitcg(tmp_path, compiler)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert_refused_then_replaced(tmp_path, compiler, "fails its integrity check")


def test_a_file_under_another_keys_name_fails_its_tag(compiler, tmp_path):
    other = written_by_vitcg(tmp_path, compiler)
    shutil.copy(other, tmp_path / "compile" / "ffffffffffffffffffffffffffffffff.bin")
    use, messages = cached(tmp_path, "ffffffffffffffffffffffffffffffff")
    assert not use.loaded and "fails its integrity check" in use.refused and compiler.loaded == []


def test_a_truncated_file_is_refused(compiler, tmp_path):
    path = written_by_vitcg(tmp_path, compiler)
    path.write_bytes(path.read_bytes()[:len(MAGIC) + TAG_BYTES // 2])
    assert_refused_then_replaced(tmp_path, compiler, "truncated")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX modes")
@pytest.mark.parametrize("bits", [stat.S_IWGRP, stat.S_IWOTH], ids=["g+w", "o+w"])
def test_a_file_others_may_write_is_refused(compiler, tmp_path, bits):
    path = written_by_vitcg(tmp_path, compiler)
    path.chmod(stat.S_IMODE(path.stat().st_mode) | bits)
    assert_refused_then_replaced(tmp_path, compiler, "group or others may write it")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_file_of_another_user_is_refused(compiler, tmp_path):
    path = written_by_vitcg(tmp_path, compiler)
    os.chown(path, 65534, -1)
    assert_refused_then_replaced(tmp_path, compiler, "owned by uid 65534")


def test_a_file_over_the_cap_is_refused_unread(compiler, tmp_path):
    written_by_vitcg(tmp_path, compiler)
    path = tmp_path / "compile" / f"{KEY}.bin"
    with path.open("r+b") as handle:  # sparse: costs no disk
        handle.truncate(compile_cache.MAX_ARTIFACT_BYTES + 1)
    tracemalloc.start()
    try:
        use, messages = cached(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak} bytes allocated to refuse a file over the cap"
    assert not use.loaded and "over the" in use.refused and compiler.loaded == [] and len(messages) == 1
    assert path.stat().st_size == compile_cache.MAX_ARTIFACT_BYTES + 1 and use.saved_bytes == 0  # left alone


def test_a_file_that_fits_the_cap_only_while_checked_is_refused(compiler, tmp_path, monkeypatch):
    """The cap bounds the bytes read, not the size fstat saw: a file growing meanwhile is still refused."""
    path = written_by_vitcg(tmp_path, compiler)
    monkeypatch.setattr(compile_cache, "MAX_ARTIFACT_BYTES", path.stat().st_size)
    real_fstat = os.fstat

    def fstat_then_grow(fd):
        st = real_fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size == path.stat().st_size:
            with path.open("ab") as handle:
                handle.write(b"more")
        return st

    monkeypatch.setattr(compile_cache.os, "fstat", fstat_then_grow)
    use, messages = cached(tmp_path)
    assert not use.loaded and "more than the" in use.refused and compiler.loaded == []


def test_a_symlink_is_refused_and_left_alone_not_written_through(compiler, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    target = written_by_vitcg(elsewhere, compiler)  # a file vitcg wrote, for the same key, in another folder
    before = target.read_bytes()
    written_by_vitcg(tmp_path, compiler)
    link = tmp_path / "compile" / f"{KEY}.bin"
    link.unlink()
    link.symlink_to(target)
    use, messages = cached(tmp_path)
    assert not use.loaded and compiler.loaded == [] and "symbolic link" in use.refused and use.saved_bytes == 0
    assert len(messages) == 1 and str(link) in messages[0]
    assert target.read_bytes() == before and link.is_symlink()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_is_refused_without_hanging(compiler, tmp_path):
    written_by_vitcg(tmp_path, compiler)
    path = tmp_path / "compile" / f"{KEY}.bin"
    path.unlink()
    os.mkfifo(path, 0o600)
    done = threading.Event()
    result = {}

    def run():
        result["use"], result["messages"] = cached(tmp_path)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(20), "reading a FIFO hung"
    assert not result["use"].loaded and "not a regular file" in result["use"].refused
    assert len(result["messages"]) == 1 and stat.S_ISFIFO(os.lstat(path).st_mode)  # left alone


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX modes")
def test_a_key_others_may_read_is_replaced(compiler, tmp_path):
    written_by_vitcg(tmp_path, compiler)
    key = tmp_path / "compile" / "key"
    old = key.read_bytes()
    key.chmod(0o644)
    use, messages = cached(tmp_path)
    assert not use.loaded and "others may read it" in use.refused and compiler.loaded == []
    assert any("replacing the compile cache key" in m for m in messages)
    assert key.read_bytes() != old and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert cached(tmp_path)[0].loaded


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX modes")
def test_a_folder_others_may_write_is_neither_read_nor_written(compiler, tmp_path):
    path = written_by_vitcg(tmp_path, compiler)
    before = path.read_bytes()
    (tmp_path / "compile").chmod(0o777)
    compiler.saved = container(("inductor", "fkernels", b"new"))
    use, messages = cached(tmp_path)
    assert not use.loaded and compiler.loaded == [] and use.saved_bytes == 0
    assert "chmod go-w" in use.refused and all("group or others may write it" in m for m in messages)
    assert path.read_bytes() == before


# issue 37, item 1: a compile/ folder that is a link, and entries vitcg did not write

def files_in(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A private folder of this user outside the cache, holding a file named ``key`` over the key's cap."""
    folder = tmp_path / "victim"
    folder.mkdir(mode=0o700)
    (folder / "key").write_bytes(b"precious\n" * 100)
    (folder / "key").chmod(0o600)
    return folder


@pytest.mark.parametrize("kind", ["bin", "aot", "bin-present"])
def test_a_compile_folder_that_is_a_link_is_neither_read_nor_written_through(compiler, tmp_path, victim, kind):
    root = tmp_path / "cache"
    root.mkdir()
    (root / "compile").symlink_to(victim)
    if kind == "bin-present":
        (victim / f"{KEY}.bin").write_bytes(b"mine")
    before = files_in(victim)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "aot":
            saved = compile_cache._store_ahead(root / "compile" / f"{KEY}.aot", KEY,
                                               SimpleNamespace(blobs={"f": b"functions"}))
        else:
            with persistent_compile_cache(KEY, root) as use:
                pass
            assert not use.loaded and compiler.loaded == []
            saved = use.saved_bytes
    messages = [str(w.message) for w in caught]
    assert files_in(victim) == before and saved == 0
    assert len(messages) == 1 and f"{root / 'compile'} is a symbolic link" in messages[0], messages


def test_a_key_over_its_cap_is_left_alone_and_the_cache_not_used(compiler, tmp_path):
    folder = tmp_path / "compile"
    folder.mkdir(mode=0o700)
    key = folder / "key"
    key.write_bytes(b"not vitcg's\n" * 100)
    key.chmod(0o600)
    use, messages = cached(tmp_path)
    assert not use.loaded and use.saved_bytes == 0 and not (folder / f"{KEY}.bin").exists()
    assert key.read_bytes() == b"not vitcg's\n" * 100
    assert len(messages) == 1 and str(key) in messages[0] and "over the" in messages[0], messages


@pytest.mark.parametrize("kind, key", [("autotune", "/tmp/vitcg-planted.pth"), ("autotune", "../../x.pth"),
                                       ("autotune", "C:evil"), ("inductor", "a\\..\\b"), ("unpickler", "f")])
def test_a_tagged_artifact_that_writes_outside_torchs_cache_is_refused(compiler, tmp_path, kind, key):
    """Even with a valid tag (the user's own key), an entry torch would write outside its cache is not loaded."""
    path = written_by_vitcg(tmp_path, compiler)
    payload = container((kind, key, b"{}"))
    secret = (tmp_path / "compile" / "key").read_bytes()
    path.write_bytes(MAGIC + compile_cache._tag(secret, KEY, payload) + payload)
    use, messages = cached(tmp_path)
    assert not use.loaded and compiler.loaded == [] and len(messages) == 1
    assert "does not make" in use.refused or "outside torch's cache" in use.refused


def test_real_torch_never_writes_a_planted_absolute_key(tmp_path, monkeypatch):
    """real_torch: an autotune artifact keyed by an absolute path makes torch's own load write that path."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    marker = tmp_path / "outside" / "planted.pth"
    planted = container(("autotune", str(marker), b'{"XBLOCK": 1}'))
    (tmp_path / "compile").mkdir(mode=0o700)
    (tmp_path / "compile" / f"{KEY}.bin").write_bytes(planted)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    use, messages = cached(tmp_path)
    assert not use.loaded and not marker.exists() and len(messages) == 1
    assert not (tmp_path / "compile" / f"{KEY}.bin").exists()  # nothing compiled to replace it with: removed


@pytest.mark.slow
def test_real_torch_round_trip(tmp_path, monkeypatch):
    """real_torch: what torch.compile saves passes vitcg's checks and loads in the next capture."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("inductor on CPU needs a C compiler")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()

    def f(x):
        return torch.nn.functional.gelu(x @ x.T) + 1

    with persistent_compile_cache(KEY, tmp_path) as first:
        torch.compile(f)(torch.randn(8, 8))
    assert not first.loaded and first.saved_bytes > 0
    torch._dynamo.reset()
    with persistent_compile_cache(KEY, tmp_path) as second:
        torch.compile(f)(torch.randn(8, 8))
    assert second.loaded and second.refused is None
    torch._dynamo.reset()
