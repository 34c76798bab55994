"""Time to first token of a full transformers VLM, eager against ``vitcg.accelerate`` (GPU, random bf16 weights).

Usage (GPU machine, repository root): python benchmarks/generate_ttft.py [MODEL...] [--json OUT] [--iters N]
[--budgets B,B,...] [--workload W]...
Models are small checkpoints' dimensions (their configs are written below); inputs come from each model's
own image processor (PIL backend, defaults) on random images, and ``input_ids`` hold the placeholders the
processor's tokenizer would expand. TTFT is the median wall time of ``generate(max_new_tokens=1)`` after
warm-up, eager and accelerated measured alternately in one process (``handle.paused()``); the accelerated
model should give the same first tokens as the eager one (bf16: a near tie may flip). A third measurement
answers ``get_image_features`` from a cache (a free encoder): the TTFT no encoder speed-up can beat. A fourth
runs the same manager with routing off (``ManagerOptions(route_eager=False)``: every pack that fits a budget
replays), a fifth with every call routed to the manager's eager side (the adapter's eager forward, its blocks
compiled with dynamic shapes where ``accelerate`` compiles), so the router's choice is judged against both of its
sides in one process: "eager" is the original call, "graphs only" the manager without routing, "eager side" the
manager routing everything eagerly, "default" the manager as shipped; "default/best" is default over the faster
of graphs only and eager side.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import json
import statistics
import time

import numpy as np
import torch
import transformers

import vitcg
from vitcg.tools.plan.compile_config import parse_budgets

WORKLOADS = {
    "1x224": [(224, 224)],
    "1x448": [(448, 448)],
    "4x448": [(448, 448)] * 4,
    "mixed3": [(476, 644), (336, 336), (784, 1036)],
}


def qwen_tokens(config, inputs, merge=2):
    ids = []
    for t, h, w in inputs["image_grid_thw"].tolist():
        ids += [config.vision_start_token_id] + [config.image_token_id] * (t * h * w // merge**2)
        ids += [config.vision_end_token_id]
    return ids


def internvl_tokens(config, inputs):
    per_tile = (config.vision_config.image_size[0] // config.vision_config.patch_size[0]) ** 2 // 4
    ids = []
    for tiles in inputs.pop("num_patches").tolist():
        ids += [config.image_token_id] * (tiles * per_tile)
    return ids


def gemma3_tokens(config, inputs):
    ids = []
    for _ in range(inputs["pixel_values"].shape[0]):
        ids += [config.boi_token_index] + [config.image_token_index] * config.mm_tokens_per_image
        ids += [config.eoi_token_index]
    return ids


MODELS = {
    # Qwen2-VL-2B: 32-layer 1280-wide ViT, merger to 1536; 28-layer text model
    "qwen2_vl": dict(
        config=lambda: transformers.Qwen2VLConfig(
            vision_config={"hidden_size": 1536},
            text_config={"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                         "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936}),
        model=transformers.Qwen2VLForConditionalGeneration, processor=transformers.Qwen2VLImageProcessorPil,
        tokens=qwen_tokens),
    # Qwen2.5-VL-3B: 32-layer 1280-wide windowed ViT, merger to 2048; 36-layer text model
    "qwen2_5_vl": dict(
        config=lambda: transformers.Qwen2_5_VLConfig(
            vision_config={"hidden_size": 1280, "out_hidden_size": 2048, "intermediate_size": 3420},
            text_config={"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                         "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936}),
        model=transformers.Qwen2_5_VLForConditionalGeneration, processor=transformers.Qwen2VLImageProcessorPil,
        tokens=qwen_tokens),
    # Qwen3-VL-2B: 24-layer 1024-wide ViT with deepstack, merger to 2048; 28-layer text model
    "qwen3_vl": dict(
        config=lambda: transformers.Qwen3VLConfig(
            vision_config={"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                           "out_hidden_size": 2048, "deepstack_visual_indexes": [5, 11, 17]},
            text_config={"hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
                         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144,
                         "vocab_size": 151936}),
        model=transformers.Qwen3VLForConditionalGeneration, processor=transformers.Qwen2VLImageProcessorPil,
        processor_kwargs={"patch_size": 16}, tokens=qwen_tokens),
    # InternVL3-1B: InternViT-300M (defaults), 448 tiles, Qwen2 0.5B-class text model
    "internvl": dict(
        config=lambda: transformers.InternVLConfig(
            text_config={"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                         "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151674}),
        model=transformers.InternVLForConditionalGeneration, processor=transformers.GotOcr2ImageProcessorPil,
        processor_kwargs={"crop_to_patches": True, "size": {"height": 448, "width": 448}}, tokens=internvl_tokens),
    # Gemma-3-4B: SigLIP so400m/14 at 896 px (one 4096-patch tile per image, pooled to 256 tokens); 34-layer text
    "gemma3": dict(
        config=lambda: transformers.Gemma3Config(
            vision_config={"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                           "num_attention_heads": 16, "image_size": 896, "patch_size": 14, "vision_use_head": False},
            text_config={"hidden_size": 2560, "num_hidden_layers": 34, "num_attention_heads": 8,
                         "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 10240}),
        model=transformers.Gemma3ForConditionalGeneration, processor=transformers.Gemma3ImageProcessorPil,
        processor_kwargs={"size": {"height": 896, "width": 896}}, drop=("num_crops",), tokens=gemma3_tokens),
}


def inputs_for(entry, config, sizes, seed=0):
    rng = np.random.default_rng(seed)
    processor = entry["processor"](**entry.get("processor_kwargs", {}))
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    inputs = dict(processor(images=images, return_tensors="pt"))
    for key in entry.get("drop", ()):
        inputs.pop(key, None)  # processor bookkeeping that generate() does not take
    ids = [11, 12, 13] + entry["tokens"](config, inputs) + [14, 15]
    inputs["input_ids"] = torch.tensor([ids])
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return {k: v.to("cuda", torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in inputs.items()}


def one_call(model, inputs):
    """Wall time (ms) of one generate(max_new_tokens=1) and its first token."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=1, do_sample=False)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, out[:, -1]


@contextlib.contextmanager
def free_vision(model, inputs):
    """The VLM with a vision encoder that costs nothing: ``get_image_features`` answers with its own earlier
    output for these inputs. TTFT then is what the rest of generate costs: the bound on any encoder speed-up."""
    base = model.model
    with torch.no_grad():
        names = inspect.signature(base.get_image_features).parameters
        cached = base.get_image_features(**{k: v for k, v in inputs.items() if k in names})
    original = base.get_image_features

    @functools.wraps(original)  # generate() picks the call's arguments by this signature
    def answer(*args, **kwargs):
        return cached

    base.get_image_features = answer
    try:
        yield
    finally:
        del base.get_image_features


@contextlib.contextmanager
def every_call_eager(manager):
    """The manager with every call routed to its eager side (the adapter's eager forward, compiled blocks included
    where ``accelerate`` compiled them): an eager price of zero for the duration."""
    costs, eager = manager.costs, manager.costs.eager
    costs.eager = lambda tokens: 0.0
    try:
        yield
    finally:
        costs.eager = eager


def ttft_sides(model, handle, inputs, iters, warmup=3):
    """Median TTFT without vitcg, with it (default routing), with graphs only (routing off), with the manager's eager
    side only, and with a free encoder, measured in turn in one process (handle.paused() runs the original calls),
    so clock and cache drift hit all alike; and whether the first tokens of eager and default agree."""
    times = {"eager": [], "default": [], "graphs_only": [], "eager_side": [], "bound": []}
    default = handle.manager.options
    for i in range(warmup + iters):
        with handle.paused():
            ms_eager, first_eager = one_call(model, inputs)
            with free_vision(model, inputs):
                ms_bound, _ = one_call(model, inputs)
        ms_default, first_default = one_call(model, inputs)
        handle.manager.options = dataclasses.replace(default, route_eager=False)
        ms_only, _ = one_call(model, inputs)
        handle.manager.options = default
        with every_call_eager(handle.manager):
            ms_side, _ = one_call(model, inputs)
        if i >= warmup:
            for key, ms in (("eager", ms_eager), ("default", ms_default), ("graphs_only", ms_only),
                            ("eager_side", ms_side), ("bound", ms_bound)):
                times[key].append(ms)
    medians = {key: statistics.median(values) for key, values in times.items()}
    return medians, bool(torch.equal(first_eager, first_default))


def budgets_argument(text: str) -> list[int]:
    """``--budgets``: vitcg's own parser, its message shown by argparse."""
    try:
        return parse_budgets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--iters", type=int, default=30,
                        help="timed rounds per workload (default 30: 10 were too noisy on an H100 machine, "
                             "benchmarks/RESULTS.md, 2026-11-26)")
    parser.add_argument("--budgets", type=budgets_argument, default=None,
                        help="token budgets, comma-separated (e.g. the ladder `vitcg plan` prints for these "
                             "workloads), for every model named, instead of the default ladder")
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS),
                        help="time only this workload (repeatable; default: all)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    limits = {} if args.budgets is None else {"token_budgets": args.budgets}
    results = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "transformers": transformers.__version__, "models": {}}
    for name in args.models:
        entry = MODELS[name]
        try:
            config = entry["config"]()
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = entry["model"](config).to(torch.bfloat16).eval()
            workloads = {w: inputs_for(entry, config, WORKLOADS[w]) for w in args.workload or WORKLOADS}
            start = time.perf_counter()
            handle = vitcg.accelerate(model, progress=False, **limits)
            capture_s = time.perf_counter() - start
            rows = {}
            for w, inputs in workloads.items():
                medians, same = ttft_sides(model, handle, inputs, args.iters)
                eager_ms, ms, only_ms, side_ms, bound_ms = (medians[k] for k in
                                                            ("eager", "default", "graphs_only", "eager_side", "bound"))
                best = min(side_ms, only_ms)
                rows[w] = {"eager_ms": eager_ms, "vitcg_ms": ms, "gain": eager_ms / ms, "same_first_token": same,
                           "graphs_only_ms": only_ms, "eager_side_ms": side_ms, "default_vs_best": ms / best,
                           "free_encoder_ms": bound_ms, "gain_bound": eager_ms / bound_ms}
                print(f"{name:11s} {w:7s} eager {eager_ms:8.2f} ms  vitcg {ms:8.2f} ms  {eager_ms / ms:.2f}x  "
                      f"graphs only {only_ms:8.2f} ms  eager side {side_ms:8.2f} ms  default/best {ms / best:.3f}  "
                      f"free encoder {bound_ms:8.2f} ms (bound {eager_ms / bound_ms:.2f}x)  same token: {same}",
                      flush=True)
            stats = handle.stats
            results["models"][name] = {"workloads": rows, "capture_s": capture_s, "budgets": list(handle.manager.budgets),
                                       "routed": stats.routed, "original": stats.original,
                                       "reasons": dict(stats.reasons), "hits": stats.manager.hits,
                                       "misses": stats.manager.misses, "routed_eager": stats.manager.routed_eager,
                                       "eager_samples": {str(k): v for k, v in
                                                         handle.manager.costs.eager_samples.items()},
                                       "replay_ms": handle.manager.costs.replay}
            handle.restore()
            del model, handle
            torch.cuda.empty_cache()
        except Exception as exc:  # one model's failure is a result; the others still run
            results["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
