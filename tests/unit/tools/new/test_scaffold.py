"""``vitcg new``'s drafting pieces: names, the schema reference, and the checks before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.specs import skip_unavailable
from vitcg.errors import UsageError, VitcgError
from vitcg.tools.new import scaffold


@pytest.mark.parametrize("model_type, name", [("qwen2_vl", "qwen2_vl"), ("kosmos-2.5", "kosmos_2_5"),
                                              ("data2vec-vision", "data2vec_vision"), ("2x", "m_2x")])
def test_spec_name_is_a_valid_spec_name(model_type, name):
    assert scaffold.spec_name(model_type) == name


def test_schema_reference_is_relative_inside_the_project_and_absolute_outside(tmp_path, monkeypatch):
    repo = Path(scaffold.__file__).resolve().parents[3]
    assert scaffold.schema_reference(repo / "vitcg" / "specs" / "x.yaml") == "../lang/schema.json"
    assert scaffold.schema_reference(repo / "x.yaml") == "vitcg/lang/schema.json"
    outside = scaffold.schema_reference(tmp_path / "x.yaml")
    assert Path(outside).is_absolute() and Path(outside).is_file()
    # stdout: as for the default output, a file in the working folder
    monkeypatch.chdir(repo)
    assert scaffold.schema_reference(None) == "vitcg/lang/schema.json"
    monkeypatch.chdir(tmp_path)
    assert scaffold.schema_reference(None) == outside


def test_a_draft_that_does_not_validate_is_never_returned(monkeypatch):
    """The last guard: a rendering bug for some model type is an error naming it, not a broken file."""
    real = scaffold.render

    def broken(d, path=None, schema=None, family=True):
        lines = real(d, path, schema, family=family)
        lines.lines = [line.replace("  patch_size: config.patch_size", "  patch_size: config.no_such_field")
                       for line in lines.lines]
        return lines

    monkeypatch.setattr(scaffold, "render", broken)
    with pytest.raises(VitcgError, match=r"the draft of 'glm_ocr' does not validate, so nothing was written"
                                         r"(.|\n)*no_such_field") as info:
        scaffold.checked_draft("glm_ocr")
    assert not isinstance(info.value, UsageError)  # exit 1: a bug to report, not a misuse


def test_model_code_that_fails_is_an_error_naming_the_model_type(monkeypatch):
    def fails(model_type):
        raise KeyError("vision_config")

    monkeypatch.setattr(scaffold, "draft", fails)
    with pytest.raises(VitcgError, match=r"cannot draft 'glm_ocr': KeyError: 'vision_config'; write the spec by hand"):
        scaffold.checked_draft("glm_ocr")


def test_no_vision_sub_config_and_no_pixels_is_refused():
    with pytest.raises(UsageError, match=r"'bert' is not a vision model vitcg can draft: BertConfig has no "
                                         r"vision_config or video_config, and its model class BertModel takes "
                                         r"'input_ids' first"):
        scaffold.draft("bert")


def _draft_text(model_type: str) -> str:
    return scaffold.render(scaffold.draft(model_type), family=False).text()  # the whole draft, not an extends


@pytest.mark.parametrize("model_type, line", [
    ("qwen3_vl", "deepstack_visual_indexes: [1]"), ("qwen2_5_vl", "fullatt_block_indexes: [1]"),
    ("got_ocr2", "global_attn_indexes: [1]"), ("mllama", "intermediate_layers_indices: [1]")])
def test_a_drafted_tiny_config_runs_its_indexed_layers(model_type, line):
    """Issue 26: the drafted tiny config had 2 layers and the default deepstack indexes [8, 16, 24], so no deepstack
    merger ran (validate now refuses that). The draft names the tiny tower's last layer instead."""
    skip_unavailable(model_type)  # got_ocr2's classes came with 5.18
    tiny = next(t for t in _draft_text(model_type).splitlines() if t.startswith("  tiny_config: "))
    assert line in tiny


def test_a_modality_the_vlm_has_and_the_draft_lacks_is_a_marked_omission():
    omits = next(t for t in _draft_text("llava_onevision").splitlines() if "omits:" in t)
    assert omits.startswith('    omits: {video: "') and "# GUESS: read the VLM's get_video_features" in omits


@pytest.mark.parametrize("model_type", ["aria", "paligemma", "mistral3"])
def test_vlm_attribute_is_read_off_the_vlms_own_modeling_code(model_type):
    """Their towers come from another model's modeling code (SigLIP, Pixtral, Idefics3); the VLM's own __init__
    sets vision_tower. Before, the draft wrote the placeholder model.visual."""
    assert scaffold.draft(model_type).vlm_attribute == "model.vision_tower"


def test_the_draft_writes_only_what_differs_from_the_style_defaults():
    from vitcg.lang import Bindings, spec_from_text

    text = _draft_text("qwen2_5_vl")
    lines = text.splitlines()
    assert "items:" not in lines and "budget:" not in lines
    assert lines[lines.index(next(t for t in lines if t.startswith("buffers:"))) + 1:][:2] == [
        "  - {name: pixel_values, arg: hidden_states}", ""]
    spec = spec_from_text(text, "qwen2_5_vl.yaml", Bindings())
    assert [(b.name, b.provider) for b in spec.buffers] == [
        ("pixel_values", "pixels"), ("grid_thw", "grid"), ("cu_seqlens", "cu_seqlens"), ("max_seqlen", "max_seqlen"),
        ("position_ids", "position_ids"), ("window_index", "window_index"),
        ("cu_window_seqlens", "cu_window_seqlens"), ("max_window_seqlen", "max_window_seqlen")]
    assert next(b for b in spec.buffers if b.name == "pixel_values").arg == "hidden_states"


def test_a_default_buffer_the_encoder_does_not_take_is_removed():
    entries = [({"name": "pixel_values", "provider": "pixels", "shape": ["budget", 3], "padding": "zeros"},
                {"shape": "rows"})]
    defaults = [{"name": "pixel_values", "provider": "pixels", "shape": ["budget", 3], "padding": "zeros"},
                {"name": "position_ids", "provider": "position_ids", "shape": ["budget", 2], "padding": "zeros"}]
    assert scaffold._buffer_changes(entries, defaults) == [({"name": "position_ids", "remove": True}, {})]
    assert scaffold._kept_guesses(entries, []) == ["pixel_values.shape: rows"]


def test_a_family_member_is_drafted_as_extends_of_the_spec_of_its_tower(tmp_path):
    """VipLLaVA's tower is the CLIP tower of the packaged clip spec: the draft extends it and states only its own
    names and the guesses where clip's values may not fit; the resolved draft is clip's spec under the new name."""
    from vitcg.lang import SpecSource

    text, guesses = scaffold.checked_draft("vipllava", tmp_path / "vipllava.yaml")
    assert "\nextends: clip   # GUESS: " in text and "\nencoder:" not in text and "\nbuffers:" not in text
    assert guesses == text.count("# GUESS: ")
    (tmp_path / "vipllava.yaml").write_text(text)
    result = SpecSource.of_files([tmp_path / "vipllava.yaml"])
    assert result.ok, [d.format() for d in result.diagnostics]
    spec = result.specs[0]
    clip = SpecSource.of_files([Path(scaffold.__file__).parents[2] / "specs" / "clip.yaml"]).specs[0]
    assert spec.name == "vipllava" and spec.architectures == ("VipLlavaForConditionalGeneration",)
    assert spec.encoder == clip.encoder and spec.buffers == clip.buffers and spec.tests.tiny_config == clip.tests.tiny_config


def test_a_tower_no_spec_has_is_drafted_whole():
    assert scaffold.family_parent(scaffold.draft("qwen3_vl_moe")) is None  # the one spec of its tower is its own


def test_an_extends_draft_that_does_not_validate_falls_back_to_the_whole_draft(monkeypatch):
    """A family spec that does not fit the model type's VLM is no reason to write nothing: the whole draft is
    written instead (it validates on its own)."""
    real = scaffold._render_extends

    def unfit(d, ranked, path, schema):
        lines = real(d, ranked, path, schema)
        lines.lines.append("geometry: {patch_size: config.no_such_field}")
        return lines

    monkeypatch.setattr(scaffold, "_render_extends", unfit)
    text, _ = scaffold.checked_draft("vipllava")
    assert "\nextends:" not in text and "\nencoder:" in text


def _model_type(name: str) -> str:
    """``name`` where this transformers has the model type, else the test is skipped."""
    from transformers import CONFIG_MAPPING

    if name not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no model type {name!r} here")
    return name


def test_the_parent_is_the_models_family_and_the_other_candidates_are_named():
    """Mistral Large 4's modular code derives from mistral3, which the pixtral spec lists: it extends pixtral, not
    lighton_ocr (first by name, same tower, another family), and the draft says why lighton_ocr was not taken."""
    d = scaffold.draft(_model_type("mistral_large4"))
    assert "mistral3" in scaffold.lineage(d)
    ranked = scaffold.parent_candidates(d)
    assert [c.spec.name for c in ranked] == ["pixtral", "lighton_ocr"] and ranked[0].rank > ranked[1].rank
    text, _ = scaffold.checked_draft("mistral_large4")
    assert "\nextends: pixtral   # GUESS: " in text and "derives from mistral3" in text
    assert "#   lighton_ocr: the same tower in another family" in text
    # its language model is not Mistral 3's: the harness gets a tiny one of its own (vipllava's is llava's: none)
    assert "\n      text_config: {hidden_size: " in text and "which is not pixtral's" in text
    assert "\n    config: {}   # GUESS: " in scaffold.checked_draft("vipllava")[0]


def test_a_towers_own_model_type_is_proven_through_its_parents_vlm():
    """clip_vision_model is CLIP's tower alone: CLIPVisionModel has no get_image_features, so the end-to-end stage
    failed on the draft's own architecture ("set tests.vlm.architecture ..."), and the vlm_attribute read off the
    tower's own code (model.vision_model) overrode clip's (LLaVA's model.vision_tower). The draft names the parent's
    VLM for the stage and keeps the parent's vlm_attribute (49 such model types in transformers 5.24)."""
    text, _ = scaffold.checked_draft(_model_type("clip_vision_model"))
    assert "\nextends: clip   # GUESS: " in text
    assert "\n    architecture: LlavaForConditionalGeneration   # GUESS: the VLM whose feature call proves" in text
    assert "vlm_attribute" not in text
    # a VLM's own draft keeps its architecture and names no other (mistral_large4 extends pixtral)
    assert "    architecture: " not in scaffold.checked_draft(_model_type("mistral_large4"))[0]
    # a parent whose harness already names the VLM passes it on (qwen2_5_omni's: the thinker)
    assert "    architecture: " not in scaffold.checked_draft(_model_type("qwen2_5_omni_vision_encoder"))[0]


def test_a_spec_whose_notes_exclude_the_model_is_never_its_parent():
    """idefics3's notes say Aria reuses its tower but is not covered: Aria's draft is whole, naming why."""
    d = scaffold.draft(_model_type("aria"))
    assert scaffold.family_parent(d) is None
    text, _ = scaffold.checked_draft("aria")
    assert "\nextends:" not in text and "\nencoder:" in text
    assert "#   idefics3: its notes exclude it: \"Aria reuses this tower class" in text


def test_a_covered_model_type_and_a_known_gap_are_said(tmp_path):
    """radio_packed lists nemotron_h_omni: the draft names it and extends it (not radio, the tower's own spec);
    perception_lm is a gap of the spec language: its draft says so, with the reason. `vitcg new` repeats both."""
    from typer.testing import CliRunner

    from vitcg.cli import app

    d = scaffold.draft(_model_type("nemotron_h_omni"))
    assert scaffold.family_parent(d).name == "radio_packed"
    assert any(n.startswith("radio_packed (") and "already covers nemotron_h_omni" in n for n in scaffold.notices(d))
    timm = scaffold.draft(_model_type("perception_lm"))
    assert any(n.startswith("perception_lm is a known gap of the spec language: timm towers")
               for n in scaffold.notices(timm))
    out = tmp_path / "perception_lm.yaml"
    result = CliRunner().invoke(app, ["new", "perception_lm", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "NOTE: perception_lm is a known gap" in result.output
    assert "# NOTE: perception_lm is a known gap" in out.read_text()


def test_checkpoints_come_from_the_configs_documentation():
    from transformers import Qwen2VLConfig

    assert scaffold.checkpoints_named(Qwen2VLConfig) == ["Qwen/Qwen2-VL-7B-Instruct"]
    text, _ = scaffold.checked_draft("qwen2_vl")
    assert "\ncheckpoints: [Qwen/Qwen2-VL-7B-Instruct]   # GUESS: named by Qwen2VLConfig's documentation" in text

    class Undocumented:
        """No link here."""

    assert scaffold.checkpoints_named(Undocumented) == []


@pytest.mark.parametrize("model_type, extra", [
    ("mllama", ("aspect_ratio_ids", "aspect_ratio_mask")), ("siglip2", ("pixel_attention_mask", "spatial_shapes")),
    ("gemma4", ("pixel_position_ids",)), ("video_llama_3", ("merge_sizes",))])
def test_a_draft_passes_every_required_argument_of_the_tower(model_type, extra):
    """Issue 37, item 6: validate refuses a spec whose calls leave out a required forward argument, so a draft passes
    each one beyond pixels and grid: an extra input role of its name, an aligned buffer and tests.inputs, each
    a marked guess."""
    from vitcg.lang import Bindings, spec_from_text
    from vitcg.lang.bindings import method_signature

    skip_unavailable(model_type)
    text = _draft_text(model_type)
    spec = spec_from_text(text, f"<draft of {model_type}>", Bindings())
    required = method_signature(spec.encoder.class_path, spec.encoder.method)["required"]
    assert set(extra) <= set(required) <= set(spec.encoder.args) & {b.arg for b in spec.buffers}
    args = next(line for line in text.splitlines() if line.startswith("  args: "))
    assert all(f"{name}: {name}" in args for name in extra) and f"{', '.join(extra)}: required by forward" in args
    assert all(m.inputs[name] for m in spec.modalities for name in extra)
    inputs = next(line for line in text.splitlines() if line.startswith("  inputs: "))
    assert "# GUESS: how vitcg check builds each required argument" in inputs


@pytest.mark.parametrize("model_type", ["muse_glimmer", "muse_spark"])
def test_the_muse_towers_are_said_to_be_covered(model_type):
    """Issue 39, item 5: the Muse specs cover their model types, so `vitcg new` names them instead of drafting a
    tower whose pixel-shuffle index, swapped interpolation axes and alternating boundary sets were gaps."""
    d = scaffold.draft(_model_type(model_type))
    assert any(n.startswith(f"{model_type} (") and f"already covers {model_type}" in n for n in scaffold.notices(d))


def test_drafting_prints_no_warning_of_transformers_and_logs_it(capfd, caplog):
    """``vitcg new cohere_compass`` printed "[transformers] `standardize_rope_params` was called but no RoPE
    parameters were found." twice on stderr: config defaults built while drafting warn. They go to vitcg's log
    (debug) instead, so the command prints only what it wrote."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="vitcg.tools.new.scaffold"):
        scaffold.checked_draft(_model_type("cohere_compass"))
    assert capfd.readouterr().err == ""
    logged = [r.getMessage() for r in caplog.records if r.name == "vitcg.tools.new.scaffold"]
    assert any("while drafting cohere_compass: [transformers] `standardize_rope_params`" in m for m in logged), logged


@pytest.mark.parametrize("model_type, tokens", [
    ("vit", "(image_size // patch_size) ** 2 + 1   # GUESS: the patch rows and 1 token before them (embeddings.cls_token)"),
    ("dinov2_with_registers", "(image_size // patch_size) ** 2 + 5   # GUESS: the patch rows and 5 tokens before them "
                              "(embeddings.cls_token, embeddings.register_tokens)"),
    ("pixio", "(image_size // patch_size) ** 2 + 8   # GUESS: the patch rows and 8 tokens"),
    ("siglip_vision_model", "(image_size // patch_size) ** 2   # GUESS: tokens one tile yields"),
    ("aimv2_vision_model", "(image_size // patch_size) ** 2   # GUESS: tokens one tile yields")])
def test_a_tiles_draft_counts_the_tokens_its_tower_puts_before_the_patches(model_type, tokens):
    """21 raw tiles drafts of the 2026-11-29 sweep failed on "manager output (16, 64) but eager output (17, 64)":
    tokens_per_tile left out the CLS token. The draft counts what the tower returns for one tile beyond its patch
    grid where a token parameter holds it; SigLIP has none, AIMv2's cls_token is its pooling head's (its rows are
    the patches alone)."""
    line = next(t for t in _draft_text(_model_type(model_type)).splitlines() if t.startswith("  tokens_per_tile: "))
    assert line.startswith(f"  tokens_per_tile: {tokens}"), line


def test_the_counted_tokens_are_the_rows_the_tower_returns(tmp_path):
    """The drafted count holds against the eager tower: vit's spec stage passes (it failed on the CLS row)."""
    from vitcg.lang import SpecSource
    from vitcg.tools.check.cases import check_spec

    text, _ = scaffold.checked_draft("vit", tmp_path / "vit.yaml")
    (tmp_path / "vit.yaml").write_text(text)
    spec = SpecSource.of_files([tmp_path / "vit.yaml"]).specs[0]
    report = check_spec(spec, device="cpu", size="tiny")
    first = next(c for c in report.cases if c.stage == "spec")
    assert first.error is None and "graph 17" in first.route, (first.route, first.error)


@pytest.mark.parametrize("order", [("llava_next", "clip"), ("clip", "llava_next")])
def test_two_drafts_in_one_folder_form_no_extends_cycle(tmp_path, order):
    """The drafts of llava_next (extends clip) and clip (extends llava_next) written into one folder found each other
    beside them: llava_next -> clip -> llava_next, both invalid. The second draft is validated as the file it will
    be, sees the cycle and is drafted whole."""
    from vitcg.lang import SpecSource

    for model_type in order:
        path = tmp_path / f"{model_type}.yaml"
        text, _ = scaffold.checked_draft(model_type, path)
        path.write_text(text)
    result = SpecSource.of_files([tmp_path / f"{t}.yaml" for t in order])
    assert result.ok, [d.format() for d in result.diagnostics]
    assert "\nextends: " in (tmp_path / f"{order[0]}.yaml").read_text()
    assert "\nextends: " not in (tmp_path / f"{order[1]}.yaml").read_text()


def _tiny_line(model_type: str) -> str:
    return next(t for t in _draft_text(_model_type(model_type)).splitlines() if t.startswith("  tiny_config: "))


@pytest.mark.parametrize("model_type, shrunk", [
    ("inkling_mm_model", "num_hidden_layers: 2"),  # stored as n_layers (attribute_map): was 24 layers, 21 GiB
    ("florence_vision", "depths: [1, 1, 1, 1]"),  # DaViT's layers per stage: was [1, 1, 9, 1]
    ("videoprism", "num_spatial_layers: 2, num_temporal_layers: 2"),
    ("zoedepth", "backbone_config: {model_type: beit, "),  # the tower's depth lies in its backbone's config
    ("zoedepth", "num_hidden_layers: 4, hidden_size: 64, num_attention_heads: 4, intermediate_size: 96, "
                 "out_indices: [1, 2, 3, 4]}"),  # its neck takes 4 feature maps: one tiny layer each
    ("sam3", "global_attn_indexes: [1]}")])  # and the backbone's indexed layers follow its tiny depth
def test_a_tiny_config_shrinks_a_depth_of_another_name_or_in_a_sub_config(model_type, shrunk):
    """Eight raw drafts of the 2026-11-29 sweep timed out and one ran out of memory: their tiny config shrank no
    depth (another field name, per-stage lists, a backbone_config), so vitcg check ran the full-size tower."""
    from vitcg.lang.bindings import release, transformers_version

    if model_type == "inkling_mm_model" and release(transformers_version()) < release("5.24"):
        pytest.skip("before transformers 5.24 no model class is built from inkling_mm_model's vision config, so "
                    "vitcg new refuses it (the sweep ran on 5.24)")
    line = _tiny_line(model_type)
    assert shrunk in line, line


def test_a_stage_count_is_not_shrunk_as_a_depth():
    """Swin's num_layers (num_hidden_layers) counts its four stages: its tiny config keeps one layer a stage."""
    line = _tiny_line("swin")
    assert "depths: [1, 1, 1, 1]" in line and "num_hidden_layers" not in line and "num_layers" not in line, line


def test_a_tiny_sub_config_reaches_the_built_config(tmp_path):
    """The nested tiny_config builds the tower it says: ZoeDepth's BEiT backbone with 4 layers of width 64 returning
    each, and every other field as ZoeDepth's default backbone has it."""
    from vitcg.lang import SpecSource
    from vitcg.tools.encoders import build_config

    text, _ = scaffold.checked_draft("zoedepth", tmp_path / "zoedepth.yaml")
    (tmp_path / "zoedepth.yaml").write_text(text)
    spec = SpecSource.of_files([tmp_path / "zoedepth.yaml"]).specs[0]
    tiny, default = build_config(spec).backbone_config.to_dict(), spec_default_backbone("zoedepth")
    assert (tiny["num_hidden_layers"], tiny["hidden_size"], tiny["out_indices"]) == (4, 64, [1, 2, 3, 4])
    assert default["out_indices"] == [6, 12, 18, 24]
    differ = {k for k in default if tiny.get(k) != default[k]}
    assert differ == {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "stage_names",
                      "out_features", "out_indices"}, differ


def spec_default_backbone(model_type: str) -> dict:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]().backbone_config.to_dict()


@pytest.mark.parametrize("model_type", ["swin", "cvt", "depth_anything", "sam2_vision_model", "zoedepth"])
def test_a_drafted_tiny_config_builds_a_tower_that_runs(tmp_path, model_type):
    """Shrinking parts apart broke what joins them: Swin's embed_dim 64 fits no head count of 3, CvT indexes a
    per-stage list past a stage of one layer, DepthAnything's neck takes its backbone's default width, SAM 2's Hiera
    keeps per-stage widths beside hidden_size. The draft keeps the smallest tiny config whose tower runs one tile on
    the meta device, as the default tower does."""
    from vitcg.lang import SpecSource
    from vitcg.lang.catalogue import STYLES
    from vitcg.tools.encoders import build_config
    from vitcg.tools.new.tokens import meta_call

    path = tmp_path / f"{scaffold.spec_name(model_type)}.yaml"
    text, _ = scaffold.checked_draft(_model_type(model_type), path)
    path.write_text(text)
    config = build_config(SpecSource.of_files([path]).specs[0])  # the tiny config, as vitcg check builds it
    d = scaffold.draft(model_type)
    geometry = scaffold._geometry(d, STYLES[d.style])
    size = config.image_size if isinstance(getattr(config, "image_size", None), int) else geometry["image_size"][2]
    assert meta_call(d.encoder, config, size, geometry["in_channels"][2]) is not None, text.split("tiny_config: ")[1][:200]
