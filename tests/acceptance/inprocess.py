"""Run the ``vitcg`` command inside the test process: the entry point a user's shell reaches
(``vitcg.cli.main``), with the same argv, working directory and environment as a subprocess, and the result
in the same shape (``subprocess.CompletedProcess``: returncode, stdout, stderr).

A subprocess pays Python's start-up and the import of torch and transformers on every call, several seconds
each on a 2-core machine; in the test process they are paid once. ``helpers.vitcg`` stays for what only a
process shows (the console script itself, the exit status the interpreter reports, output flushed at exit):
every command keeps at least one subprocess test.

What differs from a subprocess: a crash that is not a ``SystemExit`` propagates as the exception itself (the
test fails with its traceback, where a subprocess would exit 1 with the traceback on stderr), and loggers
configured with a handler bound to the real stderr before the call (transformers') write there, not into
``stderr`` of the result.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from helpers import REPO


@contextlib.contextmanager
def _process_state(argv: list[str], cwd: Path, env: Mapping[str, str] | None) -> Iterator[None]:
    """argv, working directory and environment as a subprocess would see them; all three restored on exit."""
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    try:
        sys.argv = argv
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        yield
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _exit_status(code: object) -> tuple[int, str]:
    """The status and the stderr text Python gives a ``SystemExit(code)`` at interpreter exit."""
    if code is None:
        return 0, ""
    if isinstance(code, int):
        return code, ""
    return 1, f"{code}\n"


def vitcg_inprocess(*args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None
                    ) -> subprocess.CompletedProcess:
    """``vitcg ARGS`` run by ``vitcg.cli.main`` in this process, in ``cwd``, under ``env`` (default: the
    current environment). Returns the exit status and everything written to stdout and stderr."""
    from vitcg.cli import main

    out, err = io.StringIO(), io.StringIO()
    status = 0
    with _process_state(["vitcg", *args], cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            status, text = _exit_status(exc.code)
            err.write(text)
    return subprocess.CompletedProcess(["vitcg", *args], status, out.getvalue(), err.getvalue())
