"""Files the CLI writes: replaced atomically, and a failure is a one-line UsageError instead of a traceback."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ..errors import UsageError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _target(path: Path) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, a symlink included. A write never lands in a
    symlink's target, which may be a file outside the folder the user named (``vitcg new -o LINK --force``
    once overwrote it): the link is replaced by the new file and its target is left as it was. A link to a
    device or FIFO (``/dev/stdout``) is written through, like the device itself."""
    return path


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
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder")
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {path}: permission denied")
        return
    folder = _target(path).parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: folder {folder} is not writable")


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``: readers
    see the old file or the new one, never half of one. Raises UsageError naming ``path`` on any failure.

    ``overwrite=False`` never replaces an existing file, even one created meanwhile by someone else: the
    temporary file is hard-linked into place (which fails if the name is taken) instead of renamed.

    The folder must exist. An existing file that is not a regular file (``/dev/null``, ``/dev/full``, a
    FIFO, ``/dev/stdout``) cannot be replaced by a rename, and replacing a device would be wrong anyway:
    it is written directly, and its errors (``/dev/full``: no space left on device) are UsageErrors too.
    A symlink to a regular file (or to nothing) is replaced by the new file; its target is not touched.
    """
    path = Path(path)
    target = _target(path)
    if target.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder")
    if not overwrite and (target.exists() or path.is_symlink()):
        raise UsageError(f"{path} exists and is not overwritten")
    if target.exists() and not target.is_file():
        try:
            with open(target, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {_reason(exc)}") from None
        return
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no such folder {folder}")
    try:
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() and not path.is_symlink() else _new_file_mode()
    except OSError:
        mode = _new_file_mode()
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


def read_json(path: str | os.PathLike, where: str) -> object:
    """The JSON document in ``path``. Raises UsageError starting with ``where`` (the option that named the
    file) when it cannot be read or is not JSON."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise UsageError(f"{where}: not valid JSON: {exc}") from None
