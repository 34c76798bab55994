"""Hostile input to the ``vitcg`` command (issue #13): every failure is one line and an exit code, never a
traceback, a crash or lost files.

``run`` starts the command in a subprocess where the process is the point: input that could crash the
interpreter (YAML and JSON nested thousands of levels deep), files that could block or exhaust memory (FIFOs,
/dev/zero: under a timeout and an address-space limit), a closed, full or abandoned standard output, and what
``--version`` imports. The other tests refuse arguments and files one line at a time, and ``call`` runs them
in this process (tests/support/inprocess.py: the same entry point, exit status, stdout and stderr), which
imports torch and transformers once instead of once per command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vitcg as package
from support.cli import REPO, snapshot, vitcg
from support.inprocess import vitcg_inprocess
from support.specs import copy_spec

HEADER = "generated from specs/ by vitcg — do not edit"
RENDER_SPECS = "tests/specs/render/specs"
OUTPUTS = {p.name.removesuffix(".j2") for p in (REPO / "vitcg" / "templates").glob("*.j2")}


def run(*args: str, env: dict[str, str] | None = None, stdout=subprocess.PIPE,
        shell_prefix: str | None = None) -> subprocess.CompletedProcess:
    """``python -m vitcg ARGS`` in the repository root, with extra environment and a chosen stdout."""
    command = [sys.executable, "-m", "vitcg", *args]
    if shell_prefix is not None:
        command = ["sh", "-c", shell_prefix + ' "$0" "$@"', *command]
    return subprocess.run(command, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def call(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``vitcg ARGS`` in this process, in the repository root, with extra environment."""
    return vitcg_inprocess(*args, env={**os.environ, **(env or {})})


def assert_usage_error(result: subprocess.CompletedProcess, *names: str) -> None:
    """Exit 2, no traceback, one ``error:`` line naming every one of ``names``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


# 1. generate --out never deletes what it did not generate

@pytest.fixture
def crowded(tmp_path: Path) -> Path:
    """An output folder that also holds a git checkout, notes and code: none of it is vitcg's."""
    out = tmp_path / "out"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "notes.txt").write_text("my notes\n")
    (out / "sub").mkdir()
    (out / "sub" / "code.py").write_text("print('mine')\n")
    (out / "sub" / "old.md").write_text(f"<!-- {HEADER} -->\n")  # generated-looking, but in a subfolder
    return out


def test_generate_refuses_a_folder_with_other_files_and_touches_nothing(crowded: Path):
    before = snapshot(crowded)
    result = call("generate", "--specs", RENDER_SPECS, "--out", str(crowded))
    assert_usage_error(result, "--force", f"{crowded.as_posix()}/notes.txt", f"{crowded.as_posix()}/.git/",
                       f"{crowded.as_posix()}/sub/")
    assert snapshot(crowded) == before


def test_generate_force_writes_beside_other_files_and_removes_only_its_own(crowded: Path):
    (crowded / "OLD_LIST.md").write_text(f"<!-- {HEADER} -->\nleft over\n")
    (crowded / "late.md").write_text(f"my file\n<!-- {HEADER} -->\nthe header is not in the first line\n")
    before = snapshot(crowded)
    result = call("generate", "--specs", RENDER_SPECS, "--out", str(crowded), "--force")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"removed {crowded.as_posix()}/OLD_LIST.md (not produced by any template)" in result.stdout
    after = snapshot(crowded)
    kept = {name: data for name, data in before.items() if name != "OLD_LIST.md"}
    assert {name: after.get(name) for name in kept} == kept  # .git/HEAD, notes, sub/ and late.md survive
    assert set(after) == set(kept) | OUTPUTS

    check = call("generate", "--specs", RENDER_SPECS, "--out", str(crowded), "--check")
    assert check.returncode == 0, check.stdout + check.stderr  # other files are not stale
    packaged = [p for p in (REPO / "vitcg" / "specs").glob("*.yaml") if not p.name.endswith(".tests.yaml")]
    specs = len(packaged) + 3  # --specs adds 3 to the packaged ones
    assert check.stdout.endswith(f"is up to date (5 files from {specs} specs)\n")


def test_generate_check_lists_only_generated_files_as_stale(crowded: Path):
    (crowded / "OLD_LIST.md").write_text(f"<!-- {HEADER} -->\n")
    result = call("generate", "--specs", RENDER_SPECS, "--out", str(crowded), "--check")
    assert result.returncode == 1
    assert f"stale: {crowded.as_posix()}/OLD_LIST.md: not produced by any template" in result.stdout
    for name in ("notes.txt", ".git", "sub", "code.py"):
        assert name not in result.stdout


# 2. deep nesting is a diagnostic, not a segfault; size is bounded

def test_deeply_nested_spec_is_a_diagnostic_and_other_files_still_validate(tmp_path: Path):
    (tmp_path / "deep.yaml").write_text("[" * 25_000 + "\n")
    copy_spec("qwen2_vl", tmp_path)
    result = run("validate", "--json", str(tmp_path))
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert {f["file"]: f["valid"] for f in document["files"]} == {
        str(tmp_path / "deep.yaml"): False, str(tmp_path / "qwen2_vl.yaml"): True}
    (problem,) = document["diagnostics"]
    assert problem["file"] == str(tmp_path / "deep.yaml")
    assert (problem["line"], problem["col"]) == (1, 66)  # the 65th bracket opens level 65
    assert "nested deeper than 64 levels" in problem["message"]

    text = run("validate", str(tmp_path))
    assert text.returncode == 1 and f"{tmp_path / 'deep.yaml'}:1:66: $: YAML is nested deeper" in text.stdout


def test_deep_block_nesting_is_a_diagnostic(tmp_path: Path):
    (tmp_path / "dashes.yaml").write_text("a:\n  " + "- " * 25_000 + "x\n")
    result = run("validate", str(tmp_path / "dashes.yaml"))
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert f"{tmp_path / 'dashes.yaml'}:2:" in result.stdout and "nested deeper than 64" in result.stdout


def test_oversized_spec_names_its_size_and_the_bound(tmp_path: Path):
    (tmp_path / "big.yaml").write_text("a: " + "x" * (2 << 20) + "\n")
    result = call("validate", str(tmp_path / "big.yaml"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{tmp_path / 'big.yaml'}:0:0: $: file is {(2 << 20) + 4} bytes" in result.stdout
    assert "1048576 bytes" in result.stdout


# 3. writes: atomic, and a failure is one line with exit 2

def test_schema_output_failures_are_one_line(tmp_path: Path):
    assert_usage_error(call("schema", "-o", str(tmp_path / "missing" / "schema.json")), "missing/schema.json",
                       "no such folder")
    assert_usage_error(call("schema", "-o", str(tmp_path)), str(tmp_path), "it is a folder")
    if Path("/dev/full").exists():
        assert_usage_error(call("schema", "-o", "/dev/full"), "/dev/full", "No space left on device")
    assert call("schema", "-o", os.devnull).returncode == 0  # a device is written directly, not replaced


def _within(seconds: int, *args: str) -> subprocess.CompletedProcess:
    """``python -m vitcg ARGS``, killed after ``seconds``: a command that blocks fails its test instead of hanging."""
    try:
        return subprocess.run([sys.executable, "-m", "vitcg", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"vitcg {' '.join(args)} still ran after {seconds} s")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_an_output_fifo_that_nobody_reads_is_refused_without_hanging(tmp_path: Path):
    """issue 37, item 9: ``schema -o FIFO`` and ``new T -o FIFO --force`` blocked forever with no reader."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    for args in (("schema", "-o", str(fifo)), ("schema", "--output", str(link)),
                 ("new", "qwen2_vl", "-o", str(fifo), "--force")):
        written = args[-2] if args[-1] == "--force" else args[-1]
        # a hang never ends; 90 s only bounds a slow start (`new` imports transformers and drafts first: 30 s
        # and more on a loaded 2-core machine)
        assert_usage_error(_within(90, *args), f"cannot write {written}", "a FIFO that no process reads")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "out.fifo"] and link.is_symlink()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_an_output_fifo_with_a_reader_gets_the_output(tmp_path: Path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        time.sleep(0.5)  # cat has the FIFO open for reading
        assert _within(90, "schema", "-o", str(fifo)).returncode == 0
        assert json.loads(reader.communicate(timeout=20)[0])["title"]
    finally:
        reader.kill()


def test_schema_output_replaces_the_file_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "schema.json"
    path.write_text("old\n")
    path.chmod(0o640)
    result = call("schema", "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(path.read_text())["$schema"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)  # the file keeps its mode
    assert [p.name for p in tmp_path.iterdir()] == ["schema.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_schema_output_into_a_read_only_folder(tmp_path: Path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert_usage_error(call("schema", "-o", str(folder / "schema.json")), "locked/schema.json", "ermission")
    finally:
        folder.chmod(0o755)


def test_new_output_under_a_file_is_one_line(tmp_path: Path):
    (tmp_path / "file").write_text("x\n")
    assert_usage_error(call("new", "qwen2_vl", "-o", str(tmp_path / "file" / "draft.yaml")), str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "x\n"


def test_generate_output_that_is_a_folder_is_one_line(tmp_path: Path):
    out = tmp_path / "out"
    (out / "index.json").mkdir(parents=True)
    assert_usage_error(call("generate", "--specs", RENDER_SPECS, "--out", str(out)), "index.json", "it is a folder")
    (tmp_path / "plain").write_text("x\n")
    assert_usage_error(call("generate", "--specs", RENDER_SPECS, "--out", str(tmp_path / "plain")), "plain", "is a file")


def test_bench_json_into_a_missing_folder_fails_before_running(tmp_path: Path):
    result = call("bench", "qwen2_vl", "--device", "cpu", "--size", "tiny", "--json",
                 str(tmp_path / "missing" / "bench.json"))
    assert_usage_error(result, "missing/bench.json", "no such folder")
    assert result.stdout == ""  # no spec was benchmarked
    assert_usage_error(call("bench", "qwen2_vl", "--device", "cpu", "--json", str(tmp_path)), "it is a folder")


# 4. bench options

def test_bench_from_json_missing_or_malformed(tmp_path: Path):
    plot = str(tmp_path / "plot.png")
    missing = tmp_path / "nowhere.json"
    assert_usage_error(call("bench", "--from-json", str(missing), "--plot", plot), str(missing), "cannot read")
    for name, text, reason in (("broken.json", "{", "not valid JSON"), ("list.json", "[1, 2]", "not a results file"),
                               ("nospecs.json", '{"date": "x"}', "not a results file"),
                               ("binary.json", None, "not valid JSON")):
        path = tmp_path / name
        if text is None:
            path.write_bytes(b"\xff\xfe\x00")
        else:
            path.write_text(text)
        assert_usage_error(call("bench", "--from-json", str(path), "--plot", plot), str(path), reason)
    assert not (tmp_path / "plot.png").exists()


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", ""])
def test_bench_unknown_device_is_a_usage_error(device: str):
    assert_usage_error(call("bench", "qwen2_vl", "--device", device, "--size", "tiny"), "--device", repr(device))


def test_check_unknown_device_is_a_usage_error():
    assert_usage_error(call("check", "qwen2_vl", "--device", "cuda:x"), "--device", "'cuda:x'")


# 5. a corrupt bindings cache is a cache miss

def _binding_keys(spec: Path) -> list[str]:
    """The cache keys ``vitcg validate`` looks up for ``spec``, recorded without importing transformers."""
    from vitcg.lang import Bindings, SpecSource

    class Recorder(Bindings):
        def __init__(self):
            super().__init__(use_cache=False)
            self.keys: list[str] = []

        def _lookup(self, key, compute):
            self.keys.append(key)
            kind = key.split(":", 1)[0]
            bases = ["torch.nn.modules.module.Module", "transformers.configuration_utils.PreTrainedConfig"]
            signature = {"ok": True, "required": [], "accepted": [], "var_keyword": True}
            return {"class": {"ok": True, "bases": bases}, "method": {"ok": True},
                    "signature": signature}.get(kind, {"ok": True, "snapshot": {}})

    recorder = Recorder()
    SpecSource.of_files([spec], bindings=recorder)
    return list(dict.fromkeys(recorder.keys))


def test_corrupt_bindings_cache_entries_are_recomputed(tmp_path: Path):
    spec = REPO / "vitcg" / "specs" / "qwen2_vl.yaml"
    keys = _binding_keys(spec)
    assert {k.split(":", 1)[0] for k in keys} == {"class", "method", "signature", "config"}
    bad = {"class": [{"ok": True}, {"ok": True, "bases": 7}], "method": [{"ok": "yes"}],
           "signature": [{"ok": True}, {"ok": True, "required": "grid_thw", "accepted": [], "var_keyword": 1}],
           "config": [{"ok": True, "snapshot": []}, {"ok": False}, {"ok": True}]}
    entries = {}
    for number, key in enumerate(keys):
        choices = bad[key.split(":", 1)[0]]
        entries[key] = choices[number % len(choices)]
    from vitcg.lang.bindings import transformers_version

    cache = tmp_path / f"bindings-transformers-{transformers_version()}.json"
    cache.write_text(json.dumps(entries))
    result = call("validate", str(spec), env={"VITCG_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "all valid" in result.stdout
    rewritten = json.loads(cache.read_text())
    assert all(rewritten[k] != entries[k] for k in keys)  # every malformed answer was replaced
    assert all(isinstance(rewritten[k]["bases"], list) for k in keys if k.startswith("class:"))


# 6. a closed stdout

def test_closed_stdout_is_one_line_not_a_traceback():
    result = run("validate", "vitcg/specs/qwen2_vl.yaml", stdout=None, shell_prefix="exec >&-; exec")
    assert_usage_error(result, "standard output is closed")


def test_reader_gone_is_quiet():
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails with EPIPE
    try:
        for args in (("schema",), ("--version",), ("compile-config", "--modality", "image")):
            result = run(*args, stdout=write)
            assert result.returncode == 1, (args, result.stderr)
            assert result.stderr == "", (args, result.stderr)
    finally:
        os.close(write)


# 7. --version

def test_version_prints_the_package_version_without_torch():
    result = vitcg("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"vitcg {package.__version__}\n"
    code = ("import sys\nfrom vitcg.cli import main\nsys.argv = ['vitcg', '--version']\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n")
    probe = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert probe.stdout.splitlines()[-1] == "0 False", probe.stdout + probe.stderr


# 8. compile-config: bounded integers, never Infinity or NaN

@pytest.mark.parametrize("args, named", [
    (["--budgets", f"1024,{2**63}"], str(2**63)),
    (["--budgets", str(2**31)], str(2**31)),
    (["--max-items", str(2**64)], str(2**64)),
    (["--modality", "video", "--max-frames", str(2**40)], str(2**40)),
    (["--base", '{"encoder_cudagraph_token_budgets": [99999999999999999999999]}'], "99999999999999999999999"),
    (["--base", '{"x": 1e999}'], "1e999"),
    (["--base", '{"x": NaN}'], "NaN"),
    (["--base", '{"x": -Infinity}'], "-Infinity"),
])
def test_compile_config_refuses_huge_and_non_finite_values(args: list[str], named: str):
    if "--modality" not in args:
        args = ["--modality", "image", *args]
    result = call("compile-config", *args)
    assert_usage_error(result, named)
    assert result.stdout == ""


def test_compile_config_accepts_the_largest_budget():
    result = call("compile-config", "--modality", "image", "--budgets", str(2**31 - 1))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["encoder_cudagraph_token_budgets"] == [2**31 - 1]
    assert "Infinity" not in result.stdout and "NaN" not in result.stdout


# 9. specs: non-finite numbers never reach registry/

def test_generate_refuses_a_spec_with_an_infinite_runner_kwarg(tmp_path: Path):
    specs = tmp_path / "specs"
    shutil.copytree(REPO / RENDER_SPECS, specs)
    spec = specs / "windowed_vl.yaml"
    spec.write_text(spec.read_text().replace("limit_mm_per_prompt: {image: 2, video: 1}", "limit_mm_per_prompt: .inf"))
    result = call("generate", "--specs", str(specs), "--out", str(tmp_path / "out"))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert f"{spec}:91:40: $.tests.runner_kwargs.limit_mm_per_prompt: '.inf' is infinite" in result.stderr
    assert not (tmp_path / "out").exists()


# 10. issue 27, item 5: plan's inputs, bounded and refused by name; full devices and long names in one line

def _qwen_costs(tmp_path: Path, **changes) -> Path:
    document = json.loads((REPO / "benchmarks" / "results-costs-2026-11-22-h100.json").read_text())
    entry = next(s for s in document["specs"] if s["spec"] == "qwen2_vl")
    for key, value in changes.items():
        if key == "replay":
            entry["replay_ms"].update(value)
        else:
            entry[key] = value
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(document))  # Python writes NaN and Infinity as bare words
    return path


@pytest.mark.parametrize("changes, named", [
    ({"replay": {"64": float("nan")}}, ['["replay_ms"]["64"]', "expected a finite number of ms", "got nan"]),
    ({"replay": {"64": float("inf")}}, ['["replay_ms"]["64"]', "got inf"]),
    ({"replay": {"64": 1e308}}, ['["replay_ms"]["64"]', "at most 10000000", "got 1e+308"]),
    ({"replay": {"64": -1.0}}, ['["replay_ms"]["64"]', "above 0", "got -1.0"]),
    ({"budgets": [0, 64]}, ['["budgets"][0]', "expected an integer from 1 to 2147483647", "got 0"]),
    ({"replay": {str(10**30): 5.0}}, [f'["replay_ms"]["{10**30}"]', "expected an integer", f"got '{10**30}'"]),
])
def test_plan_refuses_costs_out_of_range_by_key(tmp_path: Path, changes: dict, named: list[str]):
    result = call("plan", "qwen2_vl", "--costs", str(_qwen_costs(tmp_path, **changes)))
    assert_usage_error(result, f"--costs {tmp_path / 'costs.json'}: specs[", *named)
    assert result.stdout == ""


def _bounded(*args: str) -> subprocess.CompletedProcess:
    """``run`` under a 2 GiB address-space limit and a 60 s timeout: reading /dev/zero whole once grew to 22 GB,
    and a FIFO without a writer blocked forever."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([sys.executable, "-m", "vitcg", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, preexec_fn=limit)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs POSIX FIFOs")
def test_plan_refuses_files_that_are_not_regular_without_reading_them(tmp_path: Path):
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO"), (str(tmp_path), "a folder")):
        assert_usage_error(_bounded("plan", "qwen2_vl", "--requests", path), f"--requests {path}",
                           f"expected a regular file, got {kind}")
    assert_usage_error(_bounded("plan", "qwen2_vl", "--costs", str(fifo)), f"--costs {fifo}", "a FIFO")
    assert_usage_error(_bounded("bench", "--from-json", str(fifo), "--plot", str(tmp_path / "p.png")), "a FIFO")


def test_plan_refuses_json_nested_100k_deep(tmp_path: Path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for option in ("--requests", "--costs"):
        assert_usage_error(run("plan", "qwen2_vl", option, str(deep)), f"{option} {deep}",
                           "JSON nested deeper than 64 levels")


def _bindings_cache(folder: Path) -> Path:
    from vitcg.lang.bindings import transformers_version

    return folder / f"bindings-transformers-{transformers_version()}.json"


@pytest.mark.parametrize("kind", ["deep", "fifo"])
def test_validate_ignores_an_unreadable_bindings_cache_with_a_warning(tmp_path: Path, kind: str):
    cache = _bindings_cache(tmp_path)
    if kind == "deep":
        cache.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    elif hasattr(os, "mkfifo"):
        os.mkfifo(cache)
    else:
        pytest.skip("needs POSIX FIFOs")
    result = subprocess.run([sys.executable, "-m", "vitcg", "validate", "vitcg/specs/qwen2_vl.yaml"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "VITCG_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0 and result.stdout == "1 spec file checked: all valid\n", result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"ignoring the bindings cache {cache}" in result.stderr and result.stderr.count("UserWarning") == 1
    if kind == "deep":
        assert cache.is_file() and json.loads(cache.read_text())  # replaced by a good one
    else:  # not a file vitcg wrote (issue 37): left alone
        assert "left alone" in result.stderr and not cache.is_file() and cache.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("args", [("validate", "vitcg/specs/qwen2_vl.yaml"), ("validate", "--json",
                                  "vitcg/specs/qwen2_vl.yaml"), ("schema",), ("compile-config", "--modality", "image")])
def test_a_full_standard_output_is_one_line(args: tuple[str, ...]):
    with open("/dev/full", "w") as full:
        result = run(*args, stdout=full)
    assert_usage_error(result, "cannot write standard output: No space left on device")


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path: Path):
    name = "a" * 300
    assert_usage_error(call("new", "qwen2_vl", "-o", str(tmp_path / f"{name}.yaml")), name, "File name too long")
    assert_usage_error(call("new", "qwen2_vl", "-o", str(tmp_path / name / "x.yaml")), name, "File name too long")
    assert_usage_error(call("schema", "-o", str(tmp_path / f"{name}.json")), name, "File name too long")
    assert list(tmp_path.iterdir()) == []
