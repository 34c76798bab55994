"""``vitcg.accelerate`` on a tiny Qwen2-VL built from its config (random weights), on the CPU static path.

Per item the accelerated ``get_image_features`` must match the original (float32, 1e-5 relative), greedy
``generate`` must give the same tokens, and the model must come back unchanged after ``restore``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitcg
from vitcg.errors import SpecError, UsageError
from vitcg.tools.workloads import relative_error

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

VISION = {"depth": 2, "embed_dim": 64, "hidden_size": 48, "num_heads": 4}
TEXT = {"hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 2]}}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.Qwen2VLConfig(vision_config=VISION, text_config=TEXT)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def images(*sizes, seed=0):
    rng = np.random.default_rng(seed)
    processor = transformers.Qwen2VLImageProcessorPil()
    return processor(images=[rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in sizes], return_tensors="pt")


def prompt(model, grid):
    """input_ids as the processor would expand them: text, then per image its start token, one placeholder per
    merged patch, its end token."""
    config = model.config
    ids = [1, 2, 3]
    for t, h, w in grid.tolist():
        ids += [config.vision_start_token_id] + [config.image_token_id] * (t * h * w // 4) + [config.vision_end_token_id]
    ids += [4, 5]
    return torch.tensor([ids])


def features(model, inputs):
    with torch.no_grad():
        return model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output


def test_features_and_generate_match_the_original_per_item(model):
    inputs = images((56, 84), (112, 56), (84, 84))
    want = features(model, inputs)
    ids = prompt(model, inputs["image_grid_thw"])
    with torch.no_grad():
        tokens = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                **inputs)
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        features(model, inputs)  # the first call runs the original and learns the output layout
        fresh = images((56, 84), (112, 56), (84, 84))
        got = features(model, fresh)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want, strict=True):
            assert relative_error(g, w) <= 1e-5
        with torch.no_grad():
            accelerated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                         do_sample=False, **inputs)
        assert torch.equal(accelerated, tokens)
        assert handle.stats.routed >= 2 and handle.stats.manager.hits >= 6
    assert "forward" not in vars(model.model.visual) and not hasattr(model, "_vitcg")


def test_a_failure_on_the_graph_path_falls_back_to_the_original_with_one_warning(model, monkeypatch):
    inputs = images((56, 84), (112, 56))
    want = features(model, inputs)
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        features(model, inputs)  # learns the output layout

        def fault(*args, **kwargs):
            raise RuntimeError("a kernel the device cannot hold")

        monkeypatch.setattr(handle.manager, "execute", fault)
        with pytest.warns(RuntimeWarning, match="the graph path failed: RuntimeError: a kernel the device cannot "
                                                "hold; the encoder runs without graphs from now on") as caught:
            for _ in range(2):
                got = features(model, inputs)
                assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        assert len([w for w in caught if "graph path failed" in str(w.message)]) == 1
        assert handle.stats.reasons[handle._broken] == 2


def test_autograd_and_uncaptured_arguments_run_the_original(model):
    inputs = images((56, 56))
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])  # grad on
        assert any("autograd" in reason for reason in handle.stats.reasons)
        with torch.no_grad():
            model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"], output_attentions=True)
        assert any("output_attentions" in reason for reason in handle.stats.reasons)
        assert handle.stats.routed == 0


def test_inputs_the_spec_rejects_run_the_original(model):
    """An InputError of the spec's input checks is no answer: the original call runs and gives its own."""
    inputs = images((56, 56))
    grid = torch.tensor([[1, 4, 3]])  # w not a multiple of spatial_merge_size: the original fails in its own way
    pixels = inputs["pixel_values"][:12]
    with torch.no_grad(), vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        with pytest.raises(RuntimeError) as caught:
            model.model.get_image_features(pixels, grid)
        assert not isinstance(caught.value, vitcg.errors.VitcgError)
        [reason] = handle.stats.reasons
        assert "inputs the spec does not describe" in reason and "'image_grid_thw'" in reason and "w is not" in reason
        assert handle.stats.routed == 0


def test_calling_twice_restores_the_first_routing(model):
    first = vitcg.accelerate(model, max_num_batched_tokens=1024)
    second = vitcg.accelerate(model, max_num_batched_tokens=1024)
    assert not first.active and second.active and model._vitcg is second
    second.restore()
    second.restore()  # idempotent
    assert "forward" not in vars(model.model.visual)


def test_paused_runs_the_original_calls_then_the_graphs_again(model):
    inputs = images((56, 84))
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        features(model, inputs)  # learns the layout
        with handle.paused():
            assert "forward" not in vars(model.model.visual) and not hasattr(model, "_vitcg")
            features(model, inputs)
        routed = handle.stats.routed
        features(model, inputs)
        assert handle.stats.routed == routed + 1 and model._vitcg is handle
        assert handle.stats.calls == routed + 1 + 1  # the paused call never reached the router
    assert not hasattr(model, "_vitcg")


def test_a_dtype_change_captures_again(model):
    inputs = images((56, 84), (84, 56))
    want = features(model, inputs)
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        features(model, inputs)
        model.double()
        try:
            double = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
            features(model, double)
            got = features(model, double)
        finally:
            model.float()
        assert handle.stats.recaptures == 1 and handle.manager.dtype == torch.float64
        for g, w in zip(got, want, strict=True):
            assert relative_error(g.float(), w) <= 1e-5


def test_a_broken_user_spec_blocks_only_itself(model, tmp_path, monkeypatch):
    """A clip.yaml in $VITCG_SPECS_DIR that does not parse (DESIGN.md section 10): Qwen2-VL is accelerated by name
    and by its model type; only asking for clip reports the broken file, at its line."""
    broken = tmp_path / "clip.yaml"
    broken.write_text("name: clip\nmodel_types: [\n")
    monkeypatch.setenv("VITCG_SPECS_DIR", str(tmp_path))
    inputs = images((56, 84))
    want = features(model, inputs)
    for spec in ("qwen2_vl", None):
        with vitcg.accelerate(model, spec=spec, max_num_batched_tokens=1024) as handle:
            assert handle.spec.name == "qwen2_vl"
            features(model, inputs)  # learns the layout
            (got,) = features(model, inputs)
            assert handle.stats.routed == 1 and relative_error(got, want[0]) <= 1e-5
    with pytest.raises(SpecError, match=rf"{broken}:\d+:\d+: "):
        vitcg.accelerate(model, spec="clip")
    assert not hasattr(model, "_vitcg")


def test_unknown_model_lists_supported_types():
    text_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=32))
    with pytest.raises(UsageError, match=r"no spec for LlamaForCausalLM \(model_type 'llama'\); supported model "
                                         r"types: .*qwen2_vl"):
        vitcg.accelerate(text_model)


@pytest.mark.gpu
def test_cuda_graphs_match_the_original_per_item(no_tf32):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(0)
    config = transformers.Qwen2VLConfig(vision_config=VISION, text_config=TEXT)
    with torch.device("cuda"):
        cuda_model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    inputs = {k: v.cuda() for k, v in images((56, 84), (112, 56), (84, 84)).items()}
    want = features(cuda_model, inputs)
    with vitcg.accelerate(cuda_model, max_num_batched_tokens=1024) as handle:
        features(cuda_model, inputs)
        got = features(cuda_model, inputs)
        assert handle.manager.use_cuda_graphs and handle.stats.routed == 1 and handle.stats.manager.replays >= 1
        assert handle.compile_forward and handle.adapter._blocks  # compiled blocks by default on CUDA
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1e-5


def test_compiled_blocks_are_the_cuda_default_and_a_failed_compile_falls_back(model, monkeypatch):
    """On the CPU's static path nothing is compiled unasked. Where blocks compile by default (CUDA, stood in for
    here) and their compilation fails, the graphs are captured without them, with a warning that says why; asked
    for explicitly, the failure is the caller's error."""
    from vitcg.errors import SpecRuntimeError
    from vitcg.runtime import accelerate as module

    inputs = images((56, 84), (84, 84))
    want = features(model, inputs)
    with vitcg.accelerate(model, max_num_batched_tokens=1024) as handle:
        assert not handle.compile_forward and not handle.adapter._blocks

    def broken(manager, spec):
        raise RuntimeError("inductor: no kernel for this block")
    monkeypatch.setattr(module, "compiles_by_default", lambda encoder: True)
    monkeypatch.setattr(module, "capture_compiled", broken)
    with pytest.warns(RuntimeWarning, match="inductor: no kernel for this block; capturing without compiled blocks"):
        handle = vitcg.accelerate(model, max_num_batched_tokens=1024)
    with handle:
        assert not handle.compile_forward and not handle.adapter._blocks
        features(model, inputs)  # the first call learns the output layout
        got = features(model, inputs)
        assert handle.stats.routed == 1 and handle.stats.manager.replays == 1
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1e-5
    with pytest.raises(SpecRuntimeError, match="inductor: no kernel for this block"):
        vitcg.accelerate(model, max_num_batched_tokens=1024, compile=True)


def test_routed_calls_keep_their_signatures(model):
    import inspect

    before = inspect.signature(model.model.visual.forward), inspect.signature(model.model.get_image_features)
    with vitcg.accelerate(model, max_num_batched_tokens=1024):
        after = inspect.signature(model.model.visual.forward), inspect.signature(model.model.get_image_features)
    assert after == before


def test_internvl_generate_routes_its_get_image_features():
    """InternVL's captured call is the base model's get_image_features, which generate() calls by keyword."""
    from vitcg.lang import SpecSource
    from vitcg.lang.model import thaw

    spec = SpecSource(["vitcg/specs/internvl.yaml"], bindings=False)["internvl"]
    overrides = thaw(spec.tests.tiny_config)
    overrides["text_config"]["vocab_size"] = 151680  # the image token id must be a valid embedding
    torch.manual_seed(0)
    vlm = transformers.InternVLForConditionalGeneration(transformers.InternVLConfig(**overrides)).eval()
    processor = transformers.GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, crop_to_patches=True)
    rng = np.random.default_rng(0)
    inputs = dict(processor(images=[rng.integers(0, 255, (60, 130, 3), dtype=np.uint8)], return_tensors="pt"))
    tiles = int(inputs.pop("num_patches").sum())
    per_tile = (56 // vlm.config.vision_config.patch_size[0]) ** 2 // 4
    ids = torch.tensor([[1, 2] + [vlm.config.image_token_id] * (tiles * per_tile) + [3]])
    with torch.no_grad():
        want = vlm.generate(input_ids=ids, max_new_tokens=8, do_sample=False, **inputs)
        with vitcg.accelerate(vlm, max_num_batched_tokens=1024) as handle:
            vlm.generate(input_ids=ids, max_new_tokens=8, do_sample=False, **inputs)  # learns the layout
            got = vlm.generate(input_ids=ids, max_new_tokens=8, do_sample=False, **inputs)
            assert handle.stats.routed == 1 and handle.stats.manager.hits == tiles
    assert torch.equal(got, want)


def _tiny_vlm(spec_path: str, name: str, keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")):
    """The tiny VLM of a spec's tests.vlm, its processor's ``keys`` for three images, and the spec."""
    from vitcg.lang import SpecSource
    from vitcg.tools.check.vlm import build_processor, build_vlm

    spec = SpecSource([spec_path], bindings=False)[name]
    if spec.unavailable:
        pytest.skip(f"{name}: {spec.unavailable}")
    vlm = build_vlm(spec)
    rng = np.random.default_rng(0)
    made = build_processor(spec, vlm)(images=[rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
                                              for h, w in ((56, 84), (112, 56), (84, 84))], return_tensors="pt")
    return vlm, {k: made[k] for k in keys}, spec


def test_paddle_tower_takes_rows_on_dim_1():
    """specs/paddleocr_vl.yaml captures the tower, which the VLM calls with (1, rows, C, p, p) pixels: the router
    strips the leading 1 (the graphs hold rows first); a leading dim that is not 1 runs the original, saying why."""
    vlm, inputs, spec = _tiny_vlm("vitcg/specs/paddleocr_vl.yaml", "paddleocr_vl")
    with torch.no_grad():
        want = vlm.model.get_image_features(**inputs).pooler_output
        with vitcg.accelerate(vlm, spec=spec, max_num_batched_tokens=1024) as handle:
            vlm.model.get_image_features(**inputs)  # learns the layout
            got = vlm.model.get_image_features(**inputs).pooler_output
            assert handle.stats.routed == 1 and handle.stats.manager.hits == 3
            two = inputs["pixel_values"][:24].reshape(2, 12, 3, 14, 14)
            with pytest.raises(RuntimeError):  # the original tower fails on a batch of 2 in its own way
                vlm.model.visual(pixel_values=two, grid_thw=torch.tensor([[1, 2, 6]]))
            assert any("rows on dim 1" in reason for reason in handle.stats.reasons)
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1e-5


def test_per_item_output_layout_rebuilds_a_tuple_per_image():
    """A spec whose captured call returns pooler_output as one tensor per image (``pooler_output[*]``) gets such a
    tuple back from the router, each image's rows in its own tensor."""
    vlm, inputs, spec = _tiny_vlm("tests/specs/valid/per_item_outputs.yaml", "per_item_outputs")
    with torch.no_grad():
        want = vlm.model.get_image_features(**inputs).pooler_output
        with vitcg.accelerate(vlm, spec=spec, max_num_batched_tokens=1024) as handle:
            vlm.model.get_image_features(**inputs)  # learns the layout
            got = vlm.model.get_image_features(**inputs).pooler_output
            assert handle.stats.routed == 1
    assert isinstance(got, tuple) and [g.shape for g in got] == [w.shape for w in want]
    assert len({g.shape for g in got}) > 1  # three images of different sizes
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1e-5


def test_minicpm_tower_takes_navit_pixels_in_one_downsample_mode():
    """specs/minicpmv4_6.yaml captures the tower in the model's default 16x mode, fed the VLM's NaViT pixels
    (1, C, p, rows * p) as rows; a 4x call (use_vit_merger=False) runs the original, saying why."""
    vlm, inputs, spec = _tiny_vlm("vitcg/specs/minicpmv4_6.yaml", "minicpmv4_6", ("pixel_values", "target_sizes"))
    assert inputs["pixel_values"].shape[:3] == (1, 3, 14)
    with torch.no_grad():
        want = vlm.model.get_image_features(**inputs).pooler_output
        want_4x = vlm.model.get_image_features(**inputs, downsample_mode="4x").pooler_output
        with vitcg.accelerate(vlm, spec=spec, max_num_batched_tokens=1024) as handle:
            vlm.model.get_image_features(**inputs)  # learns the layout
            got = vlm.model.get_image_features(**inputs).pooler_output
            assert handle.stats.routed == 1 and handle.stats.manager.hits == 3
            got_4x = vlm.model.get_image_features(**inputs, downsample_mode="4x").pooler_output
            assert any("use_vit_merger=False differs" in reason for reason in handle.stats.reasons)
    for g, w in zip([*got, *got_4x], [*want, *want_4x], strict=True):
        assert relative_error(g, w) <= 1e-5
