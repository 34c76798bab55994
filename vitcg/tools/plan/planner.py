"""``vitcg plan``: the budget ladder and items per batch that minimize expected encoder latency on a sample.

From a sample of requests (the images and videos of one encoder call each), item sizes come from the spec
itself (:meth:`Spec.shape_item` and :meth:`Spec.item_sizes` at the checkpoint's geometry). Each candidate
configuration is judged by the manager's own packing (:func:`vitcg.runtime.packing.plan_packs`) and routing
(:func:`vitcg.runtime.costs.route`) over the configuration's costs (:class:`vitcg.runtime.costs.CostModel`),
with no encoder and no weights. The expected latency of a configuration is the mean over requests of the replay cost
of each pack plus one eager call for the items routed eagerly. The search starts from vLLM's default ladder
and improves it by deterministic local search (add, remove or move one budget; change items or frames per
batch) while the graphs' memory stays under a cap, so the plan is never worse than the default under the
same cost model.

Costs (:class:`CostCurves`): by default a linear model fitted to H100 measurements of the Qwen2-VL-7B vision
tower; ``--costs`` reads a ``vitcg bench --json`` result instead.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import BudgetError, UsageError, VitcgError
from ...lang.catalogue import buffer_names
from ...lang.model import Spec, thaw
from ...runtime.budgets import BudgetPlan, doubling_budgets, interpolate, lean_caps, plan_budgets
from ...runtime.costs import CostModel, route
from ...runtime.options import ManagerOptions
from ...runtime.packing import plan_packs
from ..files import read_json
from ..sizes import WORKLOADS
from .compile_config import compile_config

MANAGERS = {"vitcg": ManagerOptions(), "vllm": ManagerOptions(packing="greedy", lean=False, route_eager=False)}
"""Which manager the plan is for, as the options it packs and routes by. ``vitcg``: vitcg's manager's defaults
(tight packing, eager routing, lean caps); ``vllm``: vLLM's (greedy packing, no routing, inferred caps)."""

# Measured on an H100 (benchmarks/results-costs-2026-11-22-h100.json, Qwen2-VL-7B tower, bf16).
H100_REPLAY_MS = ((64, 3.93), (128, 4.90), (256, 6.78), (512, 11.36), (1024, 22.34), (2048, 44.59),
                  (4096, 87.05), (8192, 181.26))
"""Replay time per budget (ms), measured with about :data:`REF_SLOTS` attention segment slots."""
H100_EAGER_MS = ((64, 35.12), (256, 35.11), (512, 51.48), (4313, 121.08), (512, 37.42), (1159, 56.68))
"""Hugging Face eager forward of the bench workloads: (output tokens, ms)."""
H100_POOL_MIB = 526.2
"""Graph pool and buffers of the eight budgets 64..8192."""
SLOT_MS = 1.1e-5
"""Extra replay time per attention segment slot beyond :data:`REF_SLOTS` and per budget token (ms): the flash
varlen grid grows with slots times ``max_seqlen``. Fitted to benchmarks/RESULTS.md (vLLM's inferred caps,
128 items + 4096 frames, against lean caps: +1.5 ms at 256 tokens, +4.7 ms at 512, +370 ms at 8192)."""
REF_SLOTS = 48
"""Segment slots of the measured replays (16 items + 32 frames)."""
MAX_PIXELS = 1 << 16
"""Largest height, width or frame count accepted in a request."""


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a + b*x`` minimizing the squared *relative* error (each point weighted by 1/y), so
    small, launch-bound sizes fit as well as large ones. Needs two distinct x."""
    w = [1.0 / y**2 for _, y in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points))
    sy = sum(wi * y for wi, (_, y) in zip(w, points))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, points))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ValueError("a line needs two distinct sizes")
    b = (sw * sxy - sx * sy) / det
    return (sy - b * sx) / sw, b


@dataclass(frozen=True)
class CostCurves:
    """What a replay, an eager forward and a graph cost, as curves over sizes. Replays: ``r0 + r1*b`` ms, or ``replay_points``
    interpolated when measured; plus :data:`SLOT_MS` per segment slot over :data:`REF_SLOTS` per budget token.
    Eager: ``e0 + e1*t`` ms for ``t`` output tokens in one call. Memory: ``mib_per_token * b`` per graph."""

    source: str
    r0: float
    r1: float
    e0: float
    e1: float
    mib_per_token: float
    replay_points: tuple[tuple[int, float], ...] = ()
    slot_ms: float = SLOT_MS

    def replay(self, budget: int, slots: int = 0) -> float:
        """Below the smallest measured budget a replay costs what the smallest one did, and above the largest no
        less than the largest one did: a falling last segment extrapolated far enough would make graphs free."""
        if self.replay_points:
            base = interpolate(self.replay_points, budget, flat_below=True)
            last_budget, last_ms = self.replay_points[-1]
            base = max(base, last_ms) if budget >= last_budget else base
        else:
            base = self.r0 + self.r1 * budget
        return base + self.slot_ms * max(0, slots - REF_SLOTS) * budget

    def eager(self, tokens: int) -> float:
        return self.e0 + self.e1 * tokens if tokens else 0.0

    def memory(self, budget: int) -> float:
        return self.mib_per_token * budget

    def model(self, plan: BudgetPlan, slots: Callable[[int], int]) -> CostModel:
        """The runtime's cost model for ``plan``'s graphs (``slots(budget)``: their attention segment slots)."""
        return CostModel({b: self.replay(b, slots(b)) for b in plan.budgets}, eager=self.eager)

    def describe(self) -> str:
        replay = ("measured replay_ms interpolated" if self.replay_points
                  else f"replay {self.r0:.2f} + {self.r1:.4f}*budget ms")
        return (f"{self.source}: {replay}, eager {self.e0:.1f} + {self.e1:.4f}*tokens ms, "
                f"{self.mib_per_token:.4f} MiB per budget token, +{self.slot_ms:.1e} ms per segment slot over "
                f"{REF_SLOTS} per budget token")

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "replay_ms": {"r0": round(self.r0, 4), "r1": round(self.r1, 6),
                                                     "points": [list(p) for p in self.replay_points]},
                "eager_ms": {"e0": round(self.e0, 4), "e1": round(self.e1, 6)},
                "mib_per_budget_token": round(self.mib_per_token, 6), "slot_ms": self.slot_ms,
                "ref_slots": REF_SLOTS}


def default_costs() -> CostCurves:
    """The linear model fitted to the H100 measurements of the Qwen2-VL-7B tower."""
    r0, r1 = fit_line(H100_REPLAY_MS)
    e0, e1 = fit_line(H100_EAGER_MS)
    memory = H100_POOL_MIB / sum(b for b, _ in H100_REPLAY_MS)
    return CostCurves("default: linear model fitted to Qwen2-VL-7B tower on an H100 (2026-11-22)", r0, r1, e0, e1,
                     memory)


MAX_MS = 1e7
"""The largest time (ms) a ``--costs`` file may give one call: 2.8 hours. A real measurement is far below it; a
larger one (``1e308``) is a broken file, and sums of such times overflow to infinity."""
MAX_POOL_MIB = float(1 << 30)
"""The largest graph pool (MiB) a ``--costs`` file may give: 1 PiB, beyond any device."""


def _where_key(entry: str, *keys: object) -> str:
    return entry + "".join(f"[{json.dumps(k)}]" for k in keys)


def _positive_int(value: object, key: str, where: str) -> int:
    """``value`` as an integer from 1 to 2**31-1 (a budget or a token count; JSON object keys arrive as strings).
    Raises UsageError naming ``key``, what it expects and what it got."""
    from .compile_config import MAX_VALUE

    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        number = int(value)
    if number is None or not 0 < number <= MAX_VALUE:
        shown = value if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise UsageError(f"{where}: {key}: expected an integer from 1 to {MAX_VALUE}, got {shown!r}")
    return number


def _positive_ms(value: object, key: str, where: str, most: float = MAX_MS, unit: str = "ms") -> float:
    """``value`` as a finite number above 0 and at most ``most``. Raises UsageError naming ``key``, what it
    expects and what it got (NaN, Infinity, 1e308, a negative time, a string)."""
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not (math.isfinite(number) and 0 < number <= most):
        shown = value if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise UsageError(f"{where}: {key}: expected a finite number of {unit} above 0 and at most {most:.0f}, "
                         f"got {shown!r}")
    return number


def _field(entry: dict[str, Any], key: str, kind: type, spec: str, where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind):
        expected = {dict: "an object", list: "a list"}.get(kind, kind.__name__)
        got = "nothing" if key not in entry else type(value).__name__
        raise UsageError(f"{where}: {_where_key(spec, key)}: expected {expected}, got {got}")
    return value


def _replay_points(entry: dict[str, Any], spec: str, where: str) -> tuple[tuple[int, float], ...]:
    replay = _field(entry, "replay_ms", dict, spec, where)
    points: dict[int, float] = {}
    for key, ms in replay.items():
        at = _where_key(spec, "replay_ms", key)
        budget = _positive_int(key, f"{at} (a budget)", where)
        if budget in points:
            raise UsageError(f"{where}: {at}: budget {budget} is given twice")
        points[budget] = _positive_ms(ms, at, where)
    if not points:
        raise UsageError(f"{where}: {_where_key(spec, 'replay_ms')}: expected replay times of one budget or more, "
                         "got none")
    return tuple(sorted(points.items()))


def _eager_points(entry: dict[str, Any], spec: str, where: str) -> list[tuple[int, float]]:
    points = []
    for i, workload in enumerate(_field(entry, "workloads", list, spec, where)):
        times = workload.get("ms") if isinstance(workload, dict) else None
        if not isinstance(times, dict) or times.get("eager") is None:
            continue  # a workload the spec could not serve eagerly, or one without times
        at = _where_key(spec, "workloads", i)
        points.append((_positive_int(workload.get("tokens"), f"{at}[\"tokens\"]", where),
                       _positive_ms(times["eager"], f'{at}["ms"]["eager"]', where)))
    if len({t for t, _ in points}) < 2:
        raise UsageError(f"{where}: {_where_key(spec, 'workloads')}: expected eager times of two workload sizes "
                         f"or more, got {len({t for t, _ in points})}")
    return points


def fit_eager(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(e0, e1)`` of :func:`fit_line`, kept positive at every size of one token or more: eager times that fall
    with size (measurement noise on an encoder whose calls all cost about the same: clip's do) give a flat line,
    and a line that would start below zero goes through the origin instead, so no call is free or gains time."""
    e0, e1 = fit_line(points)
    w = [1.0 / y**2 for _, y in points]
    if e1 < 0:  # the constant that minimizes the relative error
        return sum(wi * y for wi, (_, y) in zip(w, points)) / sum(w), 0.0
    if e0 + e1 <= 0:  # the slope through the origin that minimizes the relative error
        return 0.0, sum(wi * x * y for wi, (x, y) in zip(w, points)) / sum(wi * x * x for wi, (x, _) in zip(w, points))
    return e0, e1


def _spec_results(specs: list, spec: str, where: str) -> tuple[int, dict]:
    """The index and entry of ``spec`` in a results file's ``specs``; raises UsageError naming those it has."""
    index, entry = next(((i, s) for i, s in enumerate(specs) if isinstance(s, dict) and s.get("spec") == spec),
                        (None, None))
    if entry is None:
        names = ", ".join(str(s.get("spec"))[:40] for s in specs if isinstance(s, dict)) or "none"
        raise UsageError(f"{where}: no results for spec {spec!r} (it has: {names})")
    return index, entry


def costs_from_results(path: Path, spec: str) -> CostCurves:
    """A cost model from a ``vitcg bench --json`` file: ``spec``'s measured replay_ms per budget
    (interpolated), pool_mib over its budgets, and a line through its workloads' eager times (:func:`fit_eager`).
    Raises UsageError naming the file and the key of a value that is missing or out of range (budgets are
    integers from 1 to 2**31-1; times finite, above 0 and at most :data:`MAX_MS`; the pool at most
    :data:`MAX_POOL_MIB`)."""
    where = f"--costs {path}"
    document = read_json(path, where)
    specs = document.get("specs") if isinstance(document, dict) else None
    if not isinstance(specs, list):
        raise UsageError(f"{where}: not a results file of `vitcg bench --json` (no \"specs\" list)")
    index, entry = _spec_results(specs, spec, where)
    at = f"specs[{index}]"
    replay = _replay_points(entry, at, where)
    budgets = [_positive_int(b, _where_key(at, "budgets", i), where)
               for i, b in enumerate(_field(entry, "budgets", list, at, where))]
    if not budgets:
        raise UsageError(f"{where}: {_where_key(at, 'budgets')}: expected one budget or more, got none")
    pool = _positive_ms(entry.get("pool_mib"), _where_key(at, "pool_mib"), where, MAX_POOL_MIB, "MiB")
    e0, e1 = fit_eager(_eager_points(entry, at, where))
    r0, r1 = fit_line(replay) if len(replay) > 1 else (0.0, replay[0][1] / replay[0][0])
    return CostCurves(f"measured: {path} ({spec})", r0, r1, e0, e1, pool / sum(budgets), replay)


# ---------------------------------------------------------------------------------------------- the sample

@dataclass(frozen=True)
class Request:
    """The images and videos of one encoder call, in pixels."""

    images: tuple[tuple[int, int], ...] = ()
    videos: tuple[tuple[int, int, int], ...] = ()
    name: str = ""

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        parts = [f"{h}x{w}" for h, w in self.images] + [f"{f}x{h}x{w}" for f, h, w in self.videos]
        return ",".join(parts)


_SIZE = re.compile(r"[0-9]+(x[0-9]+){1,2}")


def parse_request(text: str) -> Request:
    """``448x448,224x224`` (images HxW) or ``4x448x448`` (a video FxHxW), comma-separated. Raises UsageError."""
    images, videos = [], []
    for part in text.split(","):
        part = part.strip().lower()
        if not _SIZE.fullmatch(part):
            raise UsageError(f"--request {text}: expected images as HxW and videos as FxHxW, comma-separated "
                             f"positive integers (e.g. 448x448,4x448x448), got {part!r}")
        numbers = tuple(int(n) for n in part.split("x"))
        _check_numbers(f"--request {text}", numbers)
        (images if len(numbers) == 2 else videos).append(numbers)
    return Request(tuple(images), tuple(videos))


def _check_numbers(where: str, numbers: Sequence[Any]) -> None:
    for n in numbers:
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_PIXELS:
            raise UsageError(f"{where}: sizes must be integers from 1 to {MAX_PIXELS}, got {n!r}")


def read_requests(path: Path) -> list[Request]:
    """A JSON list of ``{"images": [[h, w], ...], "videos": [[frames, h, w], ...]}``. Raises UsageError."""
    where = f"--requests {path}"
    document = read_json(path, where)
    if not isinstance(document, list) or not document:
        raise UsageError(f'{where}: expected a non-empty JSON list of {{"images": [[h, w], ...], "videos": '
                         f'[[frames, h, w], ...]}}, got {type(document).__name__}')
    return [_request(f"{where}: request {i}", entry) for i, entry in enumerate(document)]


def _request(at: str, entry: Any) -> Request:
    """One request of a ``--requests`` file, ``at`` naming it in errors. Raises UsageError."""
    if not isinstance(entry, dict) or set(entry) - {"images", "videos"}:
        raise UsageError(f'{at}: expected an object with "images" and/or "videos", got {json.dumps(entry)[:80]}')
    images, videos = _sizes(at, entry, "images", 2), _sizes(at, entry, "videos", 3)
    if not images and not videos:
        raise UsageError(f"{at}: no images and no videos")
    return Request(images, videos)


def _sizes(at: str, entry: dict, key: str, size: int) -> tuple[tuple[int, ...], ...]:
    """The sizes under ``key`` of a request (``size`` numbers each; none when the key is absent)."""
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == size for v in value):
        shape = "[h, w]" if size == 2 else "[frames, h, w]"
        raise UsageError(f"{at}: {key!r} must be a list of {shape}, got {json.dumps(value)[:80]}")
    for v in value:
        _check_numbers(f"{at}: {key}", v)
    return tuple(tuple(v) for v in value)


def default_requests(spec: Spec) -> list[Request]:
    """The bench workloads (:data:`vitcg.tools.sizes.WORKLOADS`) the spec can serve."""
    return [Request(w.images, w.videos, w.name) for w in WORKLOADS.values()
            if not (w.videos and spec.modality("video") is None) and not (w.images and spec.modality("image") is None)]


# ---------------------------------------------------------------------------------------------- the target

@dataclass(frozen=True)
class Target:
    """What planning needs of one encoder at given engine limits (no module, no weights)."""

    name: str
    min_budget: int
    max_budget: int
    modalities: tuple[str, ...] = ("image",)
    max_frames_per_video: int = 1
    segmented: bool = True
    """Whether capture buffers hold a slot per attention segment (``cu_seqlens``)."""
    out_hidden_size: int = 1
    buffer_keys: tuple[str, ...] = ()

    @property
    def video(self) -> bool:
        return "video" in self.modalities

    def slots(self, budget: int, items: int, frames: int) -> int:
        return buffer_names(budget, items, frames)["max_segments"] if self.segmented else 0


def spec_geometry(spec: Spec) -> dict[str, int]:
    """The spec's geometry at its checkpoint's dimensions (``real_config``), from the config snapshot the
    bindings cache holds (transformers is imported only on a cache miss)."""
    from ...lang.bindings import Bindings

    bindings = Bindings()
    answer = bindings.check_config(spec.encoder.config_class, thaw(spec.tests.real_config))
    bindings.save()
    if not answer.get("ok"):
        reason = spec.unavailable or answer.get("error") or answer.get("unknown_keys")
        raise UsageError(f"{spec.name}: cannot resolve its geometry: {reason}")
    return spec.resolve_geometry(answer["snapshot"])


def target_of(spec: Spec, geometry: dict[str, int], max_num_batched_tokens: int, max_model_len: int) -> Target:
    names = {"max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len, **geometry}
    video = spec.modality("video")
    return Target(spec.name, spec.budget_min.evaluate(names), spec.budget_max.evaluate(names), spec.modality_names,
                  video.max_frames_per_video if video else 1, any(b.provider == "cu_seqlens" for b in spec.buffers),
                  geometry.get("out_hidden_size", 1), tuple(b.name for b in spec.buffers))


Items = tuple[tuple[int, int], ...]
"""One request as items: (output tokens, frames) each, images before videos (the manager's canonical order)."""


def request_items(spec: Spec, geometry: dict[str, int], request: Request) -> Items:
    items = []
    for modality, entries in (("image", request.images), ("video", request.videos)):
        if entries and spec.modality(modality) is None:
            raise UsageError(f"request {request.label}: {spec.name} has no {modality} modality "
                             f"(it has {', '.join(spec.modality_names)})")
        for entry in entries:
            _, tokens, frames = spec.item_sizes(modality, spec.shape_item(modality, entry, geometry), geometry)
            items.append((tokens, frames))
    return tuple(items)


# ---------------------------------------------------------------------------------------------- the search

@dataclass(frozen=True)
class Config:
    """One candidate: budgets, items and frames per batch."""

    budgets: tuple[int, ...]
    max_items: int
    max_frames: int


@dataclass
class Evaluation:
    config: Config
    memory_mib: float
    expected_ms: float
    per_request: list[float]
    replays: int = 0
    eager_items: int = 0


@dataclass
class Plan:
    target: Target
    costs: CostCurves
    manager: str
    requests: list[tuple[Request, int, Items]]
    """Distinct requests: (request, how many times it occurs, its items)."""
    memory_cap_mib: float
    default: Evaluation
    planned: Evaluation
    compilation_config: dict[str, Any]
    evaluations: int = 0
    notes: list[str] = field(default_factory=list)


class Planner:
    def __init__(self, target: Target, requests: Sequence[tuple[Request, int, Items]], costs: CostCurves,
                 manager: str = "vitcg"):
        if manager not in MANAGERS:
            raise UsageError(f"--manager must be one of {', '.join(MANAGERS)}, got {manager!r}")
        self.target, self.requests, self.costs, self.manager = target, list(requests), costs, manager
        self.options = MANAGERS[manager]
        self.total = sum(count for _, count, _ in self.requests)
        self._cache: dict[Config, Evaluation | None] = {}

    def _budget_plan(self, budgets: Sequence[int] | None = None, items: int = 0, frames: int | None = None
                     ) -> BudgetPlan:
        """The budgets and caps the manager would capture with these engine options."""
        t = self.target
        plan = plan_budgets(t.min_budget, t.max_budget, list(budgets) if budgets else None, items, frames,
                            t.max_frames_per_video, video=t.video)
        return lean_caps(plan, t.max_frames_per_video, frames is None) if self.options.lean and not items else plan

    def default_config(self) -> Config:
        """What the manager captures with no options: vLLM's ladder and the manager's inferred caps."""
        plan = self._budget_plan()
        return Config(plan.budgets, plan.max_items, plan.max_frames)

    def memory(self, config: Config) -> float:
        return sum(self.costs.memory(b) for b in config.budgets)

    def evaluate(self, config: Config) -> Evaluation | None:
        """Expected latency of ``config`` (None when the manager refuses it)."""
        if config in self._cache:
            return self._cache[config]
        try:
            plan = self._budget_plan(config.budgets, config.max_items, config.max_frames)
        except BudgetError:
            self._cache[config] = None
            return None
        costs = self.costs.model(plan, lambda b: self.target.slots(b, plan.max_items, plan.max_frames))
        per_request, total, replays, eager_items = [], 0.0, 0, 0
        for _, count, items in self.requests:
            tokens = [n for n, _ in items]
            packs, eager = plan_packs(tokens, plan, frames=[f for _, f in items], policy=self.options.packing,
                                      price=costs.replay.__getitem__)
            if self.options.route_eager:
                routed = route(tokens, packs, eager, costs)
                packs, eager = routed.packs, routed.eager
            ms = sum(costs.replay[p.budget] for p in packs) + costs.eager_cost(sum(tokens[i] for i in eager))
            per_request.append(ms)
            total += ms * count
            replays += len(packs) * count
            eager_items += len(eager) * count
        result = Evaluation(config, self.memory(config), total / self.total, per_request, replays, eager_items)
        self._cache[config] = result
        return result

    def candidates(self) -> list[int]:
        """Budgets worth trying: multiples of the min budget on a geometric grid (ratio 1.25), vLLM's ladder,
        and each item's and each request's tokens rounded up to a multiple of the min budget."""
        lo, hi = self.target.min_budget, self.target.max_budget
        values = set(doubling_budgets(lo, hi))
        m = 1.0
        while m * lo <= hi:
            values.add(lo * round(m))
            m *= 1.25
        for _, _, items in self.requests:
            for tokens in [t for t, _ in items] + [sum(t for t, _ in items)]:
                values.add(lo * max(1, math.ceil(tokens / lo)))
        return sorted(v for v in values if lo <= v <= hi)

    def _item_choices(self) -> list[int]:
        most = max(len(items) for _, _, items in self.requests)
        values = {1 << k for k in range(12)} | {most, self.default_config().max_items}
        return sorted(values)

    def _frame_choices(self) -> list[int]:
        if not self.target.video:
            return [0]
        videos = [f for _, _, items in self.requests for _, f in items if f]
        if not videos:
            return [0, self.default_config().max_frames]
        top = max(videos)
        return sorted({0, top, 2 * top, 4 * top, sum(videos), self.default_config().max_frames})

    def _better(self, new: Evaluation, old: Evaluation) -> bool:
        """Lower latency, or the same latency with less memory (fewer graphs for nothing)."""
        tolerance = 1e-9 * max(1.0, old.expected_ms)
        if new.expected_ms < old.expected_ms - tolerance:
            return True
        return abs(new.expected_ms - old.expected_ms) <= tolerance and new.memory_mib < old.memory_mib - 1e-9

    def _neighbours(self, config: Config, candidates: list[int]) -> list[Config]:
        budgets = set(config.budgets)
        out = [Config(tuple(sorted(budgets | {b})), config.max_items, config.max_frames)
               for b in candidates if b not in budgets]
        for b in config.budgets:
            out += _moves(config, b, candidates)
        out += [Config(config.budgets, n, config.max_frames) for n in self._item_choices() if n != config.max_items]
        out += [Config(config.budgets, config.max_items, f) for f in self._frame_choices() if f != config.max_frames]
        return out

    def fits(self, config: Config, cap: float) -> bool:
        return self.memory(config) <= cap + 1e-9

    def search(self, cap: float, max_rounds: int = 200) -> tuple[Evaluation, Evaluation]:
        """``(default, planned)``. Starts from the default (its largest budgets dropped while it exceeds
        ``cap``) and takes the best improving move until none improves."""
        default = self.evaluate(self.default_config())
        start = default.config
        smallest = self.target.min_budget
        if self.costs.memory(smallest) > cap + 1e-9:
            raise UsageError(f"--memory-cap-mib {cap:g} is below the smallest graph: budget {smallest} needs "
                             f"{self.costs.memory(smallest):.1f} MiB under {self.costs.source.split(':')[0]} costs")
        while not self.fits(start, cap):
            budgets = start.budgets[:-1] if len(start.budgets) > 1 else (smallest,)
            start = Config(budgets, min(start.max_items, budgets[0]), start.max_frames)
        current = self.evaluate(start)
        if current is None:  # the capped default broke an invariant: the smallest budget alone
            current = self.evaluate(Config((smallest,), min(start.max_items, smallest), start.max_frames))
        candidates = self.candidates()
        for _ in range(max_rounds):
            best = current
            for config in self._neighbours(current.config, candidates):
                if not self.fits(config, cap):
                    continue
                result = self.evaluate(config)
                if result is not None and self._better(result, best):
                    best = result
            if best is current:
                break
            current = best
        return default, current

    @property
    def evaluations(self) -> int:
        return len(self._cache)


def _moves(config: Config, b: int, candidates: list[int]) -> list[Config]:
    """``config`` without its budget ``b`` (unless it is the only one), then with ``b`` moved to the candidate
    below and above it that ``config`` does not hold."""
    budgets = set(config.budgets)
    out = []
    if len(budgets) > 1:
        out.append(Config(tuple(sorted(budgets - {b})), config.max_items, config.max_frames))
    if b not in candidates:
        return out
    k = candidates.index(b)
    for j in (k - 1, k + 1):
        if 0 <= j < len(candidates) and candidates[j] not in budgets:
            out.append(Config(tuple(sorted(budgets - {b} | {candidates[j]})), config.max_items, config.max_frames))
    return out


def modality_of(requests: Sequence[tuple[Request, int, Items]]) -> str:
    images = any(r.images for r, _, _ in requests)
    videos = any(r.videos for r, _, _ in requests)
    return "image+video" if images and videos else "video" if videos else "image"


def group(spec_items, requests: Sequence[Request]) -> list[tuple[Request, int, Items]]:
    """Distinct requests in first-seen order with their counts and items (``spec_items(request)``)."""
    counts = Counter((r.images, r.videos, r.name) for r in requests)
    seen, out = set(), []
    for r in requests:
        key = (r.images, r.videos, r.name)
        if key not in seen:
            seen.add(key)
            out.append((r, counts[key], spec_items(r)))
    return out


def _memory_cap(planner: Planner, memory_cap_mib: float | None) -> float:
    """The graph memory cap in MiB: ``memory_cap_mib``, else what vLLM's default ladder takes. Raises UsageError
    when the default ladder breaks an invariant or the cap is not a positive number."""
    try:
        default_memory = planner.memory(planner.default_config())
    except BudgetError as exc:  # every limit here came from the command line
        raise UsageError(str(exc)) from None
    cap = default_memory if memory_cap_mib is None else memory_cap_mib
    if not math.isfinite(cap) or cap <= 0:
        raise UsageError(f"--memory-cap-mib must be a positive number of MiB, got {memory_cap_mib!r}")
    return cap


def make_plan(target: Target, requests: Sequence[tuple[Request, int, Items]], costs: CostCurves, *,
              manager: str = "vitcg", memory_cap_mib: float | None = None) -> Plan:
    """Plan budgets, items and frames for ``requests`` (grouped, with items) on ``target``."""
    if not requests:
        raise UsageError("no requests to plan for")
    planner = Planner(target, requests, costs, manager)
    cap = _memory_cap(planner, memory_cap_mib)
    default, planned = planner.search(cap)
    modality = modality_of(requests)
    if target.video and "video" not in modality and planned.config.max_frames:
        # no video in the sample: frame slots only widen the capture buffers (never slower without them)
        zero = planner.evaluate(Config(planned.config.budgets, planned.config.max_items, 0))
        planned = zero if zero is not None else planned
    frames = planned.config.max_frames if target.video else None
    try:
        config = compile_config(modality, budgets=list(planned.config.budgets), max_items=planned.config.max_items,
                                max_frames=frames)
    except VitcgError as exc:
        raise UsageError(f"the planned configuration is not a valid compilation config: {exc}") from None
    notes = []
    if default.memory_mib > cap + 1e-9:
        notes.append(f"vLLM's default ladder needs {default.memory_mib:.0f} MiB, over the {cap:.0f} MiB cap")
    return Plan(target, costs, manager, list(requests), cap, default, planned, config, planner.evaluations, notes)


# ---------------------------------------------------------------------------------------------- output

def _config_line(e: Evaluation) -> str:
    c = e.config
    return (f"budgets {','.join(map(str, c.budgets))}; {c.max_items} items, {c.max_frames} frames per batch; "
            f"{e.memory_mib:.0f} MiB")


def _request_table(plan: Plan) -> str:
    """Per distinct request its count, items, tokens and default and planned times, then the expected mean."""
    rows = [("request", "count", "items", "tokens", "default ms", "planned ms", "speedup")]
    for (request, count, items), d, p in zip(plan.requests, plan.default.per_request, plan.planned.per_request):
        rows.append((request.label if len(request.label) <= 40 else request.label[:37] + "...", str(count),
                     str(len(items)), str(sum(t for t, _ in items)), f"{d:.2f}", f"{p:.2f}", f"{d / p:.2f}x"))
    d, p = plan.default.expected_ms, plan.planned.expected_ms
    rows.append(("expected (mean)", str(sum(c for _, c, _ in plan.requests)), "", "", f"{d:.2f}", f"{p:.2f}",
                 f"{d / p:.2f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))) for row in rows)


def plan_text(plan: Plan, *, source: str, limits: tuple[int, int], seconds: float | None = None) -> str:
    table = _request_table(plan)
    options = MANAGERS[plan.manager]
    lines = [
        f"vitcg plan {plan.target.name}: {len(plan.requests)} distinct requests ({source}); budget range "
        f"{plan.target.min_budget}..{plan.target.max_budget} (max_num_batched_tokens {limits[0]}, "
        f"max_model_len {limits[1]})",
        f"costs: {plan.costs.describe()}",
        f"manager: {plan.manager} ({options.packing} packing, "
        f"{'eager routing' if options.route_eager else 'no eager routing'}); "
        f"graph memory cap {plan.memory_cap_mib:.0f} MiB",
        "",
        table,
        "",
        f"default:  {_config_line(plan.default)} (vLLM's ladder, the manager's inferred caps)",
        f"planned:  {_config_line(plan.planned)}"
        + (f" ({plan.planned.eager_items} of the sample's items run eagerly)" if plan.planned.eager_items else ""),
        *[f"note: {n}" for n in plan.notes],
        "",
        "compilation_config:",
        json.dumps(plan.compilation_config),
    ]
    if seconds is not None:
        lines.insert(3, f"search: {plan.evaluations} configurations in {seconds:.2f} s")
    return "\n".join(lines) + "\n"


def plan_json(plan: Plan, *, source: str, limits: tuple[int, int]) -> dict[str, Any]:
    def evaluation(e: Evaluation) -> dict[str, Any]:
        return {"budgets": list(e.config.budgets), "max_items": e.config.max_items,
                "max_frames": e.config.max_frames, "memory_mib": round(e.memory_mib, 2),
                "expected_ms": round(e.expected_ms, 4), "replays": e.replays, "eager_items": e.eager_items}

    return {
        "spec": plan.target.name, "source": source, "manager": plan.manager,
        "limits": {"max_num_batched_tokens": limits[0], "max_model_len": limits[1],
                   "min_budget": plan.target.min_budget, "max_budget": plan.target.max_budget},
        "costs": plan.costs.to_json(), "memory_cap_mib": round(plan.memory_cap_mib, 2),
        "default": evaluation(plan.default), "plan": evaluation(plan.planned),
        "speedup": round(plan.default.expected_ms / plan.planned.expected_ms, 4),
        "requests": [{"request": r.label, "count": c, "items": len(items), "tokens": sum(t for t, _ in items),
                      "default_ms": round(d, 4), "plan_ms": round(p, 4)}
                     for (r, c, items), d, p in zip(plan.requests, plan.default.per_request, plan.planned.per_request)],
        "compilation_config": plan.compilation_config, "notes": plan.notes,
    }
