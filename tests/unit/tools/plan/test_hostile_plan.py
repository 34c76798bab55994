"""Hostile ``vitcg plan`` inputs (issue 27, item 5): a ``--costs`` value out of range is refused naming its key,
what was expected and what was there; every JSON file read is bounded in size and depth; and a measured cost
model never makes a call free or negative."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from support import REPO
from vitcg.errors import UsageError
from vitcg.tools.files import MAX_JSON_BYTES, MAX_JSON_DEPTH, read_json
from vitcg.tools.plan import planner as P

COSTS = REPO / "benchmarks" / "results-costs-2026-11-22-h100.json"
QWEN = 2  # qwen2_vl's index in COSTS' "specs"


def costs_file(tmp_path: Path, change) -> Path:
    """COSTS with ``change(entry)`` applied to qwen2_vl's entry, written as Python's json writes it (NaN and
    Infinity included, as a hand-edited or foreign file may hold them)."""
    document = json.loads(COSTS.read_text())
    assert document["specs"][QWEN]["spec"] == "qwen2_vl"
    change(document["specs"][QWEN])
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(document))
    return path


def setter(*keys, value):
    def change(entry):
        for key in keys[:-1]:
            entry = entry[key]
        entry[keys[-1]] = value
    return change


def add_key(key, value):
    return lambda entry: entry["replay_ms"].__setitem__(key, value)


CASES = [
    # (what is changed, the key the error names, the value it shows, what it expects)
    (setter("replay_ms", "64", value=math.nan), '["replay_ms"]["64"]', "nan", "finite number of ms above 0"),
    (setter("replay_ms", "64", value=math.inf), '["replay_ms"]["64"]', "inf", "finite number of ms above 0"),
    (setter("replay_ms", "64", value=1e308), '["replay_ms"]["64"]', "1e+308", "at most 10000000"),
    (setter("replay_ms", "64", value=-3.0), '["replay_ms"]["64"]', "-3.0", "above 0"),
    (setter("replay_ms", "64", value="4"), '["replay_ms"]["64"]', "'4'", "finite number"),
    (setter("workloads", 0, "ms", "eager", value=math.nan), '["workloads"][0]["ms"]["eager"]', "nan", "ms"),
    (setter("workloads", 0, "ms", "eager", value=-5.0), '["workloads"][0]["ms"]["eager"]', "-5.0", "above 0"),
    (setter("workloads", 0, "ms", "eager", value=1e308), '["workloads"][0]["ms"]["eager"]', "1e+308", "at most"),
    (setter("workloads", 0, "tokens", value=-5), '["workloads"][0]["tokens"]', "-5", "integer from 1"),
    (setter("workloads", 0, "tokens", value=10**30), '["workloads"][0]["tokens"]', str(10**30), "2147483647"),
    (setter("budgets", value=[0, 64]), '["budgets"][0]', "0", "integer from 1 to 2147483647"),
    (setter("budgets", value=[-64, 64]), '["budgets"][0]', "-64", "integer from 1"),
    (setter("budgets", value=[64.5]), '["budgets"][0]', "64.5", "integer from 1"),
    (setter("budgets", value=[]), '["budgets"]', "none", "one budget or more"),
    (setter("budgets", value="64"), '["budgets"]', "str", "a list"),
    (add_key(str(10**30), 5.0), f'["replay_ms"]["{10**30}"]', f"'{10**30}'", "integer from 1 to 2147483647"),
    (add_key("0", 5.0), '["replay_ms"]["0"]', "'0'", "integer from 1"),
    (add_key("-64", 5.0), '["replay_ms"]["-64"]', "'-64'", "integer from 1"),
    (add_key("064", 5.0), '["replay_ms"]["064"]', "given twice", "budget 64"),
    (setter("replay_ms", value={}), '["replay_ms"]', "none", "one budget or more"),
    (setter("pool_mib", value=math.nan), '["pool_mib"]', "nan", "MiB above 0"),
    (setter("pool_mib", value=1e308), '["pool_mib"]', "1e+308", "at most 1073741824"),
    (setter("pool_mib", value=0), '["pool_mib"]', "0", "above 0"),
    (setter("workloads", value=[]), '["workloads"]', "got 0", "two workload sizes"),
]


@pytest.mark.parametrize("change, key, actual, expected", CASES, ids=[f"{c[1]}={c[2]}" for c in CASES])
def test_costs_out_of_range_are_refused_by_key(tmp_path, change, key, actual, expected):
    path = costs_file(tmp_path, change)
    with pytest.raises(UsageError) as caught:
        P.costs_from_results(path, "qwen2_vl")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--costs {path}: specs[{QWEN}]{key}"), message
    assert actual in message and expected in message, message


def test_measured_eager_times_that_fall_with_size_never_make_a_call_free():
    # clip's measured eager times fall a little with size (13.4 ms at 577 tokens, 11.7 and 13.7 at 4616): the
    # plain line through them reached 0 ms at 67,000 tokens and went negative beyond, a free eager call.
    costs = P.costs_from_results(COSTS, "clip")
    assert costs.e1 >= 0
    for tokens in (1, 577, 4616, 10**5, 10**7):
        assert 11 < costs.eager(tokens) < 14


def test_a_line_that_would_start_below_zero_goes_through_the_origin():
    e0, e1 = P.fit_eager([(100, 1.0), (1000, 100.0)])
    assert e0 == 0 and e1 > 0
    assert P.fit_eager(P.H100_EAGER_MS) == P.fit_line(P.H100_EAGER_MS)  # a sound fit is kept as it is


def test_measured_replays_are_never_cheaper_outside_the_measured_budgets(tmp_path):
    # A last segment that falls (noise) once extrapolated to 0 ms: replays of large budgets were free.
    replay = {"256": 5.0, "512": 8.0, "1024": 7.0}
    path = costs_file(tmp_path, setter("replay_ms", value=replay))
    costs = P.costs_from_results(path, "qwen2_vl")
    assert costs.replay(64) == pytest.approx(5.0)  # below the smallest: what the smallest cost
    assert costs.replay(768) == pytest.approx(7.5)  # between: interpolated
    assert costs.replay(1 << 20) == pytest.approx(7.0)  # far above: no less than the largest


def test_the_packaged_measurements_still_load():
    for spec in ("glm_image", "clip", "qwen2_vl", "qwen3_vl"):
        costs = P.costs_from_results(COSTS, spec)
        assert all(costs.eager(t) > 0 and costs.replay(t) > 0 for t in (1, 64, 8192, 10**6))


# every JSON read is bounded

def test_json_nested_100k_deep_is_one_clean_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match=f"--requests {path}: JSON nested deeper than {MAX_JSON_DEPTH} levels"):
        P.read_requests(path)


def test_json_just_over_the_depth_bound_is_refused_and_at_it_accepted(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(UsageError, match="nested deeper"):
        read_json(path, "--x")
    path.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert read_json(path, "--x")


def test_json_over_the_size_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as handle:  # sparse: 17 MiB that take no disk
        handle.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(UsageError, match=f"holds {MAX_JSON_BYTES + 1} bytes, over the limit of {MAX_JSON_BYTES}"):
        P.read_requests(path)


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused_by_kind(special, kind):
    if not Path(special).exists():
        pytest.skip(f"no {special} here")
    with pytest.raises(UsageError, match=f"--requests {special}: expected a regular file, got {kind}"):
        P.read_requests(Path(special))


def test_a_folder_is_refused_by_kind(tmp_path):
    with pytest.raises(UsageError, match="expected a regular file, got a folder"):
        P.costs_from_results(tmp_path, "qwen2_vl")
