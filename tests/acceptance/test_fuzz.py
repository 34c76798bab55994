"""Fuzzing the ``vitcg`` command (issue #13): mutated real specs and random ``compile-config`` arguments.

Whatever the input, the command exits 0, 1 or 2, prints no traceback, names the file (and a line, where the
file has one) in every diagnostic, and changes nothing but its output. Most examples run the CLI in this
process (``vitcg.cli.main``, as the console script does) for speed; a few run it as a subprocess.
Examples are derandomized, so a run is reproducible; ``VITCG_FUZZ_EXAMPLES=5000`` explores further.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import yaml
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitcg import cli

EXAMPLES = int(os.environ.get("VITCG_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=EXAMPLES or 300,
    deadline=None if EXAMPLES else 5000,  # the first example imports torch for the bindings
    database=None,  # write nothing into the checkout (no .hypothesis/)
    derandomize=not EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SOURCES = [REPO / "vitcg" / "specs" / f"{name}.yaml" for name in
           ("qwen2_vl", "qwen2_5_vl", "internvl", "siglip2", "mllama", "hunyuan_vl")]
"""One spec per style and feature (packed, windowed, tiles, graph scope, extra roles, layer-stack scope)."""
SPEC_NAME = "spec.yaml"

# Values a mutation puts where a spec had something else.
WEIRD_STRINGS = ["", " ", "budget * 2", "max_num_batched_tokens * 1000", "2 ** 64", "2 ** 62 * 4", "1 / 0", "1 // 0",
                 "config.x", "config.patch_size", "len(config)", "__import__('os').system('true')", "(" * 300,
                 "min()", "ceil_div(1, 0)", "isqrt(-1)", "x" * 500, "transformers.x.Y", "os.system",
                 "transformers.models.llama.modeling_llama.LlamaModel", "{placeholders}", "\x00", "\udcff", "é" * 3,
                 "- a\n- b", "&a [*a]", "!!python/object:os.system"]
VALUES = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**62, 2**62 + 1, 2**63, -2**64, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WEIRD_STRINGS), st.text(max_size=40),
    st.lists(st.integers(min_value=-9, max_value=2**40), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers(min_value=-9, max_value=99), max_size=3),
)


def _paths(node, prefix=()):
    """Every path into a loaded YAML document, the root included."""
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths(child, prefix + (index,))


def _parent(data, path):
    for part in path[:-1]:
        data = data[part]
    return data


def _nest(value, depth: int, as_list: bool):
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


@st.composite
def data_mutation(draw, text: str) -> str:
    """The spec as data, with one node deleted, retyped, nested, or given a garbage sibling, dumped again."""
    data = yaml.safe_load(text)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent, key = _parent(data, path), path[-1]
        op = draw(st.sampled_from(["delete", "retype", "nest", "garbage", "copy"]))
        if op == "delete":
            del parent[key]
        elif op == "retype":
            parent[key] = draw(VALUES)
        elif op == "nest":
            parent[key] = _nest(parent[key], draw(st.integers(min_value=1, max_value=120)), draw(st.booleans()))
        elif op == "garbage" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(VALUES)
        elif op == "copy":  # another section's value in this place
            parent[key] = copy.deepcopy(_parent(data, draw(st.sampled_from(paths)) + (None,)))
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10**6)
    except (yaml.YAMLError, RecursionError):
        return text


@st.composite
def text_mutation(draw, text: str) -> bytes:
    """The spec's bytes cut short, with lines duplicated, dropped or re-indented, or random bytes spliced in."""
    raw = text.encode()
    lines = text.splitlines(keepends=True)
    op = draw(st.sampled_from(["truncate", "splice", "duplicate", "drop", "indent", "bytes", "huge"]))
    if op == "truncate":
        return raw[: draw(st.integers(min_value=0, max_value=len(raw)))]
    if op == "splice":
        at = draw(st.integers(min_value=0, max_value=len(raw)))
        return raw[:at] + draw(st.binary(max_size=64) | st.text(max_size=64).map(str.encode)) + raw[at:]
    index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
    if op == "duplicate":
        lines.insert(index, lines[index])
    elif op == "drop":
        del lines[index]
    elif op == "indent":
        lines[index] = " " * draw(st.integers(min_value=0, max_value=9)) + lines[index].lstrip(" ")
    elif op == "bytes":
        return draw(st.binary(max_size=300))
    else:  # over the 1 MiB bound, or just under it
        lines.insert(index, "# " + "x" * draw(st.sampled_from([2**20, 2**20 - len(raw) - 8])) + "\n")
    return "".join(lines).encode()


@st.composite
def mutated_spec(draw) -> bytes:
    text = draw(st.sampled_from(SOURCES)).read_text()
    if draw(st.booleans()):
        return draw(data_mutation(text)).encode("utf-8", errors="surrogatepass")
    return draw(text_mutation(text))


def run_in_process(*args: str) -> tuple[int, str, str]:
    """``vitcg ARGS`` through the console entry point, in this process: exit code, stdout, stderr.

    An exception that escapes the entry point (what a user would see as a traceback) fails the test.
    """
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "argv", ["vitcg", *args]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, out.getvalue(), err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_validated(path: Path, code: int, stdout: str, stderr: str, as_json: bool) -> None:
    """Exit 0 or 1 with a report whose every diagnostic names ``path`` (and a line unless it is about the whole
    file), or 2 with one ``error:`` line; never a traceback."""
    assert code in (0, 1, 2), (code, stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    if code == 2:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr
        return
    if as_json:
        report = json.loads(stdout)
        assert report["ok"] == (code == 0)
        diagnostics = [(d["file"], d["line"], d["message"]) for d in report["diagnostics"]]
    else:
        *blocks, summary = stdout.splitlines()
        assert summary.startswith("1 spec file checked: ")
        diagnostics = []
        for line in blocks:
            if line.startswith("    hint: "):
                continue
            assert line.startswith(f"{path}:"), line
            place, _, rest = line[len(str(path)) + 1:].partition(": ")  # LINE:COL: $.yaml.path: message
            diagnostics.append((str(path), int(place.split(":")[0]), rest.partition(": ")[2]))
    assert bool(diagnostics) == (code == 1), stdout
    for file, line, message in diagnostics:
        assert file == str(path)
        assert line >= 1 or message.startswith(("file is ", "cannot read file")), (line, message)


@pytest.fixture(scope="module", autouse=True)
def checkout_untouched():
    """The fuzzed commands write nothing into the checkout (no .hypothesis/, no stray files)."""
    def status() -> list[str]:
        # new files only (untracked or ignored): tracked files may be edited by hand while the suite runs
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--", ".",
                              ":!.pytest_cache", ":!**/__pycache__"], cwd=REPO, capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line.startswith(("??", "!!"))]

    before = status()
    yield
    assert status() == before
    assert not (REPO / ".hypothesis").exists()


@FUZZ
@given(content=mutated_spec(), as_json=st.booleans())
def test_validate_survives_mutated_specs(content: bytes, as_json: bool):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / SPEC_NAME
        path.write_bytes(content)
        before = snapshot(Path(folder))
        code, stdout, stderr = run_in_process("validate", str(path), *(["--json"] if as_json else []))
        assert_validated(path, code, stdout, stderr, as_json)
        assert snapshot(Path(folder)) == before


@settings(FUZZ, max_examples=EXAMPLES // 20 or 4, deadline=None)
@given(content=mutated_spec())
def test_validate_subprocess_survives_mutated_specs(content: bytes):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / SPEC_NAME
        path.write_bytes(content)
        before = snapshot(Path(folder))
        run = subprocess.run([sys.executable, "-m", "vitcg", "validate", str(path)], cwd=REPO, capture_output=True,
                             text=True, timeout=120, env=os.environ.copy())
        assert_validated(path, run.returncode, run.stdout, run.stderr, as_json=False)
        assert snapshot(Path(folder)) == before


NUMBERS = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**64]))
ARGS = st.lists(st.one_of(
    st.tuples(st.just("--modality"), st.sampled_from(["image", "video", "image+video", "", "audio", "IMAGE"])
              | st.text(max_size=12)),
    st.tuples(st.just("--budgets"), st.lists(NUMBERS, max_size=4).map(lambda xs: ",".join(map(str, xs)))
              | st.text(max_size=20)),
    st.tuples(st.sampled_from(["--max-items", "--max-frames"]), NUMBERS.map(str) | st.text(max_size=8)),
    st.tuples(st.just("--base"), st.one_of(
        st.text(max_size=30),
        st.recursive(st.none() | st.booleans() | NUMBERS | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8).map(json.dumps),
    )),
), max_size=5).map(lambda pairs: [part for pair in pairs for part in pair])


@settings(FUZZ, max_examples=EXAMPLES or 200)
@given(args=ARGS)
def test_compile_config_survives_random_arguments(args: list[str]):
    code, stdout, stderr = run_in_process("compile-config", *args)
    assert code in (0, 2), (code, stdout, stderr)
    assert "Traceback" not in stderr, stderr
    if code == 0:
        config = json.loads(stdout, parse_constant=lambda name: pytest.fail(f"{name} in {stdout}"))
        assert isinstance(config, dict)
    else:
        assert stdout == "" and stderr.strip(), (stdout, stderr)
