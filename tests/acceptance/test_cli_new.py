"""``vitcg new``: a draft spec from a transformers model type that validates, marks its guesses, and checks.
One test runs the real console entry point in a subprocess (a draft written to its stdout); the others call the
same entry point in this process (tests/support/inprocess.py)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from support.cli import REPO, vitcg
from support.inprocess import vitcg_inprocess
from support.specs import packaged

GUESSED = ("display_name", "architectures", "checkpoints", "class", "vlm_attribute", "args", "outputs",
           "tiny_config", "real_config", "style", "prompt_template", "image_placeholder")
"""Keys whose line every draft marks as a guess (segments, output_tokens, buffers, budget.min and others only where
they differ from the style's defaults: else a comment line carries the guess)."""
VISION = ("florence2", "kimi_k25", "minicpmv4_6", "glm_ocr", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "exaone4_5",
          "exaone4_5_vision", "internvl", "llava", "siglip_vision_model", "gemma3", "cohere_compass", "kosmos-2.5",
          "dots3_note", "mobilevit", "depth_pro", "swin")
"""Vision model types of transformers 5.23 that must be drafted (earlier failures among them)."""
NOT_VISION = ("llama", "whisper", "bert", "qwen2_audio", "t5")


def _without_notes(text: str) -> list[str]:
    """A draft's lines but the header's notes (known coverage, gaps, the tower's other specs)."""
    return [line for line in text.splitlines() if not line.startswith(("# NOTE: ", "# Other specs of ", "#   "))]


def _guessed_keys(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^\s*-?\s*([a-z_]+):.*# GUESS: \S", text, re.M)}


@pytest.mark.slow  # the suite's slowest test (2 minutes on 2 cores); CI runs it on both transformers releases
def test_every_model_type_is_drafted_valid_or_refused():
    """Every transformers model type: a draft that validates, with its guesses marked, or a UsageError."""
    from transformers import CONFIG_MAPPING

    from vitcg.errors import SpecError, UsageError
    from vitcg.lang import Bindings, spec_from_text
    from vitcg.tools.new.scaffold import draft, render

    bindings = Bindings()
    drafted, refused, extended = [], [], []
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            d = draft(model_type)
        except UsageError:
            refused.append(model_type)
            continue
        text = render(d, family=False).text()
        spec_from_text(text, f"<draft of {model_type}>", bindings)  # raises SpecError naming every problem
        assert set(GUESSED) <= _guessed_keys(text), (model_type, set(GUESSED) - _guessed_keys(text))
        family = render(d).text()  # an extends draft where a spec has the tower
        if "\nextends: " not in family:  # the same draft, with what vitcg knows of the model type in its header
            assert _without_notes(family) == _without_notes(text), model_type
        else:
            try:
                spec_from_text(family, f"<extends draft of {model_type}>", bindings)
                extended.append(model_type)
            except SpecError:  # vitcg new then writes the whole draft (checked_draft), which validated above
                pass
        drafted.append(model_type)
    bindings.save()
    missing = [m for m in VISION if m in CONFIG_MAPPING and m not in drafted]
    assert not missing, f"vision model types refused: {missing}"
    assert not [m for m in NOT_VISION if m in drafted]
    assert len(drafted) >= 150, len(drafted)
    assert {"llava", "vipllava", "llava_next_video"} <= set(extended), extended  # family members: valid extends


def test_every_guess_is_marked_with_what_to_verify(tmp_path):
    path = tmp_path / "kimi.yaml"
    assert vitcg_inprocess("new", "kimi_k25", "-o", str(path)).returncode == 0
    text = path.read_text()
    marks = {line.split(":", 1)[0].strip(): line.split("# GUESS: ", 1)[1] for line in text.splitlines()
             if "# GUESS: " in line and not line.startswith("#")}
    assert marks["class"].startswith("the encoder boundary")
    assert "Kimi_K25Model" in marks["vlm_attribute"]
    assert "Kimi_K25VisionModel.forward(pixel_values, grid_thw)" in marks["args"]
    assert "get_vision_attention_seqlens" in marks["style"]
    assert "frame" in marks["segments"] and "clip" in marks["segments"]
    # geometry read from a field of another name, or guessed outright, says so
    assert "spatial_merge_size: config.merge_kernel_size[0]   # GUESS: read from config.merge_kernel_size" in text
    assert "in_channels: 3   # GUESS: the config has no such field" in text
    # a guess about a style default the draft leaves out stays, on a comment
    assert "# buffers: position_ids.shape is the packed style's default   # GUESS: 2 (h, w) or 3" in text
    # what is read off the code for sure is not marked
    for line in ("name: kimi_k25", "  config_class: transformers.models.kimi_k25.configuration_kimi_k25."
                 "Kimi_K25VisionConfig", "  patch_size: config.patch_size"):
        assert line in text.splitlines()


def test_drafts_that_failed_to_validate_now_do(tmp_path):
    """florence2 (duplicate patch_size), kimi_k25 (unknown in_channels), kosmos-2.5 (a name with - and .)."""
    for model_type in ("florence2", "kimi_k25", "kosmos-2.5"):
        path = tmp_path / f"{model_type}.yaml"
        run = vitcg_inprocess("new", model_type, "-o", str(path))
        assert run.returncode == 0, run.stderr
        assert "guesses to verify" in run.stdout
        validate = vitcg_inprocess("validate", str(path))
        assert validate.returncode == 0, validate.stdout


def test_draft_is_checked_against_the_real_vlm_from_its_first_run(tmp_path):
    """The draft holds a tests.vlm section (a tiny language model from the VLM's own text config, its rope
    sections scaled; the placeholder fields its config names), so its first check runs the end-to-end stage:
    transformers maps no image processor to glm_ocr, and the failure says which field to set. With that one
    field set, the draft is proven end to end: nothing passes unproven."""
    path = tmp_path / "glm_ocr.yaml"
    run = vitcg_inprocess("new", "glm_ocr", "--output", str(path))
    assert run.returncode == 0, run.stderr
    assert re.search(r"wrote .*glm_ocr.yaml: \d+ guesses to verify", run.stdout)
    text = path.read_text()
    assert "# GUESS: " in text and "TODO" not in text
    assert "class: transformers.models.glm_ocr.modeling_glm_ocr.GlmOcrVisionModel" in text
    assert "style: packed" in text
    assert "mrope_section: [2, 2, 2]" in text
    assert "placeholder: {token: image_token_id, before: [image_start_token_id], after: [image_end_token_id]}" in text
    assert vitcg_inprocess("validate", str(path)).returncode == 0
    check = vitcg_inprocess("check", str(path))
    assert check.returncode == 1 and "FAILED" in check.stdout
    assert "no image processor mapped to glm_ocr: set tests.vlm.processor_class" in check.stdout
    path.write_text(text.replace("\n  vlm:", "\n  vlm:\n    processor_class: Glm46VImageProcessorPil", 1))
    check = vitcg_inprocess("check", str(path))
    assert check.returncode == 0, check.stdout
    # proven, yet a draft: the guesses the check cannot see (names, notes, the placeholder checkpoint) are left
    left = text.count("   # GUESS: ")
    assert f"glm_ocr  proven, with {left} guesses left: 6 cases, and the VLM end to end on 3 items" in check.stdout
    assert check.stdout.splitlines()[-1] == f"1 spec checked: 1 passed (1 proven), {left} guesses left (glm_ocr {left})"
    confirmed = "\n".join(line.split("   # GUESS: ")[0] for line in path.read_text().splitlines())
    path.write_text(confirmed.replace("[org/glm_ocr]", "[zai-org/GLM-OCR]") + "\n")
    check = vitcg_inprocess("check", str(path), "--json")
    assert json.loads(check.stdout)["specs"][0]["guesses"] == []


def test_draft_of_a_tile_encoder_is_valid_but_flags_what_check_disproves(tmp_path):
    path = tmp_path / "chinese_clip.yaml"  # a CLIP-style tower no packaged spec has: drafted whole
    assert vitcg_inprocess("new", "chinese_clip", "--output", str(path)).returncode == 0
    assert "\nextends:" not in path.read_text()
    assert vitcg_inprocess("validate", str(path)).returncode == 0
    assert "  tokens_per_tile: (image_size // patch_size) ** 2 + 1   # GUESS: " in path.read_text()  # its CLS token
    check = vitcg_inprocess("check", str(path))
    assert check.returncode == 1, check.stdout  # the raw draft is not proven: a guess of its end-to-end stage fails
    assert re.search(r"spec  one small image +1  graph 17 .* ok\n", check.stdout), check.stdout
    assert "FAILED: end-to-end stage" in check.stdout


def test_a_family_member_is_drafted_as_extends_and_proven(tmp_path):
    from vitcg.lang.bindings import release, transformers_version

    needed = packaged()["clip"].tests.vlm.transformers  # the draft inherits clip's end-to-end stage
    if needed and release(transformers_version()) < release(needed):
        pytest.skip(f"clip's end-to-end stage needs transformers >= {needed}")
    path = tmp_path / "llava.yaml"  # LLaVA's tower is the packaged clip spec's
    assert vitcg_inprocess("new", "llava", "--output", str(path)).returncode == 0
    assert "\nextends: clip   # GUESS: " in path.read_text()
    check = vitcg_inprocess("check", str(path))
    assert check.returncode == 0, check.stdout
    assert re.search(r"llava  proven, with \d+ guesses left: ", check.stdout), check.stdout


def test_stdout_and_refusals(tmp_path):
    run = vitcg("new", "qwen2_vl", "--output", "-")  # a subprocess: the draft on the process's own stdout
    assert run.returncode == 0 and run.stdout.startswith("# yaml-language-server: $schema=vitcg/lang/schema.json")
    run = vitcg_inprocess("new", "qwen2_vll", "--output", "-")
    assert run.returncode == 2 and "did you mean 'qwen2_vl'?" in run.stderr
    path = tmp_path / "x.yaml"
    path.write_text("keep me")
    run = vitcg_inprocess("new", "qwen2_vl", "--output", str(path))
    assert run.returncode == 2 and "pass --force" in run.stderr
    assert path.read_text() == "keep me"
    assert vitcg_inprocess("new", "qwen2_vl", "--output", str(path), "--force").returncode == 0
    assert "name: qwen2_vl" in path.read_text()


def test_force_replaces_a_symlink_and_never_writes_through_it(tmp_path):
    """``-o LINK --force`` once overwrote the file the link pointed to, outside the folder the user named."""
    precious = tmp_path / "elsewhere.txt"
    precious.write_text("keep me")
    folder = tmp_path / "drafts"
    folder.mkdir()
    link = folder / "qwen.yaml"
    link.symlink_to(precious)
    refused = vitcg_inprocess("new", "qwen2_vl", "-o", str(link))
    assert refused.returncode == 2 and "pass --force" in refused.stderr
    assert vitcg_inprocess("new", "qwen2_vl", "-o", str(link), "--force").returncode == 0
    assert precious.read_text() == "keep me"
    assert not link.is_symlink() and "name: qwen2_vl" in link.read_text()


def test_writes_anywhere_it_is_told(tmp_path):
    """Anywhere, into folders it makes; the default is NAME.yaml in the working folder, NAME the model type in
    snake case; the draft names its own path in the next steps it gives."""
    path = tmp_path / "drafts" / "deep" / "florence.yaml"
    run = vitcg_inprocess("new", "florence2", "--output", str(path))
    assert run.returncode == 0, run.stderr
    text = path.read_text()
    assert f"`vitcg validate {path}` and `vitcg check {path}`" in text
    schema = text.splitlines()[0].split("$schema=", 1)[1]
    assert schema.endswith("vitcg/lang/schema.json") and (path.parent / schema).is_file()
    run = vitcg_inprocess("new", "kosmos-2.5", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "kosmos_2_5.yaml").is_file()
    assert "name: kosmos_2_5" in (tmp_path / "kosmos_2_5.yaml").read_text()
    assert 'model_types: ["kosmos-2.5"]' in (tmp_path / "kosmos_2_5.yaml").read_text()
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside it
    again = vitcg_inprocess("new", "kosmos-2.5", cwd=tmp_path)
    assert again.returncode == 2 and "pass --force" in again.stderr
    folder = vitcg_inprocess("new", "florence2", "-o", str(tmp_path))
    assert folder.returncode == 2 and "it is a folder" in folder.stderr


WALKTHROUGH = [
    "vitcg new cohere_compass -o my_specs/cohere_compass.yaml",
    "vitcg validate my_specs/cohere_compass.yaml",
    "vitcg check my_specs/cohere_compass.yaml",
    "vitcg generate --specs my_specs",
]


def test_readme_walkthrough_works_as_written(tmp_path):
    """The README's "Adding a model" commands, run in a folder holding a copy of registry/ (the editor step
    aside)."""
    import shutil

    readme = (REPO / "README.md").read_text()
    for command in WALKTHROUGH:
        assert command in readme, command
    shutil.copytree(REPO / "registry", tmp_path / "registry", ignore=shutil.ignore_patterns("__pycache__"))
    for command in WALKTHROUGH:
        run = vitcg_inprocess(*command.split()[1:], cwd=tmp_path)
        if command.startswith("vitcg check"):  # the draft is not proven until its guesses hold: it must not pass
            assert run.returncode == 1, f"{command}\n{run.stdout}\n{run.stderr}"
            assert "cohere_compass  FAILED: end-to-end stage:" in run.stdout
            assert "spec  empty batch" in run.stdout and " ok" in run.stdout  # the spec stage ran, and holds
            continue
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
    text = (tmp_path / "registry" / "SUPPORTED_MODELS.md").read_text()
    assert "[`my_specs/cohere_compass.yaml`](../my_specs/cohere_compass.yaml)" in text
    assert "qwen2_vl" in text  # beside the packaged specs' rows


@pytest.mark.parametrize("model_type, named", [
    ("llama", ["'llama' is not a vision model", "LlamaConfig has no vision_config", "LlamaModel takes 'input_ids'"]),
    ("whisper", ["'whisper' is not a vision model", "WhisperModel takes 'input_features'"]),
    ("pp_chart2table", ["'pp_chart2table' has no importable modeling code", "write the spec by hand"]),
    ("qwen2_5_omni", ["no model class", "built from Qwen2_5OmniConfig", "try: qwen2_5_omni_thinker"]),
])
def test_refuses_model_types_it_cannot_draft(tmp_path, model_type, named):
    if importlib.util.find_spec(f"transformers.models.{model_type}") is None:
        pytest.skip(f"this transformers has no {model_type} config")
    path = tmp_path / f"{model_type}.yaml"
    run = vitcg_inprocess("new", model_type, "--output", str(path))
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    for fragment in named:
        assert fragment in lines[0], (fragment, lines[0])
    assert not path.exists()


def test_help_says_what_new_does():
    run = vitcg_inprocess("new", "--help")
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    for fragment in ("# GUESS: what to verify", "vlm_attribute", "--output", "'-' for stdout",
                     "NAME.yaml in the working folder",
                     "--force", "refuses text and audio model types"):
        assert fragment in text, fragment
