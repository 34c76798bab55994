"""The one bounded reader (``vitcg.lang.bindings.read_regular``) that the CLI's JSON inputs, the bindings cache and
the compile cache all read through (issue 27, items 1 and 5): one descriptor, checked before any byte is read, read in
steps and never past its limit."""

from __future__ import annotations

import os
import threading

import pytest

from vitcg.lang.bindings import NotRegularFile, OversizedFile, read_regular


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_regular_file_is_read_up_to_its_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert read_regular(path, 1000) == b"x" * 1000
    with pytest.raises(OversizedFile) as caught:
        read_regular(path, 999)
    assert (caught.value.size, caught.value.limit) == (1000, 999)


def test_a_file_that_grows_after_its_fstat_is_cut_at_the_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)

    def grow(st):  # runs between the fstat and the first read, as a writer racing the reader would
        with open(path, "ab") as handle:
            handle.write(b"y" * 5000)

    with pytest.raises(OversizedFile) as caught:
        read_regular(path, 100, check=grow)
    assert caught.value.size is None


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused_before_any_read(special, kind):
    if not os.path.exists(special):
        pytest.skip(f"no {special} here")
    with pytest.raises(NotRegularFile) as caught:
        read_regular(special, 10)
    assert caught.value.kind == kind


def test_a_fifo_without_a_writer_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_kind_of(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert outcome == ["a FIFO"]


def _kind_of(path):
    try:
        read_regular(path, 10)
    except NotRegularFile as exc:
        return exc.kind
    return None


def test_a_folder_is_refused_by_kind(tmp_path):
    with pytest.raises(NotRegularFile) as caught:
        read_regular(tmp_path, 10)
    assert caught.value.kind == "a folder"


def test_links_are_followed_only_when_asked(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"data")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_regular(link, 10) == b"data"
    with pytest.raises(OSError):  # ELOOP from O_NOFOLLOW
        read_regular(link, 10, follow_links=False)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10)


def test_refusals_close_the_descriptor(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)

    def refuse(st):
        raise PermissionError(f"owned by uid {st.st_uid}")

    before = open_fds()
    for _ in range(20):
        with pytest.raises(PermissionError):
            read_regular(path, 1000, check=refuse)
        with pytest.raises(OversizedFile):
            read_regular(path, 10)
        with pytest.raises(NotRegularFile):
            read_regular(tmp_path, 10)
    assert open_fds() == before


def test_the_callers_share_it():
    """No copy of the read loop is left: the JSON reader, the bindings cache and the compile cache call the helper."""
    import inspect

    from vitcg.lang import bindings
    from vitcg.runtime import compile_cache
    from vitcg.tools import files

    for function in (files.read_bounded, bindings.read_cache, compile_cache._read_trusted):
        source = inspect.getsource(function)
        assert "read_regular(" in source and ".read(" not in source, function.__qualname__
