"""Warnings of transformers and torch during a spec's check are kept for its report, not printed: the capture
itself, and ``vitcg check`` wired to it (in process, with a stand-in for the checks that warns)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
from typer.testing import CliRunner

from vitcg.cli import app
from vitcg.tools.check import cases
from vitcg.tools.check.cases import CaseResult, SpecReport
from vitcg.tools.quiet import kept_warnings


def warn(text: str) -> None:
    """A FutureWarning and a transformers logger warning, as model code gives them."""
    from transformers.utils import logging as hf_logging

    warnings.warn(f"{text} is deprecated", FutureWarning, stacklevel=1)
    hf_logging.get_logger("transformers.models.fake.modeling_fake").warning(f"{text} is falling back")


LINE = warn.__code__.co_firstlineno + 4
"""Where warn() raises its FutureWarning."""


def test_both_channels_are_kept_in_order_and_nothing_is_printed(capfd):
    from transformers.utils import logging as hf_logging

    library = hf_logging.get_logger()
    handlers = library.handlers[:]
    with kept_warnings() as kept:
        warn("causal_conv1d_fn")
        warn("causal_conv1d_fn")
        logging.getLogger("transformers").info("below the library's level: not kept")
    assert kept.lines() == [f"FutureWarning: causal_conv1d_fn is deprecated (test_quiet_warnings.py:{LINE}) (2x)",
                            "[transformers] causal_conv1d_fn is falling back (2x)"]
    assert capfd.readouterr().err == ""
    assert library.handlers == handlers  # transformers prints its warnings again after the block
    with kept_warnings() as again:  # a warning shown once before is kept again for the next spec
        warn("causal_conv1d_fn")
    assert len(again.lines()) == 2


PASS = "VLM features and generate (float32)"


def stand_in(spec, *, device, dtype, size):
    """check_spec for the test: warns like model code; ``siglip`` fails its first case."""
    warn(spec.name)
    first = CaseResult("one small image", items=1, route="graph 16", tolerance=1e-5,
                       error="VitcgError: item 0: wrong rows" if spec.name == "siglip" else None)
    return SpecReport(spec.name, device, "float32", budgets=(16, 32), max_items=4,
                      cases=[first, CaseResult(PASS, items=3, route="2 replays, 0 eager", stage="vlm", tolerance=1e-5)])


@pytest.fixture
def check(monkeypatch):
    monkeypatch.setattr(cases, "check_spec", stand_in)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["check", *args])


def test_a_passing_check_prints_one_line_per_spec_and_no_warnings(check, capfd):
    run = check("qwen2_vl", "internvl")
    assert run.exit_code == 0, run.output
    assert run.stdout.splitlines() == ["qwen2_vl  proven: 1 case, and the VLM end to end on 3 items",
                                       "internvl  proven: 1 case, and the VLM end to end on 3 items",
                                       "2 specs checked: 2 passed (2 proven)"]
    assert "deprecated" not in run.output + capfd.readouterr().err


def test_a_failed_spec_shows_its_reason_table_and_warnings(check):
    run = check("qwen2_vl", "siglip")
    assert run.exit_code == 1
    lines = run.stdout.splitlines()
    assert lines[0] == "qwen2_vl  proven: 1 case, and the VLM end to end on 3 items"
    assert lines[1] == "siglip    FAILED: one small image: VitcgError: item 0: wrong rows"
    assert lines[-4:] == ["  warnings (2):", f"    FutureWarning: siglip is deprecated (test_quiet_warnings.py:{LINE})",
                          "    [transformers] siglip is falling back",
                          "2 specs checked: 1 passed (1 proven), 1 failed (siglip)"]
    assert "qwen2_vl is deprecated" not in run.stdout  # the passing spec's warnings stay with it


def test_verbose_shows_every_table_and_warning(check):
    run = check("qwen2_vl", "--verbose")
    assert run.exit_code == 0
    assert "  stage case " in run.stdout and "    [transformers] qwen2_vl is falling back" in run.stdout


def test_json_carries_the_warnings(check):
    run = check("qwen2_vl", "--json")
    (spec,) = json.loads(run.stdout)["specs"]
    assert spec["ok"] and spec["verdict"] == "proven"
    assert spec["warnings"][1] == "[transformers] qwen2_vl is falling back"
