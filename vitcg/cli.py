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
    from .report import json_report, text_report
    from .spec import load_specs

    result = load_specs(paths or [Path("specs")], use_cache=not no_cache)
    if not result.files:
        raise UsageError(f"no spec files (*.yaml) under {', '.join(map(str, paths or ['specs']))}")
    sys.stdout.write(json_report(result) if as_json else text_report(result))
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of spec files (for editors: yaml-language-server $schema)."""
    from .spec import schema as load_schema

    text = json.dumps(load_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)


def main() -> None:
    """Console entry point: user errors are printed without a traceback."""
    try:
        app()
    except VitcgError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
