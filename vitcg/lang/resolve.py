"""Resolution: one spec file -> the whole spec it means, each value still pointing at the file and line that wrote it.

Three sources are merged under the file's own text, weakest first:

1. its style base (:mod:`.bases`), for a spec that extends no other: ``vitcg/lang/styles/_STYLE.yaml`` of its
   ``attention.style`` (``_spec.yaml`` for another style), itself merged over the bases it extends: the style's
   usual ``items``, ``budget`` and standard ``buffers``, and the harness's usual ``budgets`` and ``max_model_len``.
   A spec with ``graph_scope`` takes no ``buffers`` from it, and its ``tests`` fill a harness the spec has, never
   make one up. A value from a base is reported at the line that chose the base (``attention.style``, or
   ``extends: _STYLE`` written out), naming the default;
2. the spec it ``extends`` (by name: ``NAME.yaml`` beside the file, else in the spec folders; a base by its name,
   ``extends: _packed``), resolved the same way, recursively;
3. the file itself, with its harness: the ``tests`` mapping, written in the file or in ``NAME.tests.yaml`` (or
   ``NAME.tests.yml``) beside it.

The merge rule, one for every layer (a file over its parent, a spec over its base, a base over its base):
mappings merge key by key; ``buffers``, the spec's one list of named entries, merges entry by entry: an entry
merges into the inherited entry of its ``name`` key by key, where ``shape`` and ``value`` count as one key (writing
either replaces the other), ``remove: true`` drops that entry, and an entry of a new name is appended, replacing
the inherited entry of its ``provider`` where that provider fills one buffer (all but ``aligned`` and
``scope_arg``); every other value, a list or a scalar, is replaced. A ``remove:`` list beside ``extends`` takes
mapping keys out of the parent first. Checks run on the result (:mod:`.checks`); ``vitcg validate --resolved``
prints it, under the chain of files it extends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, shown, suggest
from . import bases
from .lets import expand as expand_lets
from .loader import LoadedYaml, Path_, Position, load_file, load_text
from .rules.buffers import SHARED_PROVIDERS

HARNESS_SUFFIXES = (".tests.yaml", ".tests.yml")
"""``NAME.tests.yaml`` (or ``NAME.tests.yml``) beside ``NAME.yaml`` holds that spec's harness: the mapping its
``tests`` key would hold."""
MAX_CHAIN = 8
"""Longest ``extends`` chain: a family needs two or three levels."""
_EXCLUSIVE = ("shape", "value")
"""Buffer keys that count as one in the merge rule: writing one replaces the other inherited."""


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
            return self.keys(b, o, dst, [*base, *(k for k in over if k not in base)])
        if dst == ("buffers",) and isinstance(base, list) and isinstance(over, list):
            self.copy.mark(self.over, o, dst)
            return self.buffers(b, o, base, over)
        return self.copy.place(self.over, o, dst)

    def keys(self, b: Path_, o: Path_, dst: Path_, keys: list) -> dict:
        """The mappings at ``b`` (inherited) and ``o`` (written) merged key by key, in the order of ``keys``."""
        base, over = _at(self.base.data, b), _at(self.over.data, o)
        return {k: self.node(b + (k,) if k in base else None, o + (k,) if k in over else None, dst + (k,))
                for k in keys}

    def buffers(self, b: Path_, o: Path_, base: list, over: list) -> list:
        """Buffers by the merge rule: inherited ones in their order (merged, dropped by ``remove: true``, or
        replaced by a new entry of their one-buffer provider), then the new ones in the file's order."""
        named = self.named(o, over)
        replaced = _replaced(base, over, named)
        inherited = {_name(e) for e in base} - {None}
        out: list = []
        for i, entry in enumerate(base):
            if i not in replaced:
                self.inherited(b + (i,), entry, o, named.get(_name(entry)), out)
        for j, entry in enumerate(over):
            if _name(entry) not in inherited and self.addable(o + (j,), entry, inherited):
                out.append(self.copy.place(self.over, o + (j,), ("buffers", len(out))))
        return out

    def named(self, o: Path_, over: list) -> dict[str, int]:
        """The index of each name the file's buffers use; a name used twice is a diagnostic (merging by name would
        hide it)."""
        named: dict[str, int] = {}
        for j, e in enumerate(over):
            name = _name(e)
            if name is not None and name in named:
                self.problems.append(self.over.diagnostic(o + (j, "name"), f"buffer name {name!r} is already used "
                                                          f"by buffers[{named[name]}]", code="semantic"))
            elif name is not None:
                named[name] = j
        return named

    def inherited(self, b: Path_, entry: Any, o: Path_, j: int | None, out: list) -> None:
        """The inherited buffer at ``b`` into ``out``: as it is, merged with the file's entry ``j`` of its name, or
        dropped where that entry says ``remove: true`` (recorded, for a check that misses it)."""
        if j is None:
            out.append(self.copy.place(self.base, b, ("buffers", len(out))))
        elif not self.removed(o + (j,), _at(self.over.data, o + (j,))):
            out.append(self.entry(b, o + (j,), ("buffers", len(out))))
        else:
            arg = entry.get("arg", entry.get("name"))
            at = o + (j, "remove")
            self.copy.out.removed[("buffer", str(arg))] = (self.over.file_of(at), self.over.position(at, key=True))

    def addable(self, at: Path_, entry: Any, inherited: set) -> bool:
        """Whether the file's entry of a new name at ``at`` is appended: not a ``remove`` of a name nothing supplies
        (a diagnostic)."""
        if not (isinstance(entry, dict) and "remove" in entry):
            return True
        self.problems.append(self.over.diagnostic(
            at + ("remove",), f"no inherited buffer named {shown(entry.get('name'))} to remove",
            hint="remove: true drops a buffer the spec would inherit (from its parent or its attention "
                 "style); inherited here: " + (", ".join(sorted(map(str, inherited))) or "none"),
            code="extends", key=True))
        return False

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
        """One buffer merged key by key, ``shape`` and ``value`` counting as one key (writing either replaces the
        other)."""
        base, over = _at(self.base.data, b), _at(self.over.data, o)
        self.copy.mark(self.over, o, dst)
        keys = [k for k in base if not (k in _EXCLUSIVE and k not in over and any(x in over for x in _EXCLUSIVE))]
        return self.keys(b, o, dst, [*keys, *(k for k in over if k not in base)])


def _replaced(base: list, over: list, named: dict[str, int]) -> set[int]:
    """The inherited buffers that a new entry of the file replaces: those of a provider that fills one buffer,
    which an entry of another name names (``target_sizes`` for ``grid``), unless the file names them itself."""
    providers = {e["provider"] for e in over if _name(e) is not None and isinstance(e.get("provider"), str)}
    return {i for i, e in enumerate(base) if isinstance(e, dict) and _name(e) not in named
            and e.get("provider") in providers - set(SHARED_PROVIDERS)}


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


def _nest(root: Path_, data: dict) -> dict:
    for key in reversed(root):
        data = {key: data}
    return data


def base_layer(spec: LoadedYaml, name: str, anchor: Path_) -> LoadedYaml | None:
    """Base ``name`` (:mod:`.bases`) as the layer under ``spec``, each value placed as if written at ``spec``'s
    ``anchor`` (the line that chose the base) and labelled as the default it is; None when it brings nothing. A
    spec with ``graph_scope`` takes no ``buffers`` from it, and its ``tests`` fill a harness the spec has."""
    data = bases.data(name)
    tests = data.pop("tests", None)
    if "graph_scope" in spec.data:
        data.pop("buffers", None)
    layers: list[LoadedYaml] = []
    if data:
        layers.append(_synthetic(data, spec, anchor, f"the {bases.style_of(name)!r} style's default"))
    if tests is not None and isinstance(spec.data.get("tests"), dict):
        layers.append(_synthetic(tests, spec, ("tests",), "the harness's default", ("tests",)))
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
        self._ancestry: dict[Path | None, tuple[tuple[str, str], ...]] = {}
        """What each resolved file extends (:meth:`ancestry`); None: the text last resolved."""

    def resolve_file(self, path: Path, display: str | None = None) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """The resolved spec of the file at ``path``, or None and the diagnostics that explain why not."""
        return self._file(Path(path), display or str(path), ())

    def resolve_text(self, text: str, file: str, at: Path | None = None) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """``text`` resolved; ``at``: the path it is about to be written to, so that it resolves as that file will
        (parents beside it first), and a spec there that would extend it back is an ``extends`` cycle now, not
        once the file is written (two drafts of ``vitcg new`` in one folder: llava_next -> clip -> llava_next)."""
        loaded, problems = load_text(text, file)
        if loaded is None:
            return None, problems
        if at is None:
            return self._loaded(loaded, None, (None,))  # None: the text, first in its chain
        key = Path(at).resolve()
        find = self.find

        def pending(name: str, near: Path | None) -> Path | None:  # the text is the file at ``at`` already
            beside = near is not None and Path(near).resolve() == key.parent
            if not (beside and name == key.stem and key.suffix in (".yaml", ".yml")):
                return find(name, near)
            first = key.with_suffix(".yaml")  # the finder's order beside a file: NAME.yaml, then NAME.yml
            return first if key.suffix == ".yml" and _there(first) else key

        self.find = pending
        try:
            return self._loaded(loaded, key.parent, (key,))
        finally:
            self.find = find

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
        """``loaded`` with its own ``let`` names written out (:mod:`.lets`), merged over its parent (the spec it
        extends, else its style base), ``extends`` and ``remove`` taken out."""
        if "extends" in loaded.data:
            parent, problems = self._parent(loaded, folder, chain)
        elif "remove" in loaded.data:
            return None, [loaded.diagnostic(("remove",), "remove drops keys a spec inherits; this spec extends none",
                                            hint="add extends: PARENT, or delete the remove list", code="extends",
                                            key=True)]
        else:
            name = bases.for_style(_style(loaded.data))
            self._ancestry[chain[-1]] = bases.chain(name)
            parent, problems = base_layer(loaded, name, ("attention", "style")), []
        if problems:
            return None, problems
        problems = expand_lets(loaded, parent.data if parent is not None else None)
        if not problems and parent is not None and "remove" in loaded.data:
            parent, problems = _removed(parent, loaded)
        if problems:
            return None, problems
        if parent is None:
            return loaded, []
        merged, problems = merge(parent, without(loaded, "extends", "remove"))
        return (None, problems) if problems else (merged, [])

    def _parent(self, loaded: LoadedYaml, folder: Path | None,
                chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """The resolved parent of ``loaded`` (the last of ``chain``), or None and the diagnostics at its
        ``extends`` line."""
        name = loaded.data["extends"]
        try:
            _named_parent(loaded, name)
            if bases.is_base(name):
                return self._base(loaded, name, chain)
            path = self._find(name, folder)
            key = path.resolve()
            self._no_cycle(key, chain)
            parent, problems = self._ancestor(path, chain)
            if parent is None and problems and all(d.line == 0 for d in problems):
                return None, [_via(d, loaded.file) for d in problems]  # unreadable: what it is, at its own path
            self._valid(parent, problems, name, path)
            self._within_limit(key, name, chain)
        except _Refused as refused:
            return None, [loaded.diagnostic(("extends",), refused.message, hint=refused.hint, code="extends")]
        self._ancestry[chain[-1]] = ((name, str(path)), *self._ancestry.get(key, ()))
        return parent, []

    def _base(self, loaded: LoadedYaml, name: str, chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """Style base ``name`` as the parent ``loaded`` names: the layer it gets without ``extends``, where its
        style is the base's."""
        style, own = bases.style_of(name), _style(loaded.data)
        if style is not None and isinstance(own, str) and own != style:
            raise _Refused(f"{name} holds the {style} style's defaults, but attention.style is {shown(own)}",
                           f"extends: {bases.for_style(own)}, or leave extends out: a spec that extends no other "
                           "extends the base of its style")
        self._ancestry[chain[-1]] = bases.chain(name)
        layer = base_layer(loaded, name, ("extends",))
        return (layer if layer is not None else LoadedYaml(loaded.file, {})), []

    def _find(self, name: str, folder: Path | None) -> Path:
        path = self.find(name, folder)
        if path is None:
            known = [*getattr(self.find, "names", lambda _: [])(folder), *bases.NAMES]
            raise _Refused(f"no spec named {name!r} to extend", suggest(name, known) or
                           "a parent is NAME.yaml beside this file or in the spec folders (vitcg/specs, "
                           "$VITCG_SPECS_DIR), or a style base (" + ", ".join(bases.NAMES) + ")")
        return path

    def _no_cycle(self, key: Path, chain: Chain) -> None:
        """Refuse a parent that is already on ``chain``, recording the cycle for each of its members."""
        if key in chain:
            cycle = chain[chain.index(key):]
            for i, member in enumerate(cycle):
                self._cycles[member] = cycle[i:] + cycle[:i]
            raise _Refused(*self._cycle(self._cycles[chain[-1]]))

    def _cycle(self, members: tuple[Path, ...]) -> tuple[str, str]:
        """:func:`_cycle`'s message, and a hint naming the member that stands beside its child in place of the spec
        folders' file of that name (a draft named like a packaged spec), when one does."""
        message, hint = _cycle(members)
        for child, parent in zip(members, (*members[1:], members[0])):
            elsewhere = self.find(parent.stem, None)
            if parent.parent == child.parent and elsewhere is not None and elsewhere.resolve() != parent:
                return message, (f"{parent.name} beside {child.name} stands in for {elsewhere} (a parent is looked up "
                                 f"beside the file first): rename {parent.name} and its name:, or move it to a folder "
                                 "of its own")
        return message, hint

    def _ancestor(self, path: Path, chain: Chain) -> tuple[LoadedYaml | None, list[Diagnostic]]:
        """The parent at ``path`` resolved; a chain too long is refused by its first file only."""
        if len(chain) >= MAX_CHAIN:  # the first of the chain has too many ancestors; this file may have few
            raise _ChainTooLong((*chain, path.resolve()))
        try:
            parent, problems = self._file(path, str(path), chain)
        except _ChainTooLong as too_long:
            if len(chain) > 1:
                raise
            names = " -> ".join("(text)" if p is None else p.stem for p in too_long.chain)
            raise _Refused(f"extends chain longer than {MAX_CHAIN} specs: {shown(names)[1:-1]} -> ...", _LONG) from None
        if parent is None and chain[-1] in self._cycles:
            raise _Refused(*self._cycle(self._cycles[chain[-1]]))
        return parent, problems

    def _valid(self, parent: LoadedYaml | None, problems: list[Diagnostic], name: str, path: Path) -> None:
        """Refuse a parent that does not validate alone, or whose file name is not its spec name."""
        if parent is not None and self.check is not None:
            problems = self.check(parent)
        if parent is None or problems:
            count = len(problems)
            raise _Refused(f"the parent spec {name!r} ({path}) does not validate ({count} error{'s' * (count != 1)})",
                           f"vitcg validate {path} lists them; fix the parent first")
        if parent.data.get("name") != name:
            raise _Refused(f"{path} is named {shown(parent.data.get('name'))}, not {name!r}",
                           "a parent is found by its file name, which must be its spec name")

    def _within_limit(self, key: Path, name: str, chain: Chain) -> None:
        """Record the chain's length for the file at hand; refuse one past :data:`MAX_CHAIN`."""
        depth = self._depth.get(key, 1) + 1
        if depth > MAX_CHAIN:  # the parent was resolved before, from a shorter chain: its depth says it
            raise _Refused(f"extends chain longer than {MAX_CHAIN} specs: {shown(name)} is one of {depth - 1} "
                           "already", _LONG)
        if chain[-1] is not None:
            self._depth[chain[-1]] = depth

    def ancestry(self, path: Path) -> tuple[tuple[str, str], ...]:
        """What the resolved file at ``path`` extends, nearest first, as ``(name, file)``: its parents, then the
        style base under them and the bases that one extends (``vitcg validate --resolved`` prints it)."""
        return self._ancestry.get(Path(path).resolve(), ())


def _named_parent(loaded: LoadedYaml, name: Any) -> None:
    """Refuse an ``extends`` that names no spec, or a file that states no name of its own."""
    if not isinstance(name, str) or not name:
        raise _Refused(f"extends names one spec, not {shown(name)}", "write the parent spec's name: extends: qwen2_vl")
    if "name" not in loaded.data:
        raise _Refused("a spec that extends another states its own name", f"add name: (not {name!r})")


def _style(data: dict) -> Any:
    """The spec's ``attention.style`` as written (None where it writes none)."""
    attention = data.get("attention")
    return attention.get("style") if isinstance(attention, dict) else None


class _Refused(Exception):
    """A parent refused: the message and hint of the diagnostic at the ``extends`` line."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


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


def without(loaded: LoadedYaml, *keys: str) -> LoadedYaml:
    """A copy of ``loaded`` without the top-level ``keys``."""
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
