"""``inprocess.vitcg_inprocess`` shows on the result's stderr what a fresh ``vitcg`` process would print there:
the acceptance tests that assert on stderr in the test process mean what they would mean in a subprocess."""

from __future__ import annotations

import sys
import warnings

import pytest

from support.inprocess import vitcg_inprocess


@pytest.fixture
def noisy_command(monkeypatch):
    """``vitcg`` replaced by a command that warns through both channels a library uses, then fails."""
    from transformers.utils import logging as hf_logging

    import vitcg.cli

    def app():
        warnings.warn("a Python warning", UserWarning, stacklevel=1)
        warnings.warn("a deprecation outside __main__", DeprecationWarning, stacklevel=1)  # hidden by default
        hf_logging.get_logger("transformers.models.fake").warning_once("a transformers warning")
        print("some output")
        sys.exit("error: it failed")

    monkeypatch.setattr(vitcg.cli, "app", app)


def test_warnings_reach_the_result_every_time(noisy_command):
    for _ in range(2):  # the second call shows them again, as a second process would
        run = vitcg_inprocess("anything")
        assert run.returncode == 1 and run.stdout == "some output\n"
        lines = run.stderr.splitlines()
        assert any(line.endswith("UserWarning: a Python warning") for line in lines), run.stderr
        assert "[transformers] a transformers warning" in lines, run.stderr
        assert lines[-1] == "error: it failed", run.stderr
        assert "deprecation" not in run.stderr


def test_the_loggers_streams_are_restored(noisy_command, caplog):
    """transformers' handler writes where it did before, and pytest's capture (caplog's handler can sit on the
    transformers logger too) still gets the records."""
    from transformers.utils import logging as hf_logging

    library = hf_logging.get_logger()
    before = [getattr(handler, "stream", None) for handler in library.handlers]
    run = vitcg_inprocess("anything")
    assert [getattr(handler, "stream", None) for handler in library.handlers] == before
    assert run.stderr.count("a transformers warning") == 1, run.stderr
