"""One process of tests/vllm/test_data_parallel.py: vLLM's distributed environment for one rank, and the models of
the specs named, loaded by vLLM's config objects and model loader, run through vLLM's real encoder graph manager.

With world size 2 (tensor parallel size 2, ``mm_encoder_tp_mode="data"``, gloo on 127.0.0.1), each rank loads
every model, makes the profiling call (``embed_multimodal`` on every batch, as vLLM's runner does before
capture), builds and captures the manager (``CpuCaptureManager``: the one double, capture on a CPU) and runs
each batch through ``manager.execute`` twice (the first pack learns the tower's output layout, the second
replays from graph rows), then once more with a fault on rank 1 alone (:func:`fault_on_one_rank`). It saves, per
spec and modality and run: the items ``execute`` returned (after vLLM's
all-gather), the items of the batch this rank encoded (the root indices of every selection the manager
postprocessed here) and the graph hits it counted. With world size 1 (tensor parallel size 1) it saves the stock
backend's items instead: the reference.

Usage: python dp_rank.py RANK WORLD PORT WORKDIR SPEC...   (WORKDIR/SPEC holds ``model/`` and ``batches.pt``;
results go to WORKDIR/SPEC/rank{RANK}.pt, or stock.pt with world size 1). Exits non-zero with a traceback on any
failure; a model vLLM's backend itself cannot build is saved as ``{"skip": why}``.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # before vLLM is imported (see conftest.py)


LOG: list[str] = []
"""The vitcg logger's messages so far (INFO and above): why a model declined or turned its graphs off."""


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOG.append(record.getMessage())


def load(spec, folder: Path, world: int):
    """``spec``'s model from ``folder`` as vLLM builds it, at tensor parallel size ``world``, encoder graphs
    asked for and, above one rank, data-parallel encoding."""
    import torch  # noqa: F401
    from doubles import modalities_from_model, no_accelerator_empty_cache
    from vllm.config import (
        CompilationConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.model_loader import get_model

    with modalities_from_model(spec), no_accelerator_empty_cache():
        model_config = ModelConfig(model=str(folder), model_impl="transformers", dtype="float32",
                                   skip_tokenizer_init=True, mm_encoder_tp_mode="data" if world > 1 else None)
        config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                            parallel_config=ParallelConfig(tensor_parallel_size=world),
                            compilation_config=CompilationConfig(
                                cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=list(spec.tests.budgets),
                                encoder_cudagraph_max_vision_items_per_batch=2))
        with set_current_vllm_config(config):
            model = get_model(vllm_config=config)
    return model, config


def run_spec(spec, folder: Path, rank: int, world: int) -> dict:
    import torch
    from doubles import CpuCaptureManager
    from vllm.config import set_current_vllm_config

    batches = torch.load(folder / "batches.pt", weights_only=False)
    LOG.clear()
    try:
        model, config = load(spec, folder / "model", world)
    except (ValueError, TypeError, AttributeError, KeyError, NotImplementedError) as exc:
        return {"skip": f"vLLM's backend cannot build it at tensor parallel size {world}: "
                        f"{type(exc).__name__}: {exc}"}
    result: dict = {"class": type(model).__name__, "log": list(LOG),
                    "mode": config.model_config.multimodal_config.mm_encoder_tp_mode}
    with set_current_vllm_config(config), torch.inference_mode():
        profiled = {modality: model.embed_multimodal(**batch) for modality, batch in batches.items()}
        if world == 1:
            result["items"] = {m: [t.clone() for t in items] for m, items in profiled.items()}
            return result
        if not hasattr(model, "_vitcg"):
            result["items"] = {m: [t.clone() for t in items] for m, items in profiled.items()}
            return result
        encoded: list[int] = []
        postprocess = model.postprocess_encoder_output

        def spy(outputs, indices, per_item_out_tokens, dest, clone=False, batch_mm_kwargs=None):
            encoded.extend(batch_mm_kwargs.indices)  # the root batch's items this selection holds
            return postprocess(outputs, indices, per_item_out_tokens, dest, clone, batch_mm_kwargs)

        model.postprocess_encoder_output = spy
        manager = CpuCaptureManager(config, torch.device("cpu"), torch.float32, model)
        result["use_dp"] = manager.use_dp
        manager.capture(graph_pool=None)
        runs = {}
        for modality, batch in batches.items():
            for attempt in (0, 1):
                encoded.clear()
                hits = manager.graph_hits
                items = manager.execute(batch)
                runs[(modality, attempt)] = {"items": [t.clone() for t in items], "encoded": sorted(encoded),
                                             "hits": manager.graph_hits - hits, "off": model._vitcg.off}
        result["runs"] = runs
        result["fault"] = fault_on_one_rank(model, manager, batches, rank)
    return result


def fault_on_one_rank(model, manager, batches: dict, rank: int) -> dict:
    """Rank 1 alone hits a fault on vitcg's path (its replay buffers), then both ranks serve two batches as vLLM's
    runner does (the manager while it takes the modality, else ``embed_multimodal``): the manager's gather is a
    collective, so a rank that left it alone would leave the other waiting. Returns the items each batch got, and
    why this rank's graphs are off (None: on)."""
    modality, batch = next(iter(batches.items()))
    if rank == 1:
        def fault(*args, **kwargs):
            raise RuntimeError("injected on rank 1")

        model._vitcg.adapter.prepare_encoder_cudagraph_replay_buffers = fault
    served = []
    for _ in range(2):
        items = manager.execute(batch) if manager.supports_modality(modality) else model.embed_multimodal(**batch)
        served.append([t.clone() for t in items])
    return {"modality": modality, "items": served, "off": model._vitcg.off}


def main(argv: list[str]) -> int:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.plugins import load_general_plugins

    from vitcg.lang import SpecSource

    rank, world, port = int(argv[0]), int(argv[1]), int(argv[2])
    workdir, names = Path(argv[3]), argv[4:]
    torch.set_num_threads(1)
    logging.getLogger("vitcg").setLevel(logging.INFO)
    logging.getLogger("vitcg").addHandler(_Keep())
    registry = SpecSource()
    load_general_plugins()  # as every vLLM process does: vitcg's classes replace the backend's
    with set_current_vllm_config(VllmConfig(parallel_config=_parallel(world))):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(world, 1)
    try:
        for name in names:
            out = workdir / name / (f"rank{rank}.pt" if world > 1 else "stock.pt")
            torch.save(run_spec(registry[name], workdir / name, rank, world), out)
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()
    return 0


def _parallel(world: int):
    from vllm.config import ParallelConfig

    return ParallelConfig(tensor_parallel_size=world)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        code = 1
    sys.exit(code)
