"""Sweep ``vitcg new`` over every transformers model type with a vision tower: draft, validate, check the raw draft.

Usage: python benchmarks/raw_drafts.py [--out DIR] [--timeout S] [--deadline HH:MM] [--only TYPE ...]
                                      [--summary | --validate-only]

The model types are those ``vitcg new`` drafts (:func:`vitcg.tools.new.scaffold.draft` returns rather than
refusing), listed once in one process and kept in ``DIR/model_types.json``. Each model type then runs in its own
subprocess, killed after ``--timeout`` seconds: ``vitcg new TYPE -o DIR/drafts/NAME/NAME.yaml``, ``vitcg
validate`` and ``vitcg check --json`` on that file (CPU, tiny), the three commands through vitcg's console entry
point in that one process (transformers imported once). Each draft lies in a folder of its own, as a user's
first draft does: ``extends:`` is looked up beside the file first, where a sibling draft named like a packaged
spec would stand in for it. Model types that no packaged spec lists in its ``model_types`` run first, in a
fixed shuffled order. Each result is appended to ``DIR/results.jsonl`` as it comes, so a rerun resumes where
the last one stopped; ``--summary`` only writes ``DIR/summary.json`` and ``DIR/summary.md`` from the results so
far, with the failures grouped by :data:`REASONS`. ``--validate-only`` runs ``vitcg new`` and ``vitcg
validate`` alone for every model type in one process (minutes, where the whole sweep takes hours on two cores)
into ``DIR/validate.jsonl``.

A result's ``verdict`` is one of: ``proven`` (no guesses left), ``proven with guesses`` (``vitcg check`` says
"proven, with N guesses left"), ``spec stage only``, ``failed`` (the reason's first line), ``new refused`` or
``new failed`` (``vitcg new`` exited non-zero), ``invalid`` (the draft did not validate: nothing was checked),
``crashed`` (a traceback), ``timed out`` (the stage it was in).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> tuple[int, str, str, str | None]:
    """``vitcg ARGS`` through the console entry point in this process: exit status, stdout, stderr, and the
    traceback of an exception the entry point let through (a crash), else None."""
    from vitcg.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["vitcg", *args]
    code, crash = 0, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a crash of vitcg is what the sweep reports
        code, crash = 1, traceback.format_exc()
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue(), crash


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def one(model_type: str, folder: Path) -> None:
    """Worker: the three commands for one model type, one JSON line per stage on stdout."""
    from vitcg.tools.new.scaffold import spec_name

    path = folder / spec_name(model_type) / f"{spec_name(model_type)}.yaml"
    tic = time.perf_counter()
    _emit({"stage": "new", "started": True})
    code, out, err, crash = _cli("new", model_type, "-o", str(path), "--force")
    head = [line for line in path.read_text().splitlines()[:40] if line.startswith("extends: ")] if code == 0 else []
    _emit({"stage": "new", "code": code, "stdout": out[-2000:], "stderr": err[-2000:], "crash": crash,
           "extends": head[0].split("#")[0].removeprefix("extends: ").strip() if head else None,
           "seconds": round(time.perf_counter() - tic, 1)})
    if code != 0 or crash:
        return
    tic = time.perf_counter()
    code, out, err, crash = _cli("validate", str(path))
    _emit({"stage": "validate", "code": code, "stdout": out[-3000:], "stderr": err[-2000:], "crash": crash,
           "seconds": round(time.perf_counter() - tic, 1)})
    if code != 0 or crash:
        return
    tic = time.perf_counter()
    code, out, err, crash = _cli("check", str(path), "--json")
    spec = None
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        spec = json.loads(out)["specs"][0]
    _emit({"stage": "check", "code": code, "crash": crash, "stderr": err[-2000:],
           "stdout": out[-2000:] if spec is None else "",
           "verdict": spec and spec.get("verdict"), "reason": spec and spec.get("reason"),
           "guesses": len(spec.get("guesses") or ()) if spec else None,
           "seconds": round(time.perf_counter() - tic, 1)})


def validate_all(model_types: list[str], folder: Path) -> None:
    """Worker: ``vitcg new`` and ``vitcg validate`` (no check) for every model type in this one process, one JSON
    line each: the fast pass that says which drafts validate, for the model types the full sweep has not reached."""
    from vitcg.tools.new.scaffold import spec_name

    for model_type in model_types:
        path = folder / spec_name(model_type) / f"{spec_name(model_type)}.yaml"
        tic = time.perf_counter()
        code, out, err, crash = _cli("new", model_type, "-o", str(path), "--force")
        record = {"model_type": model_type, "new": code, "crash": crash,
                  "detail": (err or out).strip().splitlines()[0][:300] if code and (err or out).strip() else ""}
        if code == 0 and not crash:
            code, out, err, crash = _cli("validate", str(path))
            record.update({"validate": code, "crash": crash,
                           "detail": out.strip().splitlines()[0][:300] if code else ""})
        record["seconds"] = round(time.perf_counter() - tic, 1)
        _emit(record)


def list_model_types() -> dict:
    """Worker: every model type ``vitcg new`` drafts, those it refuses (with why), and the packaged specs' model
    types."""
    import warnings

    warnings.filterwarnings("ignore")
    from transformers import CONFIG_MAPPING, __version__

    from vitcg.errors import UsageError
    from vitcg.lang import SpecSource, packaged_specs_dir
    from vitcg.tools.new.scaffold import draft, spec_name

    vision, refused, broken = [], {}, {}
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                draft(model_type)
        except UsageError as exc:
            refused[model_type] = str(exc).splitlines()[0][:300]
            continue
        except Exception as exc:  # noqa: BLE001 - `vitcg new` turns this into an error naming the model type
            broken[model_type] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        vision.append(model_type)
    covered = {spec_name(t): spec.name for spec in SpecSource([str(packaged_specs_dir())]).specs
               for t in spec.model_types}
    everything = list(CONFIG_MAPPING.keys())  # len() of the lazy mapping itself is 0
    return {"transformers": __version__, "all": len(everything), "vision": vision, "refused": refused,
            "draft_raised": broken, "covered": {t: covered[spec_name(t)] for t in vision if spec_name(t) in covered}}


MEMORY_CAP = 8 << 30
"""Address space of one worker: a draft whose tiny config is not tiny (inkling_mm_model's check reached 21 GiB and
the kernel's OOM killer on a shared 23 GiB machine) fails inside its worker with a MemoryError instead."""


def _capped() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run_one(model_type: str, folder: Path, timeout: float, env: dict) -> dict:
    tic = time.perf_counter()
    command = [sys.executable, __file__, "--worker", model_type, "--out", str(folder)]
    timed_out = False
    try:
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=_capped)
        stdout, stderr, code = run.stdout, run.stderr, run.returncode
    except subprocess.TimeoutExpired as exc:
        timed_out = True
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        code = None
    stages = {}
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            stages[record["stage"]] = record
    result = {"model_type": model_type, "seconds": round(time.perf_counter() - tic, 1), "stages": stages}
    result.update(_classify(stages, timed_out, code, stderr))
    return result


def _classify(stages: dict, timed_out: bool, code: int | None, stderr: str) -> dict:
    """The verdict and its one-line detail from a worker's stages."""
    new, valid, check = stages.get("new", {}), stages.get("validate"), stages.get("check")
    last = [s for s in ("new", "validate", "check") if s in stages][-1:] or ["start"]
    if timed_out:
        return {"verdict": "timed out", "detail": f"in {'check' if valid else last[0]}"}
    for record in (new, valid, check):
        if record and record.get("crash"):
            return {"verdict": "crashed", "detail": f"{record['stage']}: " + record["crash"].strip().splitlines()[-1]}
    if code is not None and code < 0:  # a signal: the kernel's OOM killer (SIGKILL), or the memory cap's abort
        return {"verdict": "killed", "detail": f"signal {-code} in {'check' if valid else last[0]}"}
    if "code" not in new:
        tail = stderr.strip().splitlines()[-1:] or [f"worker exited {code}"]
        return {"verdict": "crashed", "detail": "worker: " + tail[0]}
    if new["code"] != 0:
        first = (new.get("stderr") or new.get("stdout") or "").strip().splitlines()[:1] or [""]
        refused = "write the spec by hand" in first[0] and "does not validate" not in first[0]
        return {"verdict": "new refused" if refused else "new failed", "detail": first[0][:300]}
    if valid is None:
        return {"verdict": "crashed", "detail": "worker stopped after new"}
    if valid["code"] != 0:
        lines = (valid.get("stdout") or valid.get("stderr") or "").strip().splitlines()
        return {"verdict": "invalid", "detail": (lines[0] if lines else "")[:300]}
    if check is None:
        return {"verdict": "crashed", "detail": "worker stopped after validate"}
    verdict, guesses = check.get("verdict"), check.get("guesses") or 0
    reason = (check.get("reason") or "").strip().splitlines()[:1] or [""]
    if verdict == "proven":
        return {"verdict": "proven with guesses" if guesses else "proven", "guesses": guesses, "detail": reason[0]}
    if verdict == "spec_only":
        return {"verdict": "spec stage only", "guesses": guesses, "detail": reason[0]}
    if verdict == "failed":
        return {"verdict": "failed", "guesses": guesses, "detail": reason[0]}
    tail = (check.get("stderr") or check.get("stdout") or "").strip().splitlines()[-1:] or [""]
    return {"verdict": str(verdict), "guesses": guesses, "detail": (reason[0] or tail[0])[:300]}


REASONS = (
    ("a token count off by the tokens before the patches (a CLS token)", r"manager output \(\d+, \d+\) but eager output"),
    ("an output width or row count other than the drafted out_hidden_size or items formula",
     r"graph returned rows of width|graph returned \d+ rows for"),
    ("channels-first outputs", r"channels first"),
    ("a tower that returns a plain tensor or a backbone output (no last_hidden_state)", r"has no 'last_hidden_state'"),
    ("a package this environment lacks (timm, natten, scipy)", r"requires the \w+ library|No module named"),
    ("a backbone without SDPA", r"does not support an attention implementation through torch\.nn\.functional"),
    ("the tiny encoder does not build", r"building the tiny encoder failed"),
    ("a host sync in the captured forward", r"HostSyncError"),
    ("end to end: a standalone tower (no get_image_features)", r"^end-to-end stage: .*has no get_image_features"),
    ("end to end: no image processor mapped to the model type", r"^end-to-end stage: .*has no image processor mapped"),
    ("end to end: vlm_attribute names no encoder", r"^end-to-end stage: .* is a \w+, not the spec's"),
    ("end to end: other", r"^end-to-end stage"),
    ("other spec-stage failures", r""),
)
"""Why a raw draft failed, read off its detail line: the first pattern that matches names the reason."""


def reasons(results: list[dict]) -> dict[str, list[str]]:
    """The failed model types of ``results`` by :data:`REASONS`, in that order (empty reasons left out)."""
    import re

    found: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r["model_type"]):
        if r["verdict"] == "failed":
            label = next(label for label, pattern in REASONS if re.search(pattern, r.get("detail", "")))
            found.setdefault(label, []).append(r["model_type"])
    return {label: found[label] for label, _ in REASONS if label in found}


ORDER = ("proven", "proven with guesses", "spec stage only", "failed", "invalid", "new failed", "new refused",
         "crashed", "killed", "timed out")


def summarize(folder: Path, listing: dict, results: list[dict], command: str) -> None:
    by_type = {r["model_type"]: r for r in results}
    counts = {v: sum(r["verdict"] == v for r in by_type.values()) for v in ORDER}
    counts.update({v: sum(r["verdict"] == v for r in by_type.values()) for r in by_type.values()
                   for v in [r["verdict"]] if v not in ORDER})
    validated = sum(bool(r["stages"].get("validate", {}).get("code") == 0) for r in by_type.values())
    fast = folder / "validate.jsonl"
    passes = [json.loads(line) for line in fast.read_text().splitlines()] if fast.exists() else []
    fast_pass = {"model_types": len(passes), "drafted": sum(p["new"] == 0 and not p["crash"] for p in passes),
                 "validate_ok": sum(p.get("validate") == 0 and not p["crash"] for p in passes),
                 "not_ok": {p["model_type"]: p["detail"] for p in passes if p.get("validate") != 0 or p["crash"]}}
    document = {"date": datetime.date.today().isoformat(), "transformers": listing["transformers"],
                "command": command, "model_types_in_transformers": listing["all"],
                "vision_model_types": len(listing["vision"]), "swept": len(by_type), "validate_ok": validated,
                "new_and_validate_of_every_model_type": fast_pass,
                "counts": counts, "failed_by_reason": reasons(list(by_type.values())),
                "refused_by_new": listing["refused"], "covered": listing["covered"],
                "results": [{k: v for k, v in r.items() if k != "stages"}
                            | {"extends": r["stages"].get("new", {}).get("extends"),
                               "covered_by": listing["covered"].get(r["model_type"]),
                               "validates": r["stages"].get("validate", {}).get("code") == 0}
                            for r in sorted(by_type.values(), key=lambda r: r["model_type"])]}
    (folder / "summary.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [f"# Raw drafts of `vitcg new`, {document['date']}, transformers {document['transformers']}, CPU tiny",
             "", f"Command: `{command}`", "",
             f"{len(by_type)} of {len(listing['vision'])} model types with a vision tower swept "
             f"({listing['all']} model types in transformers); {validated} drafts validate."
             + (f" `--validate-only` over all {fast_pass['model_types']}: {fast_pass['drafted']} drafted, "
                f"{fast_pass['validate_ok']} validate." if passes else ""), "",
             "| verdict | count |", "|---|---|"]
    lines += [f"| {v} | {c} |" for v, c in counts.items() if c]
    lines += ["", "| why failed | count |", "|---|---|"]
    lines += [f"| {label} | {len(types)} |" for label, types in document["failed_by_reason"].items()]
    lines += ["", "| model type | covered by | extends | validates | check | seconds | detail |",
              "|---|---|---|---|---|---|---|"]
    for r in document["results"]:
        check = r["verdict"] + (f" ({r['guesses']} guesses left)" if r.get("guesses") and
                                r["verdict"] != "proven" else "")
        detail = r.get("detail", "").replace("|", "\\|")
        lines.append(f"| {r['model_type']} | {r['covered_by'] or ''} | {r['extends'] or ''} | "
                     f"{'yes' if r['validates'] else 'no'} | {check} | {r['seconds']} | {detail[:160]} |")
    (folder / "summary.md").write_text("\n".join(lines) + "\n")


def _shuffled(model_type: str) -> str:
    """A fixed order that is not alphabetical, so that the counts of a sweep stopped early sample every family
    rather than the first letters (a model type and its ``_vision`` sub-type sit apart)."""
    return hashlib.sha1(model_type.encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/raw-drafts"))
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per model type (all three commands)")
    parser.add_argument("--deadline", help="HH:MM (UTC): start no model type after it")
    parser.add_argument("--only", nargs="*", help="these model types (again, even if already swept)")
    parser.add_argument("--summary", action="store_true", help="only summarize the results so far")
    parser.add_argument("--validate-only", action="store_true", help="only vitcg new and validate, every model "
                        "type in one process (DIR/validate.jsonl)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--list-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-validate", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = args.out.resolve()
    if args.worker:
        (folder / "drafts").mkdir(parents=True, exist_ok=True)
        one(args.worker, folder / "drafts")
        return
    if args.worker_validate:
        validate_all(args.worker_validate, folder / "validate-drafts")
        return
    if args.list_worker:
        sys.stdout.write(json.dumps(list_model_types()) + "\n")
        return
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.setdefault("VITCG_CACHE_DIR", str(folder / "cache"))
    env.pop("VITCG_SPECS_DIR", None)  # the packaged specs only: what a new user has
    listing_file = folder / "model_types.json"
    if not listing_file.exists():
        print("listing the model types vitcg new drafts ...", flush=True)
        run = subprocess.run([sys.executable, __file__, "--list-worker", "--out", str(folder)], env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"listing failed:\n{run.stderr[-3000:]}")
        listing_file.write_text(run.stdout.strip().splitlines()[-1] + "\n")
    listing = json.loads(listing_file.read_text())
    if args.validate_only:
        (folder / "validate-drafts").mkdir(exist_ok=True)
        with (folder / "validate.jsonl").open("w") as f:
            subprocess.run([sys.executable, __file__, "--worker-validate", *(args.only or listing["vision"]),
                            "--out", str(folder)], env=env, stdout=f, stderr=subprocess.DEVNULL)
        return
    results_file = folder / "results.jsonl"
    lines = results_file.read_text().splitlines() if results_file.exists() else []
    results = list({r["model_type"]: r for r in map(json.loads, lines)}.values())  # a rerun's result wins
    command_file = folder / "command.txt"  # the sweep's own command, for the summary a later --summary writes
    if not args.summary:
        command_file.write_text("nice -n 19 python benchmarks/raw_drafts.py " + " ".join(sys.argv[1:]) + "\n")
    command = command_file.read_text().strip() if command_file.exists() else "python benchmarks/raw_drafts.py"
    if args.summary:
        summarize(folder, listing, results, command)
        return
    done = {r["model_type"] for r in results}
    todo = args.only if args.only is not None else [
        t for t in sorted(listing["vision"], key=lambda t: (t in listing["covered"], _shuffled(t))) if t not in done]
    print(f"transformers {listing['transformers']}: {len(listing['vision'])} of {listing['all']} model types have "
          f"a vision tower ({len(listing['covered'])} covered by a packaged spec); {len(done)} swept, "
          f"{len(todo)} to go", flush=True)
    deadline = None
    if args.deadline:
        hours, minutes = map(int, args.deadline.split(":"))
        now = datetime.datetime.now(datetime.UTC)
        deadline = now.replace(hour=hours, minute=minutes, second=0, microsecond=0)
    for i, model_type in enumerate(todo, 1):
        if deadline and datetime.datetime.now(datetime.UTC) >= deadline:
            print(f"deadline {args.deadline} reached: {len(todo) - i + 1} model types left", flush=True)
            break
        result = _run_one(model_type, folder, args.timeout, env)
        results = [r for r in results if r["model_type"] != model_type] + [result]
        with results_file.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"[{i}/{len(todo)}] {model_type}: {result['verdict']}"
              + (f", {result['guesses']} guesses left" if result.get("guesses") else "")
              + f" ({result['seconds']} s) {result.get('detail', '')[:150]}", flush=True)
    summarize(folder, listing, results, command)


if __name__ == "__main__":
    main()
