"""Safe YAML with positions: a spec file becomes plain data plus a map from YAML path to line and column.

PyYAML's ``compose`` keeps node marks; this module walks the node tree itself so that duplicate keys,
non-string keys, unsafe tags and alias-expansion bombs are errors instead of silent surprises. Plain scalars are
resolved as YAML 1.2's core schema says, not as PyYAML's YAML 1.1: ``1:30`` is a string (1.1: 90, base 60),
``yes``/``no``/``on``/``off`` are strings, ``010`` is ten and ``0o10`` eight, ``1e3`` is a number. Control
characters (written as escapes in double-quoted strings; the reader refuses them raw) are refused in every
string but tab, line feed and carriage return.
"""

from __future__ import annotations

import errno
import math
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import SHOWN_CHARS, Diagnostic, shown
from .bindings import NotRegularFile, OversizedFile, read_regular

MAX_FILE_BYTES = 1024 * 1024
"""Largest spec file read: real specs are a few KiB, and every later bound is cheap within this one."""
MAX_NODES = 20_000
"""Nodes visited while converting one file; aliases count each time they are expanded."""
MAX_DEPTH = 64
"""Deepest collection nesting. Checked on the parser's events before composing: libyaml's composer recurses
in C, so 25,000 nested ``[`` overflow its stack and kill the process before any Python check can run."""


class _CoreResolver(yaml.resolver.BaseResolver):
    """YAML 1.2's core schema for plain scalars (section 10.3.2); anything else is a string."""


for _tag, _pattern, _first in (
    ("null", r"~|null|Null|NULL|", "~nN"),
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
     "-+.0123456789"),
    ("merge", r"<<", "<"),  # not core YAML 1.2: recognized only to be refused with a clear message
):
    _CoreResolver.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"),
                                        [*_first, ""] if _tag == "null" else list(_first))

if hasattr(yaml, "CSafeLoader"):  # libyaml's parser (5x faster); nodes and marks are the same either way
    class _COMPOSER(yaml.cyaml.CParser, yaml.constructor.SafeConstructor, _CoreResolver):
        def __init__(self, stream: str):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            _CoreResolver.__init__(self)
else:  # pragma: no cover - PyYAML built without libyaml
    class _COMPOSER(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                    yaml.constructor.SafeConstructor, _CoreResolver):
        def __init__(self, stream: str):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            _CoreResolver.__init__(self)


def _core_int(text: str) -> int:
    """A YAML 1.2 core integer: decimal (leading zeros allowed), ``0o`` octal or ``0x`` hexadecimal."""
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _control(text: str) -> str | None:
    """The first control character of ``text`` other than tab, line feed and carriage return, or None."""
    return next((c for c in text if c not in "\t\n\r" and unicodedata.category(c) == "Cc"), None)

Path_ = tuple  # a YAML path: a tuple of str keys and int indices


def format_path(path: Path_) -> str:
    """``("buffers", 0, "shape")`` -> ``$.buffers[0].shape``; a key that is not a plain word is quoted and cut:
    ``$.tests.runner_kwargs['a b']``."""
    text = "$"
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part and part.isprintable() and len(part) <= SHOWN_CHARS and not any(c in part for c in " .[]'\""):
            text += f".{part}"
        else:
            text += f"[{shown(part)}]"
    return text


@dataclass(frozen=True)
class Position:
    line: int
    """1-based."""
    col: int
    """1-based."""


@dataclass
class LoadedYaml:
    """The data of one spec and where each node of it stands: in its own file, or (after
    :mod:`.resolve`) in a parent it extends, its harness file, or a default of the spec language."""

    file: str
    data: Any
    values: dict[Path_, Position] = field(default_factory=dict)
    """Position of the value at each path."""
    keys: dict[Path_, Position] = field(default_factory=dict)
    """Position of the mapping key that introduces each path."""
    styles: dict[Path_, str | None] = field(default_factory=dict)
    """Scalar style at each path (None for plain scalars, '"' or "'" when quoted)."""
    origins: dict[Path_, str] = field(default_factory=dict)
    """The file of each path whose value was written in another file than :attr:`file`."""
    defaults: dict[Path_, str] = field(default_factory=dict)
    """Paths whose value no file wrote: what supplied it (``the 'tiles' style's default``)."""
    own_paths: dict[Path_, Path_] = field(default_factory=dict)
    """The path each value has in the file that wrote it, where a merge placed it elsewhere (a child's first
    buffer at ``buffers[5]`` of the merged spec is ``buffers[0]`` of its file): diagnostics show that one, the path
    the user finds in the file they open. Paths not listed (a file's own, as loaded) are their own."""
    removed: dict[tuple[str, str], tuple[str, Position]] = field(default_factory=dict)
    """What a ``remove`` of an inheriting spec took out, and the file and position of the entry that did:
    ``("buffer", ARG)`` for a buffer passed as ``ARG``, ``("key", DOTTED)`` for an entry of ``remove:``. A check
    that misses it points there, at the line the user must change."""

    def locate(self, path: Path_, *, key: bool = False) -> tuple[Path_, Position]:
        """The closest path with a known position at or above ``path`` (its key with ``key=True``), and that
        position."""
        table = self.keys if key else self.values
        probe = tuple(path)
        while probe:
            if probe in table:
                return probe, table[probe]
            if probe in self.values:
                return probe, self.values[probe]
            probe = probe[:-1]
        return (), self.values.get((), Position(1, 1))

    def position(self, path: Path_, *, key: bool = False) -> Position:
        """The closest known position for ``path`` (walking up to the parent when needed)."""
        return self.locate(path, key=key)[1]

    def file_of(self, path: Path_) -> str:
        """The file that wrote the value at ``path`` (or the closest value above it)."""
        probe, _ = self.locate(path)
        return self.origins.get(probe, self.file)

    def own_path(self, path: Path_) -> Path_:
        """``path`` as written in the file that wrote its value (:attr:`own_paths`; below a listed path, the rest
        follows it)."""
        path = tuple(path)
        for n in range(len(path), 0, -1):
            own = self.own_paths.get(path[:n])
            if own is not None:
                return own + path[n:]
        return path

    def where(self, path: Path_, seen_from: str) -> str:
        """The value at ``path`` named for a message printed at a line of ``seen_from``: its own path and line
        (``buffers[1] (line 12)``), its file too where another file wrote it (``buffers[1] of parent.yaml:12``), or
        what supplied it and the line that chose that (a default)."""
        own = format_path(self.own_path(path))[2:]
        probe, pos = self.locate(path)
        file = self.origins.get(probe, self.file)
        at = f"line {pos.line}" if file == seen_from else f"{file}:{pos.line}"
        source = next((self.defaults[p] for p in _prefixes(probe) if p in self.defaults), None)
        if source is not None:
            return f"{source} ({at} chose it)"
        return f"{own} ({at})" if file == seen_from else f"{own} of {at}"

    def diagnostic(self, path: Path_, message: str, *, hint: str | None = None, code: str = "schema",
                   key: bool = False, col_offset: int = 0) -> Diagnostic:
        probe, pos = self.locate(path, key=key)
        return self.at(probe, pos, path, message, hint, code, col_offset)

    def at_removal(self, removal: tuple[str, Position], path: Path_, message: str, hint: str, code: str) -> Diagnostic:
        """A diagnostic for ``path`` at the ``remove`` entry that took away what it misses (one of :attr:`removed`:
        that entry's file and position), the message ending in ``(removed here)``."""
        file, pos = removal
        return Diagnostic(file, pos.line, pos.col, format_path(path), f"{message} (removed here)", hint, code,
                          None if file == self.file else self.file)

    def at(self, probe: Path_, pos: Position, path: Path_, message: str, hint: str | None, code: str,
           col_offset: int = 0) -> Diagnostic:
        """A diagnostic for ``path`` located at ``pos`` of the value at ``probe``: in the file that wrote it, and
        naming the default that supplied it, if one did."""
        file = self.origins.get(probe, self.file)
        source = next((self.defaults[p] for p in _prefixes(probe) if p in self.defaults), None)
        if source is not None:
            hint = f"{hint}; " if hint else ""
            hint += f"this value is {source}: write {format_path(path)[2:] or 'it'} in the spec to replace it"
        return Diagnostic(file, pos.line, pos.col + col_offset, format_path(self.own_path(path)), message, hint,
                          code, None if file == self.file else self.file)


def _prefixes(path: Path_):
    """``path`` and each path above it, longest first."""
    return (path[:n] for n in range(len(path), -1, -1))


_SEXAGESIMAL = re.compile(r"^([-+]?)([0-9][0-9_]*(?::[0-5]?[0-9])+)(\.[0-9_]*)?$")
"""YAML 1.1's base-60 numbers (``1:30`` is 90, ``1:30.5`` is 90.5); YAML 1.2 reads them as strings."""


def sexagesimal_hint(loaded: LoadedYaml, path: Path_, value: Any) -> str | None:
    """A hint for a plain scalar at ``path`` that YAML 1.1 would have read as a base-60 number, else None.

    Written unquoted, ``1:30`` was 90 under PyYAML's YAML 1.1; vitcg reads YAML 1.2's core schema, where it is the
    string '1:30'. A quoted one was meant as a string, so it gets no hint."""
    if not isinstance(value, str) or path not in loaded.styles or loaded.styles[path] is not None:
        return None
    found = _SEXAGESIMAL.match(value)
    if found is None or (found.group(3) is None and found.group(2).startswith("0")):
        return None  # YAML 1.1's sexagesimal integers start with 1-9
    sign, digits, fraction = found.groups()
    number = 0
    for part in digits.replace("_", "").split(":"):
        number = number * 60 + int(part)
    meant = ("-" if sign == "-" else "") + str(number) + (fraction or "").replace("_", "").rstrip(".")
    return (f"YAML 1.1 read {value} as a base-60 number ({meant}); vitcg reads YAML 1.2, where it is the string "
            f"{value!r}: write {meant} if that is meant")


def _too_big(size: int) -> str:
    return f"file is {size} bytes; specs are limited to 1 MiB ({MAX_FILE_BYTES} bytes)"


def _too_deep(text: str) -> tuple[int, int] | None:
    """1-based line and column of the first collection nested deeper than :data:`MAX_DEPTH`, else None.

    Reads the event stream, which the parser builds with its own stack (it never recurses), so any input is
    safe here; only composing nodes recurses. Malformed YAML stops the scan: composing reports the same
    error, at a point the scan has seen to be shallow enough. Newer libyaml builds refuse nesting past 1000
    levels while scanning ahead, before the event at depth 65 is seen; such a text is scanned again with
    PyYAML's pure-Python parser, which has no such limit, to find where the bound is crossed.
    """
    try:
        return _first_too_deep(yaml.parse(text, Loader=_COMPOSER))
    except yaml.YAMLError:
        pass
    try:
        return _first_too_deep(yaml.parse(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None


def _first_too_deep(events) -> tuple[int, int] | None:
    depth = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            if depth > MAX_DEPTH:  # the same rule as the converter's: a collection at depth 65 is too deep
                return event.start_mark.line + 1, event.start_mark.column + 1
            depth += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


class _LoadFailure(Exception):
    def __init__(self, diagnostic: Diagnostic):
        self.diagnostic = diagnostic


class _ComposeFailure(Exception):
    def __init__(self, message: str, where: tuple[int, int] = (1, 1), hint: str | None = None):
        self.message, self.where, self.hint = message, where, hint


def _compose(text: str) -> yaml.Node | None:
    """The YAML node tree of ``text``; raises _ComposeFailure saying what is malformed and where (1-based)."""
    try:
        return yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise _ComposeFailure(f"invalid YAML: {problem}",
                              (1, 1) if mark is None else (mark.line + 1, mark.column + 1)) from None
    except yaml.reader.ReaderError as exc:
        # No mark, and str(exc) adds a second line naming PyYAML's buffer: locate it from the position.
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - text.rfind("\n", 0, exc.position)
        raise _ComposeFailure(f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason}",
                              (line, col), "remove it, or write it as an escape inside a double-quoted string") from None
    except yaml.YAMLError as exc:
        raise _ComposeFailure(f"invalid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise _ComposeFailure("YAML is nested too deeply") from None


def load_text(text: str, file: str) -> tuple[LoadedYaml | None, list[Diagnostic]]:
    """Parse ``text`` as one YAML document whose top level is a mapping.

    Returns the loaded data, or None and the diagnostics that explain why not.
    """
    def fail(message: str, line: int = 1, col: int = 1, hint: str | None = None) -> tuple[None, list[Diagnostic]]:
        return None, [Diagnostic(file, line, col, "$", message, hint, "yaml")]

    if "\x00" in text:
        return fail("file contains a NUL byte; a spec must be UTF-8 text")
    # Characters never outnumber UTF-8 bytes: encode only texts that might be within the bound.
    size = len(text) if len(text) > MAX_FILE_BYTES else len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_FILE_BYTES:
        return fail(_too_big(size), 0, 0)
    deep = _too_deep(text)
    if deep is not None:
        return fail(f"YAML is nested deeper than {MAX_DEPTH} levels", *deep,
                    hint="a spec needs a few levels; look for unclosed [ or { brackets, or runaway indentation")
    try:
        root = _compose(text)
    except _ComposeFailure as failure:
        return fail(failure.message, *failure.where, hint=failure.hint)
    if root is None:
        return fail("file is empty; a spec is a YAML mapping",
                    hint="start from an existing file in vitcg/specs/ or from `vitcg new`")
    loaded = LoadedYaml(file, None)
    if not isinstance(root, yaml.MappingNode):
        pos = _pos(root)
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a scalar"
        return fail(f"the top level of a spec must be a mapping, not {kind}", pos.line, pos.col)
    converter = _Converter(loaded)
    try:
        loaded.data = converter.convert(root, ())
    except _LoadFailure as failure:
        return None, [failure.diagnostic]
    except RecursionError:
        return fail("YAML is nested too deeply")
    if converter.problems:
        return None, converter.problems
    return loaded, []


def load_file(path: str | Path, display: str | None = None, *,
              folder: str | Path | None = None) -> tuple[LoadedYaml | None, list[Diagnostic]]:
    """Read and parse one spec file (a spec, a parent or a harness). Refused with a diagnostic, before any byte is
    read: a link whose target is outside ``folder`` (default: the folder holding ``path``), named by the link and
    never by what it points at (a link to a credentials file would otherwise be echoed key by key); anything but a
    regular file (a FIFO, folder or device: opened without waiting); a file over 1 MiB; then a file that is not
    UTF-8."""
    display = display or str(path)
    path = Path(path)
    try:
        raw = _read_spec_file(path, Path(folder) if folder is not None else path.parent)
    except _Unreadable as exc:
        return None, [Diagnostic(display, 0, 0, "$", exc.message, exc.hint, "yaml")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, [Diagnostic(display, line, 1, "$", "file is not valid UTF-8", None, "yaml")]
    return load_text(text, display)


class _Unreadable(Exception):
    """Why a spec file was not read: the message and hint of its diagnostic."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


def _read_spec_file(path: Path, home: Path) -> bytes:
    """The bytes of the spec file ``path`` whose folder is ``home``; raises :class:`_Unreadable` when
    :func:`load_file` refuses it."""
    target = _link_target(path)
    if target is not None and not _inside(target, home):
        raise _Unreadable("the file is a link to a file outside its folder",
                          "vitcg reads a spec, its parent and its harness only inside the spec's folder: copy the "
                          "file there instead of linking to it")
    try:
        return read_regular(path, MAX_FILE_BYTES, check=None if target is None else _is(target))
    except NotRegularFile as exc:
        raise _Unreadable(f"the file is {exc.kind}, not a regular file",
                          "a spec, a parent and a harness are regular files") from None
    except OversizedFile as exc:
        raise _Unreadable(_too_big(exc.size) if exc.size is not None
                          else _too_big(MAX_FILE_BYTES + 1) + " (or more)") from None
    except FileNotFoundError as exc:
        if target is not None:  # the link is there (discovery found it), what it names is not
            raise _Unreadable(f"the file is a link to {shown(os.readlink(path))}, which does not exist",
                              "a spec, a parent and a harness are regular files: put the file there, or delete "
                              "the link") from None
        raise _Unreadable(f"cannot read file: {exc.strerror or exc}") from None
    except OSError as exc:
        raise _Unreadable(f"cannot read file: {exc.strerror or exc}") from None


def _link_target(path: Path) -> Path | None:
    """Where the link ``path`` ends, every link on the way followed; None when ``path`` is not a link."""
    try:
        return path.resolve() if path.is_symlink() else None
    except (OSError, RuntimeError):  # a loop of links: the read reports it
        return None


def _inside(target: Path, folder: Path) -> bool:
    try:
        return target.is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def _is(target: Path):
    """A ``read_regular`` check that the file opened is ``target``: a link switched after the folder check is
    refused, not read."""
    def check(opened: os.stat_result) -> None:
        try:
            expected = target.stat()
        except OSError:
            expected = None
        if expected is None or (expected.st_dev, expected.st_ino) != (opened.st_dev, opened.st_ino):
            raise OSError(errno.ESTALE, "the link changed while it was read")
    return check


def _pos(node: yaml.Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


_SAFE_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:map",
}


class _Converter:
    def __init__(self, loaded: LoadedYaml):
        self.loaded = loaded
        self.visited = 0
        self.problems: list[Diagnostic] = []
        """Errors that do not stop the walk (duplicate or non-string keys): all of them are reported."""
        self.constructor = yaml.SafeLoader("")

    def error(self, node: yaml.Node, path: Path_, message: str, hint: str | None = None) -> _LoadFailure:
        pos = _pos(node)
        return _LoadFailure(Diagnostic(self.loaded.file, pos.line, pos.col, format_path(path), message, hint, "yaml"))

    def convert(self, node: yaml.Node, path: Path_, depth: int = 0) -> Any:
        self.enter(node, path, depth)
        self.loaded.values.setdefault(path, _pos(node))
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        return self.scalar(node, path)

    def enter(self, node: yaml.Node, path: Path_, depth: int) -> None:
        """Count the node; raise when the document has too many nodes, nests too deep or uses a tag specs do not."""
        self.visited += 1
        if self.visited > MAX_NODES:
            raise self.error(node, path, f"more than {MAX_NODES} YAML nodes (anchors and aliases expand too far)",
                             "a spec needs no aliases; write values out")
        if depth > MAX_DEPTH:
            raise self.error(node, path, f"YAML is nested deeper than {MAX_DEPTH} levels")
        if node.tag not in _SAFE_TAGS:
            raise self.error(node, path, f"unsupported YAML tag {node.tag!r}", "specs use plain YAML values only")

    def scalar(self, node: yaml.Node, path: Path_) -> Any:
        """The scalar's value; a control character in a string or a number that is not finite is a problem."""
        self.loaded.styles.setdefault(path, node.style or None)
        try:
            if node.tag == "tag:yaml.org,2002:int" and not node.style:
                value = _core_int(node.value)
            else:
                value = self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise self.error(node, path, f"invalid value: {exc}") from None
        if isinstance(value, str) and (bad := _control(value)) is not None:
            self.problems.append(self.error(node, path, f"string holds the control character U+{ord(bad):04X}",
                                            "remove it; specs hold printable text (tabs and newlines are fine)"
                                            ).diagnostic)
        if isinstance(value, float) and not math.isfinite(value):
            # Neither JSON nor a Python literal can hold it: registry/ would render Infinity, a NameError.
            kind = "NaN" if value != value else "infinite"
            self.problems.append(self.error(node, path, f"{node.value!r} is {kind}; numbers in a spec must be finite",
                                            "write a finite number").diagnostic)
        return value

    def mapping(self, node: yaml.MappingNode, path: Path_, depth: int) -> dict:
        result: dict[str, Any] = {}
        first_seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self.problems.append(self.error(key_node, path, "YAML merge keys ('<<') are not supported",
                                                "write the keys out").diagnostic)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "a " + key_node.id
                self.problems.append(self.error(key_node, path, f"mapping keys must be strings, got {shown!r}",
                                                "quote the key").diagnostic)
                continue
            key = key_node.value
            if (bad := _control(key)) is not None:
                self.problems.append(self.error(key_node, path, f"key holds the control character U+{ord(bad):04X}",
                                                "remove it").diagnostic)
                continue
            if key in first_seen:
                first = _pos(first_seen[key])
                self.problems.append(self.error(
                    key_node, path + (key,), f"duplicate key {key!r} (first defined at line {first.line})",
                    "remove one of the two entries").diagnostic)
                continue
            first_seen[key] = key_node
            self.loaded.keys[path + (key,)] = _pos(key_node)
            result[key] = self.convert(value_node, path + (key,), depth + 1)
        return result
