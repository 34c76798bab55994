"""A persistent cache for the inductor kernels of ``compile_forward`` adapters, used only when vitcg can vouch for it.

Inductor's own caches live under ``/tmp`` and key on graphs that dynamo must first trace again. vitcg keeps what
``torch.compiler.save_cache_artifacts`` returns after a capture in one file per key, and hands it back to
``torch.compiler.load_cache_artifacts`` before the next capture with the same key, in any later process. With the
repeated blocks compiled once per budget (:mod:`vitcg.runtime.regions`), qwen2_vl's 8 budgets compile and
capture in 22 s on an H100 from nothing and in 10 s from this cache. Blocks compiled ahead of time are kept
beside it, in ``KEY.aot`` (:func:`capture_compiled`), which loads without a dynamo trace (4.1 s). The key
covers what the kernels depend on: the spec's file, the budgets and capture limits, dtype, device model, the
torch, transformers and triton versions, and how the forward is compiled (:data:`COMPILE_FORMAT`). The file
lives under ``compile/`` in vitcg's cache folder (``VITCG_CACHE_DIR``). What is stored must load whatever command
wrote it: importing this module registers vitcg's custom ops (:mod:`vitcg.runtime.ops`), which stored code calls
by name, so they exist before any artifact is handed to torch.

Loading an artifact runs code: torch unpickles parts of it, and writes each entry to a path built from the entry's
key. The key is computable from public facts, so anyone who can put a file at ``compile/KEY.bin`` chooses what runs
inside ``accelerate``. So a file is handed to torch only when all of these hold, checked before any byte of it is
unpickled, on the very file descriptor that is read:

- the ``compile/`` folder is owned by the current user and writable by no one else (vitcg makes it with mode 0700);
- the file is a regular file (not a link, FIFO or device), owned by the current user, writable by no one else, and
  at most :data:`MAX_ARTIFACT_BYTES` (read in bounded steps, never whole-then-check);
- it carries an HMAC-SHA256 tag over its cache key and payload made with ``compile/key``, 32 random bytes that vitcg
  made for this user (mode 0600, owned by the user, readable by no one else);
- its payload is torch's artifact container holding only the artifact kinds a ``torch.compile`` produces
  (:data:`EXPECTED_KINDS`), each keyed by a relative path without ``..``: checked with a plain byte reader, no pickle.

Anything else is not loaded (``CompileCacheUse.loaded`` stays False), one warning says why, and the kernels are
compiled as if the file were absent. A regular file within the cap is then replaced (through a temporary file and
``os.replace``). What vitcg never wrote is left alone and nothing is stored under that key: a ``compile/`` folder
that is a symbolic link (its target may be any folder of the user's: nothing is read from or written into it), an
entry or key that is a link, FIFO, folder or device, or one over its cap (:func:`vitcg.lang.bindings.write_cache_file`
checks each folder below the cache root with ``lstat`` and writes relative to its descriptor). On systems without
``os.getuid`` (Windows) the ownership and mode checks are skipped; the tag still holds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch

from ..lang.bindings import (
    NotRegularFile,
    OversizedFile,
    UnsafeCachePath,
    cache_root,
    read_regular,
    transformers_version,
    write_cache_file,
)
from ..lang.model import Spec
from . import ops  # noqa: F401  (registers vitcg's custom ops, which stored artifacts call, before any loads)

log = logging.getLogger(__name__)

COMPILE_FORMAT = "blocks-static-2"
"""What is compiled (the repeated blocks, per budget), and how vitcg's custom ops are called from it: artifacts
of another strategy are not reused. 2: ``vitcg::packed_attention`` takes its block configuration as arguments."""

MAGIC = b"vitcgcc1"
"""The first bytes of every file vitcg writes; the number changes when the layout below does.
Layout: ``MAGIC``, a 32-byte HMAC-SHA256 tag, then the bytes ``save_cache_artifacts`` returned."""

TAG_BYTES = hashlib.sha256().digest_size
KEY_BYTES = 32
"""The secret's length: 256 random bits from :mod:`secrets`, as long as the HMAC's block of SHA-256 output."""

KEY_FILE = "key"
"""The secret's name inside ``compile/``: beside the artifacts it vouches for, so one private folder holds both."""

MAX_ARTIFACT_BYTES = 1 << 30
"""The largest file read (1 GiB). A small CPU graph saves 156 kB; the cap bounds what a planted or runaway file
costs (a 3 GiB file read whole took a process to 6.4 GB), not what vitcg writes, which it stays far below.
A larger artifact is not stored (a warning says so)."""

EXPECTED_KINDS = frozenset({"inductor", "aot_autograd", "autotune", "pgo", "precompile"})
"""The artifact kinds ``torch.compile`` records (torch 2.6 to 2.13): any other kind is not loaded."""

_CONTAINER_VERSION = 1
"""The version that opens torch's artifact container (``torch.utils._appending_byte_serializer``)."""

_OWNERSHIP = hasattr(os, "getuid")
"""Whether files have POSIX owners and modes to check (not on Windows)."""


class UntrustedCacheFile(Exception):
    """A compile-cache file (or its folder or key) that vitcg will not hand to torch; the message says why.
    ``replace``: whether vitcg may replace it with what it compiles (a regular file within the cap, in a folder it
    trusts); False for what vitcg never wrote, which is left alone and stores nothing under that key."""

    def __init__(self, message: str, *, replace: bool = True):
        super().__init__(message)
        self.replace = replace


def compile_key(spec: Spec, device: torch.device, dtype: torch.dtype, **shapes: Any) -> str:
    """A digest of everything the compiled kernels depend on; ``shapes``: budgets and capture limits."""
    try:
        source = hashlib.sha256(Path(spec.file).read_bytes()).hexdigest()
    except OSError:  # a spec built in memory: its parsed form stands for its text
        source = hashlib.sha256(repr(spec).encode()).hexdigest()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    device = torch.device(device)
    parts = {"spec": spec.name, "source": source, "dtype": str(dtype), "device": device.type,
             "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
             "torch": torch.__version__, "transformers": transformers_version(), "triton": triton_version,
             "shapes": shapes, "format": COMPILE_FORMAT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class CompileCacheUse:
    path: Path
    loaded: bool = False
    """Whether artifacts were found, trusted and loaded before the capture."""
    saved_bytes: int = 0
    """Bytes of artifacts written after the capture (0 when nothing new was compiled or they could not be stored)."""
    refused: str | None = None
    """Why the file at :attr:`path` was not loaded though it existed (vitcg could not vouch for it, or torch could
    not load it), or None."""


def _check_owner(st: os.stat_result, what: str, path: Path, *, private: bool = False) -> None:
    """Raise :class:`UntrustedCacheFile` unless ``st`` is the current user's and no one else may write it
    (``private``: nor read it)."""
    if not _OWNERSHIP:
        return
    if st.st_uid != os.getuid():
        raise UntrustedCacheFile(f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})")
    mode = stat.S_IMODE(st.st_mode)
    if private and mode & 0o077:
        raise UntrustedCacheFile(f"{what} {path} has mode {mode:04o}: others may read it (vitcg makes it 0600)")
    if mode & 0o022:
        raise UntrustedCacheFile(f"{what} {path} has mode {mode:04o}: group or others may write it "
                                 f"(chmod go-w {path})")


def _check_folder(folder: Path) -> None:
    """Raise :class:`UntrustedCacheFile` unless ``folder`` is a directory (not a link to one: its target may be
    any folder of the user's) of the current user that only they may write: anyone else who may write it could
    swap files between the checks and the read."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise UntrustedCacheFile(f"cannot inspect the folder {folder}: {exc.strerror}", replace=False) from None
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheFile(f"{folder} is a symbolic link: vitcg reads and writes nothing through it",
                                 replace=False)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedCacheFile(f"{folder} is not a folder", replace=False)
    try:
        _check_owner(st, "the folder", folder)
    except UntrustedCacheFile as exc:
        raise UntrustedCacheFile(str(exc), replace=False) from None


def _read_trusted(path: Path, limit: int, *, what: str, private: bool = False) -> bytes | None:
    """The bytes of ``path`` (None when there is no such entry), read through one file descriptor whose owner, mode,
    kind and size are checked first, at most ``limit + 1`` bytes of it (:func:`vitcg.lang.bindings.read_regular`,
    links not followed). Raises :class:`UntrustedCacheFile`."""
    link = UntrustedCacheFile(f"{what} {path} is a symbolic link, left alone", replace=False)
    if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
        raise link
    try:
        return read_regular(path, limit, follow_links=False,
                            check=lambda st: _check_owner(st, what, path, private=private))
    except FileNotFoundError:
        if os.path.islink(path):
            raise link from None
        return None
    except NotRegularFile:
        raise UntrustedCacheFile(f"{what} {path} is not a regular file, left alone", replace=False) from None
    except OversizedFile as exc:
        raise UntrustedCacheFile(f"{what} {path} holds {exc.size} bytes, over the {limit}-byte cap, left alone"
                                 if exc.size is not None else
                                 f"{what} {path} holds more than the {limit}-byte cap, left alone",
                                 replace=False) from None
    except OSError as exc:  # ELOOP: the entry is a link, which O_NOFOLLOW refuses to open
        if os.path.islink(path):
            raise link from None
        raise UntrustedCacheFile(f"{what} {path} cannot be read: {exc.strerror}") from None


def _secret(folder: Path, *, create: bool) -> bytes:
    """This user's key for ``folder``: read (and checked), or, with ``create``, made when missing or unusable (a
    key that is a link, not a regular file or over its cap is not vitcg's: it is left alone, and raised).
    Raises :class:`UntrustedCacheFile` (without ``create``: when there is no usable key)."""
    path = folder / KEY_FILE
    try:
        secret = _read_trusted(path, KEY_BYTES, what="the key", private=True)
        if secret is not None and len(secret) == KEY_BYTES:
            return secret
        problem = None if secret is None else f"the key {path} holds {len(secret)} bytes, not {KEY_BYTES}"
    except UntrustedCacheFile as exc:
        if not exc.replace:
            raise
        problem = str(exc)
    if not create:
        raise UntrustedCacheFile(problem or f"there is no key {path} to check it with (vitcg did not write it)")
    secret = secrets.token_bytes(KEY_BYTES)
    where = f"{folder.name}/{KEY_FILE}"
    try:
        if problem is not None:  # a key anyone else may have read or written vouches for nothing: a new one
            warnings.warn(f"vitcg: replacing the compile cache key: {problem}", stacklevel=5)
            write_cache_file(folder.parent, where, secret, limit=KEY_BYTES)
        else:  # never replaces a key another process made meanwhile: keep theirs
            write_cache_file(folder.parent, where, secret, limit=KEY_BYTES, exclusive=True)
    except FileExistsError:
        return _secret(folder, create=False)
    except UnsafeCachePath as exc:
        raise UntrustedCacheFile(str(exc), replace=False) from None
    return secret


def _tag(secret: bytes, key: str, payload: bytes) -> bytes:
    """The HMAC of a file's cache key and payload: a file moved to another key's name does not verify."""
    mac = hmac.new(secret, MAGIC, hashlib.sha256)
    mac.update(key.encode() + b"\0")
    mac.update(payload)
    return mac.digest()


def artifact_index(payload: bytes) -> list[tuple[str, str]]:
    """The ``(kind, key)`` of every artifact in torch's artifact container ``payload``, read as plain bytes (no
    pickle). Raises :class:`UntrustedCacheFile` for a malformed container, a kind outside :data:`EXPECTED_KINDS`,
    or a key torch would turn into a path outside its cache folder (absolute, a drive, ``..``, NUL, backslash)."""
    view = memoryview(payload)
    end, pos = len(payload), 4
    if end < 12 or int.from_bytes(view[:4], "big") != zlib.crc32(view[4:]):
        raise UntrustedCacheFile("the artifacts are truncated or corrupt (checksum)")

    def number() -> int:
        nonlocal pos
        if pos + 8 > end:
            raise UntrustedCacheFile("the artifacts are truncated")
        pos += 8
        return int.from_bytes(view[pos - 8:pos], "big")

    def chunk() -> memoryview:
        nonlocal pos
        size = number()
        if size > end - pos:
            raise UntrustedCacheFile("the artifacts are truncated")
        pos += size
        return view[pos - size:pos]

    def text() -> str:
        try:
            return base64.b64decode(chunk(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise UntrustedCacheFile("the artifacts hold a malformed name") from None

    if number() != _CONTAINER_VERSION:
        raise UntrustedCacheFile("the artifacts are in a container version vitcg does not know")
    index = []
    while pos < end:
        kind = text()
        if kind not in EXPECTED_KINDS:
            raise UntrustedCacheFile(f"the artifacts hold a kind torch.compile does not make: {kind[:60]!r}")
        for _ in range(number()):
            key = _inside_cache(kind, text())
            chunk()
            index.append((kind, key))
    return index


def _inside_cache(kind: str, key: str) -> str:
    """``key`` if torch would keep it inside its cache folder (relative, no ``..``, drive, NUL or backslash);
    raises :class:`UntrustedCacheFile` otherwise."""
    if (not key or len(key) > 512 or "\0" in key or "\\" in key or key.startswith("/")
            or ".." in PurePosixPath(key).parts or PureWindowsPath(key).drive):
        raise UntrustedCacheFile(f"a {kind} artifact is keyed {key[:80]!r}: a path outside torch's cache")
    return key


def _trusted_payload(path: Path, key: str, check: Callable[[bytes], Any] = artifact_index) -> bytes | None:
    """The artifacts in ``path`` if vitcg can vouch for them (see the module docstring), None when there is no file.
    ``check`` reads the payload's layout without unpickling (torch's container, or :func:`aot_index`).
    Raises :class:`UntrustedCacheFile` saying why not."""
    if not os.path.lexists(path.parent):
        return None
    _check_folder(path.parent)  # before any look inside: a folder that is a link is not read through
    if not os.path.lexists(path):
        return None
    data = _read_trusted(path, MAX_ARTIFACT_BYTES, what="the file")
    if data is None:  # removed since the lexists
        return None
    header = len(MAGIC) + TAG_BYTES
    if len(data) <= header or not data.startswith(MAGIC):
        raise UntrustedCacheFile(f"the file {path} is not one vitcg wrote (no vitcg header) or is truncated")
    secret = _secret(path.parent, create=False)
    payload = data[header:]
    if not hmac.compare_digest(data[len(MAGIC):header], _tag(secret, key, payload)):
        raise UntrustedCacheFile(f"the file {path} fails its integrity check: vitcg did not write it for this key "
                                 f"with your key, or it was changed since")
    check(payload)
    return payload


def _warn(message: str) -> None:
    warnings.warn(f"vitcg: {message}", stacklevel=4)


@contextlib.contextmanager
def _storing(what: str, path: Path) -> Iterator[None]:
    """A store into the cache that cannot be done is one warning, never an error: a folder vitcg will not trust,
    or a read-only one, costs the next start its compile time, nothing else."""
    try:
        yield
    except (UntrustedCacheFile, UnsafeCachePath) as exc:
        _warn(f"not storing {what} {path}: {exc}")
    except OSError as exc:
        _warn(f"could not store {what} {path}: {exc}")


@contextlib.contextmanager
def persistent_compile_cache(key: str, root: str | os.PathLike | None = None, *,
                             needed: Callable[[], bool] = lambda: True) -> Iterator[CompileCacheUse]:
    """Load the artifacts stored under ``key`` on entry, if vitcg can vouch for them (see the module docstring);
    on a clean exit, store what was compiled, unless ``needed()`` says nothing will read it. A file that is
    refused or fails to load is reported (``loaded`` False, ``refused`` the reason, one warning) and replaced by
    what this capture compiles."""
    path = Path(root or cache_root()) / "compile" / f"{key}.bin"
    use = CompileCacheUse(path)
    replaceable = True
    try:
        payload = _trusted_payload(path, key)
    except UntrustedCacheFile as exc:
        payload, use.refused, replaceable = None, str(exc), exc.replace
        _warn(f"not loading the compile cache: {exc}; compiling instead")
    if payload is not None:
        _load_artifacts(use, payload)
    yield use
    if use.loaded or not replaceable:  # what vitcg never wrote is left alone (warned about above)
        return
    _store_artifacts(use, path, key, needed)


def _load_artifacts(use: CompileCacheUse, payload: bytes) -> None:
    """Hand a vouched-for payload to torch; ``use`` says whether it loaded, or why not (with one warning)."""
    try:
        use.loaded = torch.compiler.load_cache_artifacts(payload) is not None  # None: torch could not read it
        if not use.loaded:
            use.refused = "torch could not read the artifacts"
    except Exception as exc:  # a stale file (another torch build): compile as if it were absent, then replace it
        use.refused = f"{type(exc).__name__}: {exc}"
    if use.loaded:
        log.info("compile cache: loaded %d bytes of artifacts from %s", len(payload), use.path)
    else:
        _warn(f"ignoring the compile cache {use.path}: {use.refused}; compiling instead")


def _store_artifacts(use: CompileCacheUse, path: Path, key: str, needed: Callable[[], bool]) -> None:
    """Store what this capture compiled under ``key`` (unless ``needed()`` says nothing reads it); with nothing to
    store, drop a refused file so that it is not read again."""
    artifacts = torch.compiler.save_cache_artifacts() if needed() else None
    blob = artifacts[0] if artifacts else b""
    with _storing("the compile cache", path):
        if blob:
            _store(path, key, blob)
            use.saved_bytes = len(blob)
        elif use.refused is not None:  # nothing new to store: drop the refused entry so it is not read again
            _check_folder(path.parent)
            os.unlink(path)


def _store(path: Path, key: str, payload: bytes, check: Callable[[bytes], Any] = artifact_index) -> None:
    """Write ``payload`` to ``path`` with its tag, in a private folder, replacing (never writing through) what is
    there. Raises :class:`UntrustedCacheFile` (a folder others may write, artifacts vitcg would refuse) or OSError."""
    if len(payload) + len(MAGIC) + TAG_BYTES > MAX_ARTIFACT_BYTES:
        raise UntrustedCacheFile(f"the artifacts take {len(payload)} bytes, over the {MAX_ARTIFACT_BYTES}-byte cap")
    check(payload)  # what would be refused on loading is not stored
    folder = path.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)  # never follows a link of that name: it exists, and the check below refuses it
    _check_folder(folder)
    secret = _secret(folder, create=True)
    write_cache_file(folder.parent, f"{folder.name}/{path.name}", MAGIC + _tag(secret, key, payload) + payload,
                     limit=MAX_ARTIFACT_BYTES)
    log.info("compile cache: stored %d bytes of artifacts in %s", len(payload), path)


AOT_MAGIC = b"vitcgaot1\n"
"""The first line of the payload of a ``KEY.aot`` file: block functions compiled ahead of time
(:class:`vitcg.runtime.regions.AheadOfTime`). Then one JSON line, ``{"functions": [[signature, bytes], ...]}``,
then the serialized functions in that order."""

MAX_AOT_INDEX_BYTES = 1 << 20


def aot_index(payload: bytes) -> list[tuple[str, int]]:
    """The ``(signature, length)`` entries of an ahead-of-time payload, read with :mod:`json` (no pickle); raises
    :class:`UntrustedCacheFile` for any other layout."""
    if not payload.startswith(AOT_MAGIC):
        raise UntrustedCacheFile("the file does not hold block functions in vitcg's layout")
    end = payload.find(b"\n", len(AOT_MAGIC), len(AOT_MAGIC) + MAX_AOT_INDEX_BYTES)
    try:
        entries = json.loads(payload[len(AOT_MAGIC):end])["functions"] if end > 0 else None
        index = [(str(signature), int(length)) for signature, length in entries]
    except (ValueError, TypeError, KeyError):
        index = None
    if index is None or any(length < 0 for _, length in index) or \
            end + 1 + sum(length for _, length in index) != len(payload):
        raise UntrustedCacheFile("the block functions' index does not match the file")
    return index


def _aot_payload(blobs: dict[str, bytes]) -> bytes:
    index = json.dumps({"functions": [[signature, len(blob)] for signature, blob in blobs.items()]})
    return AOT_MAGIC + index.encode() + b"\n" + b"".join(blobs.values())


def _aot_blobs(payload: bytes) -> dict[str, bytes]:
    index = aot_index(payload)
    offset = payload.index(b"\n", len(AOT_MAGIC)) + 1
    blobs = {}
    for signature, length in index:
        blobs[signature] = payload[offset:offset + length]
        offset += length
    return blobs


def _load_ahead(path: Path, key: str, ahead: Any) -> tuple[bool, UntrustedCacheFile | None]:
    """Hand the block functions stored under ``key`` to ``ahead``. Returns whether they were loaded, and why a
    file that exists was not (vitcg cannot vouch for it: warned, and replaced after the capture if ``replace``)."""
    try:
        payload = _trusted_payload(path, key, aot_index)
    except UntrustedCacheFile as exc:
        _warn(f"not loading the compiled block functions: {exc}; compiling instead")
        return False, exc
    if payload is None:
        return False, None
    ahead.load(_aot_blobs(payload))
    log.info("compile cache: loaded %d bytes of block functions from %s", len(payload), path)
    return True, None


def _store_ahead(path: Path, key: str, ahead: Any) -> int:
    """Store ``ahead``'s functions under ``key``; the bytes written (0 when they could not be, with a warning)."""
    payload = _aot_payload(ahead.blobs)
    with _storing("the compiled block functions", path):
        _store(path, key, payload, aot_index)
        return len(payload)
    return 0


def capture_compiled(manager: Any, spec: Spec) -> tuple[Any, CompileCacheUse]:
    """``manager.capture()`` (its adapter built with ``compile_forward``) inside the persistent cache of its spec,
    budgets, capture limits, device and dtype. Returns the capture report and how the cache was used.

    Blocks compiled ahead of time (the adapter's ``ahead``, :class:`vitcg.runtime.regions.AheadOfTime`) are kept
    in ``KEY.aot``: when that file loads, the capture needs neither dynamo nor inductor's artifacts, so
    ``KEY.bin`` is not read. The artifacts serve the block calls that cannot be compiled ahead of time, and are
    stored only when there were such calls."""
    key = compile_key(spec, manager.device, manager.dtype, budgets=list(manager.budgets),
                      max_items=manager.plan.max_items, max_frames=manager.plan.max_frames)
    _eager_functions(manager.model, key)
    ahead = getattr(manager.model, "ahead", None)
    if ahead is None or ahead.disabled:
        with persistent_compile_cache(key) as use:
            report = manager.capture()
        return report, use
    path = Path(cache_root()) / "compile" / f"{key}.aot"
    loaded, refused = _load_ahead(path, key, ahead)
    if loaded:
        use = CompileCacheUse(path, loaded=True)
        report = manager.capture()
    else:
        with persistent_compile_cache(key, needed=lambda: bool(ahead.fallbacks)) as use:
            report = manager.capture()
        use.refused = use.refused or (str(refused) if refused is not None else None)
    if ahead.compiled and not ahead.disabled and (refused is None or refused.replace):
        stored = _store_ahead(path, key, ahead)
        if stored:
            use.saved_bytes, use.path = use.saved_bytes + stored, path  # the file a later start loads
    return report, use


def hosted_compiled(adapter: Any, spec: Spec, host: str) -> Callable[[], int]:
    """The persistent cache of the block functions of a ``compile_forward`` adapter whose capture a host drives
    budget by budget (vLLM's manager, through the plugin), so that no call of vitcg's wraps the whole capture.
    Loads the functions stored for the spec, device, dtype and ``host`` into ``adapter.ahead`` now, and returns
    ``store``, which writes them all again (``KEY.aot``) when forwards since its last call compiled new ones, and
    returns the bytes written. Call it outside any stream capture: the host's warm-up call before each budget's
    capture is where that budget's functions compile. The key names no budgets: a function's signature names its
    shapes, so one file serves whatever budgets the host picks. The eager forward's functions (``compile_eager``)
    are kept in ``KEY.eager.aot`` as :func:`capture_compiled` keeps them. Only functions compiled ahead of time are
    kept: calls that cannot be compiled so run the plain compilation, which each process compiles again (inductor's
    own caches speed that up)."""
    key = compile_key(spec, adapter.device, adapter.dtype, host=host)
    _eager_functions(adapter, key)
    ahead = getattr(adapter, "ahead", None)
    if ahead is None:
        return lambda: 0
    return _kept(ahead, Path(cache_root()) / "compile" / f"{key}.aot", key)


def _kept(ahead: Any, path: Path, key: str) -> Callable[[], int]:
    """Load the functions stored in ``path`` under ``key`` into ``ahead``, and return ``store``: it writes them all
    again when calls since its last one compiled new ones (unless the file is one vitcg will not replace), and
    returns the bytes written."""
    _, refused = _load_ahead(path, key, ahead)
    stored = 0

    def store() -> int:
        nonlocal stored
        if ahead.compiled <= stored or ahead.disabled or (refused is not None and not refused.replace):
            return 0
        stored = ahead.compiled
        return _store_ahead(path, key, ahead)
    return store


def _eager_functions(adapter: Any, key: str) -> None:
    """The block functions of ``adapter``'s eager forward (``compile_eager``: dynamic shapes) from ``KEY.eager.aot``,
    and the file written again after each eager call that compiled new ones: they are compiled at the first eager
    call of a size they do not serve, not at capture, so a later process loads them instead of compiling at its
    first eager call."""
    ahead = getattr(adapter, "eager_ahead", None)
    if ahead is not None:
        adapter.on_eager_compiled = _kept(ahead, Path(cache_root()) / "compile" / f"{key}.eager.aot", key)
