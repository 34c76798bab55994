"""``benchmarks/issue38_tables.py`` renders RESULTS.md's issue 38 tables, marking each row past the issue's bound."""

from __future__ import annotations

from support.scripts import benchmark


def _module():
    return benchmark("issue38_tables")


def _ttft_row(default_vs_best: float) -> dict:
    return {"eager_ms": 50.0, "vitcg_ms": 30.0, "gain": 50 / 30, "graphs_only_ms": 29.0, "eager_side_ms": 48.0,
            "default_vs_best": default_vs_best, "gain_bound": 2.0, "same_first_token": True}


def test_ttft_marks_the_default_more_than_3_percent_behind_its_better_side():
    rows = _module().ttft({"models": {"m": {"workloads": {"near": _ttft_row(1.029), "far": _ttft_row(1.031)}}}})
    lines = rows.splitlines()[2:]
    assert "| 1.029 |" in lines[0] and "| **1.031** |" in lines[1]


def _workload(tight: float, graphs: float, eager: float, inductor: float, compiled: float | None) -> dict:
    ms = {"eager": eager, "vitcg_tight": tight, "vitcg_graphs": graphs, "vitcg_inductor": inductor, "exact": graphs}
    if compiled is not None:
        ms["compile"] = compiled
    return {"workload": "w", "tokens": 512, "ms": ms, "floor_ms": 2.0, "packing": {"tight": {"budgets": [512]}}}


def test_bench_takes_the_better_side_and_marks_torch_compile_ahead_or_failing():
    tables = _module().bench([{"specs": [{"spec": "s", "workloads": [
        _workload(tight=10.0, graphs=12.0, eager=9.0, inductor=5.0, compiled=6.0),
        _workload(tight=10.0, graphs=12.0, eager=20.0, inductor=7.0, compiled=6.0),
        _workload(tight=10.0, graphs=10.0, eager=20.0, inductor=7.0, compiled=None)]}]}])
    ahead, behind, failed = tables.splitlines()[2:]
    assert "| **1.111** |" in ahead and "| 0.83 |" in ahead and "| 2.50x |" in ahead
    assert "| 0.833 |" in behind and "| **1.17** |" in behind
    assert "| fails | - |" in failed


def test_plugin_skips_declined_models_and_marks_losses():
    workloads = {"small": {"items": 1, "stock_ms": 10.0, "plugin_ms": 5.0, "plugin_gain": 2.0, "plugin_equal": True},
                 "big": {"items": 8, "stock_ms": 10.0, "plugin_ms": 20.0, "plugin_gain": 0.5, "plugin_equal": False},
                 "declined": {"stock_ms": 10.0}}
    small, big = _module().plugin({"models": {"m": {"workloads": workloads}}}).splitlines()[2:]
    assert "| 2.00x | - | - | yes |" in small and "| **0.50x** |" in big and big.endswith("| **no** |")


def test_plugin_names_the_paths_of_either_file_layout():
    """Earlier files: ``plugin`` holds plain blocks, ``compiled`` the compiled ones; later files (a model with
    ``compiled_blocks``): ``plugin`` is the default, compiled, and ``plain`` the plain one."""
    row = {"items": 2, "stock_ms": 10.0, "plugin_ms": 4.0, "plugin_gain": 2.5, "plugin_equal": True}
    earlier = _module().plugin({"models": {"m": {"workloads": {"w": {**row, "compiled_ms": 5.0, "compiled_gain": 2.0,
                                                                     "compiled_equal": False}}}}})
    assert earlier.splitlines()[0].startswith("| model | workload | items | stock | plugin (plain blocks) | gain | "
                                              "plugin (compiled blocks) |")
    assert earlier.splitlines()[2].endswith("| 4.00 | 2.50x | 5.00 | 2.00x | **no** |")
    later = _module().plugin({"models": {"m": {"compiled_blocks": True, "workloads": {
        "w": {**row, "plain_ms": 12.5, "plain_gain": 0.8, "plain_equal": True}}}}})
    assert "| plugin (default, compiled blocks) | gain | plugin (plain blocks) |" in later.splitlines()[0]
    assert later.splitlines()[2].endswith("| 4.00 | 2.50x | 12.50 | **0.80x** | yes |")


def test_attention_divides_vitcgs_kernel_by_cudnn_per_segment():
    case = {"backends": {"triton_runtime": {"tflops": 300.0}, "cudnn_segments": {"tflops": 400.0}}}
    table = _module().attention({"dims": {"80": {"cases": {"mixed": case}}}})
    assert table.splitlines()[0] == "| head dim | mixed |"
    assert table.splitlines()[2] == "| 80 | **300 / 400 (0.75)** |"
