"""Conformance: run fixed cases through the budget manager and through eager, item by item.

The cases are derived from each spec's geometry, so every spec gets the same scrutiny: one small
image, several images of different sizes, one video, image and video in one call, an item larger than
the largest budget (beside a small one), and an empty batch. An item is correct when its manager output
has the rows ``items.output_tokens`` says, is finite, and matches the eager output of that item alone
within the dtype's relative tolerance. Host bounds that only CUDA kernels read (``max_seqlen``...) are compared
with the boundaries they bound at capture and at every replay (:mod:`.bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import VitcgError
from ...lang import InvalidSpec
from ...lang.model import Spec
from ...runtime.adapter import adapter_for
from ...runtime.hf import output_entry
from ...runtime.manager import EncoderCudaGraphManager, ManagerOptions
from ..encoders import build_encoder
from ..guesses import Guess, guesses
from ..workloads import InputBuilder, Inputs, on_device, relative_error
from .bounds import Watch, capture_overruns
from .failures import describe, step

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 1e-2, torch.float16: 1e-2}
"""Tolerance of :func:`relative_error` (graph against eager) per dtype."""
PIXELS = ("the pixel rows' shape (tests.inputs.pixels, else the pixel buffer's shape in buffers) against geometry "
          "(patch_size, in_channels, image_size) and tests.tiny_config")
"""What shapes the rows the model's first layer reads: where to look when a layer gets rows of the wrong width."""
HALF = (torch.bfloat16, torch.float16)
NOISE_FACTOR = 1.5
"""In half precision a deep encoder's own rounding noise can exceed 1e-2 (32 bf16 layers with random
weights reach ~2e-2 between two attention kernels). A half-precision item also passes when its error
against a float32 eager reference is at most this factor times eager's own error against that reference:
the graph is then as accurate as the model's own forward."""


@dataclass
class CaseResult:
    name: str
    items: int = 0
    route: str = ""
    """How the items ran: budgets replayed and eager count."""
    max_error: float = 0.0
    finite: bool = True
    error: str | None = None
    """Why the case could not complete (a clear message), or None."""
    skipped: str | None = None
    tolerance: float = 0.0
    graph_vs_fp32: float | None = None
    """Half precision: largest error of a graph output against the float32 eager reference."""
    eager_vs_fp32: float | None = None
    """Half precision: eager's own error against the float32 eager reference, for the same item."""
    noise_ok: bool = False
    """Every item within tolerance or within NOISE_FACTOR of eager's own float32 error."""
    stage: str = "spec"
    """``spec``: against the spec's own eager call; ``vlm``: end to end against the full VLM."""

    @property
    def ok(self) -> bool:
        within = self.max_error <= self.tolerance or self.noise_ok
        return self.skipped is not None or (self.error is None and self.finite and within)


@dataclass
class SpecReport:
    spec: str
    device: str
    dtype: str
    budgets: tuple[int, ...] = ()
    max_items: int = 0
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None
    unavailable: str | None = None
    """Why the installed transformers cannot run the spec (not a failure), or None."""
    guesses: list[Guess] = field(default_factory=list)
    """The lines of the spec's own files that are still guesses (:mod:`.guesses`): a draft's ``# GUESS:`` lines
    and placeholder checkpoints."""
    warnings: list[str] = field(default_factory=list)
    """What transformers and torch warned while the spec was checked (:mod:`.quiet`), one line per distinct
    warning; filled by the caller that kept them."""

    @property
    def ok(self) -> bool:
        return self.error is None and all(case.ok for case in self.cases)


def _cases(builder: InputBuilder, max_budget: int) -> list[tuple[str, Callable[[], Inputs] | str]]:
    spec = builder.spec
    has_image, has_video = spec.modality("image") is not None, spec.modality("video") is not None
    video = spec.modality("video")
    frames = min(4, video.max_frames_per_video) if video else 0
    tiles = not spec.attention_style.segmented
    first = "image" if has_image else "video"
    huge = _oversized(builder, first, max_budget)

    def one(modality, *sizes):
        return lambda: builder.inputs(modality, list(sizes))

    def item(modality, a, b):
        return builder.image(a, b) if modality == "image" else builder.video(1, a, b)

    no_video = "no video modality"
    single = spec.modality(first).count_key is None
    return [
        ("one small image" if has_image else "one small item", one(first, item(first, 2, 4))),
        ("images of different sizes",  # more items than one pack holds: two packs, two budgets
         one(first, *(item(first, a, b) for a, b in ((2, 2), (4, 6), (2, 4), (6, 8), (4, 4), (8, 12))))
         if not tiles else one(first, 1, 3, 2, 1, 2)),
        ("one video", one("video", builder.video(frames, 4, 4)) if has_video else no_video),
        ("image and video in one call", _mixed(builder, frames) if has_image and has_video else
         "needs image and video"),
        ("item larger than the largest budget",
         "every item is one tile, within every budget" if single else
         one(first, item(first, 2, 2), item(first, huge, huge) if not tiles else huge)),
        ("empty batch", one(first)),
    ]


def _oversized(builder: InputBuilder, modality: str, max_budget: int) -> int:
    """The size of an item of ``modality`` larger than ``max_budget``: tiles (a tile style), else the side of a
    square grid."""
    if builder.spec.attention_style.segmented:
        return math.isqrt(max_budget) + 1
    return max_budget // builder.spec.item_sizes(modality, 1, builder.geometry)[1] + 1


def _mixed(builder: InputBuilder, frames: int) -> Callable[[], Inputs]:
    """The inputs of one call holding an image and a video of ``frames // 2`` frames (at least one)."""
    tiles = not builder.spec.attention_style.segmented
    return lambda: {**builder.inputs("image", [builder.image(4, 6) if not tiles else 2]),
                    **builder.inputs("video", [builder.video(max(1, frames // 2), 2, 4)])}


def _route(manager: EncoderCudaGraphManager, before: dict) -> str:
    after = manager.stats
    budgets = after.replays_per_budget - before["per_budget"]
    parts = [f"{b}x{n}" if n > 1 else str(b) for b, n in sorted(budgets.items())]
    route = f"graph {'+'.join(parts)}" if parts else ""
    eager = after.misses - before["misses"]
    if eager:
        route += (", " if route else "") + f"eager {eager}"
    return route or "-"


def check_spec(spec: Spec, *, device: str = "cpu", dtype: torch.dtype | None = None, size: str = "tiny",
               seed: int = 0, budget_multiple: int = 4) -> SpecReport:
    """Build the spec's encoder and run every case; never raises for a failing spec (the report says why).

    ``budget_multiple``: the engine's max_num_batched_tokens and max_model_len are this times the min
    budget, which keeps tiny CPU runs fast and gives several budgets and an oversized item (a budget
    bounded by max_model_len alone would otherwise size the capture buffers for a huge engine).
    """
    dtype = _default_dtype(device, dtype)
    report = SpecReport(spec.name, device, str(dtype).removeprefix("torch."), unavailable=spec.unavailable,
                        guesses=guesses(spec))
    if spec.unavailable:
        return report
    tolerance = TOLERANCE[dtype]
    config = "tests.tiny_config" if size == "tiny" else "tests.real_config"
    try:
        with step(f"building the {size} encoder", f"{config} against encoder.config_class (a value its validators "
                  "refuse, or a field it derives from others) and encoder.class"):
            module = build_encoder(spec, size, device=device, dtype=dtype, seed=seed)
            adapter = adapter_for(spec, module)
            # same seed, same weights: the float32 twin is the reference for half-precision noise
            reference = (adapter_for(spec, build_encoder(spec, size, device=device, dtype=torch.float32, seed=seed))
                         if dtype in HALF else None)
        with step("planning the budgets", "budget.min, budget.max and the geometry they read"):
            min_budget, _ = adapter.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 1 << 30,
                                                                        "max_model_len": 1 << 30})
            limit = budget_multiple * min_budget
            # route_eager off: a check proves the graphs, so every pack that fits a budget replays (on CUDA the
            # router would run the first calls of each size eagerly, to time them, and a check makes only such
            # calls)
            manager = EncoderCudaGraphManager(adapter, max_num_batched_tokens=limit, max_model_len=limit,
                                              device=device, dtype=dtype, options=ManagerOptions(route_eager=False))
        report.budgets, report.max_items = manager.budgets, manager.plan.max_items
        with step(f"capturing the budget graphs of {type(module).__name__}", _graph_fields(spec)):
            manager.capture()
        generator = torch.Generator().manual_seed(seed)
        builder = InputBuilder(spec, adapter, generator)
        merge = adapter.geometry.get("spatial_merge_size", 1)
        # host bounds (max_seqlen...) are read by CUDA kernels only: proven here against the boundaries
        with step("filling each budget's graph with one item", _graph_fields(spec)):
            overruns = capture_overruns(spec, adapter, builder, manager)
        if overruns:
            raise VitcgError(overruns[0].message(merge) + _more(overruns))
        watch = Watch(spec, manager.graphs)
        cases = _cases(builder, manager.budgets[-1])
    except Exception as exc:  # noqa: BLE001 - model code fails in any way on a wrong spec; the report says how
        report.error = describe(exc)
        return report
    for name, make in cases:
        case = CaseResult(name, tolerance=tolerance)
        report.cases.append(case)
        if isinstance(make, str):
            case.skipped = make
            continue
        try:
            _run_case(spec, case, make, adapter, manager, reference)
            if watch.overruns:
                raise VitcgError(watch.overruns[0].message(merge) + _more(watch.overruns))
        except Exception as exc:  # noqa: BLE001 - as above: a failing case is a result, not a crash
            # a width or row mismatch may have a plainer cause than the formula the manager names
            case.error = _output_problem(spec, adapter, make) or describe(exc)
        watch.overruns.clear()
    if size == "tiny":
        report.cases.append(_end_to_end(spec, device, seed))
    return report


def _graph_fields(spec: Spec) -> str:
    """The spec fields the graph path reads beyond the eager call: what to check when only it fails."""
    scope = ", graph_scope" if spec.graph_scope is not None else ""
    return (f"buffers (shapes, providers, padding){scope} and the items formulas against "
            f"{spec.encoder.class_path.rsplit('.', 1)[-1]}.forward")


def _run_case(spec: Spec, case: CaseResult, make: Callable[[], Inputs], adapter,
              manager: EncoderCudaGraphManager, reference) -> None:
    """Run one case through the manager and compare each item with eager; fills ``case``, raises on a failure
    that stops the case (model code failing names its step, :func:`.failures.step`)."""
    with step("making the case's inputs", "tests.inputs (shapes and fills) and the geometry they read"):
        inputs = on_device(adapter, make())
        items = adapter.get_encoder_cudagraph_item_specs(inputs)
    case.items = len(items)
    before = {"per_budget": manager.stats.replays_per_budget.copy(), "misses": manager.stats.misses}
    with step("the graphs", _graph_fields(spec), widths=PIXELS):
        outputs = manager.execute(inputs)
    case.route = _route(manager, before)
    if len(outputs) != len(items):
        raise VitcgError(f"manager returned {len(outputs)} outputs for {len(items)} items")
    case.noise_ok = reference is not None
    for index, (item, got) in enumerate(zip(items, outputs)):
        with step(f"the eager call of item {index}", "tests.inputs and tests.tiny_config", widths=PIXELS):
            selected = adapter.select_encoder_cudagraph_items(inputs, [index])
            want = adapter.encoder_eager_forward(selected)
        if got.shape != want.shape:
            raise VitcgError(f"item {index}: manager output {tuple(got.shape)} but eager output "
                             f"{tuple(want.shape)} (items.output_tokens says {item.output_tokens})")
        case.finite = case.finite and bool(torch.isfinite(got).all())
        error = relative_error(got, want)
        case.max_error = max(case.max_error, error)
        if reference is not None:
            _against_fp32(case, reference, selected, got, want, error)


def _against_fp32(case: CaseResult, reference, selected: Inputs, got: torch.Tensor, want: torch.Tensor,
                  error: float) -> None:
    """Compare an item's graph and eager outputs (``got``, ``want``; ``error`` apart) with the float32 twin's
    ``reference`` output: a half-precision case passes when the graph is as accurate as eager."""
    exact = reference.encoder_eager_forward(
        {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
         for k, v in selected.items()})  # not the capture axis key list
    graph32, eager32 = relative_error(got, exact), relative_error(want, exact)
    case.graph_vs_fp32 = max(case.graph_vs_fp32 or 0.0, graph32)
    case.eager_vs_fp32 = max(case.eager_vs_fp32 or 0.0, eager32)
    case.noise_ok = case.noise_ok and (error <= case.tolerance or graph32 <= NOISE_FACTOR * eager32)


def invalid_report(entry: InvalidSpec, *, device: str = "cpu", dtype: torch.dtype | None = None) -> SpecReport:
    """The report of a selected spec file that does not validate: failed before any case, saying why."""
    return SpecReport(entry.name, device, str(_default_dtype(device, dtype)).removeprefix("torch."),
                      error=entry.reason())


def channels_first(output: Any, entries: tuple[str, ...], width: int) -> str | None:
    """What is wrong with an encoder ``output`` whose ``encoder.outputs`` field holds features on a dimension other
    than the last (a convolutional neck's ``(batch, channels, h, w)``), or None: vitcg reads each row's features from
    the last dimension, so such an output looks like a wrong ``out_hidden_size``."""
    for entry in entries:
        value = output_entry(output, entry)[2]
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(tensor, torch.Tensor) or tensor.dim() < 3 or tensor.shape[-1] == width:
                continue
            if width in tuple(tensor.shape[1:-1]):
                dim = tuple(tensor.shape).index(width, 1)
                return (f"encoder output {entry!r} has shape {tuple(tensor.shape)}: its features lie on dim {dim} "
                        f"(channels first; {width} is out_hidden_size), but vitcg reads each row's features from the "
                        "last dimension, so out_hidden_size is not what is wrong; capture the call that returns rows "
                        "of features (encoder.method: the VLM's own feature call, such as get_image_features, where "
                        "the projector flattens the neck)")
    return None


def _output_problem(spec: Spec, adapter: Any, make: Callable[[], Inputs]) -> str | None:
    """:func:`channels_first` of the encoder's own output for a failed case's inputs (None when that call fails
    too: the case's own error says more)."""
    width = adapter.geometry.get("out_hidden_size")
    try:
        calls = adapter.eager_calls(on_device(adapter, make()))
        with torch.no_grad():
            output = getattr(adapter.module, spec.encoder.method)(**calls[0]) if calls else None
    except Exception:  # noqa: BLE001 - only a diagnosis: the case's error stands
        return None
    return channels_first(output, spec.encoder.outputs, width) if output is not None else None


def _more(overruns: list) -> str:
    """`` (and N more)`` after the first of several overruns."""
    return f" (and {len(overruns) - 1} more)" if len(overruns) > 1 else ""


def _default_dtype(device: str, dtype: torch.dtype | None) -> torch.dtype:
    return dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)


def _end_to_end(spec: Spec, device: str, seed: int) -> CaseResult:
    """The end-to-end stage (:mod:`.vlm`) as one case: the full VLM's own features and greedy tokens."""
    from .vlm import TOLERANCE as VLM_TOLERANCE
    from .vlm import Unavailable, check_vlm

    case = CaseResult("VLM features and generate (float32)", tolerance=VLM_TOLERANCE, stage="vlm")
    try:
        case.items, case.max_error, case.route = check_vlm(spec, device, seed)
    except Unavailable as exc:
        case.skipped = str(exc)
    except VitcgError as exc:
        case.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - a model or processor may fail in any way; the report says how
        case.error = describe(exc)
    return case
