"""Files the CLI writes: replaced atomically, and a failure is a one-line UsageError instead of a traceback."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from ..errors import UsageError
from ..lang.bindings import NotRegularFile, OversizedFile, file_kind, read_regular


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _target(path: Path) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, a symlink included. A write never lands in a
    symlink's target, which may be a file outside the folder the user named (``vitcg new -o LINK --force``
    once overwrote it): the link is replaced by the new file and its target is left as it was."""
    return path


def check_output(path: str | os.PathLike) -> bool:
    """Whether ``path`` is written through (True: a character device such as ``/dev/null`` or ``/dev/stdout``, or
    a FIFO, or a link to one) rather than replaced by a new regular file (False: nothing there, a regular file, or
    a link to one or to nothing). Raises UsageError for anything else, before anything is opened: a folder, a
    socket or a block device is not a file to write or replace."""
    path = Path(path)
    try:
        st = os.stat(path)  # through a link: what it points at decides
    except OSError:
        return False  # nothing there, or a dangling link (replaced); an unreadable folder fails at the write
    if stat.S_ISREG(st.st_mode):
        return False
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return True
    kind = file_kind(st.st_mode)
    if kind == "a folder":
        raise UsageError(f"cannot write {path}: it is a folder")
    link = " (through a symbolic link)" if path.is_symlink() else ""
    raise UsageError(f"cannot write {path}: it is {kind}, not a regular file{link}; vitcg writes regular files, "
                     f"character devices and FIFOs (to print instead, leave the option out or pass '-' where the "
                     f"command takes it)")


def _write_through(path: Path, data: bytes) -> None:
    """Write ``data`` to a character device or FIFO. A FIFO is opened without blocking, so one that nobody
    reads is a UsageError at once instead of a hang (``vitcg schema -o FIFO`` once blocked forever)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UsageError(f"cannot write {path}: it is a FIFO that no process reads") from None
        raise UsageError(f"cannot write {path}: {_reason(exc)}") from None
    try:
        os.set_blocking(fd, True)  # a reader is there: write all of it, waiting for it as a pipe does
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {_reason(exc)}") from None
    finally:
        os.close(fd)


def _new_file_mode() -> int:
    # mkstemp creates files readable by their owner only; a written file gets the mode `open` would give it.
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def check_writable(path: str | os.PathLike) -> None:
    """Raise UsageError unless ``path`` looks writable: not a folder, in an existing folder we may write to.

    For commands that work a long time before they write (``vitcg bench --json``): a typo in the path
    fails at once instead of after the work.
    """
    path = Path(path)
    check_output(path)
    folder = _target(path).parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: folder {folder} is not writable")


def _kept_mode(path: Path, target: Path) -> int:
    """The permission bits the new file gets: those of the file it replaces, else (a link, nothing there, a file
    that cannot be read) a new file's."""
    try:
        return stat.S_IMODE(target.stat().st_mode) if target.exists() and not path.is_symlink() else _new_file_mode()
    except OSError:
        return _new_file_mode()


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``: readers
    see the old file or the new one, never half of one. Raises UsageError naming ``path`` on any failure.

    ``overwrite=False`` never replaces an existing file, even one created meanwhile by someone else: the
    temporary file is hard-linked into place (which fails if the name is taken) instead of renamed.

    The folder must exist. A character device or FIFO (``/dev/null``, ``/dev/stdout``, or a link to one) cannot be
    replaced by a rename, and replacing a device would be wrong anyway: it is written directly, a FIFO without
    blocking on one that nobody reads (:func:`_write_through`); a socket, block device or folder is refused
    before anything is opened (:func:`check_output`). A symlink to a regular file (or to nothing) is replaced by
    the new file; its target is not touched. No existing path is ever opened for writing: the data goes into a
    new temporary file (``O_EXCL``, which no link can redirect) that is renamed or linked into place.
    """
    path = Path(path)
    target = _target(path)
    if check_output(target):
        _write_through(target, data)
        return
    if not overwrite and (target.exists() or path.is_symlink()):
        raise UsageError(f"{path} exists and is not overwritten")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no such folder {folder}")
    mode = _kept_mode(path, target)
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            # Without it a crash after the rename can leave an empty file where the old one was.
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        if overwrite:
            os.replace(temporary, target)
            temporary = None
        else:
            _link_new(temporary, target, data)
    except FileExistsError:
        raise UsageError(f"{path} exists and is not overwritten") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {_reason(exc)}") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _link_new(temporary: str, target: Path, data: bytes) -> None:
    """Put the written ``temporary`` at ``target`` unless that name exists (FileExistsError, even when it was
    created a moment ago): a hard link, or on file systems without them an exclusive create."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise
    except OSError:
        with open(target, "xb") as handle:
            handle.write(data)


def write_text_atomic(path: str | os.PathLike, text: str, *, overwrite: bool = True) -> None:
    """``text`` as UTF-8, newlines as given, written with :func:`write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"), overwrite=overwrite)


def make_folder(path: str | os.PathLike) -> None:
    """``mkdir -p path``; raises UsageError naming ``path`` when it cannot be made (a file is in the way)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot make folder {path}: a file of that name is in the way")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make folder {path}: {_reason(exc)}") from None


MAX_JSON_BYTES = 16 << 20
"""The largest JSON file a command reads (16 MiB). A ``vitcg bench --json`` result of every packaged spec takes
about 0.5 MB and a sample of 100,000 requests about 3 MB; ``--requests /dev/zero`` once grew a process to 22 GB."""

MAX_JSON_DEPTH = 64
"""The deepest nesting a JSON file a command reads may have, as for spec files: vitcg's own files nest 7 levels
(a bench result), and Python's parser raises RecursionError at about 1,000."""


def read_bounded(path: str | os.PathLike, where: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (:func:`vitcg.lang.bindings.read_regular`).
    Raises UsageError starting with ``where`` for anything else: a file that cannot be opened, one over ``limit``
    bytes (read in steps, never whole), a folder, device or FIFO (``/dev/zero`` never ends; a FIFO without a writer
    would block forever: it is opened without waiting and refused before any read)."""
    try:
        return read_regular(path, limit)
    except NotRegularFile as exc:
        raise UsageError(f"{where}: expected a regular file, got {exc.kind}") from None
    except OversizedFile as exc:
        raise UsageError(f"{where}: the file holds {exc.size} bytes, over the limit of {limit}" if exc.size is not None
                         else f"{where}: the file holds more than the limit of {limit} bytes") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it: {_reason(exc)}") from None


def json_depth(document: object, limit: int) -> int:
    """How deep ``document`` nests (a scalar: 0, ``[]``: 1), counted without recursion and only up to
    ``limit + 1``: a deeper document stops the count there."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def parse_json(data: bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> object:
    """The JSON document in ``data`` (UTF-8). Raises UsageError starting with ``where`` when it is not JSON or nests
    deeper than ``max_depth`` (checked on the parsed value; a document too deep to parse at all is refused the
    same way, not with a RecursionError)."""
    import json

    too_deep = f"{where}: JSON nested deeper than {max_depth} levels"
    try:
        document = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise UsageError(too_deep) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are; so are 5,000-digit integers
        raise UsageError(f"{where}: not valid JSON: {exc}") from None
    if json_depth(document, max_depth) > max_depth:
        raise UsageError(too_deep)
    return document


def read_json(path: str | os.PathLike, where: str, *, limit: int = MAX_JSON_BYTES) -> object:
    """The JSON document in the regular file ``path`` (at most ``limit`` bytes, nested at most
    :data:`MAX_JSON_DEPTH` levels). Raises UsageError starting with ``where`` (the option that named the file) when
    it cannot be read, is not a regular file, is too large or too deep, or is not JSON."""
    return parse_json(read_bounded(path, where, limit), where)
