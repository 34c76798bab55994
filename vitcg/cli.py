"""The ``vitcg`` command: wiring only; each command calls one module and maps errors to exit codes.

Exit codes: 0 ok, 1 spec errors or failed checks, 2 usage errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from .errors import UsageError, VitcgError

app = typer.Typer(
    name="vitcg",
    help="Declarative CUDA graphs for the vision encoders of vision-language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")
"""What ``--device`` accepts: torch device names of the backends vitcg runs on."""


def _version(value: bool) -> None:
    if value:
        # The package itself is light (vitcg.accelerate is imported on first use), so this needs no torch.
        from . import __version__

        typer.echo(f"vitcg {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Declarative CUDA graphs for the vision encoders of vision-language models."""


def _check_device(device: str, hint: str = "") -> None:
    """Raise UsageError unless ``device`` is cpu, cuda or cuda:N."""
    if not DEVICE.fullmatch(device):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {device!r}{hint}")


def _check_cuda(device: str, hint: str = "") -> None:
    """Raise UsageError when ``device`` is a CUDA device and this machine has none (imports torch)."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device cuda: no CUDA device is available here{hint}")


def _dtypes() -> dict:
    """The ``--dtype`` names and their torch dtypes (imports torch)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


SpecPaths = Annotated[list[Path] | None, typer.Argument(help="Spec files or folders (default: the packaged specs, "
                                                       "then $VITCG_SPECS_DIR's folders).", show_default=False)]
SpecFolders = Annotated[list[Path] | None, typer.Option(
    "--specs", metavar="DIR", help="A folder of your own specs (repeatable), after the packaged specs and "
    "$VITCG_SPECS_DIR's folders; a spec replaces an earlier one of the same name.", show_default=False)]


@app.command()
def validate(
    paths: SpecPaths = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print diagnostics as JSON.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Re-import transformers classes instead of "
                                           "using the cached facts.")] = False,
    resolved: Annotated[bool, typer.Option("--resolved", help="Print each spec file as checks see it: merged "
                                           "with the spec it extends, its NAME.tests.yaml harness and its "
                                           "style base (in vitcg/lang/styles/), under a comment naming "
                                           "those files (YAML, or JSON with --json); checked as without "
                                           "--resolved: exit 1 and its diagnostics (YAML comments) when it "
                                           "does not validate.")] = False,
) -> None:
    """Check spec files: YAML, schema, formulas, semantics and transformers bindings. Prints every error.
    Without PATH: the packaged specs, then $VITCG_SPECS_DIR's folders (a later spec replaces one of its name)."""
    from .lang import SpecSource, spec_folders
    from .tools.check.report import json_report, text_report

    if resolved:
        from .lang import Bindings
        from .tools.resolved import resolved_report

        text, ok = resolved_report(paths or [], as_json, Bindings(use_cache=not no_cache))
        sys.stdout.write(text)
        raise typer.Exit(0 if ok else 1)
    if paths:
        result = SpecSource.of_files(paths, use_cache=not no_cache)
    else:
        result = SpecSource(spec_folders(), use_cache=not no_cache)
    if not result.files:
        raise UsageError(f"no spec files (*.yaml) under {', '.join(map(str, paths or spec_folders()))}")
    sys.stdout.write(json_report(result) if as_json else text_report(result))
    raise typer.Exit(0 if result.ok else 1)


def _entries(names: list[str] | None, all_specs: bool, folders: list[Path] | None) -> list:
    """The entries (specs, or files that do not validate) named on the command line, or all with ``--all``, from
    the packaged specs, ``$VITCG_SPECS_DIR`` and the ``--specs`` ``folders`` (:class:`vitcg.lang.SpecSource`)."""
    from .lang import SpecSource, spec_folders

    source = SpecSource(spec_folders(folders or ()))
    return source.all() if all_specs else source.select(names or [])


def _select_specs(names: list[str] | None, all_specs: bool, folders: list[Path] | None):
    """Specs named on the command line (names from the registry with ``--specs`` ``folders``, or file paths), or
    all with ``--all``. Raises SpecError when a selected file does not validate (other broken files do not
    matter)."""
    from .errors import SpecError
    from .lang import InvalidSpec

    chosen = _entries(names, all_specs, folders)
    broken = [d for entry in chosen if isinstance(entry, InvalidSpec) for d in entry.diagnostics]
    if broken:
        raise SpecError(broken)
    return chosen


@app.command()
def check(
    specs: Annotated[list[str] | None, typer.Argument(help="Spec names (the packaged specs, $VITCG_SPECS_DIR, "
                                                      "--specs) or spec files.", show_default=False)] = None,
    all_specs: Annotated[bool, typer.Option("--all", help="Check every spec: the packaged ones, then those of "
                                            "$VITCG_SPECS_DIR and --specs.")] = False,
    device: Annotated[str, typer.Option(help="cpu, or cuda (real CUDA graph capture and replay).")] = "cpu",
    size: Annotated[str, typer.Option(help="tiny (spec's tiny_config) or real (checkpoint dimensions).")] = "tiny",
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16 (default: float32 on cpu, "
                                                   "bfloat16 on cuda).")] = None,
    spec_dirs: SpecFolders = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the reports as JSON (with each spec's verdict, "
                                          "guesses and warnings).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every spec's table of cases, the lines "
                                          "of its files that are still guesses and the warnings transformers "
                                          "and torch gave while it ran, not only a failed spec's.")] = False,
) -> None:
    """Run fixed cases through the budget manager and through eager, per item, then (tiny size) the end-to-end
    stage against the full VLM and its own image processor; fail on any mismatch. Prints one line per spec
    (proven, spec stage only, or FAILED with the first failure: its step, the model file and line, the spec field
    to check; "proven, with N guesses left" while the spec's files still hold `# GUESS:` lines or placeholder
    checkpoints) and a summary; a failed spec's table and warnings below it."""
    _check_device(device)
    from .tools.check.report import check_json, check_summary, check_text

    _check_cuda(device)
    if size not in ("tiny", "real"):
        raise UsageError(f"--size must be tiny or real, got {size!r}")
    dtypes = _dtypes()
    if dtype is not None and dtype not in dtypes:
        raise UsageError(f"--dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    chosen = _entries(specs, all_specs, spec_dirs)
    width = max((len(spec.name) for spec in chosen), default=0)
    progress = _Progress(len(chosen))
    reports = []
    for index, spec in enumerate(chosen, 1):
        progress.show(index, spec.name)
        report = _check_one(spec, device=device, dtype=dtypes.get(dtype), size=size)
        reports.append(report)
        progress.clear()
        if not as_json:
            sys.stdout.write(check_text([report], verbose=verbose, summary=False, width=width))
            sys.stdout.flush()
    sys.stdout.write(check_json(reports) if as_json else check_summary(reports) + "\n")
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


class _Progress:
    """Which spec of how many runs, on stderr when it is a terminal; a log or a pipe gets no control codes."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.on = sys.stderr.isatty()

    def show(self, index: int, name: str) -> None:
        self._write(f"\r\x1b[K[{index}/{self.total}] {name}")

    def clear(self) -> None:
        self._write("\r\x1b[K")

    def _write(self, text: str) -> None:
        if self.on:
            sys.stderr.write(text)
            sys.stderr.flush()


def _check_one(spec, *, device: str, dtype, size: str):
    """``vitcg check``'s report of one registry entry, with the warnings transformers and torch gave meanwhile;
    an invalid spec gets a row of its own, so a broken draft does not stop the other specs."""
    from .lang import InvalidSpec
    from .tools.check.cases import check_spec, invalid_report
    from .tools.encoders import release
    from .tools.quiet import kept_warnings

    with kept_warnings() as kept:
        if isinstance(spec, InvalidSpec):
            report = invalid_report(spec, device=device, dtype=dtype)
        else:
            report = check_spec(spec, device=device, dtype=dtype, size=size)
        release(device)
    report.warnings = kept.lines()
    return report


@app.command()
def demo(
    spec: Annotated[str, typer.Argument(help="A spec with tests.vlm (its tiny full VLM is built).")] = "qwen2_vl",
    spec_dirs: SpecFolders = None,
    device: Annotated[str, typer.Option(help="cpu, or cuda.")] = "cpu",
) -> None:
    """vitcg.accelerate on a tiny Hugging Face VLM (random weights): its features and greedy generate, with and
    without graphs."""
    _check_device(device)
    from .tools.check.vlm import Unavailable, check_vlm

    _check_cuda(device)
    chosen = _select_specs([spec], False, spec_dirs)[0]
    try:
        items, error, route = check_vlm(chosen, device)
    except Unavailable as exc:
        raise UsageError(f"{chosen.name}: the demo cannot run: {exc}") from None
    fed = "images and videos" if chosen.tests.vlm and chosen.tests.vlm.video else "images"
    typer.echo(f"{chosen.name}: tiny {chosen.architectures[0]} with random weights (float32, {device}), {items} "
               f"{fed} from its own image processor, vitcg.accelerate(model):\n"
               f"  get_*_features per item: max relative error {error:.1e} against the model without vitcg\n"
               f"  generate: the same greedy tokens (encoder: {route})")


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of spec files (for editors: yaml-language-server $schema)."""
    from .lang import schema as load_schema
    from .tools.files import write_text_atomic

    text = json.dumps(load_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        write_text_atomic(output, text)


@app.command()
def generate(
    check_only: Annotated[bool, typer.Option("--check", help="Render to memory and compare; list stale files "
                                             "and exit 1 if any. Writes nothing.")] = False,
    spec_dirs: SpecFolders = None,
    templates: Annotated[Path | None, typer.Option(help="Templates; NAME.j2 renders to OUT/NAME (default: the "
                                                   "packaged templates).", show_default=False)] = None,
    out: Annotated[Path, typer.Option(help="Folder of generated files.")] = Path("registry"),
    force: Annotated[bool, typer.Option("--force", help="Write into an --out folder that also holds files vitcg "
                                        "did not generate (they are left alone).")] = False,
) -> None:
    """Render docs, test configs and model lists into registry/ from the specs (the packaged ones, then those of
    $VITCG_SPECS_DIR and --specs); remove generated files no template makes any more. Files without the
    generated-file header are never removed; an --out folder holding any is refused unless --force."""
    from .lang import spec_folders
    from .tools.render import generate as render_registry

    result = render_registry(spec_folders(spec_dirs or ()), templates, out, check=check_only, force=force)
    sys.stdout.write(result.text())
    raise typer.Exit(1 if check_only and result.stale else 0)


@app.command("compile-config")
def compile_config(
    modality: Annotated[str, typer.Option(help="image, video or image+video (items per batch 1, 1 or 2).",
                                          show_default=False)],
    base: Annotated[str | None, typer.Option(help="Compilation config (a JSON object) to merge into.")] = None,
    budgets: Annotated[str | None, typer.Option(help="Token budgets, comma-separated: 1024,2048,4096.")] = None,
    max_items: Annotated[int | None, typer.Option(help="Vision items per batch, instead of the modality's "
                                                  "(0 = auto).")] = None,
    max_frames: Annotated[int | None, typer.Option(help="Video frames per batch.")] = None,
    serve: Annotated[str | None, typer.Option(help="Print the whole `vllm serve MODEL` command instead: vLLM's "
                                              "Transformers backend, where vitcg's plugin adds encoder graphs.",
                                              metavar="MODEL")] = None,
) -> None:
    """Print the engine compilation config (JSON) that turns on encoder CUDA graphs for a modality."""
    from .errors import BudgetError
    from .tools.plan.compile_config import compile_config as build
    from .tools.plan.compile_config import parse_base, parse_budgets

    try:
        config = build(modality, parse_base(base), budgets=parse_budgets(budgets), max_items=max_items,
                       max_frames=max_frames)
    except BudgetError as exc:
        # Every value here came from the command line, so a broken invariant is a usage error.
        raise UsageError(str(exc)) from None
    try:
        # Infinity and NaN are not JSON: an engine reading this config would reject it, or worse, accept it.
        text = json.dumps(config, allow_nan=False)
    except ValueError as exc:
        raise UsageError(f"the compilation config holds a value JSON cannot carry: {exc}") from None
    if serve is not None:
        from .tools.plan.compile_config import serve_command

        text = serve_command(serve, config)
    sys.stdout.write(text + "\n")


@app.command()
def bench(
    specs: Annotated[list[str] | None, typer.Argument(help="Spec names (the packaged specs, $VITCG_SPECS_DIR, "
                                                      "--specs) or spec files.", show_default=False)] = None,
    all_specs: Annotated[bool, typer.Option("--all", help="Benchmark every spec: the packaged ones, then those of "
                                            "$VITCG_SPECS_DIR and --specs.")] = False,
    workload: Annotated[list[str] | None, typer.Option(help="Workload to run (repeatable; default: all).")] = None,
    device: Annotated[str, typer.Option(help="cuda (the real measurement) or cpu (a smoke run).")] = "cuda",
    size: Annotated[str, typer.Option(help="real (checkpoint dimensions) or tiny.")] = "real",
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    iters: Annotated[int, typer.Option(help="Timed runs per method (median reported).")] = 20,
    warmup: Annotated[int, typer.Option(help="Untimed runs before timing.")] = 3,
    no_compile: Annotated[bool, typer.Option("--no-compile", help="Skip torch.compile (its first call per "
                                             "shape takes seconds).")] = False,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Engine limit: largest budget.")] = 8192,
    budgets: Annotated[str | None, typer.Option(help="Token budgets, comma-separated (e.g. the ladder `vitcg plan` "
                                                "prints), instead of the default ladder.")] = None,
    roofline: Annotated[bool, typer.Option("--roofline", help="Measure the device's matmul rate and copy "
                                           "bandwidth first and give each workload its floor (FLOPs counted on "
                                           "the eager forward, weights read once).")] = False,
    spec_dirs: SpecFolders = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write all results to this JSON file.")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="Write a latency plot (PNG; needs matplotlib).")] = None,
    from_json: Annotated[Path | None, typer.Option(help="Plot results of an earlier --json run instead of "
                                                   "measuring.")] = None,
) -> None:
    """Median latency of HF eager, torch.compile, vitcg budget graphs and an exact-shape graph per workload."""
    if from_json is not None:
        _plot_earlier(from_json, plot_out)
        return
    _check_device(device, " (cuda is the real measurement, cpu a smoke run)")
    _check_bench_outputs(json_out, plot_out)
    from .tools.workloads import WORKLOADS

    unknown = [w for w in workload or () if w not in WORKLOADS]
    if unknown:
        raise UsageError(f"unknown workload {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}")
    from .tools.bench.measure import run_bench

    _check_cuda(device, " (use --device cpu for a smoke run)")
    torch_dtype = _bench_dtype(dtype, size, iters, warmup)
    from .tools.plan.compile_config import parse_budgets

    token_budgets = parse_budgets(budgets)
    chosen = _select_specs(specs, all_specs, spec_dirs)
    run = run_bench(chosen, workloads=workload or list(WORKLOADS), device=device, size=size, dtype=torch_dtype,
                    iters=iters, warmup=warmup, compile_eager=not no_compile, token_budgets=token_budgets,
                    max_num_batched_tokens=max_num_batched_tokens, roofline=roofline,
                    command="vitcg " + " ".join(sys.argv[1:]),
                    json_out=json_out, log=typer.echo, warn=lambda line: typer.echo(line, err=True))
    if plot_out is not None:
        _plot(run.document["specs"], plot_out)
    if run.failed:
        typer.echo(f"{len(run.failed)} of {len(chosen)} specs failed: {', '.join(run.failed)}", err=True)
        raise typer.Exit(1)


def _plot_earlier(from_json: Path, plot_out: Path | None) -> None:
    """``vitcg bench --from-json``: plot the results of an earlier run into ``plot_out``."""
    from .tools.files import check_writable

    if plot_out is None:
        raise UsageError("--from-json needs --plot")
    check_writable(plot_out)
    _plot(_read_results(from_json), plot_out, source=from_json)


def _check_bench_outputs(json_out: Path | None, plot_out: Path | None) -> None:
    """Raise UsageError unless the result paths can be written (and matplotlib is there for a plot): a run takes
    minutes to hours, so a path that cannot be written fails now, not after the run."""
    from .tools.files import check_writable

    for target in (json_out, plot_out):
        if target is not None:
            check_writable(target)
    if plot_out is not None:
        _need_matplotlib()


def _bench_dtype(dtype: str, size: str, iters: int, warmup: int):
    """The torch dtype of ``--dtype``; raises UsageError unless it and ``--size``, ``--iters``, ``--warmup`` are
    valid."""
    dtypes = _dtypes()
    if dtype not in dtypes or size not in ("tiny", "real") or iters < 1 or warmup < 0:
        raise UsageError("--dtype must be bfloat16/float16/float32, --size tiny/real, --iters >= 1, --warmup >= 0")
    return dtypes[dtype]


@app.command()
def plan(
    spec: Annotated[str, typer.Argument(help="A spec name (the packaged specs, $VITCG_SPECS_DIR, --specs) or spec "
                                        "file.", show_default=False)],
    request: Annotated[list[str] | None, typer.Option(help="One encoder call: images HxW and videos FxHxW, "
                                                      "comma-separated (repeatable).")] = None,
    requests: Annotated[Path | None, typer.Option(help='JSON list of {"images": [[h, w], ...], "videos": '
                                                  '[[frames, h, w], ...]}, one per encoder call.')] = None,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Engine limit: largest budget.")] = 8192,
    max_model_len: Annotated[int, typer.Option(help="Engine limit: largest budget.")] = 32768,
    memory_cap_mib: Annotated[float | None, typer.Option(help="Graph memory cap in MiB (default: what vLLM's "
                                                         "default ladder takes).")] = None,
    costs: Annotated[Path | None, typer.Option(help="A `vitcg bench --json` result: the spec's measured replay, "
                                               "pool and eager times instead of the default model.")] = None,
    manager: Annotated[str, typer.Option(help="vitcg (tight packing, eager routing) or vllm (greedy).")] = "vitcg",
    spec_dirs: SpecFolders = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Choose token budgets and items per batch that minimize expected encoder latency on a sample of requests
    (default: the bench workloads) under a graph memory cap; print vLLM's compilation_config for them."""
    from .tools.plan.compile_config import check_bound

    for name, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-model-len", max_model_len)):
        if value <= 0:
            raise UsageError(f"{name} must be a positive integer, got {value}")
        check_bound(name, value)
    import time

    from .tools.plan import planner as planning

    chosen = _select_specs([spec], False, spec_dirs)[0]
    sample = [planning.parse_request(text) for text in request or ()]
    if requests is not None:
        sample += planning.read_requests(requests)
    source = "--request/--requests" if sample else "bench workloads"
    if not sample:
        sample = planning.default_requests(chosen)
    cost_model = planning.costs_from_results(costs, chosen.name) if costs else planning.default_costs()
    geometry = planning.spec_geometry(chosen)
    target = planning.target_of(chosen, geometry, max_num_batched_tokens, max_model_len)
    if target.min_budget > target.max_budget:
        raise UsageError(f"{chosen.name}: min budget {target.min_budget} exceeds max budget {target.max_budget}; "
                         "raise --max-num-batched-tokens / --max-model-len")
    grouped = planning.group(lambda r: planning.request_items(chosen, geometry, r), sample)
    tic = time.perf_counter()
    result = planning.make_plan(target, grouped, cost_model, manager=manager, memory_cap_mib=memory_cap_mib)
    seconds = time.perf_counter() - tic
    limits = (max_num_batched_tokens, max_model_len)
    if as_json:
        sys.stdout.write(json.dumps(planning.plan_json(result, source=source, limits=limits), indent=2) + "\n")
    else:
        sys.stdout.write(planning.plan_text(result, source=source, limits=limits, seconds=seconds))


@app.command()
def new(
    model_type: Annotated[str, typer.Argument(help="A transformers model type with a vision encoder, e.g. glm_ocr "
                                              "(`vitcg new` refuses text and audio model types).",
                                              show_default=False)],
    output: Annotated[str | None, typer.Option("--output", "-o", help="Where to write the draft (e.g. in a folder "
                                               "of your specs, for --specs or $VITCG_SPECS_DIR); '-' for stdout (default: "
                                               "NAME.yaml in the working folder, NAME being the model type in snake "
                                               "case).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output file if it exists (without it an "
                                        "existing file is never touched).")] = False,
) -> None:
    """Draft a spec from a transformers model type. The draft validates; every line that is a guess ends in
    `# GUESS: what to verify` (encoder class and boundary, vlm_attribute, args, outputs, attention style,
    geometry read from other fields, buffers, budgets, test prompts). Confirm them, then run `vitcg check`."""
    from .tools.files import make_folder, write_text_atomic
    from .tools.new.scaffold import checked_draft, spec_name

    path = None if output == "-" else Path(output or f"{spec_name(model_type)}.yaml")
    if path is not None:
        _check_draft_path(path, force)
    text, guesses = checked_draft(model_type, path)
    if path is None:
        sys.stdout.write(text)
        return
    make_folder(path.parent)
    write_text_atomic(path, text, overwrite=force)
    typer.echo(f"wrote {path}: {guesses} guesses to verify (lines ending in '# GUESS:'). "
               f"Next: vitcg validate {path} && vitcg check {path}")
    for line in text.splitlines():  # what vitcg already knows of the model type, repeated from the draft's header
        if line.startswith(("# NOTE: ", "#   ")) or line.startswith("# Other specs of this tower"):
            typer.echo(line.removeprefix("# "))


def _check_draft_path(path: Path, force: bool) -> None:
    """Raise UsageError unless ``vitcg new`` may write its draft at ``path``. Drafting imports transformers
    (seconds): a path that cannot be a file fails before it."""
    from .tools.files import check_output

    check_output(path)  # a folder, socket or block device: refused before the draft
    if (path.exists() or path.is_symlink()) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"cannot write {path}: {ancestor} is not a folder")


def _read_results(path: Path) -> list[dict]:
    """The ``specs`` list of a ``vitcg bench --json`` file. Raises UsageError naming ``path`` otherwise."""
    from .tools.files import read_json

    document = read_json(path, f"--from-json {path}")
    specs = document.get("specs") if isinstance(document, dict) else None
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise UsageError(f"--from-json {path}: not a results file of `vitcg bench --json` (no \"specs\" list "
                         "of objects)")
    return specs


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'vitcg[bench]'") from None


def _plot(results: list[dict], path: Path, source: Path | None = None) -> None:
    _need_matplotlib()
    from .tools.bench.measure import plot

    try:
        plot(results, str(path))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        # Results read back from a file may be hand-edited or from another version: name the file, not a frame.
        where = f"--from-json {source}" if source is not None else "--plot"
        raise UsageError(f"{where}: cannot plot these results: {type(exc).__name__}: {exc}") from None


def _drop_stdout() -> None:
    """Point fd 1 at /dev/null: the interpreter flushes stdout at exit, and must not fail a second time."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def os_error_line(exc: OSError) -> str | None:
    """One line for an OSError no command turned into a UsageError: a path the system refuses (a 300-character
    name: ENAMETOOLONG) or standard output that cannot take the results (``> /dev/full``). None for anything
    else, which is a bug and keeps its traceback."""
    import errno

    if exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
        return f"cannot write standard output: {exc.strerror}"
    return None


def main() -> None:
    """Console entry point: user errors are printed without a traceback, and so is a closed stdout."""
    if sys.stdout is None:
        # fd 1 was closed (`vitcg ... >&-`): Python has no stdout to write results to.
        typer.echo("error: standard output is closed; redirect it (>/dev/null) instead of closing it", err=True)
        sys.exit(2)
    try:
        app()
    except VitcgError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # typer maps a broken pipe inside a command to exit 1; one outside a command exits the same way.
        _drop_stdout()
        sys.exit(1)
    except OSError as exc:
        message = os_error_line(exc)
        if message is None:
            raise
        typer.echo(f"error: {message}", err=True)
        _drop_stdout()
        sys.exit(2)
    finally:
        # Buffered output is otherwise written at interpreter exit, where a reader that went away (`| head`)
        # prints "Exception ignored ... BrokenPipeError" and the exit code becomes 120.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _drop_stdout()
            sys.exit(1)
        except OSError as exc:  # `vitcg validate > /dev/full`: the output was not written, and says so
            _drop_stdout()
            typer.echo(f"error: {os_error_line(exc) or exc}", err=True)
            sys.exit(2)
