"""Data-parallel encoding under tensor parallelism (``--mm-encoder-tp-mode data``) against vLLM 0.33.0's real code,
two ranks on a CPU.

What runs: three processes of ``dp_rank.py``. Two are the ranks of one tensor parallel group (vLLM's own
``init_distributed_environment(world_size=2, ...)`` and ``initialize_model_parallel(2, 1)``, gloo on 127.0.0.1);
each loads every model below with vLLM's own config objects (``ParallelConfig(tensor_parallel_size=2)``,
``ModelConfig(mm_encoder_tp_mode="data")``) and model loader, so the Transformers backend shards the language
model across the two ranks as it does on GPUs, and vLLM itself decides from the plugin's class whether the mode
stays ``data``. Each rank makes the profiling call, builds vLLM's real ``EncoderCudaGraphManager`` (``use_dp`` is
vLLM's own decision), captures, and runs every batch through ``manager.execute`` twice: vLLM's ``_dp_shard``
(load balance, ``select_encoder_cudagraph_items`` with each rank's unsorted indices), ``_execute_local`` and
``_dp_gather`` (the gloo all-gather) are vLLM's code. The third process loads the same models at tensor parallel
size 1 and keeps the stock backend's items: the reference. The one double is capture on a CPU
(``CpuCaptureManager``, doubles.py), plus the processor-modalities and ``empty_cache`` doubles of the loader.

Asserted: a spec whose tower stays whole on each rank serves every item of images (and videos) of several sizes
from the graphs, equal to the stock backend at tensor parallel size 1 (float32, relative error <= 1e-5), each
rank having encoded some of the items (the root indices of the selections it postprocessed, and its graph hits)
and the two together all of them, once each. A spec whose tower the backend shards under tensor parallelism (its
fusers split CLIP's attention and GLM-4V's MLP across ranks) declines with one line, and the stock backend then
serves mode ``data`` as mode ``weights``: every rank encodes every item, equal to tensor parallel size 1.
Qwen2-VL's and Qwen3-VL's videos are made here from their image patches (their video processors need
torchvision, which has no CPU build on PyPI): random patch rows of several frame counts and sizes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.eager import assert_items_match
from support.specs import packaged
from vitcg.tools.check.vlm import backend_batches, build_vlm

REGISTRY = packaged()
SCRIPT = Path(__file__).with_name("dp_rank.py")
ROOT = Path(__file__).resolve().parents[2]
REPLICATED = ["qwen2_vl", "qwen3_vl"]
"""Specs whose towers the backend keeps whole on each rank: data-parallel encoding through vitcg's graphs."""
SHARDED = {"clip": "CLIPVisionModel's layers hold a shard of their weight"}
"""Specs whose towers the backend shards under tensor parallelism: the plugin declines, with this in its line."""
VIDEO_GRIDS = [(2, 4, 4), (1, 4, 8), (2, 8, 4)]
"""(frames, height, width) in patches of the videos made for grid specs without a video batch."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def videos_from_patches(image_batch: dict) -> dict:
    """Videos laid out as the backend hands them over, with the image batch's patch width: random patch rows of
    :data:`VIDEO_GRIDS`."""
    rows = [t * h * w for t, h, w in VIDEO_GRIDS]
    width = image_batch["pixel_values"].shape[-1]
    return {"pixel_values_videos": torch.randn(sum(rows), width, generator=torch.Generator().manual_seed(11)),
            "video_grid_thw": torch.tensor(VIDEO_GRIDS), "num_video_patches": torch.tensor(rows)}


def prepare(name: str, folder: Path) -> None:
    """``name``'s tiny VLM saved in ``folder/model`` and its batches in ``folder/batches.pt``."""
    spec = REGISTRY[name]
    vlm = build_vlm(spec)
    batches = backend_batches(spec, vlm)
    if spec.modality("video") is not None and "video" not in batches and "image_grid_thw" in batches["image"]:
        batches["video"] = videos_from_patches(batches["image"])
    vlm.config.architectures = [type(vlm).__name__]
    vlm.save_pretrained(folder / "model")
    torch.save(batches, folder / "batches.pt")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    """Per spec: ``stock`` (tensor parallel size 1) and ``ranks`` (the two ranks' results), from one run of the
    three processes side by side."""
    names = [*REPLICATED, *SHARDED]
    work = tmp_path_factory.mktemp("data_parallel")
    for name in names:
        (work / name).mkdir()
        prepare(name, work / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ports = {1: free_port(), 2: free_port()}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(rank), str(world), str(ports[world]), str(work),
                               *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank, world in ((0, 1), (0, 2), (1, 2))]
    outs = []
    try:
        outs = [proc.communicate(timeout=480) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-4000:]
    return {name: {"stock": torch.load(work / name / "stock.pt", weights_only=False),
                   "ranks": [torch.load(work / name / f"rank{r}.pt", weights_only=False) for r in (0, 1)]}
            for name in names}


def usable(result: dict) -> None:
    for part in (result["stock"], *result["ranks"]):
        if "skip" in part:
            pytest.skip(part["skip"])


@pytest.mark.parametrize("name", REPLICATED)
def test_each_rank_encodes_its_share_and_the_gathered_items_equal_the_stock_backend(name, results):
    result = results[name]
    usable(result)
    stock, ranks = result["stock"]["items"], result["ranks"]
    for rank, part in enumerate(ranks):
        assert part["class"] == "VitcgMultiModalForCausalLM" and part["mode"] == "data", part["log"]
        assert part["use_dp"], f"rank {rank}: vLLM's manager does not shard"
    assert set(stock) == {m for m, _ in ranks[0]["runs"]}
    for (modality, attempt), run0 in ranks[0]["runs"].items():
        run1 = ranks[1]["runs"][(modality, attempt)]
        what = f"{name} {modality} (run {attempt})"
        items = len(stock[modality])
        assert run0["encoded"] and run1["encoded"], f"{what}: a rank encoded nothing: {run0['encoded']}, {run1['encoded']}"
        assert sorted(run0["encoded"] + run1["encoded"]) == list(range(items)), f"{what}: not every item once"
        for rank, run in enumerate((run0, run1)):
            assert run["off"] is None, f"{what}, rank {rank}: {run['off']}"
            assert run["hits"] == len(run["encoded"]), f"{what}, rank {rank}: not every item replayed"
            assert_items_match(run["items"], stock[modality], what=f"{what}, rank {rank}: ")


@pytest.mark.parametrize("name", REPLICATED)
def test_a_fault_on_one_rank_keeps_the_ranks_in_step_and_the_items_equal_the_stock_backend(name, results):
    """Rank 1 alone turns its graphs off (a fault in its replay buffers): both ranks keep calling the manager, whose
    gather is a collective (no hang), and every item of both batches still equals the stock backend's."""
    result = results[name]
    usable(result)
    stock = result["stock"]["items"]
    faults = [part["fault"] for part in result["ranks"]]
    assert faults[0]["off"] is None, faults[0]["off"]
    assert "prepare_encoder_cudagraph_replay_buffers failed: RuntimeError: injected on rank 1" in (faults[1]["off"] or "")
    for rank, fault in enumerate(faults):
        for attempt, items in enumerate(fault["items"]):
            assert_items_match(items, stock[fault["modality"]], what=f"{name}, rank {rank}, batch {attempt}: ")


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_a_sharded_tower_declines_and_the_stock_backend_serves_mode_data(name, results):
    result = results[name]
    usable(result)
    stock = result["stock"]["items"]
    for rank, part in enumerate(result["ranks"]):
        assert part["class"] == "TransformersMultiModalForCausalLM" and part["mode"] == "data", part["log"]
        declined = [line for line in part["log"] if "runs without encoder CUDA graphs" in line]
        assert len(declined) == 1 and SHARDED[name] in declined[0], part["log"]
        assert "--mm-encoder-tp-mode data needs the whole tower on every rank" in declined[0]
        assert set(part["items"]) == set(stock)
        for modality, items in part["items"].items():
            assert_items_match(items, stock[modality], what=f"{name} {modality}, rank {rank}, stock at TP 2: ")
