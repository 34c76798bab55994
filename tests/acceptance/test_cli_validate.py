"""``vitcg validate`` and ``vitcg schema`` driven like a user would: exit codes, output. One test per command
runs the real console entry point in a subprocess; the others call the same entry point in this process."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest

from support.cli import REPO, vitcg
from support.inprocess import vitcg_inprocess
from support.specs import spec_text
from vitcg.lang import resolve_file

INVALID = REPO / "tests" / "specs" / "invalid"


def test_validate_default_folder_is_all_valid():
    """Without PATH: the packaged specs."""
    run = vitcg("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    count = len([p for p in (REPO / "vitcg" / "specs").glob("*.yaml") if not p.name.endswith(".tests.yaml")])
    # specs needing a newer transformers than the installed one are noted, never errors
    assert run.stdout.strip().splitlines()[-1].startswith(f"{count} spec files checked: all valid")


@pytest.fixture(scope="module")
def invalid_run() -> subprocess.CompletedProcess:
    return vitcg_inprocess("validate", str(INVALID))


def test_validate_invalid_folder_reports_every_file(invalid_run):
    run = invalid_run
    assert run.returncode == 1
    assert "Traceback" not in run.stdout + run.stderr
    cases = sorted(INVALID.glob("*.yaml"))
    expected_errors = sum(len(p.with_suffix(".expected").read_text().splitlines()) for p in cases)
    summary = run.stdout.strip().splitlines()[-1]
    assert summary == f"{len(cases)} spec files checked: 0 valid, {len(cases)} invalid ({expected_errors} errors)"
    for path in cases:
        assert f"{path.relative_to(REPO)}:" in run.stdout or f"{path}:" in run.stdout


@pytest.mark.parametrize("case", sorted(p.stem for p in INVALID.glob("*.yaml")))
def test_each_invalid_case_is_one_line_with_location(case, invalid_run):
    path = INVALID / f"{case}.yaml"
    lines = [line for line in invalid_run.stdout.splitlines() if line.startswith(f"{path}:")]
    want = path.with_suffix(".expected").read_text().splitlines()
    assert len(lines) == len(want)
    for line, expected in zip(lines, want):
        number, _, fragment = expected.partition(": ")
        assert line.startswith(f"{path}:{number}:"), line
        assert fragment in line


def test_single_file_exit_status():
    run = vitcg_inprocess("validate", str(INVALID / "bad_enum_style.yaml"))
    assert run.returncode == 1
    assert run.stdout.splitlines()[0].startswith(f"{INVALID / 'bad_enum_style.yaml'}:23:10: $.attention.style: ")
    assert run.stdout.splitlines()[1] == "    hint: did you mean 'packed'?"


def test_json_output_is_machine_readable():
    run = vitcg_inprocess("validate", "--json", str(INVALID / "formula_unknown_name.yaml"))
    assert run.returncode == 1
    document = json.loads(run.stdout)
    assert document["ok"] is False
    [diag] = document["diagnostics"]
    assert diag["line"] == 35 and diag["path"] == "$.items.output_tokens"
    assert diag["hint"] == "did you mean 'spatial_merge_size'?"
    assert set(diag) == {"file", "line", "col", "path", "message", "hint", "code", "via"} and diag["via"] is None


def test_missing_path_is_a_usage_error():
    run = vitcg_inprocess("validate", "does/not/exist")
    assert run.returncode == 2
    assert "no such file or folder: does/not/exist" in run.stderr
    assert "Traceback" not in run.stderr


def test_folder_without_specs_is_a_usage_error(tmp_path):
    run = vitcg_inprocess("validate", str(tmp_path))
    assert run.returncode == 2
    assert "no spec files" in run.stderr


def test_unknown_option_is_a_usage_error():
    assert vitcg_inprocess("validate", "--frobnicate").returncode == 2


def test_duplicate_names_across_files(tmp_path):
    text = spec_text("qwen2_vl")
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text)
    run = vitcg_inprocess("validate", str(tmp_path))
    assert run.returncode == 1
    assert f"{tmp_path / 'b.yaml'}:1:7: $.name: spec name 'qwen2_vl' is already used by {tmp_path / 'a.yaml'}:1" in run.stdout


def test_schema_command_prints_the_shipped_schema_and_specs_satisfy_it(tmp_path):
    run = vitcg("schema")
    assert run.returncode == 0
    schema = json.loads(run.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == json.loads((REPO / "vitcg" / "lang" / "schema.json").read_text())
    for path in (REPO / "vitcg" / "specs").glob("*.yaml"):
        if path.name.endswith(".tests.yaml"):
            continue
        loaded, problems = resolve_file(path)  # the schema describes a resolved spec (its harness and defaults in)
        assert not problems and "extends" not in loaded.data
        jsonschema.validate(loaded.data, schema)
    out = tmp_path / "schema.json"
    assert vitcg_inprocess("schema", "--output", str(out)).returncode == 0
    assert json.loads(out.read_text()) == schema


def test_help_lists_commands():
    run = vitcg_inprocess("--help")
    assert run.returncode == 0
    for command in ("validate", "schema"):
        assert command in run.stdout


# issue 37: a linked file is never printed; --resolved keeps validate's exit status and prints one YAML document
def test_a_harness_linked_outside_the_folder_is_never_printed(tmp_path):
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key: sekrit123\n")
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "x.yaml").write_text("name: x\nextends: qwen2_vl\n")
    (folder / "x.tests.yaml").symlink_to(secret)
    for args in (("validate",), ("validate", "--resolved"), ("validate", "--resolved", "--json")):
        run = vitcg_inprocess(*args, str(folder / "x.yaml"))
        assert run.returncode == 1, (args, run.stdout, run.stderr)
        assert "sekrit123" not in run.stdout + run.stderr and "aws_secret" not in run.stdout + run.stderr
        assert f"{folder / 'x.tests.yaml'}" in run.stdout and "outside its folder" in run.stdout


def test_validate_resolved_of_an_invalid_spec_exits_1_and_stays_one_yaml_document(tmp_path):
    import yaml
    path = tmp_path / "bogus.yaml"
    path.write_text("name: bogus\nfoo: bar\n")
    for extra in ((), ("--json",)):
        run = vitcg_inprocess("validate", "--resolved", *extra, str(path))
        assert run.returncode == 1, (extra, run.stdout)
    run = vitcg_inprocess("validate", "--resolved", str(path))
    assert f"{path}:2:1: $.foo: unknown key 'foo'" in run.stdout
    assert all(line.startswith("#") or not line.startswith(" ") for line in run.stdout.splitlines())
    assert "# " + "    hint: " in run.stdout  # the hint is a comment too
    documents = list(yaml.safe_load_all(run.stdout))
    assert len(documents) == 1 and documents[0]["name"] == "bogus"  # the flattened spec, diagnostics above it
    document = json.loads(vitcg_inprocess("validate", "--resolved", "--json", str(path)).stdout)[str(path)]
    assert any(d["message"] == "unknown key 'foo'" for d in document["diagnostics"]) and document["resolved"]["foo"] == "bar"


def test_validate_resolved_of_a_spec_that_does_not_resolve_keeps_hints_as_comments(tmp_path):
    import yaml
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nextends: qwen2_vll\n")
    run = vitcg_inprocess("validate", "--resolved", str(path))
    assert run.returncode == 1 and "hint: did you mean 'qwen2_vl'?" in run.stdout
    assert [d for d in yaml.safe_load_all(run.stdout) if d is not None] == []
