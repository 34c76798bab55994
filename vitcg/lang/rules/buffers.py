"""Buffer rules: unique names, what each provider allows, host against tensor, tuple args, what the style needs.

Provider rules cover style, graph_scope, padding, params and geometry; list rules cover the required providers,
a row-wise padded buffer and the arguments the eager call passes the pixels and grid/tiles as.

Rules on one entry take its index and its raw mapping; rules on the whole list take the raw entries, or the
:class:`Buffer` objects built from the entries whose provider applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...errors import Diagnostic, FormulaError, suggest
from .. import catalogue as cat
from ..formulas import Formula
from ..loader import LoadedYaml
from ..model import Buffer, Modality, Spec
from .common import error

SHARED_PROVIDERS = ("aligned", "scope_arg")
"""Providers that may fill several buffers; every other provider fills at most one."""

Entry = Mapping[str, Any]


def buffer_arg(entry: Entry) -> str:
    """The encoder argument a buffer is passed as (its name unless ``arg`` says otherwise)."""
    return entry.get("arg", entry["name"])


def _unique_providers(entries: Sequence[Entry]) -> dict[str, int]:
    """Provider -> index of the last buffer it fills, for the providers that fill one buffer."""
    return {e["provider"]: i for i, e in enumerate(entries) if e["provider"] not in SHARED_PROVIDERS}


def unique_buffers(loaded: LoadedYaml, entries: Sequence[Entry]) -> Iterator[Diagnostic]:
    """Each buffer name and arg is used once, and each provider but aligned and scope_arg fills one buffer. The
    message names the other buffer by its own index and line, and its file (or the default that supplied it) where
    that is not the file of the line reported: a child's buffer clashing with its parent's names the parent's."""
    tables: dict[str, dict[str, int]] = {"name": {}, "arg": {}, "provider": {}}
    for i, entry in enumerate(entries):
        keys = {"name": entry["name"], "arg": buffer_arg(entry)}
        if entry["provider"] not in SHARED_PROVIDERS:
            keys["provider"] = entry["provider"]
        for what, key in keys.items():
            table = tables[what]
            if key in table:
                at = ("buffers", i, what) if what in entry else ("buffers", i)
                other = loaded.where(("buffers", table[key]), loaded.file_of(at))
                named = "" if what == "name" else f", buffer {entries[table[key]]['name']!r}"
                yield error(loaded, at, f"buffer {what} {key!r} is already used by {other}{named}")
            table[key] = i


def tuple_args_scoped(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """Only scope_arg buffers address a tuple element (an arg ``name.N``)."""
    if "." in buffer_arg(entry) and entry["provider"] != "scope_arg":
        yield error(loaded, ("buffers", index, "arg"), "only scope_arg buffers address tuple elements (name.N)")


def provider_serves_style(loaded: LoadedYaml, index: int, entry: Entry,
                          style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """The buffer's provider serves the spec's attention style."""
    provider = entry["provider"]
    info = cat.PROVIDERS[provider]
    if style.name not in info.styles:
        yield error(loaded, ("buffers", index, "provider"),
                    f"provider {provider!r} does not apply to {style.name} style",
                    hint=f"it serves: {', '.join(sorted(info.styles))}")


def provider_matches_scope(loaded: LoadedYaml, index: int, entry: Entry, scoped: bool) -> Iterator[Diagnostic]:
    """With ``graph_scope`` every buffer is a scope_arg; without it, none is."""
    provider = entry["provider"]
    if cat.PROVIDERS[provider].scoped == scoped:
        return
    if scoped:
        yield error(loaded, ("buffers", index, "provider"),
                    f"with graph_scope every buffer is a 'scope_arg', not {provider!r}", hint="provider: scope_arg")
    else:
        yield error(loaded, ("buffers", index, "provider"),
                    f"provider {provider!r} fills the arguments of a graph_scope call", hint="add graph_scope.module")


def epilogue_whole_encoder(loaded: LoadedYaml, scoped: bool) -> Iterator[Diagnostic]:
    """An epilogue follows a whole-encoder graph: with graph_scope the model's own forward already runs every
    step after the scoped call eagerly."""
    if scoped and "epilogue" in loaded.data:
        yield error(loaded, ("epilogue",), "epilogue applies to whole-encoder specs: with graph_scope, the forward "
                    "after the scoped call already runs eagerly", hint="remove epilogue, or remove graph_scope",
                    key=True)


def replace_whole_encoder(loaded: LoadedYaml, scoped: bool) -> Iterator[Diagnostic]:
    """A replacement reads its buffer from the encoder call's keyword arguments: a whole-encoder graph's."""
    if scoped and "replace" in loaded.data:
        yield error(loaded, ("replace",), "replace applies to whole-encoder specs: with graph_scope, the scoped "
                    "call's arguments come from the model's own prologue", hint="remove replace, or remove graph_scope",
                    key=True)


def replace_reads_buffer(loaded: LoadedYaml, entries: Sequence[Entry]) -> Iterator[Diagnostic]:
    """Each replacement reads the one buffer of its provider: the spec must have it."""
    providers = {entry["provider"] for entry in entries}
    for index, item in enumerate(loaded.data.get("replace", ())):
        needed = cat.REPLACEMENTS[item["with"]].provider
        if needed not in providers:
            yield error(loaded, ("replace", index, "with"),
                        f"{item['with']!r} reads a buffer of provider {needed!r}, and the spec has none",
                        hint=f"add a buffer with provider: {needed} (registry/VOCABULARY.md)")


def buffers_need_replace(loaded: LoadedYaml, entries: Sequence[Entry]) -> Iterator[Diagnostic]:
    """A buffer that only a replacement reads needs a ``replace`` that reads it."""
    read = {cat.REPLACEMENTS[item["with"]].provider for item in loaded.data.get("replace", ())}
    for index, entry in enumerate(entries):
        provider = entry["provider"]
        if provider in cat.READ_BY_REPLACEMENTS and provider not in read:
            forms = ", ".join(r.name for r in cat.REPLACEMENTS.values() if r.provider == provider)
            yield error(loaded, ("buffers", index, "provider"),
                        f"only a replacement reads a {provider!r} buffer, and no replace entry reads it",
                        hint=f"add replace: [{{module: CLASS, with: {forms}}}], or remove the buffer")


def layer_args_whole_encoder(loaded: LoadedYaml, scoped: bool) -> Iterator[Diagnostic]:
    """``layer_args`` adds host integers to the layers of a whole-encoder graph: with graph_scope, a host integer
    the scoped call lacks is a ``scope_arg`` buffer with ``value``."""
    if scoped and "layer_args" in loaded.data:
        yield error(loaded, ("layer_args",), "layer_args applies to whole-encoder specs: with graph_scope, a host "
                    "integer the scoped call lacks is a scope_arg buffer with value", key=True,
                    hint="remove layer_args, or remove graph_scope")


def layer_args_name_host_buffers(loaded: LoadedYaml, buffers: Sequence[Buffer]) -> Iterator[Diagnostic]:
    """Each value of ``layer_args.by_type`` names a host buffer of the spec (one written with ``value``): the
    layers get integers fixed at capture, never a tensor refilled per replay."""
    entry = loaded.data.get("layer_args")
    if entry is None:
        return
    host = sorted(b.name for b in buffers if b.is_host)
    for kind, args in entry["by_type"].items():
        for arg, name in args.items():
            if name not in host:
                yield error(loaded, ("layer_args", "by_type", kind, arg),
                            f"{name!r} is no host buffer of the spec: layer_args passes host integers fixed at capture",
                            hint=suggest(name, host) or "name a buffer written with value: (a host integer)")


def padding_allowed(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """The buffer's padding rule is one its provider supports."""
    provider, padding = entry["provider"], entry["padding"]
    paddings = cat.PROVIDERS[provider].paddings
    if padding not in paddings:
        yield error(loaded, ("buffers", index, "padding"),
                    f"provider {provider!r} pads with {' or '.join(map(repr, paddings))}, not {padding!r}",
                    hint=f"padding: {paddings[0]}")


def absent_allowed(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """``absent`` is set on a scope_arg buffer whose padding rule the absence applies to (``one_segment``: segment
    boundaries, ``trailing_segment``)."""
    if "absent" not in entry:
        return
    absence = cat.ABSENCES[entry["absent"]]
    if entry["provider"] != "scope_arg":
        yield error(loaded, ("buffers", index, "absent"),
                    f"absent applies to scope_arg buffers (an argument a scoped call may leave out), not to "
                    f"provider {entry['provider']!r}", hint="remove absent", key=True)
    elif entry["padding"] not in absence.paddings:
        yield error(loaded, ("buffers", index, "absent"),
                    f"absent: {absence.name} applies to buffers padded with "
                    f"{' or '.join(map(repr, absence.paddings))} (segment boundaries), not {entry['padding']!r}",
                    hint=f"padding: {absence.paddings[0]}, or remove absent", key=True)


def rows_dim_in_range(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """``params.rows_dim`` is one of the buffer's dimensions."""
    rows_dim = entry.get("params", {}).get("rows_dim", 0)
    if rows_dim and "shape" in entry and rows_dim >= len(entry["shape"]):
        yield error(loaded, ("buffers", index, "params", "rows_dim"),
                    f"rows_dim {rows_dim} is beyond the buffer's {len(entry['shape'])} dimensions")


def _names(formula: Any) -> set[str]:
    """The names a raw (unparsed) formula mentions."""
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(formula)))


def pixels_leading_dims(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """A pixels buffer with ``rows_dim`` k: its dimensions before k are leading 1s (a batch of one) or dimensions
    of each row (MiniCPM-V's ``(1, C, p, rows * p)``), so none reads a buffer name: the graphs store the rows
    first (as the inputs come), and the call gets them back in its own layout. Dimension k reads ``budget``."""
    rows_dim = entry.get("params", {}).get("rows_dim", 0)
    shape = entry.get("shape", ())
    if entry["provider"] != "pixels" or not rows_dim or rows_dim >= len(shape):
        return
    for j, dim in enumerate(shape[:rows_dim]):
        read = [n for n in cat.BUFFER_NAMES if n in _names(dim)]
        if read:
            yield error(loaded, ("buffers", index, "shape", j),
                        f"dimension {j} is {dim!r}, but a pixels buffer's dimensions before rows_dim {rows_dim} "
                        f"are leading 1s or belong to each row, so they cannot read {read[0]!r}",
                        hint=f"shape: [1, <dims of one row>..., <rows>, ...] with the rows on dimension {rows_dim}")
    if "budget" not in _names(shape[rows_dim]):
        yield error(loaded, ("buffers", index, "shape", rows_dim),
                    f"dimension {rows_dim} (rows_dim) is {shape[rows_dim]!r}, but it holds the rows, so it reads "
                    "budget",
                    hint="budget, or budget * patch_size with params.row_width: patch_size where each row spans "
                         "patch_size entries of it")


def host_or_tensor(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """Host providers get 'value', tensor providers 'shape'; for scope_arg, 'fixed' padding goes with 'value'."""
    provider = entry["provider"]
    kind = cat.PROVIDERS[provider].kind
    if kind == "either" and (entry["padding"] == "fixed") != ("value" in entry):
        yield error(loaded, ("buffers", index, "padding"),
                    "a host integer ('value') has padding 'fixed', a tensor ('shape') does not")
    if kind == "host" and "shape" in entry:
        yield error(loaded, ("buffers", index, "shape"),
                    f"{provider!r} is a host integer fixed at capture: give 'value', not 'shape'", key=True)
    if kind == "tensor" and "value" in entry:
        yield error(loaded, ("buffers", index, "value"), f"{provider!r} is a tensor buffer: give 'shape', not 'value'",
                    key=True)


def aligned_role_exists(loaded: LoadedYaml, index: int, entry: Entry,
                        modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """An 'aligned' buffer names, in ``params.role``, an extra input role of the modalities."""
    if entry["provider"] != "aligned":
        return
    extra_roles = sorted({r for m in modalities for r in m.inputs if r not in cat.STANDARD_ROLES})
    if entry.get("params", {}).get("role") not in extra_roles:
        yield error(loaded, ("buffers", index, "params"), "an 'aligned' buffer names one of the extra input roles "
                    f"in params.role ({', '.join(extra_roles) or 'the modalities have none'})")


def below_needs_indices(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """``params.below`` (the rows of the table a role indexes) goes with an index dtype, int64 or int32: only
    indices are checked against it."""
    params = entry.get("params", {})
    if "below" in params and params.get("dtype") not in ("int64", "int32"):
        yield error(loaded, ("buffers", index, "params", "below"),
                    f"params.below bounds index values, but the buffer's dtype is {params.get('dtype', 'model')!r}",
                    hint="params.dtype: int64 (or int32) for an index role, or remove below")


def params_allowed(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """Each key of ``params`` is a param the provider takes."""
    provider = entry["provider"]
    params = cat.PROVIDERS[provider].params
    for param in entry.get("params", {}):
        if param not in params:
            yield error(loaded, ("buffers", index, "params", param), f"provider {provider!r} takes no param {param!r}",
                        hint=f"its params: {', '.join(sorted(params)) or 'none'}", key=True)


def provider_geometry(loaded: LoadedYaml, index: int, entry: Entry,
                      geometry: Sequence[str]) -> Iterator[Diagnostic]:
    """The spec defines every geometry name the provider reads."""
    provider = entry["provider"]
    for needed in cat.PROVIDERS[provider].geometry:
        if needed not in geometry:
            yield error(loaded, ("buffers", index, "provider"),
                        f"provider {provider!r} reads geometry {needed!r}, which the spec does not define",
                        hint=f"add geometry.{needed}")


def shape_not_empty(loaded: LoadedYaml, index: int, entry: Entry) -> Iterator[Diagnostic]:
    """A tensor buffer's shape has at least one dimension."""
    if "shape" in entry and not entry["shape"]:
        yield error(loaded, ("buffers", index, "shape"), "a tensor buffer needs at least one dimension")


def tuple_args_complete(loaded: LoadedYaml, buffers: Sequence[Buffer]) -> Iterator[Diagnostic]:
    """The elements a tuple argument's buffers address (``name.0``, ``name.1``, ...) have no gaps."""
    tuples: dict[str, list[int]] = {}
    for buffer in buffers:
        name, _, index = buffer.arg.partition(".")
        if index:
            tuples.setdefault(name, []).append(int(index))
    for name, indices in tuples.items():
        if sorted(indices) != list(range(len(indices))):
            yield error(loaded, ("buffers",), f"tuple argument {name!r} has elements {sorted(indices)}; "
                        f"give {name}.0 to {name}.{len(indices) - 1} without gaps")


def row_wise_buffer(loaded: LoadedYaml, buffers: Sequence[Buffer]) -> Iterator[Diagnostic]:
    """Some buffer is padded row by row, so it says how many rows a capture holds."""
    if buffers and not any(cat.PADDINGS[b.padding].row_wise for b in buffers):
        yield error(loaded, ("buffers",), "no buffer is padded row by row, so none says how many rows a capture holds",
                    hint="pad the buffer of the call's rows with "
                    + " or ".join(r.name for r in cat.PADDINGS.values() if r.row_wise))


def required_providers(loaded: LoadedYaml, entries: Sequence[Entry], style: cat.AttentionStyle,
                       scoped: bool) -> Iterator[Diagnostic]:
    """Without graph_scope, a buffer is filled by each provider the attention style requires; a grid padded
    ``trailing_item`` stands for ``cu_seqlens`` (the encoder derives its segments from it)."""
    if scoped:
        return
    providers = _unique_providers(entries)
    segments_from_grid = any(e.get("provider") == "grid" and e.get("padding") == "trailing_item" for e in entries)
    for needed in style.required_providers:
        if needed == "cu_seqlens" and segments_from_grid:
            continue
        if needed not in providers:
            hint = cat.PROVIDERS[needed].doc
            if needed == "cu_seqlens":
                hint += "; or, for an encoder that derives its segments from its grid, padding: trailing_item there"
            yield error(loaded, ("buffers",), f"{style.name} style needs a buffer filled by provider {needed!r}",
                        hint=hint)


def eager_args_agree(loaded: LoadedYaml, entries: Sequence[Entry], buffers: Sequence[Buffer],
                     args: Mapping[str, str], style: cat.AttentionStyle) -> Iterator[Diagnostic]:
    """The pixels and grid/tiles buffers are passed as the arguments the eager call passes those roles as."""
    by_role = {role: arg for arg, role in args.items()}
    providers = _unique_providers(entries)
    for role in style.roles:
        buffer = next((b for b in buffers if b.provider == role), None)
        if buffer is not None and role in by_role and buffer.arg != by_role[role]:
            index = providers[role]
            yield error(loaded, ("buffers", index, "arg" if "arg" in entries[index] else "name"),
                        f"the {role} buffer is passed as {buffer.arg!r}, but the eager call passes {role} as "
                        f"{by_role[role]!r}", hint=f"arg: {by_role[role]}")


def grid_buffer_width(loaded: LoadedYaml, entries: Sequence[Entry], buffers: Sequence[Buffer],
                      modalities: Sequence[Modality]) -> Iterator[Diagnostic]:
    """A grid buffer whose row width is a literal holds as many columns as the modalities' ``grid_columns``."""
    columns = next((m.grid_columns for m in modalities if "grid" in m.inputs), cat.GRID_COLUMNS)
    for buffer in buffers:
        if (buffer.provider != "grid" or buffer.shape is None or len(buffer.shape) != 2 or buffer.shape[1] is None
                or buffer.shape[1].names):  # a width that failed to parse has its own diagnostic
            continue
        width = buffer.shape[1].evaluate({})
        if width != len(columns):
            position = next(i for i, e in enumerate(entries) if e["name"] == buffer.name)
            yield error(loaded, ("buffers", position, "shape", 1),
                        f"the grid buffer holds {width} columns per row, but the grid rows are "
                        f"({', '.join(columns)})", hint=f"shape: [..., {len(columns)}]")


def square_masks(loaded: LoadedYaml, entries: Sequence[Entry], buffers: Sequence[Buffer]) -> Iterator[Diagnostic]:
    """A buffer padded by ``square_mask`` holds the call's rows twice: on its rows dimension and on its last
    dimension, the same formula both times and the same as the rows of the call's row buffer."""
    rows = next((b for b in buffers if cat.PADDINGS[b.padding].row_wise and b.shape is not None), None)
    for buffer in buffers:
        if buffer.padding != "square_mask" or buffer.shape is None or None in buffer.shape:
            continue
        index = next(i for i, e in enumerate(entries) if e["name"] == buffer.name)
        found = _unsquare(loaded, index, buffer, rows)
        if found is not None:
            yield found


def _unsquare(loaded: LoadedYaml, index: int, buffer: Buffer, rows: Buffer | None) -> Diagnostic | None:
    """What is wrong with the shape of the square_mask ``buffer`` (entry ``index``), the first of: too few
    dimensions, a last dimension that is not its rows, rows that are not those of the row buffer ``rows``."""
    shape, d = buffer.shape, buffer.rows_dim
    if len(shape) < 2 or d >= len(shape) - 1:
        return error(loaded, ("buffers", index, "shape"),
                     f"padding 'square_mask' pads the rows on dimension {d} (rows_dim) and again on the last "
                     f"dimension, but this shape has {len(shape)} dimension{'s' if len(shape) > 1 else ''}"
                     + (" and its rows are the last" if len(shape) > 1 else ""),
                     hint="a (1, 1, rows, rows) attention mask: shape: [1, 1, <rows>, <rows>], "
                          "params: {rows_dim: 2}")
    if not shape[d].same_as(shape[-1]):
        return error(loaded, ("buffers", index, "shape", len(shape) - 1),
                     f"a square_mask's last dimension must be its rows: {str(shape[-1])!r} is not "
                     f"{str(shape[d])!r} (dimension {d}, rows_dim)", hint=f"shape: [..., {shape[d]}]")
    if rows is not None and not shape[d].same_as(rows.shape[rows.rows_dim]):
        return error(loaded, ("buffers", index, "shape", d),
                     f"a square_mask masks the call's rows, {str(rows.shape[rows.rows_dim])!r} (buffer "
                     f"{rows.name!r}), not {str(shape[d])!r}",
                     hint=f"shape: [..., {rows.shape[rows.rows_dim]}, {rows.shape[rows.rows_dim]}]")
    return None


def _capture_points(low: int, high: int, frames_per_item: int) -> Iterator[tuple[int, int, int]]:
    """(budget, max_items, max_frames) of the captures a rule samples: each power-of-two budget from ``low`` to
    ``high`` and both ends; item counts up to ``low`` (vLLM's ``items <= min(budgets)``) at and beside each power of
    two, where a cap written into a formula shows; no frames, one per item, ``frames_per_item`` per item and as
    many as the budget (an engine may set frames per batch on its own)."""
    budgets = sorted({low, high, *(1 << k for k in range(low.bit_length(), high.bit_length()))})
    counts = sorted({low, *(n for k in range(low.bit_length()) for n in (1 << k, (1 << k) + 1) if n <= low)})
    for budget in (b for b in budgets if low <= b <= high):
        for items in counts:
            frames = {0, items, items * frames_per_item, budget} if frames_per_item else {0}
            for max_frames in sorted(frames):
                yield budget, items, max_frames


def _not_positive(buffer: Buffer, low: int, geometry: Mapping[str, int]) -> bool:
    """Whether the first dimension fails where ``buffer_sizes_positive`` looks (and says so itself)."""
    try:
        return buffer.shape[0].evaluate({**cat.buffer_names(low, 1, 1), **geometry}) <= 0
    except FormulaError:
        return True


def _budget_range(spec: Spec, geometry: Mapping[str, int]) -> tuple[int, int] | None:
    """The min and max budget under the default limits and ``geometry``; None when a formula fails (the budget
    rules say why) or they make no range."""
    limits = {**cat.DEFAULT_LIMITS, **geometry}
    try:
        low, high = spec.budget_min.evaluate(limits), spec.budget_max.evaluate(limits)
    except FormulaError:
        return None
    return (low, high) if 0 < low <= high else None


def _short_capacity(loaded: LoadedYaml, spec: Spec, geometry: Mapping[str, int],
                    config: str) -> Iterator[Diagnostic]:
    """The capacity diagnostics of one geometry: at most one per buffer, at the first capture that overflows."""
    budgets = _budget_range(spec, geometry)
    if budgets is None:
        return
    low, high = budgets
    split = any(m.split for m in spec.modalities)
    roles = frozenset(r for m in spec.modalities for r in m.item_roles)
    video = max((m.max_frames_per_video for m in spec.modalities if m.name == "video"), default=0)
    for buffer in spec.buffers:
        need = cat.PROVIDERS[buffer.provider].needs(buffer.padding, buffer.params.get("role"), roles)
        if need is None or buffer.shape is None or _not_positive(buffer, low, geometry):
            continue
        found = _overflow(loaded, buffer, need, _capture_points(low, high, video), split=split, geometry=geometry,
                          config=config)
        if found is not None:
            yield found


def _overflow(loaded: LoadedYaml, buffer: Buffer, need: Formula, captures: Iterable[tuple[int, int, int]], *,
              split: bool, geometry: Mapping[str, int], config: str) -> Diagnostic | None:
    """The diagnostic of the first of ``captures`` (budget, max_items, max_frames) where ``buffer``'s first
    dimension holds fewer rows than its provider ``need``s; None when every capture fits."""
    for budget, items, frames in captures:
        names = {**cat.capacity_names(budget, items, frames, split), **geometry}
        try:
            held, needed = buffer.shape[0].evaluate(names), need.evaluate(names)
        except FormulaError:
            return None  # a name the capture does not give: buffer_sizes_positive says which
        if held < needed:
            index = next(i for i, e in enumerate(loaded.data["buffers"]) if e["name"] == buffer.name)
            written = re.sub(r"\bgrid_rows\b", "max_segments" if split else "max_items", need.source)
            return error(loaded, ("buffers", index, "shape", 0),
                         f"buffer {buffer.name!r} holds {buffer.shape[0]} = {held} rows at budget={budget}, "
                         f"max_items={items}, max_frames={frames} ({config}), but a pack can need "
                         f"{written} = {needed}: {cat.PROVIDERS[buffer.provider].capacity.doc}",
                         hint=f"shape: [{written}{', ...' if len(buffer.shape) > 1 else ''}]; a capture "
                              "allocates what the spec writes, never more")
    return None


def capacities_hold(loaded: LoadedYaml, spec: Spec,
                    geometries: Mapping[str, Mapping[str, int]]) -> Iterator[Diagnostic]:
    """A buffer whose provider states a capacity (:class:`vitcg.lang.catalogue.Capacity`: segment slots, grid rows,
    a row per item) holds it on its first dimension for every capture :func:`_capture_points` samples between the
    min and max budget under the default limits, under every config: the runtime allocates the spec's shape and
    never raises it, so the written formula is the buffer's real size."""
    for label, geometry in geometries.items():
        found = list(_short_capacity(loaded, spec, geometry, "the config defaults" if label == "defaults" else label))
        yield from found
        if found:
            return  # the same formula is short under the other configs too
