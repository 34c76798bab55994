"""Resolution: one spec file -> the whole spec it means, each value still pointing at the file and line that wrote it.

Three sources are merged under the file's own text, weakest first:

1. the defaults of the spec language: the attention style's usual ``items``, ``budget`` and (for a spec without
   ``graph_scope``) standard ``buffers`` (``catalogue.STYLE_DEFAULTS``; a buffer the spec writes under another
   name for the same provider replaces that provider's default), and the harness's usual ``budgets`` and
   ``max_model_len`` (``catalogue.TESTS_DEFAULTS``);
2. the spec it ``extends`` (by name: ``NAME.yaml`` beside the file, else in the spec folders), resolved the same
   way, recursively;
3. the file itself, with its harness: the ``tests`` mapping, written in the file or in ``NAME.tests.yaml`` (or
   ``NAME.tests.yml``) beside it.

Merging: mappings merge key by key; ``buffers`` merge by ``name`` (a buffer of an inherited name merges into the
inherited one, ``remove: true`` drops it, a new name is appended); any other list, and every scalar, is replaced.
Checks run on the result (:mod:`.checks`); ``vitcg validate --resolved`` prints it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, shown, suggest
from . import catalogue as cat
from .lets import expand as expand_lets
from .loader import LoadedYaml, Path_, Position, load_file, load_text

HARNESS_SUFFIXES = (".tests.yaml", ".tests.yml")
"""``NAME.tests.yaml`` (or ``NAME.tests.yml``) beside ``NAME.yaml`` holds that spec's harness: the mapping its
``tests`` key would hold."""
MAX_CHAIN = 8
"""Longest ``extends`` chain: a family needs two or three levels."""
_EXCLUSIVE = ("shape", "value")
"""Buffer keys of which a spec holds one: writing one drops the other inherited."""


def harness_files(spec_file: Path) -> list[Path]:
    """The harness files of ``spec_file`` that are there (``NAME.tests.yaml``, ``NAME.tests.yml``), whatever they
    are: a FIFO, a folder or a dangling link is found too, and loading it says what it is."""
    stem = spec_file.name.rsplit(".", 1)[0]
    return [p for p in (spec_file.with_name(stem + s) for s in HARNESS_SUFFIXES) if _there(p)]


def _there(path: Path) -> bool:
    """Whether ``path`` names an entry of its folder, a dangling link included."""
    return os.path.lexists(path)


def is_harness_file(path: Path) -> bool:
    """Whether ``path`` is named as a harness file (discovery does not load it as a spec of its own)."""
    return path.name.endswith(HARNESS_SUFFIXES)


class _Copy:
    """Builds a merged :class:`LoadedYaml`: each value placed in it records where it came from."""

    def __init__(self, file: str):
        self.out = LoadedYaml(file, None)

    def place(self, source: LoadedYaml, src: Path_, dst: Path_, own_root: Path_ = ()) -> Any:
        """The value of ``source`` at ``src``, copied to ``dst`` with the positions of its whole subtree, and the path
        each value has in its own file (under ``own_root``: ``tests`` for a harness file's values)."""
        for path in {*source.values, *source.keys}:
            if path[:len(src)] == src:
                self.out.own_paths[dst + path[len(src):]] = own_root + source.own_path(path)
        for table, target in ((source.values, self.out.values), (source.keys, self.out.keys),
                              (source.styles, self.out.styles)):
            for path, value in table.items():
                if path[:len(src)] == src:
                    target[dst + path[len(src):]] = value
        for path in list(source.values):
            if path[:len(src)] == src:
                moved = dst + path[len(src):]
                file = source.origins.get(path, source.file)
                if file != self.out.file:
                    self.out.origins[moved] = file
                else:
                    self.out.origins.pop(moved, None)
        for path, label in source.defaults.items():
            if path[:len(src)] == src:
                self.out.defaults[dst + path[len(src):]] = label
        return _copy(_at(source.data, src))

    def mark(self, source: LoadedYaml, src: Path_, dst: Path_) -> None:
        """Record the position of the node at ``src`` (not its subtree) for ``dst``, and its own path."""
        self.out.own_paths[dst] = source.own_path(src)
        if src in source.values:
            self.out.values[dst] = source.values[src]
            file = source.origins.get(src, source.file)
            if file != self.out.file:
                self.out.origins[dst] = file
        if src in source.keys:
            self.out.keys[dst] = source.keys[src]
        if src in source.defaults:
            self.out.defaults[dst] = source.defaults[src]


def _at(data: Any, path: Path_) -> Any:
    for part in path:
        data = data[part]
    return data


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class _Merge:
    """``over`` merged onto ``base`` into a fresh :class:`LoadedYaml` named after ``over``'s file."""

    def __init__(self, base: LoadedYaml, over: LoadedYaml):
        self.base, self.over = base, over
        self.copy = _Copy(over.file)
        self.problems: list[Diagnostic] = []

    def run(self) -> tuple[LoadedYaml, list[Diagnostic]]:
        self.copy.out.removed = {**self.base.removed, **self.over.removed}
        self.copy.out.data = self.node((), (), ())
        return self.copy.out, self.problems

    def node(self, b: Path_ | None, o: Path_ | None, dst: Path_) -> Any:
        if o is None:
            return self.copy.place(self.base, b, dst)
        over = _at(self.over.data, o)
        base = _at(self.base.data, b) if b is not None else None
        if isinstance(base, dict) and isinstance(over, dict):
            self.copy.mark(self.over, o, dst)
            return {k: self.node(b + (k,) if k in base else None, o + (k,) if k in over else None, dst + (k,))
                    for k in [*base, *(k for k in over if k not in base)]}
        if dst == ("buffers",) and isinstance(base, list) and isinstance(over, list):
            self.copy.mark(self.over, o, dst)
            return self.buffers(b, o, base, over)
        return self.copy.place(self.over, o, dst)

    def buffers(self, b: Path_, o: Path_, base: list, over: list) -> list:
        """Buffers merged by name: inherited ones in their order (merged, or dropped by ``remove: true``), then
        the new ones in the file's order."""
        named: dict[str, int] = {}
        for j, e in enumerate(over):
            name = _name(e)
            if name is not None and name in named:  # checked here: merging by name would hide it
                self.problems.append(self.over.diagnostic(o + (j, "name"), f"buffer name {name!r} is already used "
                                                          f"by buffers[{named[name]}]", code="semantic"))
            elif name is not None:
                named[name] = j
        inherited = {_name(e) for e in base} - {None}
        out: list = []
        for i, entry in enumerate(base):
            j = named.get(_name(entry))
            if j is None:
                out.append(self.copy.place(self.base, b + (i,), ("buffers", len(out))))
            elif not self.removed(o + (j,), over[j]):
                out.append(self.entry(b + (i,), o + (j,), ("buffers", len(out))))
            else:
                arg = entry.get("arg", entry.get("name"))
                at = o + (j, "remove")
                self.copy.out.removed[("buffer", str(arg))] = (self.over.file_of(at), self.over.position(at, key=True))
        for j, entry in enumerate(over):
            if _name(entry) in inherited:
                continue
            if isinstance(entry, dict) and "remove" in entry:
                self.problems.append(self.over.diagnostic(
                    o + (j, "remove"), f"no inherited buffer named {shown(entry.get('name'))} to remove",
                    hint="remove: true drops a buffer the spec would inherit (from its parent or its attention "
                         "style); inherited here: " + (", ".join(sorted(map(str, inherited))) or "none"),
                    code="extends", key=True))
                continue
            out.append(self.copy.place(self.over, o + (j,), ("buffers", len(out))))
        return out

    def removed(self, at: Path_, entry: dict) -> bool:
        """Whether ``entry`` says ``remove: true`` (alone with its name, else a diagnostic)."""
        if "remove" not in entry:
            return False
        extra = sorted(set(entry) - {"name", "remove"})
        if entry["remove"] is not True or extra:
            self.problems.append(self.over.diagnostic(
                at + ("remove",), "remove takes the value true and stands alone with the buffer's name"
                + (f" (found also: {', '.join(extra)})" if extra else ""), code="extends", key=True))
        return True

    def entry(self, b: Path_, o: Path_, dst: Path_) -> dict:
        """One buffer merged key by key; writing ``shape`` drops an inherited ``value`` and the other way round."""
        base, over = _at(self.base.data, b), _at(self.over.data, o)
        self.copy.mark(self.over, o, dst)
        keys = [k for k in base if not (k in _EXCLUSIVE and k not in over and any(x in over for x in _EXCLUSIVE))]
        return {k: self.node(b + (k,) if k in base else None, o + (k,) if k in over else None, dst + (k,))
                for k in [*keys, *(k for k in over if k not in base)]}


def _name(entry: Any) -> str | None:
    """A buffer entry's name, where it has one that is a string (a hostile spec may write anything there)."""
    name = entry.get("name") if isinstance(entry, dict) else None
    return name if isinstance(name, str) else None


def merge(base: LoadedYaml, over: LoadedYaml) -> tuple[LoadedYaml, list[Diagnostic]]:
    """``over`` merged onto ``base``; diagnostics for buffer removals that do not apply."""
    return _Merge(base, over).run()


def _synthetic(data: dict, anchor: LoadedYaml, at: Path_, label: str, root: Path_ = ()) -> LoadedYaml:
    """``data`` placed at ``root`` as if written at ``anchor``'s position of ``at``, every value labelled as
    supplied by ``label``."""
    path, pos = anchor.locate(at)
    file = anchor.origins.get(path, anchor.file)
    out = LoadedYaml(anchor.file, _nest(root, _copy(data)))

    def walk(value: Any, where: Path_) -> None:
        out.values[where] = pos
        if len(where) > len(root):
            out.defaults[where] = label
        if where:
            out.keys[where] = pos
        if file != anchor.file:
            out.origins[where] = file
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, where + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, where + (i,))

    walk(out.data, ())
    return out


def _not_provided(defaults: list[dict], written: list) -> list[dict]:
    """The default buffers whose provider no written buffer of another name fills: a spec that writes its own
    buffer for a provider (``target_sizes`` for ``grid``) replaces the default of that provider."""
    taken = {(e.get("provider"), e.get("name")) for e in written
             if isinstance(e, dict) and isinstance(e.get("provider"), str) and isinstance(e.get("name"), str)}
    return [d for d in defaults if not any(p == d["provider"] and n != d["name"] for p, n in taken)]


def _nest(root: Path_, data: dict) -> dict:
    for key in reversed(root):
        data = {key: data}
    return data


def language_defaults(spec: LoadedYaml) -> LoadedYaml | None:
    """The spec language's defaults for ``spec`` (one that extends no other), as a LoadedYaml anchored at the line
    that chose them; None when none apply."""
    data = spec.data
    attention = data.get("attention")
    style = attention.get("style") if isinstance(attention, dict) else None
    layers: list[LoadedYaml] = []
    if isinstance(style, str) and style in cat.STYLE_DEFAULTS:
        defaults = dict(cat.STYLE_DEFAULTS[style])
        if "graph_scope" in data:
            defaults.pop("buffers", None)
        elif isinstance(data.get("buffers"), list):
            defaults["buffers"] = _not_provided(defaults["buffers"], data["buffers"])
        if defaults:
            layers.append(_synthetic(defaults, spec, ("attention", "style"), f"the {style!r} style's default"))
    if isinstance(data.get("tests"), dict):
        layers.append(_synthetic(dict(cat.TESTS_DEFAULTS), spec, ("tests",), "the harness's default",
                                 ("tests",)))
    if not layers:
        return None
    result = layers[0]
    for layer in layers[1:]:
        result, _ = merge(result, layer)
    return result


Finder = Callable[[str, Path | None], Path | None]
"""Where the spec a name refers to lives: ``(name, folder of the spec that names it)`` -> its file, or None. A finder
may also have ``names(folder)``: the names it could find, for a did-you-mean."""


class Resolver:
    """Resolves spec files (each once): their parents, harness files and defaults. ``find`` locates a parent by
    name; ``check`` tells whether a parent is valid (its diagnostics, a parent being checked alone)."""

    def __init__(self, find: Finder, check: Callable[[LoadedYaml], list[Diagnostic]] | None = None):
        self.find = find
        self.check = check
        self._done: dict[Path, tuple[LoadedYaml | None, list[Diagnostic]]] = {}
        self._cycles: dict[Path, tuple[Path, ...]] = {}
        """Each file found on an ``extends`` cycle: the cycle, starting at that file (an intrinsic fact, whichever
        file was resolved first)."""
        self._depth: dict[Path, int] = {}
        """How many specs the chain of each resolved file holds, itself included (1 when it extends none)."""

    def resolve_file(self, path: Path, display: str | None = None) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """The resolved spec of the file at ``path``, or None and the diagnostics that explain why not."""
        return self._file(Path(path), display or str(path), ())

    def resolve_text(self, text: str, file: str) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        loaded, problems = load_text(text, file)
        if loaded is None:
            return None, problems
        return self._loaded(loaded, None, (None,))  # None: the text, first in its chain

    def _file(self, path: Path, display: str, chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """``path`` resolved, from the cache when it was before: a result depends on the file and its ancestors
        only, never on ``chain`` (the files whose resolution led here), which serves to find cycles and bounds the
        recursion (:class:`_ChainTooLong`, never cached)."""
        key = path.resolve()
        if key in self._done:
            return self._done[key]
        loaded, problems = load_file(path, display)
        if loaded is not None:
            loaded, problems = self._harness(loaded, path)
        if loaded is not None:
            loaded, problems = self._loaded(loaded, path.parent, (*chain, key))
        self._done[key] = (loaded, problems)
        return loaded, problems

    def _harness(self, loaded: LoadedYaml, path: Path) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """``loaded`` with its ``NAME.tests.yaml`` as its ``tests`` mapping, when that file exists."""
        found = harness_files(path)
        if not found:
            return loaded, []
        if len(found) > 1:
            return None, [loaded.diagnostic((), f"the harness is written twice: in {found[0].name} and {found[1].name}",
                                            hint="keep one of the two files", code="extends")]
        sibling = found[0]
        display = str(Path(loaded.file).with_name(sibling.name))
        harness, problems = load_file(sibling, display)
        if harness is None:
            return None, [_via(d, loaded.file) for d in problems]
        if "tests" in loaded.data:
            return None, [loaded.diagnostic(("tests",), f"the harness is written twice: here and in {display}",
                                            hint="keep one: the tests section or the harness file",
                                            code="extends", key=True)]
        grafted = _Copy(loaded.file)
        grafted.out.data = grafted.place(loaded, (), ())
        tests = grafted.place(harness, (), ("tests",), ("tests",))  # shown as tests.KEY, as written inline
        grafted.out.keys[("tests",)] = Position(1, 1)  # line 1 of the harness file, its origin
        grafted.out.data["tests"] = tests
        return grafted.out, []

    def _loaded(self, loaded: LoadedYaml, folder: Path | None,
                chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """``loaded`` with its own ``let`` names written out (:mod:`.lets`), on its parent (when it extends one) and
        the language's defaults, ``extends`` taken out."""
        if "extends" in loaded.data:  # the parent holds the defaults already
            parent, problems = self._parent(loaded, folder, chain)
            if parent is None:
                return None, problems
            problems = expand_lets(loaded, parent.data)
            if problems:
                return None, problems
            parent, problems = _removed(parent, loaded)
            if problems:
                return None, problems
            merged, problems = merge(parent, _without(loaded, "extends", "remove"))
        elif "remove" in loaded.data:
            return None, [loaded.diagnostic(("remove",), "remove drops keys a spec inherits; this spec extends none",
                                            hint="add extends: PARENT, or delete the remove list", code="extends",
                                            key=True)]
        else:
            problems = expand_lets(loaded)
            if problems:
                return None, problems
            defaults = language_defaults(loaded)
            merged, problems = merge(defaults, loaded) if defaults is not None else (loaded, [])
        return (None, problems) if problems else (merged, [])

    def _parent(self, loaded: LoadedYaml, folder: Path | None,
                chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """The resolved parent of ``loaded`` (the last of ``chain``), or None and the diagnostics at its
        ``extends`` line."""
        name = loaded.data["extends"]

        def fail(message: str, hint: str | None = None) -> tuple[None, list[Diagnostic]]:
            return None, [loaded.diagnostic(("extends",), message, hint=hint, code="extends")]

        if not isinstance(name, str) or not name:
            return fail(f"extends names one spec, not {shown(name)}", "write the parent spec's name: extends: qwen2_vl")
        if "name" not in loaded.data:
            return fail("a spec that extends another states its own name", f"add name: (not {name!r})")
        path = self.find(name, folder)
        if path is None:
            known = getattr(self.find, "names", lambda _: [])(folder)
            return fail(f"no spec named {name!r} to extend", suggest(name, known) or
                        "a parent is NAME.yaml beside this file or in the spec folders (vitcg/specs, $VITCG_SPECS_DIR)")
        key = path.resolve()
        if key in chain:
            cycle = chain[chain.index(key):]
            for i, member in enumerate(cycle):
                self._cycles[member] = cycle[i:] + cycle[:i]
            return fail(*_cycle(self._cycles[chain[-1]]))
        if len(chain) >= MAX_CHAIN:  # the first of the chain has too many ancestors; this file may have few
            raise _ChainTooLong((*chain, key))
        try:
            parent, problems = self._file(path, str(path), chain)
        except _ChainTooLong as too_long:
            if len(chain) > 1:
                raise
            names = " -> ".join("(text)" if p is None else p.stem for p in too_long.chain)
            return fail(f"extends chain longer than {MAX_CHAIN} specs: {shown(names)[1:-1]} -> ...", _LONG)
        if parent is None and chain[-1] in self._cycles:
            return fail(*_cycle(self._cycles[chain[-1]]))
        if parent is None and problems and all(d.line == 0 for d in problems):
            return None, [_via(d, loaded.file) for d in problems]  # unreadable: what it is, at its own path
        if parent is not None and self.check is not None:
            problems = self.check(parent)
        if parent is None or problems:
            count = len(problems)
            return fail(f"the parent spec {name!r} ({path}) does not validate ({count} error{'s' * (count != 1)})",
                        f"vitcg validate {path} lists them; fix the parent first")
        if parent.data.get("name") != name:
            return fail(f"{path} is named {shown(parent.data.get('name'))}, not {name!r}",
                        "a parent is found by its file name, which must be its spec name")
        depth = self._depth.get(key, 1) + 1
        if depth > MAX_CHAIN:  # the parent was resolved before, from a shorter chain: its depth says it
            return fail(f"extends chain longer than {MAX_CHAIN} specs: {shown(name)} is one of {depth - 1} "
                        "already", _LONG)
        if chain[-1] is not None:
            self._depth[chain[-1]] = depth
        return parent, []


_LONG = "a family needs two or three levels: extend a spec nearer the root of the chain"

Chain = tuple[Path | None, ...]
"""The files whose resolution led to the one at hand, the first one first (None: a text, not a file)."""


class _ChainTooLong(Exception):
    """Raised where a chain passes :data:`MAX_CHAIN`: caught by the first file of the chain, the one whose
    ancestry is too long, so that no file between caches a failure that is not its own."""

    def __init__(self, chain: Chain):
        super().__init__(chain)
        self.chain = chain


def _cycle(members: tuple[Path, ...]) -> tuple[str, str]:
    """The message and hint of an ``extends`` cycle, from its first member."""
    names = " -> ".join(p.stem for p in (*members, members[0]))
    return f"extends cycle: {shown(names)[1:-1]}", "a spec cannot inherit from itself: remove one extends: of the cycle"


def _without(loaded: LoadedYaml, *keys: str) -> LoadedYaml:
    copy = _Copy(loaded.file)
    copy.out.data = copy.place(loaded, (), ())
    copy.out.removed = dict(loaded.removed)
    for key in keys:
        copy.out.data.pop(key, None)
    return copy.out


def _removed(parent: LoadedYaml, child: LoadedYaml) -> tuple[LoadedYaml, list[Diagnostic]]:
    """``parent`` without the mapping keys the child's ``remove:`` list names (dotted paths such as
    ``encoder.call_kwargs.output_hidden_states``); a path the parent does not hold is a diagnostic at its entry."""
    paths = child.data.get("remove", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        return parent, [child.diagnostic(("remove",), f"remove lists dotted key paths, not {shown(paths)}",
                                         hint="remove: [encoder.call_kwargs.output_hidden_states, modalities.video]",
                                         code="extends")]
    copy = _Copy(parent.file)
    copy.out.data = copy.place(parent, (), ())
    copy.out.removed = dict(parent.removed)
    problems = []
    seen: dict[str, int] = {}
    for i, dotted in enumerate(paths):
        if dotted in seen:
            problems.append(child.diagnostic(("remove", i), f"{shown(dotted)} is removed twice (first at "
                                             f"remove[{seen[dotted]}])", hint="delete one of the two entries",
                                             code="extends"))
            continue
        seen[dotted] = i
        *head, last = dotted.split(".")
        node = copy.out.data
        for part in head:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            problems.append(child.diagnostic(("remove", i), f"the parent holds no key {shown(dotted)} to remove",
                                             hint="name a mapping key of the parent's resolved spec (vitcg validate "
                                                  "--resolved PARENT); a buffer is removed in buffers: by "
                                                  "remove: true", code="extends"))
            continue
        del node[last]
        copy.out.removed[("key", dotted)] = (child.file_of(("remove", i)), child.position(("remove", i)))
    return copy.out, problems


def _via(diagnostic: Diagnostic, spec_file: str) -> Diagnostic:
    from dataclasses import replace
    return diagnostic if diagnostic.file == spec_file else replace(diagnostic, via=spec_file)


def folder_finder(folders: Sequence[Path]) -> Finder:
    """A :data:`Finder` that looks beside the spec first, then in ``folders`` (later folders win, as in the
    registry)."""
    def places(near: Path | None) -> list[Path]:
        return [Path(f) for f in ([near] if near is not None else []) + list(reversed(list(folders)))]

    def find(name: str, near: Path | None) -> Path | None:
        if not _plain_name(name):
            return None
        for folder in places(near):
            for suffix in (".yaml", ".yml"):
                candidate = folder / f"{name}{suffix}"
                if _there(candidate):  # what is not a regular file is refused by loading it, saying what it is
                    return candidate
        return None

    def names(near: Path | None) -> list[str]:
        return [p.stem for folder in places(near) if folder.is_dir() for p in folder.glob("*.y*ml")
                if p.suffix in (".yaml", ".yml") and not is_harness_file(p)]

    find.names = names  # type: ignore[attr-defined]
    return find


def _plain_name(name: str) -> bool:
    """A spec name, never a path: no separators, no leading dot."""
    return bool(name) and not name.startswith(".") and "/" not in name and "\\" not in name and len(name) <= 100
