"""Fuzzing the ``vitcg`` command (issue #13): mutated real specs and random ``compile-config`` arguments; and (issue
27) plan inputs, bindings and compile cache files, protocol methods called directly, index inputs around the end of
the table they index, two threads on one model; and (issue 37) folders of specs that extend, remove and link
harness files. The whole file takes about 47 s on a 2-core machine under load
(load average 6), 31 s of CPU.

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
import warnings
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.cli import REPO, snapshot
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


# Issue 27, item 6: the surfaces issue 27 hardened. Cache files and plan inputs never raise anything but the
# documented error; protocol methods called directly on an adapter refuse or serve exactly; two threads on one
# accelerated model get the original features. Derandomized like the rest, and small: these examples add about
# 30 s on a 2-core machine.

JSON_LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from(WEIRD_STRINGS), st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8) | st.sampled_from(["images", "videos", "specs"]), inner,
                                           max_size=4), max_leaves=12)
COSTS_FILE = REPO / "benchmarks" / "results-costs-2026-11-22-h100.json"


@st.composite
def plan_document(draw) -> bytes:
    """A ``--requests`` or ``--costs`` file: random JSON, the real costs file with one value replaced, a document
    nested past the bound, or raw bytes."""
    kind = draw(st.sampled_from(["random", "costs", "deep", "bytes", "requests"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth, opening, closing = draw(st.integers(60, 100_000)), *draw(st.sampled_from([("[", "]"), ('{"k":', "}")]))
        return (opening * depth + "1" + closing * depth).encode()  # written as text: json.dumps would recurse
    if kind == "requests":
        sizes = st.lists(st.one_of(NUMBERS, JSON_LEAVES), min_size=2, max_size=3)
        entry = st.fixed_dictionaries({}, optional={"images": st.lists(sizes, max_size=3),
                                                    "videos": st.lists(sizes, max_size=2)})
        return json.dumps(draw(st.lists(entry, max_size=4))).encode()
    if kind == "random":
        return json.dumps(draw(JSON_VALUES)).encode()
    document = json.loads(COSTS_FILE.read_text())
    paths = [p for p in _paths(document) if p and p[0] == "specs"]
    path = draw(st.sampled_from(paths))
    _parent(document, path)[path[-1]] = draw(JSON_VALUES)
    return json.dumps(document).encode()


@settings(FUZZ, max_examples=EXAMPLES or 100, deadline=None)
@given(content=plan_document())
def test_plan_inputs_are_read_or_refused_in_one_line(content: bytes):
    from vitcg.errors import UsageError
    from vitcg.tools.plan import planner as planning

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.json"
        path.write_bytes(content)
        try:
            requests = planning.read_requests(path)
        except UsageError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"--requests {path}: "), str(exc)
        else:
            assert requests and all(0 < n <= planning.MAX_PIXELS for r in requests for s in r.images + r.videos
                                    for n in s)
        try:
            costs = planning.costs_from_results(path, "qwen2_vl")
        except UsageError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"--costs {path}: "), str(exc)
        else:  # whatever was measured, no call is free, negative or infinite
            for size in (1, 64, 4096, 10**6):
                assert 0 < costs.replay(size) < float("inf") and 0 < costs.eager(size) < float("inf")
                assert 0 < costs.memory(size) < float("inf")


def _binding_answers() -> dict[str, dict]:
    """Fresh answers (no cache) for a class, a method and a config of qwen2_vl."""
    from vitcg.lang.bindings import Bindings

    fresh = Bindings(use_cache=False)
    encoder = "transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel"
    config = "transformers.models.qwen2_vl.configuration_qwen2_vl.Qwen2VLVisionConfig"
    return {f"class:{encoder}": fresh.check_class(encoder), f"method:{encoder}:forward": fresh.check_method(encoder, "forward"),
            f"config:{config}:{{}}": fresh.check_config(config, {})}


BINDING_ANSWERS: dict[str, dict] = {}


@settings(FUZZ, max_examples=EXAMPLES or 30, deadline=None)
@given(content=st.one_of(st.binary(max_size=200), JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                         st.integers(40, 5000).map(lambda depth: ("[" * depth + "]" * depth).encode()),
                         st.lists(JSON_VALUES, min_size=3, max_size=3)))
def test_a_bindings_cache_file_never_changes_an_answer(content):
    from vitcg.lang.bindings import Bindings, _valid_entry

    if not BINDING_ANSWERS:
        BINDING_ANSWERS.update(_binding_answers())
    if isinstance(content, list):  # the three keys, each with a random entry (a well-formed one is a real answer)
        entries = {key: value for key, value in zip(BINDING_ANSWERS, content) if not _valid_entry(key, value)}
        content = json.dumps(entries).encode()
    with tempfile.TemporaryDirectory() as folder:
        cached = Bindings(cache_dir=folder)
        cached.path.write_bytes(content)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one per unreadable file, by design
            answers = {key: _ask(cached, key) for key in BINDING_ANSWERS}
            cached.save()
        assert answers == BINDING_ANSWERS
        assert {key: _ask(Bindings(cache_dir=folder), key) for key in BINDING_ANSWERS} == BINDING_ANSWERS


def _ask(bindings, key: str) -> dict:
    kind, rest = key.split(":", 1)
    if kind == "class":
        return bindings.check_class(rest)
    if kind == "method":
        path, method = rest.rsplit(":", 1)
        return bindings.check_method(path, method)
    path, overrides = rest.split(":", 1)
    return bindings.check_config(path, json.loads(overrides))


@st.composite
def compile_cache_file(draw) -> tuple[str, bytes]:
    """What may lie at ``compile/KEY.bin``: random bytes, vitcg's header over random bytes, or a file tagged with the
    user's own key (what a planted file cannot be) over a random or a mutated artifact container."""
    from vitcg.runtime import compile_cache as cc

    kind = draw(st.sampled_from(["bytes", "header", "tagged", "container"]))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=300))
    if kind == "header":
        return kind, cc.MAGIC + draw(st.binary(max_size=300))
    if kind == "tagged":
        return kind, draw(st.binary(max_size=300))
    # torch's container layout: crc, version, then (kind, count, (key, data)*)*; names base64, sizes 8 bytes
    import base64
    import zlib

    def chunk(data: bytes) -> bytes:
        return len(data).to_bytes(8, "big") + data

    artifact_kind = draw(st.sampled_from(sorted(cc.EXPECTED_KINDS) + ["pickle", "", "inductor/../x"]))
    key = draw(st.sampled_from(["a/b", "/etc/x", "../up", "ok", "x\\y", "C:x", "", "a\x00b"]) | st.text(max_size=12))
    body = (1).to_bytes(8, "big") + chunk(base64.b64encode(artifact_kind.encode())) + (1).to_bytes(8, "big")
    body += chunk(base64.b64encode(key.encode("utf-8", "surrogatepass"))) + chunk(draw(st.binary(max_size=40)))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(body)))
        body = body[:cut]
    return kind, zlib.crc32(body).to_bytes(4, "big") + body


@settings(FUZZ, max_examples=EXAMPLES or 120, deadline=None)
@given(case=compile_cache_file())
def test_a_compile_cache_file_reaches_torch_only_when_vouched_for(case):
    from vitcg.runtime import compile_cache as cc

    kind, data = case
    key = "0" * 32
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "compile"
        folder.mkdir(mode=0o700)
        path = folder / f"{key}.bin"
        if kind in ("tagged", "container"):
            secret = cc._secret(folder, create=True)
            data = cc.MAGIC + cc._tag(secret, key, data) + data
        path.write_bytes(data)
        path.chmod(0o600)
        try:
            payload = cc._trusted_payload(path, key)
        except cc.UntrustedCacheFile as exc:
            assert str(exc)
            return
        # vouched for: vitcg's own tag, and only artifacts torch.compile makes, under relative keys
        assert kind in ("tagged", "container") and payload is not None
        for artifact, name in cc.artifact_index(payload):
            assert artifact in cc.EXPECTED_KINDS and not name.startswith("/") and ".." not in name.split("/")


PROTOCOL_SPECS = ("qwen2_vl", "video_llama_3", "gemma4", "instructblip", "mllama")
"""Packed, packed with item values (``per_item``), tiles with ``items.valid``, and tiles with index roles bounded by
their tables (``params.below``)."""
MAX_ITEMS = {"gemma4": 1}
"""Items per call where the default (3) costs too much: a Gemma 4 tile is 2520 patches, and its eager forward of 3
took 1.4 s of the test's time on a 2-core machine (0.1 s for the others)."""
ADAPTERS: dict[str, object] = {}


def _adapter(name: str):
    if name not in ADAPTERS:
        from support.tiny import tiny_adapter

        ADAPTERS[name] = tiny_adapter(name)
    return ADAPTERS[name]


@st.composite
def protocol_call(draw):
    """A spec, a valid call of it, and that call with a few of its values changed: dtype, sign, shape, layout."""
    import torch

    from vitcg.tools.workloads import InputBuilder

    name = draw(st.sampled_from(PROTOCOL_SPECS))
    adapter = _adapter(name)
    builder = InputBuilder(adapter.spec, adapter, torch.Generator().manual_seed(draw(st.integers(0, 3))))
    tiles = not adapter.spec.attention_style.segmented
    items = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1,
                          max_size=MAX_ITEMS.get(name, 3)))
    kwargs = builder.inputs("image", [1 if tiles else builder.image(2 * h, 2 * w) for h, w in items])
    for _ in range(draw(st.integers(1, 2))):  # an unchanged call is covered by `vitcg check`
        key = draw(st.sampled_from(sorted(kwargs, key=lambda k: (k.startswith("pixel_values"), k))))
        value = kwargs[key]
        if not isinstance(value, torch.Tensor):  # already None or a list
            continue
        change = draw(st.sampled_from(["dtype", "negate", "past_table", "drop_row", "zero_width", "scramble", "none",
                                       "list"]))
        if change == "dtype":
            value = value.to(draw(st.sampled_from([torch.int8, torch.uint8, torch.int16, torch.int32, torch.float16,
                                                   torch.float64, torch.bool])))
        elif change == "negate" and value.dtype != torch.bool:
            value = -value
        elif change == "past_table" and not value.is_floating_point() and value.dtype != torch.bool:
            value = value + draw(st.sampled_from([1, 9, 2 ** 20, 2 ** 40]))  # index ids past an embedding table
        elif change == "drop_row":
            value = value[:-1]
        elif change == "zero_width" and value.ndim > 1:
            value = value[..., :0]
        elif change == "scramble" and value.numel():
            flat = value.flatten()
            value = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(1))].reshape(value.shape)
        elif change == "none":
            value = None
        elif change == "list":
            value = value.tolist()
        kwargs[key] = value
    return name, kwargs, draw(st.lists(st.integers(-1, 4) | st.sampled_from([1.5, "0", True, None]), max_size=3))


@settings(FUZZ, max_examples=EXAMPLES or 25, deadline=None)
@given(call=protocol_call())
def test_protocol_methods_called_directly_refuse_or_serve_exactly(call):
    import torch

    from vitcg.errors import VitcgError

    name, kwargs, indices = call
    adapter = _adapter(name)

    def attempt(method: str, *args):
        try:  # a graph-scoped adapter refuses protocol-only members on access (UnsupportedError)
            return True, getattr(adapter, method)(kwargs, *args)
        except VitcgError as exc:
            return False, exc
    served, specs = attempt("get_encoder_cudagraph_item_specs")
    eager_served, rows = attempt("encoder_eager_forward")
    assert served == eager_served, (specs, rows)
    attempt("get_input_modality")
    attempt("select_encoder_cudagraph_items", indices)
    if served:  # an empty call included: no items give empty buffers
        attempt("prepare_encoder_cudagraph_replay_buffers", max(len(specs), 1), 0)
    if served:  # the rows the spec promises are the rows the model returns
        assert isinstance(rows, torch.Tensor) and rows.shape[0] == sum(s.output_tokens for s in specs)


TABLES = {"instructblip": ("qformer_input_ids", lambda m: m.qformer.embeddings.word_embeddings.num_embeddings),
          "mllama": ("aspect_ratio_ids", lambda m: m.pre_tile_positional_embedding.embedding.num_embeddings)}
"""Specs whose index inputs the model looks up in a table: the key, and the table's rows read from the model."""


@st.composite
def index_call(draw):
    """A valid call of a spec in :data:`TABLES` with some of its index values replaced by values around the table's
    end, at either end, or far past it."""
    import torch

    from vitcg.tools.workloads import InputBuilder

    name = draw(st.sampled_from(sorted(TABLES)))
    adapter = _adapter(name)
    key, table = TABLES[name]
    rows = table(adapter.module)
    builder = InputBuilder(adapter.spec, adapter, torch.Generator().manual_seed(0))
    kwargs = builder.inputs("image", [1] * draw(st.integers(1, 3)))
    ids = kwargs[key].clone()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, ids.numel() - 1))
        ids.view(-1)[at] = draw(st.integers(-2, 2) | st.integers(rows - 2, rows + 2) | st.sampled_from([2 ** 31, 2 ** 62]))
    kwargs[key] = ids
    return name, kwargs, rows


@settings(FUZZ, max_examples=EXAMPLES or 20, deadline=None)
@given(call=index_call())
def test_index_inputs_are_served_exactly_when_the_model_has_their_rows(call):
    """Served (rows as the item specs promise) when every id is a row of the model's table; otherwise an InputError
    naming the key, where the model itself raises IndexError (and a graph replay on a GPU would assert)."""
    from vitcg.errors import InputError

    name, kwargs, rows = call
    adapter = _adapter(name)
    key = TABLES[name][0]
    inside = bool(((kwargs[key] >= 0) & (kwargs[key] < rows)).all())
    if inside:
        specs = adapter.get_encoder_cudagraph_item_specs(kwargs)
        assert adapter.encoder_eager_forward(kwargs).shape[0] == sum(s.output_tokens for s in specs)
        return
    for method in ("get_encoder_cudagraph_item_specs", "encoder_eager_forward"):
        with pytest.raises(InputError, match=f"'{key}': row \\d+: expected indices in \\[0, {rows}\\)"):
            getattr(adapter, method)(kwargs)


THREAD_MODEL: list = []


@settings(FUZZ, max_examples=EXAMPLES // 50 or 3, deadline=None)
@given(grids=st.lists(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3),
                      min_size=2, max_size=2))
def test_two_threads_on_one_accelerated_model_get_the_original_features(grids):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import transformers

    import vitcg

    if not THREAD_MODEL:
        torch.manual_seed(0)
        config = transformers.Qwen2VLConfig(
            vision_config={"depth": 2, "embed_dim": 64, "hidden_size": 48, "num_heads": 4},
            text_config={"hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 64, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 2]}})
        THREAD_MODEL.append(transformers.Qwen2VLForConditionalGeneration(config).eval())
    model = THREAD_MODEL[0]
    calls = []
    for t, items in enumerate(grids):
        grid = torch.tensor([[1, 2 * h, 2 * w] for h, w in items])
        rows = int(grid.prod(dim=1).sum())
        calls.append((torch.randn(rows, 1176, generator=torch.Generator().manual_seed(t)), grid))

    def features(pixels, grid):
        with torch.no_grad():
            return model.model.get_image_features(pixels, grid).pooler_output

    want = [features(*c) for c in calls]
    with vitcg.accelerate(model, max_num_batched_tokens=256):
        start = threading.Barrier(2)

        def work(t):
            start.wait()
            return [features(*calls[t]) for _ in range(3)]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(work, range(2)))
    for t, got in enumerate(results):
        for each in got:
            assert [g.shape for g in each] == [w.shape for w in want[t]]
            for g, w in zip(each, want[t]):
                assert float((g - w).norm() / w.norm().clamp_min(1e-12)) <= 1e-5


# issue 37: the spec language's surfaces (extends, remove, harness files, folders), fuzzed as one folder of specs
FAMILY = ["a", "b", "c", "d"]
PARENTS = FAMILY + ["qwen2_vl", "nowhere", "../a", ""]
REMOVALS = ["encoder.call_kwargs", "encoder.args.grid_thw", "encoder.nothing", "tests.real_config", "geometry",
            "x" * 300, "tests.budgets", "modalities.video"]
HARNESSES = ["none", "yaml", "yml", "both", "fifo", "folder", "outside", "dangling"]
SECRET = "sekrit-37:*:19000"


@st.composite
def spec_folder(draw) -> list[tuple[str, str, str, list[int]]]:
    """Up to four specs of one folder: (name, the spec's text, its harness kind, the harness's budgets)."""
    files = []
    for name in draw(st.lists(st.sampled_from(FAMILY), min_size=1, max_size=4, unique=True)):
        if draw(st.booleans()):
            text = (REPO / "vitcg" / "specs" / "qwen2_vl.yaml").read_text().replace("name: qwen2_vl", f"name: {name}", 1)
        else:
            text = f"name: {draw(st.sampled_from([name, name + '_other']))}\nextends: {draw(st.sampled_from(PARENTS))!r}\n"
            removals = draw(st.lists(st.sampled_from(REMOVALS), max_size=3))
            if removals:
                text += f"remove: {json.dumps(removals)}\n"
            buffers = draw(st.lists(st.sampled_from(["grid_thw", "cu_seqlens", "nothing"]), max_size=2))
            if buffers:
                text += "buffers:\n" + "".join(f"  - {{name: {b}, remove: true}}\n" for b in buffers)
        budgets = draw(st.lists(st.sampled_from([64, 1024, 2**20, 2**20 + 1, 10**23]), min_size=1, max_size=2,
                                unique=True))
        files.append((name, text, draw(st.sampled_from(HARNESSES)), budgets))
    return files


def write_folder(root: Path, files) -> Path:
    folder = root / "specs"
    folder.mkdir()
    (root / "secret").write_text(f"{SECRET}\n")
    harness = (REPO / "vitcg" / "specs" / "qwen2_vl.tests.yaml").read_text()
    for name, text, kind, budgets in files:
        (folder / f"{name}.yaml").write_text(text)
        body = harness.replace("budgets: [", f"budgets: {budgets}  # [", 1) if "budgets: [" in harness else harness
        if "extends" in text:
            body = f"budgets: {budgets}\n"
        for suffix in {"yaml": [".tests.yaml"], "yml": [".tests.yml"], "both": [".tests.yaml", ".tests.yml"]}.get(kind, []):
            (folder / f"{name}{suffix}").write_text(body)
        target = folder / f"{name}.tests.yaml"
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "folder":
            target.mkdir()
        elif kind == "outside":
            target.symlink_to(root / "secret")
        elif kind == "dangling":
            target.symlink_to(root / "gone")
    return folder


@settings(FUZZ, max_examples=EXAMPLES or 25, deadline=None)
@given(files=spec_folder())
def test_a_folder_of_related_specs_validates_the_same_whatever_the_order(files):
    from vitcg.lang import SpecSource
    with tempfile.TemporaryDirectory() as root:
        folder = write_folder(Path(root), files)
        code, stdout, stderr = run_in_process("validate", str(folder))
        assert code in (0, 1) and "Traceback" not in stdout + stderr, (code, stdout, stderr)
        assert SECRET not in stdout + stderr and "sekrit" not in stdout + stderr
        for line in stdout.splitlines()[:-1]:
            if not line.startswith("    hint: "):
                assert line.startswith((str(folder) + "/", str(REPO / "vitcg" / "specs") + "/")), line
        resolved, out, err = run_in_process("validate", "--resolved", str(folder))
        assert resolved == code and "sekrit" not in out + err, (resolved, code, out)
        assert all(d is None or isinstance(d, dict) for d in yaml.safe_load_all(out))  # one YAML document a file
        together = set(SpecSource.of_files([folder], bindings=False).invalid_files)
        alone = {str(p) for p in sorted(folder.glob("*.yaml"), reverse=True) if not p.name.endswith(".tests.yaml")
                 if not SpecSource.of_files([p], bindings=False).ok}
        assert together == alone
