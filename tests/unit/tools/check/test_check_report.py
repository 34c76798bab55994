"""``vitcg check``'s text reporter, exact strings: one line per spec (proven, spec stage only, FAILED with why,
skipped), its table and kept warnings only when it failed or with ``verbose``, and the summary line."""

from __future__ import annotations

import json

from vitcg.tools.check.cases import CaseResult, SpecReport
from vitcg.tools.check.report import Verdict, check_json, check_summary, check_text, verdict
from vitcg.tools.guesses import Guess


def case(name: str, **fields) -> CaseResult:
    return CaseResult(name, **{"items": 1, "route": "graph 64", "tolerance": 1e-5, **fields})


def report(spec: str, *cases: CaseResult, **fields) -> SpecReport:
    return SpecReport(spec, "cpu", "float32", budgets=(64, 128), max_items=4, cases=list(cases), **fields)


VLM = "VLM features and generate (float32)"
PROVEN = report("qwen2_vl", case("one small image"), case("one video", skipped="no video modality"),
                case(VLM, items=3, route="2 replays, 0 eager", stage="vlm"),
                warnings=["[transformers] `causal_conv1d_fn` is falling back"])
SPEC_ONLY = report("aimv2", case("one small image"), case("empty batch", items=0, route="-"),
                   case(VLM, stage="vlm", skipped="Aimv2Model is a contrastive image-text model\nmore"))
FAILED = report("wrong_width", case("one small image", error="VitcgError: item 0: manager output (16, 96)"),
                case(VLM, items=3, stage="vlm"), warnings=["FutureWarning: old argument (modeling_x.py:7) (2x)"])
BROKEN = SpecReport("broken", "cpu", "float32", error="broken.yaml does not validate (1 error):\n  duplicate key")
UNAVAILABLE = SpecReport("future", "cpu", "float32", unavailable="unavailable in transformers 5.23.0")


def test_verdicts_and_their_reasons():
    assert verdict(PROVEN) == (Verdict.PROVEN, "1 case, and the VLM end to end on 3 items")
    assert verdict(SPEC_ONLY) == (Verdict.SPEC_ONLY, "2 cases; no end-to-end stage: Aimv2Model is a contrastive "
                                                     "image-text model")
    assert verdict(FAILED) == (Verdict.FAILED, "one small image: VitcgError: item 0: manager output (16, 96)")
    assert verdict(BROKEN) == (Verdict.FAILED, "before any case: broken.yaml does not validate (1 error):")
    assert verdict(UNAVAILABLE) == (Verdict.UNAVAILABLE, "unavailable in transformers 5.23.0")
    long = report("x", case("one video", error="RuntimeError: shapes differ\n  at line 3"))
    assert verdict(long) == (Verdict.FAILED, "one video: RuntimeError: shapes differ")
    real = report("siglip", case("one small image"))
    assert verdict(real) == (Verdict.SPEC_ONLY, "1 case; no end-to-end stage: it runs at --size tiny only")
    inaccurate = report("x", case("one small image", max_error=3e-4))
    assert verdict(inaccurate) == (Verdict.FAILED, "one small image: max rel err 3.00e-04 > tolerance 1e-05")
    end_to_end = report("x", case("one small image"), case(VLM, stage="vlm", error="greedy generate differs"))
    assert verdict(end_to_end) == (Verdict.FAILED, "end-to-end stage: greedy generate differs")


def test_passing_specs_are_one_line_each_and_their_warnings_stay_quiet():
    assert check_text([PROVEN, SPEC_ONLY, UNAVAILABLE]).splitlines() == [
        "qwen2_vl  proven: 1 case, and the VLM end to end on 3 items",
        "aimv2     spec stage only: 2 cases; no end-to-end stage: Aimv2Model is a contrastive image-text model",
        "future    skipped: unavailable in transformers 5.23.0",
        "3 specs checked: 2 passed (1 proven, 1 spec stage only), 1 unavailable in this transformers (future)",
    ]


def test_a_failed_spec_shows_its_table_and_its_warnings():
    assert check_text([FAILED]).splitlines() == [
        "wrong_width  FAILED: one small image: VitcgError: item 0: manager output (16, 96)",
        "  cpu, float32; budgets 64/128, up to 4 items",
        "  stage case                                   items  route                  max rel err  finite  result",
        "  spec  one small image                            1  graph 64                  0.00e+00  yes     "
        "FAILED: VitcgError: item 0: manager output (16, 96)",
        "  vlm   VLM features and generate (float32)        3  graph 64                  0.00e+00  yes     ok",
        "  warnings (1):",
        "    FutureWarning: old argument (modeling_x.py:7) (2x)",
        "1 spec checked: 0 passed, 1 failed (wrong_width)",
    ]
    assert check_text([BROKEN], summary=False).splitlines() == [
        "broken  FAILED: before any case: broken.yaml does not validate (1 error):",
        "  cpu, float32",
        "  FAILED before any case: broken.yaml does not validate (1 error):",
        "      duplicate key",
    ]


def test_verbose_shows_every_table_and_every_warning():
    lines = check_text([PROVEN, SPEC_ONLY], verbose=True, width=12).splitlines()
    assert lines[0] == "qwen2_vl      proven: 1 case, and the VLM end to end on 3 items"
    assert lines[1] == "  cpu, float32; budgets 64/128, up to 4 items"
    assert lines[3].startswith("  spec  one small image ") and lines[3].endswith("  ok")
    assert lines[4].endswith("skipped (no video modality)")
    assert lines[6:8] == ["  warnings (1):", "    [transformers] `causal_conv1d_fn` is falling back"]
    assert lines[8].startswith("aimv2         spec stage only: ")
    assert sum(line.startswith("  stage case") for line in lines) == 2


def test_summary_lines():
    assert check_summary([PROVEN]) == "1 spec checked: 1 passed (1 proven)"
    assert check_summary([PROVEN, FAILED, BROKEN]) == "3 specs checked: 1 passed (1 proven), 2 failed (wrong_width, broken)"
    assert check_summary([BROKEN]) == "1 spec checked: 0 passed, 1 failed (broken)"


def test_json_keeps_its_keys_and_adds_the_verdict_and_warnings():
    document = json.loads(check_json([PROVEN, FAILED]))
    assert set(document) == {"ok", "specs"} and document["ok"] is False
    first = document["specs"][0]
    assert set(first) == {"spec", "device", "dtype", "budgets", "max_items", "ok", "error", "unavailable", "cases",
                          "verdict", "reason", "guesses", "warnings"}
    assert set(first["cases"][0]) == {"name", "stage", "items", "route", "max_error", "graph_vs_fp32",
                                      "eager_vs_fp32", "finite", "tolerance", "ok", "error", "skipped"}
    assert (first["verdict"], first["warnings"]) == ("proven", ["[transformers] `causal_conv1d_fn` is falling back"])
    assert document["specs"][1]["verdict"] == "failed"


def test_a_long_reason_is_cut_to_the_line_width():
    long = report("glm_image", case("one small image"), case(VLM, stage="vlm", skipped="because " * 40))
    line = check_text([long], summary=False).rstrip("\n")
    assert len(line) <= 120 and line.endswith(" because because...") and len(line) > 110, line
    assert "because " * 40 in check_text([long], verbose=True)  # the table keeps all of it


DRAFT = report("lfm2_vl", case("one small image"), case(VLM, items=3, route="2 replays, 0 eager", stage="vlm"),
               guesses=[Guess("lfm2_vl.yaml", 10, "checkpoints: [org/lfm2_vl]   # GUESS: real checkpoint names"),
                        Guess("lfm2_vl.yaml", 17, "config: {}   # GUESS: the text config")])


def test_a_draft_with_guesses_left_is_not_plainly_proven():
    """Was "lfm2_vl  proven: ..." for a draft still holding its guesses and a placeholder checkpoint."""
    assert check_text([DRAFT, PROVEN], verbose=False).splitlines() == [
        "lfm2_vl   proven, with 2 guesses left: 1 case, and the VLM end to end on 3 items",
        "qwen2_vl  proven: 1 case, and the VLM end to end on 3 items",
        "2 specs checked: 2 passed (2 proven), 2 guesses left (lfm2_vl 2)",
    ]
    assert check_text([DRAFT], verbose=True).splitlines()[-4:] == [
        "  guesses left (2):",
        "    lfm2_vl.yaml:10: checkpoints: [org/lfm2_vl]   # GUESS: real checkpoint names",
        "    lfm2_vl.yaml:17: config: {}   # GUESS: the text config",
        "1 spec checked: 1 passed (1 proven), 2 guesses left (lfm2_vl 2)",
    ]
    one = report("x", case("one small image"), guesses=DRAFT.guesses[:1])
    assert check_text([one]).splitlines()[0] == ("x  spec stage only, with 1 guess left: 1 case; no end-to-end stage: "
                                                 "it runs at --size tiny only")
    document = json.loads(check_json([DRAFT, PROVEN]))
    assert document["specs"][0]["guesses"] == [
        {"file": "lfm2_vl.yaml", "line": 10, "text": "checkpoints: [org/lfm2_vl]   # GUESS: real checkpoint names"},
        {"file": "lfm2_vl.yaml", "line": 17, "text": "config: {}   # GUESS: the text config"}]
    assert document["specs"][1]["guesses"] == []
