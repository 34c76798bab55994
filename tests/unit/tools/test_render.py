"""Rendering vitcg/templates/ into registry/: golden files, strictness, escaping, staleness, and the plain-data context.

Golden outputs of every template for the fixed specs in ``tests/specs/render/specs/`` live in
``tests/specs/render/golden/NAME.golden``. After an intended change, refresh them with
``VITCG_UPDATE_GOLDEN=1 python -m pytest tests/unit/tools/test_render.py`` and review the diff.
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO
from support.specs import load_test_configs
from vitcg.errors import RenderError, SpecError, UsageError
from vitcg.lang import SpecSource
from vitcg.tools.render import (
    HEADER,
    build_context,
    find_stale,
    foreign_files,
    generate,
    markdown_cell,
    python_literal,
    render_templates,
    template_names,
)

TEMPLATES = REPO / "vitcg" / "templates"
CASES = REPO / "tests" / "specs" / "render"
GOLDEN = CASES / "golden"
UPDATE = os.environ.get("VITCG_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def case_specs():
    return SpecSource([CASES / "specs"], bindings=False)


@pytest.fixture(scope="module")
def rendered(case_specs):
    return render_templates(build_context(case_specs, [CASES / "specs"]), TEMPLATES)


@pytest.mark.parametrize("name", [n.removesuffix(".j2") for n in template_names(TEMPLATES)])
def test_golden(rendered, name):
    golden = GOLDEN / f"{name}.golden"
    if UPDATE:
        golden.write_text(rendered[name], encoding="utf-8")
    assert golden.is_file(), f"no golden file {golden.relative_to(REPO)}; refresh with VITCG_UPDATE_GOLDEN=1"
    assert rendered[name] == golden.read_text(encoding="utf-8"), (
        f"{name} differs from {golden.relative_to(REPO)}; if intended, refresh with VITCG_UPDATE_GOLDEN=1")


def test_every_golden_has_a_template(rendered):
    assert sorted(p.name.removesuffix(".golden") for p in GOLDEN.glob("*.golden")) == sorted(rendered)


def test_every_output_has_header_and_trailing_newline(rendered):
    for name, text in rendered.items():
        assert HEADER in "\n".join(text.splitlines()[:3]), name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
    assert json.loads(rendered["index.json"])["_generated"] == HEADER


def test_output_does_not_depend_on_spec_order(case_specs, rendered):
    shuffled = list(case_specs)
    random.Random(0).shuffle(shuffled)
    shuffled.reverse()
    assert render_templates(build_context(shuffled, [CASES / "specs"]), TEMPLATES) == rendered


def test_context_is_plain_data(case_specs):
    def walk(value):
        if isinstance(value, dict):
            assert all(isinstance(k, str) for k in value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        else:
            assert value is None or isinstance(value, (str, int, float, bool)), type(value)

    context = build_context(case_specs, [CASES / "specs"])
    walk(context)
    json.dumps(context)
    spec = context["specs_by_name"]["tiles_image"]
    assert spec["supports"] == {"image": True, "video": False, "mixed": False}
    assert spec["file"] == "specs/tiles_image.yaml"
    assert spec["test_config"]["modalities"] == ["image"] and spec["test_config"]["video_prompt"] is None


def test_prompts_are_built_from_chat_template(case_specs):
    config = build_context(case_specs)["specs_by_name"]["packed_vl"]["test_config"]
    assert config["image_prompt"] == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                                      "What is in this image?<|im_end|>\n<|im_start|>assistant\n")
    assert "<|video_pad|><|vision_end|>Describe this video in one sentence.<|im_end|>" in config["video_prompt"]


def test_supported_models_table_has_one_row_per_spec(case_specs, rendered):
    lines = rendered["SUPPORTED_MODELS.md"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Architecture |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert len(rows) == len(case_specs)
    for row in rows:
        # Cells split on unescaped pipes only: an escaped one stays inside its cell.
        cells = row.replace("\\|", "").strip("|").split("|")
        assert len(cells) == 9, row
    assert "Qwen2.5-VL \\| windowed" in rows[2]
    assert [r.split("|")[1].strip() for r in rows] == [
        "`Qwen2VLForConditionalGeneration`", "`InternVLForConditionalGeneration`",
        "`Qwen2_5_VLForConditionalGeneration`"]


def test_supported_models_renders_as_tables(case_specs, rendered):
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(rendered["SUPPORTED_MODELS.md"])
    models = html.split("<table>")[1]
    assert models.count("<tr>") == 1 + len(case_specs)
    assert models.count("<td>") == 9 * len(case_specs)
    assert "<td>Qwen2.5-VL | windowed</td>" in models
    assert html.count("<h3>") == len(case_specs)


@pytest.mark.parametrize("value, cell", [
    ("plain", "plain"),
    ("a | b", "a \\| b"),
    ("line one\nline two", "line one<br>line two"),
    ("crlf\r\nand\rcr", "crlf<br>and<br>cr"),
    ("  padded |\n", "padded \\|"),
    (42, "42"),
])
def test_markdown_cell_escapes_pipes_and_newlines(value, cell):
    assert markdown_cell(value) == cell


@pytest.mark.parametrize("value", [
    "it's \"quoted\"", "back\\slash", 'triple """ quotes', "new\nline\ttab", "ünïcode — ✅︎", "{braces}",
    None, True, 0, -3, 1.5, [], {}, ["a", 1, None], {"k": {"nested": [True, "x"]}},
])
def test_python_literal_round_trips(value):
    assert ast.literal_eval(python_literal(value)) == value


def test_python_literal_refuses_other_objects():
    with pytest.raises(RenderError, match="set"):
        python_literal({1, 2})


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), {"k": [float("inf")]}])
def test_python_literal_refuses_non_finite_floats(value):
    # repr() gives `inf`, which compiles and then raises NameError when registry/test_configs.py is imported.
    with pytest.raises(RenderError, match="inf|nan"):
        python_literal(value)


@pytest.mark.parametrize("name, text", [
    ("x.py.j2", "# {{ header }}\nX = {{ specs[0].test_config.vllm_runner_kwargs | py }}\n"),
    ("x.json.j2", '{{ {"_generated": header, "x": specs[0].test_config.vllm_runner_kwargs} | json }}\n'),
    ("x.json.j2", '{\n  "_generated": "{{ header }}",\n  "x": Infinity\n}\n'),
])
def test_non_finite_floats_never_reach_the_output(case_specs, tmp_path, name, text):
    # Validation refuses them in specs; a spec object built around it must still not render Infinity.
    context = build_context(case_specs)
    context["specs"][0]["test_config"]["vllm_runner_kwargs"] = {"limit_mm_per_prompt": float("inf")}
    with pytest.raises(RenderError, match=f"{name}(:[0-9]+)?: .*(inf|Infinity)"):
        render_templates(context, _templates(tmp_path, **{name: text}))


def _templates(tmp_path: Path, **templates: str) -> Path:
    folder = tmp_path / "templates"
    folder.mkdir()
    for name, text in templates.items():
        (folder / name).write_text(text)
    return folder


def test_missing_field_names_template_line_and_spec(case_specs, tmp_path):
    folder = _templates(tmp_path, **{"bad.md.j2": "<!-- {{ header }} -->\n{% for spec in specs %}\n"
                                                  "{{ spec.tests.max_model_len }} {{ spec.tests.no_such_key }}\n"
                                                  "{% endfor %}\n"})
    with pytest.raises(RenderError) as info:
        render_templates(build_context(case_specs, [CASES / "specs"]), folder)
    message = str(info.value)
    assert message.startswith(f"{(folder / 'bad.md.j2').as_posix()}:3: ")
    assert "spec 'packed_vl' (specs/packed_vl.yaml) has no field 'tests.no_such_key'" in message


def test_missing_top_level_variable_is_an_error(case_specs, tmp_path):
    folder = _templates(tmp_path, **{"bad.md.j2": "<!-- {{ header }} -->\n{{ no_such_name }}\n"})
    with pytest.raises(RenderError, match=r"bad\.md\.j2:2: 'no_such_name' is undefined"):
        render_templates(build_context(case_specs), folder)


def test_missing_field_in_a_condition_is_an_error(case_specs, tmp_path):
    folder = _templates(tmp_path, **{"bad.md.j2": "<!-- {{ header }} -->\n"
                                                  "{% for s in specs if s.docs.missing %}x{% endfor %}\n"})
    with pytest.raises(RenderError, match="has no field 'docs.missing'"):
        render_templates(build_context(case_specs), folder)


@pytest.mark.parametrize("text, match", [
    ("no header here\n", "header"),
    ("# {{ header }}\ndef broken(:\n", "not valid py"),
    ("<!-- {{ header }} -->\n{{ ''.__class__.__mro__[1].__subclasses__() }}\n", "bad.py.j2|bad.md.j2"),
    ("<!-- {{ header }} -->\n{% for %}\n", r"bad\.(md|py)\.j2:2"),
])
def test_bad_templates_raise_render_error(case_specs, tmp_path, text, match):
    name = "bad.py.j2" if "def " in text else "bad.md.j2"
    folder = _templates(tmp_path, **{name: text})
    with pytest.raises(RenderError, match=match):
        render_templates(build_context(case_specs), folder)


def test_templates_cannot_change_the_shared_context(case_specs, tmp_path):
    folder = _templates(tmp_path, **{"a.md.j2": "<!-- {{ header }} -->\n{{ specs.pop() }}\n"})
    with pytest.raises(RenderError):
        render_templates(build_context(case_specs), folder)


def test_folder_without_templates_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no templates"):
        template_names(tmp_path)
    with pytest.raises(UsageError, match="no such templates folder"):
        template_names(tmp_path / "missing")


def _copy_cases(tmp_path: Path) -> tuple[Path, Path]:
    specs = tmp_path / "specs"
    specs.mkdir()
    for path in (CASES / "specs").glob("*.yaml"):
        (specs / path.name).write_text(path.read_text())
    return specs, tmp_path / "registry"


def test_generate_writes_then_is_current(tmp_path):
    specs, out = _copy_cases(tmp_path)
    first = generate([specs], TEMPLATES, out)
    assert first.written and {s.reason for s in first.stale} == {"missing"}
    assert sorted(p.name for p in out.iterdir()) == sorted(first.rendered)
    assert out.joinpath("SUPPORTED_MODELS.md").read_text() == (GOLDEN / "SUPPORTED_MODELS.md.golden").read_text()
    again = generate([specs], TEMPLATES, out, check=True)
    assert again.stale == [] and "is up to date (5 files from 3 specs)" in again.text()


def test_find_stale_reports_differing_missing_and_extra_generated_files(tmp_path):
    out = tmp_path / "registry"
    (out / "__pycache__").mkdir(parents=True)
    (out / "__pycache__" / "test_configs.cpython-312.pyc").write_bytes(b"\0")
    (out / "same.md").write_text("same\n")
    (out / "changed.md").write_text("old\n")
    (out / "extra.txt").write_text(f"# {HEADER}\nx\n")
    (out / "notes.txt").write_text(f"mine\n{HEADER}\n")  # the header below the first line does not count
    (out / "sub").mkdir()
    (out / "sub" / "nested.md").write_text(f"# {HEADER}\n")  # generated files lie directly in the folder
    stale = find_stale({"same.md": "same\n", "changed.md": "new\n", "missing.json": "{}\n"}, out)
    assert [(s.path.name, s.reason) for s in stale] == [
        ("changed.md", "differs"), ("extra.txt", "not produced by any template"), ("missing.json", "missing")]
    assert [p.name for p in foreign_files({"changed.md": ""}, out)] == ["notes.txt", "same.md", "sub"]


def test_check_writes_nothing_and_generate_removes_extra_files(tmp_path):
    specs, out = _copy_cases(tmp_path)
    generate([specs], TEMPLATES, out)
    (out / "old.md").write_text(f"<!-- {HEADER} -->\nleft over\n")
    (out / "index.json").write_text("{}\n")
    check = generate([specs], TEMPLATES, out, check=True)
    assert not check.written
    assert [(s.path.name, s.reason) for s in check.stale] == [
        ("index.json", "differs"), ("old.md", "not produced by any template")]
    assert (out / "old.md").exists() and (out / "index.json").read_text() == "{}\n"
    assert "stale: " in check.text() and "run `vitcg generate`" in check.text()
    fixed = generate([specs], TEMPLATES, out)
    assert "removed " in fixed.text() and not (out / "old.md").exists()
    assert generate([specs], TEMPLATES, out, check=True).stale == []


def test_generate_refuses_invalid_specs(tmp_path):
    specs, out = _copy_cases(tmp_path)
    (specs / "broken.yaml").write_text("name: 3\n")
    with pytest.raises(SpecError):
        generate([specs], TEMPLATES, out, check=True)


def test_repository_registry_is_current():
    result = generate(out_dir=REPO / "registry", check=True)  # the defaults: packaged specs and templates
    assert result.stale == [], result.text()


def test_generated_test_configs_are_importable_and_match_specs():
    configs = load_test_configs(REPO / "registry")
    specs = SpecSource([REPO / "vitcg" / "specs"], bindings=False)
    assert list(configs) == specs.names
    for name, config in configs.items():
        spec = specs[name]
        assert config.model == spec.checkpoints[0]
        assert config.modalities == [m for m in ("image", "video") if m in spec.modality_names]
        assert config.max_model_len == spec.tests.max_model_len
        assert config.compilation_config_overrides == {"encoder_cudagraph_token_budgets": list(spec.tests.budgets)}
        assert config.marks == list(spec.tests.marks)


def test_render_does_not_import_torch():
    code = ("import sys; from pathlib import Path; from vitcg.tools.render import generate; "
            "generate(out_dir=Path('registry'), check=True); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]
