"""Atomic writes of the CLI (issue #13): the old file or the new one, never half; failures are UsageErrors; only
regular files are written (issue 37)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from vitcg.errors import UsageError
from vitcg.tools.files import check_writable, make_folder, write_bytes_atomic, write_text_atomic


def test_write_replaces_and_leaves_only_the_file(tmp_path: Path):
    path = tmp_path / "out.json"
    write_text_atomic(path, "first — ünïcode\n")
    assert path.read_bytes() == "first — ünïcode\n".encode()
    path.chmod(0o600)
    write_text_atomic(path, "second\r\n")  # newlines as given
    assert path.read_bytes() == b"second\r\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_new_file_gets_the_umask_mode(tmp_path: Path):
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old\n")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UsageError, match=f"cannot write {path}: Permission denied"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_unwritable_folder_is_a_usage_error(tmp_path: Path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)  # what a read-only folder does, even to root's tests
    with pytest.raises(UsageError, match="out.json: Permission denied"):
        write_text_atomic(tmp_path / "out.json", "x")


def test_missing_folder_and_folder_paths(tmp_path: Path):
    with pytest.raises(UsageError, match=f"no such folder {tmp_path / 'missing'}"):
        write_text_atomic(tmp_path / "missing" / "out.json", "x")
    with pytest.raises(UsageError, match="it is a folder"):
        write_text_atomic(tmp_path, "x")
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_is_replaced_and_its_target_left_alone(tmp_path: Path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "precious.txt"
    target.write_text("old")
    folder = tmp_path / "out"
    folder.mkdir()
    link = folder / "link.txt"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert not link.is_symlink() and link.read_text() == "new" and target.read_text() == "old"
    dangling = folder / "dangling.txt"
    dangling.symlink_to(outside / "missing.txt")
    write_text_atomic(dangling, "x")
    assert not dangling.is_symlink() and not (outside / "missing.txt").exists()
    with pytest.raises(UsageError, match="exists and is not overwritten"):
        (folder / "again.txt").symlink_to(target)
        write_text_atomic(folder / "again.txt", "y", overwrite=False)
    assert target.read_text() == "old"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_devices_are_written_directly():
    with pytest.raises(UsageError, match="cannot write /dev/full: No space left on device"):
        write_bytes_atomic("/dev/full", b"x" * 100_000)
    write_bytes_atomic(os.devnull, b"x")  # not replaced by a regular file
    assert Path(os.devnull).is_char_device()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_a_fifo_that_nobody_reads_is_refused_at_once(tmp_path: Path):
    """issue 37, item 9: a FIFO without a reader blocked the write forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "to-fifo").symlink_to(fifo)
    for path in (fifo, tmp_path / "to-fifo"):
        with pytest.raises(UsageError, match=f"cannot write {path}: it is a FIFO that no process reads"):
            write_bytes_atomic(path, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "to-fifo"]


def test_a_socket_is_refused_before_opening(tmp_path: Path, monkeypatch):
    import builtins
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))

        def no_open(*args, **kwargs):
            raise AssertionError(f"opened {args[0]}")

        monkeypatch.setattr(builtins, "open", no_open)
        monkeypatch.setattr(os, "open", no_open)
        for check in (check_writable, lambda p: write_bytes_atomic(p, b"x")):
            with pytest.raises(UsageError, match=f"cannot write {path}: it is a socket, not a regular file"):
                check(path)


def test_check_writable(tmp_path: Path):
    check_writable(tmp_path / "new.json")
    check_writable(os.devnull)
    with pytest.raises(UsageError, match="no such folder"):
        check_writable(tmp_path / "missing" / "new.json")
    with pytest.raises(UsageError, match="it is a folder"):
        check_writable(tmp_path)


def test_make_folder(tmp_path: Path):
    make_folder(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="cannot make folder .*file"):
        make_folder(tmp_path / "file")
    with pytest.raises(UsageError, match="cannot make folder .*file/sub"):
        make_folder(tmp_path / "file" / "sub")


def test_no_overwrite_keeps_an_existing_file_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "draft.yaml"
    write_text_atomic(path, "first\n", overwrite=False)
    assert path.read_text() == "first\n"
    with pytest.raises(UsageError, match="exists and is not overwritten"):
        write_text_atomic(path, "second\n", overwrite=False)
    assert path.read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.yaml"]


def test_no_overwrite_loses_a_race_cleanly(tmp_path: Path, monkeypatch):
    """A file created between the check and the write is kept: the link step refuses the taken name."""
    from vitcg.tools import files

    path = tmp_path / "draft.yaml"
    real_link = files.os.link

    def racing_link(source, target):
        Path(target).write_text("theirs")
        real_link(source, target)

    monkeypatch.setattr(files.os, "link", racing_link)
    with pytest.raises(UsageError, match="exists and is not overwritten"):
        write_text_atomic(path, "mine", overwrite=False)
    assert path.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.yaml"]
