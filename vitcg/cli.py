"""The ``vitcg`` command: wiring only; each command calls one module and maps errors to exit codes.

Exit codes: 0 ok, 1 spec errors or failed checks, 2 usage errors.
"""

from __future__ import annotations

import json
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

SpecPaths = Annotated[list[Path] | None, typer.Argument(help="Spec files or folders (default: specs/).",
                                                       show_default=False)]


@app.command()
def validate(
    paths: SpecPaths = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print diagnostics as JSON.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Re-import transformers classes instead of "
                                           "using the cached facts.")] = False,
) -> None:
    """Check spec files: YAML, schema, formulas, semantics and transformers bindings. Prints every error."""
    from .lang import load_specs
    from .tools.report import json_report, text_report

    result = load_specs(paths or [Path("specs")], use_cache=not no_cache)
    if not result.files:
        raise UsageError(f"no spec files (*.yaml) under {', '.join(map(str, paths or ['specs']))}")
    sys.stdout.write(json_report(result) if as_json else text_report(result))
    raise typer.Exit(0 if result.ok else 1)


def _select_specs(names: list[str] | None, all_specs: bool, specs_dir: Path):
    """Specs named on the command line (names from ``specs_dir``, or file paths), or all with ``--all``."""
    from .lang import Registry, load_registry

    if not names and not all_specs:
        raise UsageError("name specs to check, or pass --all")
    if all_specs:
        return list(load_registry([specs_dir]))
    only_files = all(n.endswith((".yaml", ".yml")) for n in names)
    return (Registry([]) if only_files else load_registry([specs_dir])).select(names)


@app.command()
def check(
    specs: Annotated[list[str] | None, typer.Argument(help="Spec names (from --specs-dir) or spec files.",
                                                      show_default=False)] = None,
    all_specs: Annotated[bool, typer.Option("--all", help="Check every spec in --specs-dir.")] = False,
    device: Annotated[str, typer.Option(help="cpu, or cuda (real CUDA graph capture and replay).")] = "cpu",
    size: Annotated[str, typer.Option(help="tiny (spec's tiny_config) or real (checkpoint dimensions).")] = "tiny",
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16 (default: float32 on cpu, "
                                                   "bfloat16 on cuda).")] = None,
    specs_dir: Annotated[Path, typer.Option(help="Folder of spec files.")] = Path("specs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the reports as JSON.")] = False,
) -> None:
    """Run fixed cases through the budget manager and through eager, per item; fail on any mismatch."""
    import torch

    from .tools.cases import check_spec
    from .tools.encoders import release
    from .tools.report import check_json, check_text

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"--device must be cpu or cuda, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here")
    if size not in ("tiny", "real"):
        raise UsageError(f"--size must be tiny or real, got {size!r}")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype is not None and dtype not in dtypes:
        raise UsageError(f"--dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    reports = []
    for spec in _select_specs(specs, all_specs, specs_dir):
        report = check_spec(spec, device=device, dtype=dtypes.get(dtype), size=size)
        reports.append(report)
        release(device)
        if not as_json:
            sys.stdout.write(check_text([report], summary=False))
            sys.stdout.flush()
    sys.stdout.write(check_json(reports) if as_json else check_text(reports, details=False))
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of spec files (for editors: yaml-language-server $schema)."""
    from .lang import schema as load_schema

    text = json.dumps(load_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)


@app.command()
def generate(
    check_only: Annotated[bool, typer.Option("--check", help="Render to memory and compare; list stale files "
                                             "and exit 1 if any. Writes nothing.")] = False,
    specs: Annotated[Path, typer.Option(help="Folder of spec files.")] = Path("specs"),
    templates: Annotated[Path, typer.Option(help="Templates; NAME.j2 renders to OUT/NAME.")] = Path("templates"),
    out: Annotated[Path, typer.Option(help="Folder of generated files.")] = Path("registry"),
) -> None:
    """Render docs, test configs and model lists into registry/ from the specs; remove files no template makes."""
    from .tools.render import generate as render_registry

    result = render_registry(specs, templates, out, check=check_only)
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
) -> None:
    """Print the engine compilation config (JSON) that turns on encoder CUDA graphs for a modality."""
    from .errors import BudgetError
    from .tools.compile_config import compile_config as build
    from .tools.compile_config import parse_base, parse_budgets

    try:
        config = build(modality, parse_base(base), budgets=parse_budgets(budgets), max_items=max_items,
                       max_frames=max_frames)
    except BudgetError as exc:
        # Every value here came from the command line, so a broken invariant is a usage error.
        raise UsageError(str(exc)) from None
    sys.stdout.write(json.dumps(config) + "\n")


@app.command()
def bench(
    specs: Annotated[list[str] | None, typer.Argument(help="Spec names (from --specs-dir) or spec files.",
                                                      show_default=False)] = None,
    all_specs: Annotated[bool, typer.Option("--all", help="Benchmark every spec in --specs-dir.")] = False,
    workload: Annotated[list[str] | None, typer.Option(help="Workload to run (repeatable; default: all).")] = None,
    device: Annotated[str, typer.Option(help="cuda (the real measurement) or cpu (a smoke run).")] = "cuda",
    size: Annotated[str, typer.Option(help="real (checkpoint dimensions) or tiny.")] = "real",
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    iters: Annotated[int, typer.Option(help="Timed runs per method (median reported).")] = 20,
    warmup: Annotated[int, typer.Option(help="Untimed runs before timing.")] = 3,
    no_compile: Annotated[bool, typer.Option("--no-compile", help="Skip torch.compile (its first call per "
                                             "shape takes seconds).")] = False,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Engine limit: largest budget.")] = 8192,
    specs_dir: Annotated[Path, typer.Option(help="Folder of spec files.")] = Path("specs"),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write all results to this JSON file.")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="Write a latency plot (PNG; needs matplotlib).")] = None,
    from_json: Annotated[Path | None, typer.Option(help="Plot results of an earlier --json run instead of "
                                                   "measuring.")] = None,
) -> None:
    """Median latency of HF eager, torch.compile, vitcg budget graphs and an exact-shape graph per workload."""
    from .tools.workloads import WORKLOADS

    if from_json is not None:
        if plot_out is None:
            raise UsageError("--from-json needs --plot")
        _plot(json.loads(from_json.read_text())["specs"], plot_out)
        return
    unknown = [w for w in workload or () if w not in WORKLOADS]
    if unknown:
        raise UsageError(f"unknown workload {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}")
    import torch

    from .tools.bench import run_bench

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (use --device cpu for a smoke run)")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes or size not in ("tiny", "real") or iters < 1 or warmup < 0:
        raise UsageError("--dtype must be bfloat16/float16/float32, --size tiny/real, --iters >= 1, --warmup >= 0")
    chosen = _select_specs(specs, all_specs, specs_dir)
    run = run_bench(chosen, workloads=workload or list(WORKLOADS), device=device, size=size, dtype=dtypes[dtype],
                    iters=iters, warmup=warmup, compile_eager=not no_compile,
                    max_num_batched_tokens=max_num_batched_tokens, command="vitcg " + " ".join(sys.argv[1:]),
                    json_out=json_out, log=typer.echo, warn=lambda line: typer.echo(line, err=True))
    if plot_out is not None:
        _plot(run.document["specs"], plot_out)
    if run.failed:
        typer.echo(f"{len(run.failed)} of {len(chosen)} specs failed: {', '.join(run.failed)}", err=True)
        raise typer.Exit(1)


@app.command()
def new(
    model_type: Annotated[str, typer.Argument(help="A transformers model type, e.g. glm_ocr.", show_default=False)],
    output: Annotated[str | None, typer.Option("--output", "-o", help="Where to write the draft ('-' for "
                                               "stdout; default: specs/MODEL_TYPE.yaml).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Draft a spec from a transformers model type; every guess is marked TODO(vitcg new)."""
    from .tools.scaffold import draft, render

    text = render(draft(model_type))
    if output == "-":
        sys.stdout.write(text)
        return
    path = Path(output or f"specs/{model_type}.yaml")
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    todos = text.count("TODO(vitcg new)")
    typer.echo(f"wrote {path}: {todos} TODOs to confirm. Next: vitcg validate {path} && vitcg check {path}")


def _plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'vitcg[bench]'") from None
    from .tools.bench import plot

    plot(results, str(path))


def main() -> None:
    """Console entry point: user errors are printed without a traceback."""
    try:
        app()
    except VitcgError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
