"""Facts about the transformers classes a spec names: do the import paths resolve, what do the configs hold.

Importing transformers model code costs seconds (it pulls in torch), so the facts are cached on disk,
keyed by the installed transformers version: a second ``vitcg validate`` imports nothing. The cache
holds plain JSON (config snapshots from ``to_dict()``), never pickles. Set ``VITCG_CACHE_DIR`` to move
it, or pass ``use_cache=False`` (``vitcg validate --no-cache``) to bypass it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import itertools
import json
import os
import secrets
import stat
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ALLOWED_PREFIX = "transformers."
"""Specs may only name classes inside transformers: loading a spec never imports arbitrary modules."""


MISSING = "missing"
"""What :func:`transformers_version` says when transformers is not installed."""


def transformers_version() -> str:
    """The installed transformers version, read from its metadata (no import), or :data:`MISSING`."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return MISSING


def release(text: str) -> tuple[int, ...]:
    """``5.23.0rc1`` -> (5, 23, 0): the numeric release, padded to three parts."""
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def import_object(path: str) -> Any:
    """Import ``transformers.x.y.Name``. Raises ImportError with a one-line reason."""
    if not path.startswith(ALLOWED_PREFIX):
        raise ImportError(f"{path!r} is outside the transformers package")
    module_path, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:  # a broken optional dependency raises anything
        raise ImportError(f"cannot import module {module_path!r}: {exc}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ImportError(f"module {module_path!r} has no attribute {name!r}") from None
    except Exception as exc:  # transformers' lazy modules import on attribute access
        raise ImportError(f"cannot import {path!r}: {exc}") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def config_snapshot(config: Any) -> dict[str, Any]:
    """A JSON-safe dict of a config instance (sub-configs nested), what geometry formulas read."""
    return _jsonable(config.to_dict())


def _sub_config_class(config_cls: type, key: str, value: Mapping[str, Any]) -> type | None:
    sub = getattr(config_cls, "sub_configs", {}).get(key)
    if sub is None:
        return None
    if sub.__name__ == "AutoConfig":
        from transformers import CONFIG_MAPPING

        model_type = value.get("model_type")
        # Not .get: CONFIG_MAPPING is lazy, and only its __getitem__ imports the config class.
        known = isinstance(model_type, str) and model_type in CONFIG_MAPPING  # a spec may put anything there
        return CONFIG_MAPPING[model_type] if known else None
    return sub


def unknown_config_keys(config_cls: type, overrides: Mapping[str, Any], prefix: tuple = ()) -> list[list]:
    """Paths of keys in ``overrides`` that the config class does not declare (HF stores them silently)."""
    known = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else None
    if known is None:
        return []
    known |= set(getattr(config_cls, "attribute_map", {}))
    # a property with a setter is set from its keyword like a field (a backbone's out_indices, out_features)
    known |= {name for klass in config_cls.__mro__ for name, attr in vars(klass).items()
              if isinstance(attr, property) and attr.fset is not None}
    known |= {"model_type"}
    problems = []
    for key, value in overrides.items():
        if key not in known:
            problems.append([*prefix, key, sorted(known)])
        elif isinstance(value, Mapping):
            sub = _sub_config_class(config_cls, key, value)
            if sub is not None:
                problems.extend(unknown_config_keys(sub, value, (*prefix, key)))
    return problems


def _check_class(path: str) -> dict[str, Any]:
    try:
        obj = import_object(path)
    except ImportError as exc:
        return {"ok": False, "error": str(exc)}
    if not isinstance(obj, type):
        return {"ok": False, "error": f"{path!r} is not a class"}
    configured_by = getattr(obj, "config_class", None)
    if not isinstance(configured_by, type):
        return {"ok": True, "bases": [_name(c) for c in obj.__mro__], "config_class": None, "sub_configs": []}
    subs = getattr(configured_by, "sub_configs", None) or {}
    return {"ok": True, "bases": [_name(c) for c in obj.__mro__], "config_class": _name(configured_by),
            "sub_configs": sorted(_name(c) for c in subs.values() if isinstance(c, type))}


def _name(cls: type) -> str:
    return cls.__module__ + "." + cls.__name__


def _has_method(path: str, method: str) -> bool:
    try:
        return callable(getattr(import_object(path), method, None))
    except ImportError:
        return False


def method_signature(path: str, method: str) -> dict[str, Any]:
    """The parameters of ``method`` of the class at ``path`` (``self`` left out): ``{"ok": True, "required": [...],
    "accepted": [...], "var_keyword": bool}``, ``required`` naming those without a default in call order,
    ``accepted`` every name a keyword may bind, ``var_keyword`` whether it takes ``**kwargs``; or ``{"ok": False,
    "error": ...}`` when the class does not import or the method has no signature. The validate rule on required
    arguments and ``vitcg new``'s drafts both read it, so a draft passes what the rule asks for."""
    try:
        function = getattr(import_object(path), method)
        parameters = list(inspect.signature(function).parameters.values())
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        return {"ok": False, "error": f"no signature for {path}.{method}: {exc}"}
    if parameters and parameters[0].name == "self" and not isinstance(inspect.getattr_static(
            import_object(path), method, None), staticmethod):
        parameters = parameters[1:]
    named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return {"ok": True, "required": [p.name for p in named if p.default is p.empty],
            "accepted": [p.name for p in named if p.kind is not p.POSITIONAL_ONLY],
            "var_keyword": any(p.kind is p.VAR_KEYWORD for p in parameters)}


def _check_config(path: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    try:
        cls = import_object(path)
    except ImportError as exc:
        return {"ok": False, "error": str(exc)}
    unknown = unknown_config_keys(cls, overrides)
    if unknown:
        return {"ok": False, "unknown_keys": unknown}
    try:
        config = cls(**overrides)
    except Exception as exc:
        message = " ".join(str(exc).split())
        return {"ok": False, "error": f"{cls.__name__}(**overrides) failed: {message[:300]}"}
    return {"ok": True, "snapshot": config_snapshot(config)}


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _valid_unknown_keys(problems: Any) -> bool:
    return isinstance(problems, list) and all(
        isinstance(p, list) and len(p) >= 2 and _strings(p[:-1]) and _strings(p[-1]) for p in problems)


def _valid_failure(kind: str, entry: dict) -> bool:
    if kind == "config" and "unknown_keys" in entry:
        return _valid_unknown_keys(entry["unknown_keys"])
    return isinstance(entry.get("error"), str)


def _valid_signature(entry: dict) -> bool:
    return (_strings(entry.get("required")) and _strings(entry.get("accepted"))
            and isinstance(entry.get("var_keyword"), bool))


def _valid_class(entry: dict) -> bool:
    configured_by = entry.get("config_class", 0)  # a missing key is an older cache format: recompute
    return (_strings(entry.get("bases")) and (configured_by is None or isinstance(configured_by, str))
            and _strings(entry.get("sub_configs")))


def _valid_config(entry: dict) -> bool:
    return isinstance(entry.get("snapshot"), dict)


_VALID_ANSWER = {"signature": _valid_signature, "class": _valid_class, "config": _valid_config}
"""The shape of a successful answer, by the kind of check (the key's prefix)."""


def _valid_entry(key: str, entry: Any) -> bool:
    """Whether a cached answer has the shape its check returns; the cache file is not trusted (edited by
    hand, truncated, written by another vitcg version), and a malformed answer would crash its reader."""
    if not isinstance(entry, dict) or not isinstance(entry.get("ok"), bool):
        return False
    kind = key.split(":", 1)[0]
    if kind == "method":
        return True
    if not entry["ok"]:
        return _valid_failure(kind, entry)
    valid = _VALID_ANSWER.get(kind)
    return valid is not None and valid(entry)


def cache_root() -> Path:
    """vitcg's cache folder: ``VITCG_CACHE_DIR``, else ``$XDG_CACHE_HOME/vitcg`` (``~/.cache/vitcg``)."""
    return Path(os.environ.get("VITCG_CACHE_DIR") or
                Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitcg")


class UnsafeCachePath(OSError):
    """A cache file vitcg will not write, the message naming the path and why: a folder on the way from the cache
    root is a symbolic link or not a folder, or the entry there is not a regular file (a link included) or holds more
    than its cap. vitcg never made such a thing, so it neither writes through it nor replaces it."""


_DIR_FDS = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and os.mkdir in os.supports_dir_fd
"""Whether folders can be opened and written relative to a descriptor (POSIX): then a folder checked is the folder
written, even if its name is swapped for a link meanwhile."""

_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _entry_kind(st: os.stat_result) -> str:
    return "a symbolic link" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)


def _check_replaceable(path: Path, st: os.stat_result | None, limit: int) -> None:
    """Raise :class:`UnsafeCachePath` unless the entry ``st`` (by ``lstat``; None: there is none) is one vitcg may
    have written: a regular file of at most ``limit`` bytes."""
    if st is None:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeCachePath(f"{path} is {_entry_kind(st)}, not a file vitcg wrote: left alone")
    if st.st_size > limit:
        raise UnsafeCachePath(f"{path} holds {st.st_size} bytes, over the {limit}-byte cap of what vitcg writes "
                              f"there: left alone")


def _lstat(name: str | Path, dir_fd: int | None = None) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def write_cache_file(root: Path, relative: str, data: bytes, *, limit: int, exclusive: bool = False,
                     folder_mode: int = 0o700) -> None:
    """``data`` into the cache file ``root / relative`` (a ``/``-separated path) through a temporary file beside it
    and ``os.replace``: readers see the old file or the new one, never half of one. ``exclusive``: never replace an
    existing entry (FileExistsError), even one made a moment ago.

    ``root`` is the folder the user chose (it may be a link, and is made if missing). Below it nothing is reached
    through a link: every folder on the way is checked with ``lstat`` (made with ``folder_mode`` when missing) and,
    where the system allows, opened without following links, the next step taken relative to its descriptor. An
    existing entry that is not a regular file or holds over ``limit`` bytes is not one vitcg wrote, and is left
    alone. Raises :class:`UnsafeCachePath` for a link or non-folder on the way or such an entry, or OSError."""
    root = Path(root)
    *folders, name = relative.split("/")
    root.mkdir(parents=True, exist_ok=True)
    if not _DIR_FDS:
        _write_by_path(root, folders, name, data, limit=limit, exclusive=exclusive, folder_mode=folder_mode)
        return
    fd = os.open(root, _DIRECTORY_FLAGS)
    try:
        where = root
        for folder in folders:
            where = where / folder
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, folder_mode, dir_fd=fd)
            st = _lstat(folder, fd)
            if st is None or not stat.S_ISDIR(st.st_mode):
                raise UnsafeCachePath(f"{where} is {'missing' if st is None else _entry_kind(st)}, not a folder: "
                                      f"vitcg writes nothing through it")
            inner = os.open(folder, _DIRECTORY_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            os.close(fd)
            fd = inner
        _check_replaceable(where / name, _lstat(name, fd), limit)
        temporary = f".{name}.{secrets.token_hex(8)}"
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                      | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as handle:
                handle.write(data)
            if exclusive:
                os.link(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
            else:
                os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
                temporary = None
        finally:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=fd)
    finally:
        os.close(fd)


def _write_by_path(root: Path, folders: list[str], name: str, data: bytes, *, limit: int, exclusive: bool,
                   folder_mode: int) -> None:
    """:func:`write_cache_file` where folders cannot be opened relative to a descriptor (Windows): each folder is
    checked with ``lstat`` just before use."""
    where = root
    for folder in folders:
        where = where / folder
        with contextlib.suppress(FileExistsError):
            os.mkdir(where, folder_mode)
        st = _lstat(where)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise UnsafeCachePath(f"{where} is {'missing' if st is None else _entry_kind(st)}, not a folder: "
                                  f"vitcg writes nothing through it")
    path = where / name
    _check_replaceable(path, _lstat(path), limit)
    fd, temporary = tempfile.mkstemp(dir=where, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if exclusive:
            os.link(temporary, path)
        else:
            os.replace(temporary, path)
            temporary = None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


class NotRegularFile(Exception):
    """A path :func:`read_regular` will not read: a folder, FIFO, device or socket (``kind`` names which)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class OversizedFile(Exception):
    """A file over the limit :func:`read_regular` was given: ``size`` bytes by its ``fstat``, or None when it grew
    past the limit while being read."""

    def __init__(self, size: int | None, limit: int):
        super().__init__(f"{size if size is not None else 'more than'} bytes, over {limit}")
        self.size, self.limit = size, limit


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, for a message: ``a folder``, ``a FIFO``, ..."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


READ_STEP = 1 << 20
"""Bytes per read of :func:`read_regular`: memory grows with what the file holds, never past the limit plus one
step."""


def read_regular(path: str | os.PathLike, limit: int, *, follow_links: bool = True,
                 check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, read through one file descriptor whose
    ``fstat`` is checked first: what is checked is what is read. The file is opened without waiting (a FIFO without
    a writer would block the open forever) and refused before any read unless it is a regular file; ``check`` (the
    caller's own test of the ``fstat``: an owner, a mode) runs next; then it is read in steps of
    :data:`READ_STEP`, never whole, and refused once past ``limit`` (``/dev/zero`` never ends; a file may grow after
    its ``fstat``). ``follow_links=False`` refuses a symbolic link (OSError ``ELOOP`` where ``O_NOFOLLOW`` exists).

    Raises :class:`NotRegularFile`, :class:`OversizedFile`, whatever ``check`` raises, or OSError from the open or a
    read (FileNotFoundError when there is no such entry)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a folder with its own error
            raise NotRegularFile(file_kind(st.st_mode))
        if check is not None:
            check(st)
        if st.st_size > limit:
            raise OversizedFile(st.st_size, limit)
        handle = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with handle:
        chunks, total = [], 0
        while total <= limit:
            chunk = handle.read(min(READ_STEP, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise OversizedFile(None, limit)
        return b"".join(chunks)


MAX_CACHE_BYTES = 64 << 20
"""The largest bindings cache read (64 MiB): the packaged specs' facts take about 0.4 MB per transformers
version, so a file a hundred times larger is not one vitcg wrote, and reading it whole would cost memory."""

MAX_CACHE_DEPTH = 32
"""The deepest nesting accepted in a bindings cache: its entries nest 6 levels (config snapshots with sub-configs);
a file nested 100,000 levels deep once made ``vitcg validate`` fail with RecursionError."""


class UnusableCache(Exception):
    """A bindings cache file that is not read (the message says why): its answers are recomputed. ``replace``:
    whether the file may be one vitcg wrote (a regular file within the cap), so that fresh answers replace it; a
    link, FIFO, folder or device, or a file over the cap, is left alone."""

    def __init__(self, message: str, *, replace: bool = True):
        super().__init__(message)
        self.replace = replace


def _depth(document: Any, limit: int) -> int:
    """How deep ``document`` nests, counted without recursion and only up to ``limit + 1``."""
    deepest, stack = 0, [(document, 1)]
    while stack and deepest <= limit:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def read_cache(path: Path) -> dict[str, Any]:
    """The entries of the bindings cache ``path`` ({} when there is none). Raises :class:`UnusableCache` for a file
    that is not a regular file (a FIFO would block the read forever; a symbolic link is not followed), is over
    :data:`MAX_CACHE_BYTES`, is not JSON, nests deeper than :data:`MAX_CACHE_DEPTH` or is not a JSON object. Entries
    are checked one by one on lookup."""
    try:
        data = read_regular(path, MAX_CACHE_BYTES, follow_links=False)
    except FileNotFoundError:
        return {}
    except NotRegularFile:
        raise UnusableCache("it is not a regular file", replace=False) from None
    except OversizedFile as exc:
        raise UnusableCache(f"it holds {exc.size} bytes, over the limit of {MAX_CACHE_BYTES}" if exc.size is not None
                            else f"it holds more than {MAX_CACHE_BYTES} bytes", replace=False) from None
    except OSError as exc:  # ELOOP: a symbolic link, which O_NOFOLLOW refuses to open
        if os.path.islink(path):
            raise UnusableCache("it is a symbolic link", replace=False) from None
        raise UnusableCache(f"cannot read it: {exc.strerror}") from None
    too_deep = UnusableCache(f"it nests deeper than {MAX_CACHE_DEPTH} levels")
    try:
        entries = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise UnusableCache(f"not JSON ({exc})") from None
    if _depth(entries, MAX_CACHE_DEPTH) > MAX_CACHE_DEPTH:
        raise too_deep
    if not isinstance(entries, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(entries), "a number")
        raise UnusableCache(f"expected a JSON object, got {kind}")
    return entries


class Bindings:
    """Resolves classes and config snapshots, remembering the answers per transformers version."""

    def __init__(self, use_cache: bool = True, cache_dir: str | os.PathLike | None = None):
        self.version = transformers_version()
        self.use_cache = use_cache
        self.path = Path(cache_dir or cache_root()) / f"bindings-transformers-{self.version}.json"
        self._entries: dict[str, Any] | None = None
        self._dirty = False
        self._left_alone = False

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = {}
            if self.use_cache:
                try:
                    self._entries = read_cache(self.path)
                except UnusableCache as exc:
                    # The answers are recomputed as if there were no file, so the file changes no result.
                    if exc.replace:
                        warnings.warn(f"vitcg: ignoring the bindings cache {self.path}: {exc}; it will be rewritten",
                                      stacklevel=5)
                        self._dirty = True
                    else:  # not a file vitcg wrote: never replaced, so nothing is stored this time
                        warnings.warn(f"vitcg: ignoring the bindings cache {self.path}: {exc}; it is left alone "
                                      f"and nothing is cached", stacklevel=5)
                        self._left_alone = True
        return self._entries

    def _lookup(self, key: str, compute) -> dict[str, Any]:
        entries = self._load()
        if not _valid_entry(key, entries.get(key)):
            # Missing or malformed: a cache miss either way; the fresh answer replaces it on save.
            entries[key] = compute()
            self._dirty = True
        return entries[key]

    def check_class(self, path: str) -> dict[str, Any]:
        """``{"ok": True, "bases": [...]}`` or ``{"ok": False, "error": ...}``."""
        return self._lookup(f"class:{path}", lambda: _check_class(path))

    def check_method(self, path: str, method: str) -> dict[str, Any]:
        """``{"ok": True}`` when the class at ``path`` has a callable ``method``."""
        return self._lookup(f"method:{path}:{method}", lambda: {"ok": _has_method(path, method)})

    def check_signature(self, path: str, method: str) -> dict[str, Any]:
        """``{"ok": True, "required": [...], "accepted": [...], "var_keyword": bool}``: the parameters of
        ``method`` of the class at ``path``, ``self`` left out; or ``{"ok": False, "error": ...}``."""
        return self._lookup(f"signature:{path}:{method}", lambda: method_signature(path, method))

    def check_config(self, path: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """``{"ok": True, "snapshot": {...}}``, or ``ok: False`` with ``error`` or ``unknown_keys``."""
        key = f"config:{path}:{json.dumps(overrides, sort_keys=True)}"
        return self._lookup(key, lambda: _check_config(path, dict(overrides)))

    def save(self) -> None:
        """Write new answers to disk (atomically, never through a link or over a file vitcg did not write:
        :func:`write_cache_file`); failures to write are not errors, a path vitcg will not write one warning."""
        if not (self.use_cache and self._dirty and self._entries is not None) or self._left_alone:
            return
        try:
            write_cache_file(self.path.parent, self.path.name, json.dumps(self._entries, sort_keys=True).encode(),
                             limit=MAX_CACHE_BYTES, folder_mode=0o777)
            self._dirty = False
        except UnsafeCachePath as exc:
            warnings.warn(f"vitcg: not writing the bindings cache: {exc}", stacklevel=2)
        except OSError:
            pass


def bindings_for(choice: Bindings | None | bool, use_cache: bool) -> Bindings | None:
    """The bindings a loader checks specs with: a new :class:`Bindings` (cached unless ``use_cache`` is False) for
    True, none for False, else ``choice`` itself."""
    if choice is True:
        return Bindings(use_cache=use_cache)
    return None if choice is False else choice
