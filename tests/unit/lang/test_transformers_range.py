"""A spec that needs a newer transformers than the installed one is reported as unavailable, never as an error."""

from __future__ import annotations

import re

import pytest

from support import REPO
from vitcg.errors import UsageError
from vitcg.lang import SpecSource
from vitcg.lang.bindings import release, transformers_version
from vitcg.tools.check.cases import check_spec
from vitcg.tools.check.report import check_text, text_report

FUTURE = REPO / "tests" / "specs" / "valid" / "needs_future_transformers.yaml"


def testrelease_ordering():
    assert release("5.17.0") < release("5.20") < release("5.23.0rc1") <= release("5.23") < release("5.100")


def test_a_spec_needing_a_newer_transformers_is_valid_and_unavailable():
    result = SpecSource.of_files([FUTURE], use_cache=False)
    assert result.ok and [s.name for s in result.unavailable] == ["needs_future_transformers"]
    text = text_report(result)
    assert f"{FUTURE}: note: unavailable in transformers {transformers_version()} (the spec needs >= 99.0)" in text
    assert text.rstrip().endswith("all valid (1 unavailable in this transformers)")


def test_an_unavailable_spec_is_skipped_by_check_and_not_failed():
    (spec,) = SpecSource.of_files([FUTURE], bindings=False).specs
    report = check_spec(spec)
    assert report.ok and not report.cases and report.unavailable
    text = check_text([report])
    assert "skipped: unavailable in transformers" in text
    assert text.splitlines()[-1] == ("1 spec checked: 0 passed, 1 unavailable in this transformers "
                                     "(needs_future_transformers)")


def test_accelerate_refuses_an_unavailable_spec():
    torch = pytest.importorskip("torch")
    import vitcg

    (spec,) = SpecSource.of_files([FUTURE], bindings=False).specs
    with pytest.raises(UsageError, match="unavailable in transformers"):
        vitcg.accelerate(torch.nn.Linear(2, 2), spec=spec)


def test_specs_in_the_repository_state_their_oldestrelease_where_it_matters():
    """Every ``transformers`` key parses, and the pin in pyproject covers the oldest one CI runs (5.17)."""
    pins = [s.transformers for s in SpecSource.of_files([REPO / "vitcg" / "specs"], bindings=False).specs if s.transformers]
    assert all(release(p) > release("5.17") for p in pins)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"transformers>=5.17,<5.25"' in pyproject


def test_ci_runs_both_ends_of_the_supported_range():
    """pyproject's range, .ci/setup's default (the newest stage), .ci/run's oldest stage and the README agree, so
    moving the upper end (docs/writing-specs.md, "A new transformers release") cannot miss one of them."""
    low, high = re.search(r'"transformers>=([0-9.]+),<([0-9.]+)"', (REPO / "pyproject.toml").read_text()).groups()
    newest = re.search(r"^transformers=\$\{2:-([0-9.]+)\}$", (REPO / ".ci" / "setup").read_text(), re.M).group(1)
    run = (REPO / ".ci" / "run").read_text()
    oldest = re.search(r"^\.ci/setup \.venv-oldest ([0-9.]+)$", run, re.M).group(1)
    assert release(oldest)[:2] == release(low)[:2]
    assert release(newest) < release(high) and release(newest)[:2] == (release(high)[0], release(high)[1] - 1)
    assert re.search(r"^\.ci/setup$", run, re.M) and f"({newest})" in run
    readme = (REPO / "README.md").read_text()
    assert f"the newest ({newest}) and the oldest ({oldest})" in readme
    assert f"transformers {low} through {'.'.join(map(str, release(newest)[:2]))}" in " ".join(readme.split())
