"""Run the ``vitcg`` command inside the test process: the entry point a user's shell reaches
(``vitcg.cli.main``), with the same argv, working directory and environment as a subprocess, and the result
in the same shape (``subprocess.CompletedProcess``: returncode, stdout, stderr).

A subprocess pays Python's start-up and the import of torch and transformers on every call, several seconds
each on a 2-core machine; in the test process they are paid once. ``support.cli.vitcg`` stays for what only a
process shows (the console script itself, the exit status the interpreter reports, output flushed at exit):
every command keeps at least one subprocess test.

What a fresh process would print to stderr lands in ``stderr`` of the result here too: Python warnings under
the interpreter's default filters (not pytest's, which would record them for its own summary), shown again
however often earlier calls raised them, and the ``transformers`` logger, whose handler was bound to the stderr
of the moment it was first imported, with its ``warning_once`` memory cleared.

What differs from a subprocess: a crash that is not a ``SystemExit`` propagates as the exception itself (the
test fails with its traceback, where a subprocess would exit 1 with the traceback on stderr); modules are
imported once per test process (a warning raised while importing one shows in the first call only); and a
segfault would end the test run (tests of hostile input that could crash the interpreter stay subprocesses).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from support.cli import REPO

PYTHON_WARNING_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                          ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                          ("ignore", ResourceWarning, ""))
"""The filters of an interpreter started without ``-W`` or ``PYTHONWARNINGS`` (``warnings.filters`` there, in
order): what a user's ``vitcg`` runs under."""


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` as a fresh process has it: the formatted warning on the current stderr."""
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _stream_handlers(logger: logging.Logger) -> list[logging.StreamHandler]:
    """The plain stream handlers of ``logger`` (transformers' own): not files, not pytest's capture handlers,
    which are stream handlers too and may sit on the same logger."""
    return [handler for handler in logger.handlers if type(handler) is logging.StreamHandler]


@contextlib.contextmanager
def _fresh_warnings(stderr: io.StringIO, outer: TextIO) -> Iterator[None]:
    """Python warnings under the interpreter's default filters, shown on the (redirected) ``stderr``; the
    ``transformers`` logger's stream handlers write to ``stderr`` and forget which warnings they gave once.
    A handler that transformers creates during the call (its first import) is left on ``outer``, the stderr
    outside the call."""
    library = logging.getLogger("transformers")
    streams = [(handler, handler.stream) for handler in _stream_handlers(library)]
    once = getattr(sys.modules.get("transformers.utils.logging"), "warning_once", None)
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in reversed(PYTHON_WARNING_FILTERS):  # each insert goes first
            warnings.filterwarnings(action, category=category, module=module)
        warnings.showwarning = _show_on_stderr
        if once is not None:
            once.cache_clear()
        for handler, _ in streams:
            handler.setStream(stderr)
        try:
            yield
        finally:
            for handler, stream in streams:
                handler.setStream(stream)
            for handler in _stream_handlers(library):
                if handler.stream is stderr:
                    handler.setStream(outer)


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


class _Terminal(io.StringIO):
    """A captured stream that says it is a terminal, as a user's stderr is when nothing redirects it."""

    def isatty(self) -> bool:
        return True


def vitcg_inprocess(*args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None,
                    terminal: bool = False) -> subprocess.CompletedProcess:
    """``vitcg ARGS`` run by ``vitcg.cli.main`` in this process, in ``cwd``, under ``env`` (default: the
    current environment), with a stderr that says it is a terminal if ``terminal``. Returns the exit status and
    everything written to stdout and stderr."""
    from vitcg.cli import main

    out, err, outer = io.StringIO(), _Terminal() if terminal else io.StringIO(), sys.stderr
    status = 0
    with (_process_state(["vitcg", *args], cwd, env), contextlib.redirect_stdout(out),
          contextlib.redirect_stderr(err), _fresh_warnings(err, outer)):
        try:
            main()
        except SystemExit as exc:
            status, text = _exit_status(exc.code)
            err.write(text)
    return subprocess.CompletedProcess(["vitcg", *args], status, out.getvalue(), err.getvalue())
