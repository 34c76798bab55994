"""``vitcg plan``'s model and search, on the CPU: item sizes from the spec, packing by the manager's own
``plan_packs`` and ``route``, the search never worse than vLLM's ladder, memory caps, eager routing, input errors."""

from __future__ import annotations

import json
import random
import time

import pytest

from support import REPO
from vitcg.errors import UsageError
from vitcg.lang import SpecSource
from vitcg.tools.plan import planner as P
from vitcg.tools.plan.compile_config import compile_config

COSTS = REPO / "benchmarks" / "results-costs-2026-11-22-h100.json"


@pytest.fixture(scope="module")
def qwen():
    spec = SpecSource([REPO / "vitcg" / "specs" / "qwen2_vl.yaml"])["qwen2_vl"]
    geometry = P.spec_geometry(spec)
    return spec, geometry, P.target_of(spec, geometry, 8192, 32768)


def planned(qwen, requests, costs=None, **options):
    spec, geometry, target = qwen
    grouped = P.group(lambda r: P.request_items(spec, geometry, r), requests)
    return P.make_plan(target, grouped, costs or P.default_costs(), **options)


def test_item_sizes_come_from_the_spec(qwen):
    spec, geometry, _ = qwen
    # 480x640 is shaped to a 34x46 patch grid (as the processor rounds it), merged 2x2: 17*23 tokens
    assert P.request_items(spec, geometry, P.parse_request("480x640,224x224")) == ((17 * 23, 0), (64, 0))
    assert P.request_items(spec, geometry, P.parse_request("4x448x448")) == ((2 * 256, 2),)  # temporal patch 2


def test_the_default_costs_fit_the_h100_measurements():
    costs = P.default_costs()
    assert "Qwen2-VL-7B" in costs.source
    for budget, ms in P.H100_REPLAY_MS:
        assert costs.replay(budget) == pytest.approx(ms, rel=0.25)
    assert costs.eager(64) == pytest.approx(35.1, rel=0.15) and costs.eager(4313) == pytest.approx(121, rel=0.15)
    assert sum(costs.memory(b) for b, _ in P.H100_REPLAY_MS) == pytest.approx(P.H100_POOL_MIB)
    assert costs.eager(0) == 0.0
    assert costs.replay(1024, slots=1024) > costs.replay(1024, slots=48) == costs.replay(1024)


def test_costs_from_a_bench_result_interpolate_its_replays():
    costs = P.costs_from_results(COSTS, "qwen2_vl")
    assert str(COSTS) in costs.source
    assert costs.replay(64) == pytest.approx(3.931) and costs.replay(8192) == pytest.approx(181.262)
    assert costs.replay(96) == pytest.approx((3.931 + 4.897) / 2)
    assert costs.memory(16320) == pytest.approx(526.2)
    with pytest.raises(UsageError, match="no results for spec 'llama4'.*qwen2_vl"):
        P.costs_from_results(COSTS, "llama4")


@pytest.mark.parametrize("manager", ["vitcg", "vllm"])
def test_the_plan_is_never_slower_than_vllms_ladder(qwen, manager):
    """A property over seeded random samples: the search starts at the default and only improves it."""
    rng = random.Random(15)
    sizes = [(224, 224), (448, 448), (480, 640), (768, 1024), (720, 1280), (336, 336), (1080, 1920), (28, 28)]
    for _ in range(8):
        sample = []
        for _ in range(rng.randint(1, 6)):
            images = tuple(rng.choice(sizes) for _ in range(rng.randint(0, 5)))
            videos = tuple((rng.choice((2, 4, 8)), *rng.choice(sizes[:4])) for _ in range(rng.randint(0 if images else 1, 1)))
            sample.append(P.Request(images, videos))
        plan = planned(qwen, sample, manager=manager)
        assert plan.planned.expected_ms <= plan.default.expected_ms + 1e-9
        assert plan.planned.memory_mib <= plan.memory_cap_mib + 1e-9
        for default_ms, plan_ms in zip(plan.default.per_request, plan.planned.per_request):
            assert plan_ms > 0 and default_ms > 0


def test_small_single_images_get_a_small_first_budget(qwen):
    plan = planned(qwen, [P.Request(((224, 224),))] * 5)
    budgets = plan.planned.config.budgets
    assert budgets[0] == 64  # holds the item's 64 tokens, no padding
    assert plan.planned.memory_mib < plan.default.memory_mib
    assert plan.planned.eager_items == 0
    assert plan.planned.expected_ms == pytest.approx(P.default_costs().replay(64))


def test_a_tight_memory_cap_drops_large_budgets(qwen):
    sample = P.default_requests(qwen[0])
    loose = planned(qwen, sample)
    tight = planned(qwen, sample, memory_cap_mib=60)
    assert max(tight.planned.config.budgets) * P.default_costs().mib_per_token <= 60
    assert max(tight.planned.config.budgets) < max(loose.planned.config.budgets)
    assert tight.planned.memory_mib <= 60 and tight.notes  # the default ladder is over the cap, and it says so
    assert tight.planned.eager_items > 0  # what no budget holds runs eagerly


def test_a_cap_below_the_smallest_graph_is_a_clear_error(qwen):
    with pytest.raises(UsageError, match="below the smallest graph: budget 64 needs 2.1 MiB"):
        planned(qwen, [P.Request(((224, 224),))], memory_cap_mib=1)


def test_expensive_replays_route_items_eagerly(qwen):
    costs = P.CostCurves("injected", r0=500.0, r1=1.0, e0=1.0, e1=0.001, mib_per_token=0.01)
    sample = [P.Request(((448, 448), (224, 224))), P.Request(((224, 224),))]
    plan = planned(qwen, sample, costs)
    assert plan.planned.eager_items == plan.default.eager_items == 3  # the manager's own routing, both ladders
    assert plan.planned.replays == 0
    assert plan.planned.per_request == [pytest.approx(costs.eager(256 + 64)), pytest.approx(costs.eager(64))]
    assert plan.planned.config.budgets == (64,)  # nothing replays: the least memory at the same latency


def test_greedy_packing_of_vllm_is_planned_too(qwen):
    """vLLM's manager pads the mixed workload into one large replay; the plan's ladder and caps fix it."""
    mixed = [r for r in P.default_requests(qwen[0]) if r.name == "mixed"]
    plan = planned(qwen, mixed, manager="vllm")
    assert plan.default.config.max_items == 64 and plan.default.expected_ms > 2 * plan.planned.expected_ms


def test_the_compilation_config_is_what_compile_config_builds(qwen):
    plan = planned(qwen, P.default_requests(qwen[0]))
    c = plan.planned.config
    assert plan.compilation_config == compile_config("image+video", budgets=list(c.budgets), max_items=c.max_items,
                                                     max_frames=c.max_frames)
    images_only = planned(qwen, [P.Request(((448, 448),))])
    assert images_only.compilation_config["encoder_cudagraph_max_frames_per_batch"] == 0
    assert images_only.compilation_config["cudagraph_mm_encoder"] is True


def test_planning_is_deterministic_and_quick(qwen):
    sample = P.default_requests(qwen[0])
    tic = time.perf_counter()
    first = planned(qwen, sample)
    seconds = time.perf_counter() - tic
    second = planned(qwen, sample)
    assert first.planned.config == second.planned.config and first.planned.expected_ms == second.planned.expected_ms
    assert seconds < 5  # < 0.3 s on an idle 2-core machine
    document = P.plan_json(first, source="bench workloads", limits=(8192, 32768))
    assert json.loads(json.dumps(document))["compilation_config"] == first.compilation_config
    assert "compilation_config:" in P.plan_text(first, source="bench workloads", limits=(8192, 32768))


@pytest.mark.parametrize("text", ["22x", "224", "0x224", "axb", "", "224x224,", "1x2x3x4", "99999999x2"])
def test_bad_requests_name_the_option(text):
    with pytest.raises(UsageError, match="--request"):
        P.parse_request(text)


def test_a_request_parses_images_and_videos():
    request = P.parse_request("448x448, 224X224,4x448x448")
    assert request.images == ((448, 448), (224, 224)) and request.videos == ((4, 448, 448),)
    assert request.label == "448x448,224x224,4x448x448"


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"images": [[224]]}]', "request 0: 'images' must be a list of \\[h, w\\]"),
    ('[{"images": [[224, 224]], "audio": []}]', "request 0: expected an object"),
    ('[{"videos": [[4, -1, 224]]}]', "sizes must be integers"),
    ('[{}]', "no images and no videos"),
])
def test_bad_request_files_are_usage_errors(tmp_path, content, message):
    path = tmp_path / "requests.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        P.read_requests(path)


def test_a_request_file_is_grouped(qwen, tmp_path):
    path = tmp_path / "requests.json"
    path.write_text(json.dumps([{"images": [[224, 224]]}] * 3 + [{"videos": [[4, 448, 448]]}]))
    plan = planned(qwen, P.read_requests(path))
    assert [(r.label, count) for r, count, _ in plan.requests] == [("224x224", 3), ("4x448x448", 1)]


def test_a_video_for_an_image_only_spec_is_refused():
    spec = SpecSource([REPO / "vitcg" / "specs" / "siglip.yaml"])["siglip"]
    geometry = P.spec_geometry(spec)
    with pytest.raises(UsageError, match="siglip has no video modality"):
        P.request_items(spec, geometry, P.parse_request("4x224x224"))
    assert all(not r.videos for r in P.default_requests(spec))
