"""Templates -> registry/: every ``vitcg/templates/NAME.j2`` renders to ``registry/NAME`` from the loaded specs.

Rendering reads typed specs only, through a plain-data context built from :meth:`Spec.to_json` plus a few
derived values; no torch objects and no Spec objects reach a template. The environment is sandboxed and
strict: a missing field is a :class:`RenderError` naming the template, its line and the spec.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import RenderError, UsageError
from ..lang import Spec, SpecSource, packaged_specs_dir, spec_folders
from ..lang.catalogue import vocabulary
from ..lang.folders import packaged_folder
from ..lang.gaps import GAPS
from .files import make_folder, write_text_atomic

HEADER = "generated from specs/ by vitcg — do not edit"
"""Every generated file carries this line, in its own comment syntax (JSON: the ``_generated`` key)."""

IMAGE_QUESTION = "What is in this image?"
VIDEO_QUESTION = "Describe this video in one sentence."
"""The questions of vLLM's ViT CUDA graph tests, so generated prompts match theirs."""

TEMPLATE_SUFFIX = ".j2"
IGNORED_DIRS = frozenset({"__pycache__"})
"""Importing ``registry/*.py`` writes bytecode there; it is neither generated nor someone else's file."""
SHOWN_NAMES = 5
"""Files named in the refusal of an output folder that holds other files; the rest are counted."""


def has_header(name: str, head: list[str]) -> bool:
    """Whether a file called ``name`` whose first lines are ``head`` carries :data:`HEADER`: in its first line,
    or for JSON in the second as the ``_generated`` key (indented JSON opens with ``{`` alone).

    Rendered output must pass this, and a file of the output folder that passes it counts as generated: the
    only kind ``vitcg generate`` may remove. So the rule is strict; a header further down does not count.
    """
    if head and HEADER in head[0]:
        return True
    return (name.endswith(".json") and len(head) > 1 and head[0].strip() == "{"
            and head[1].lstrip().startswith('"_generated"') and HEADER in head[1])


def markdown_cell(value: Any) -> str:
    """``value`` as one Markdown table cell: ``|`` escaped, newlines turned into ``<br>``."""
    text = str(value).strip().replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("|", "\\|").replace("\n", "<br>")


def python_literal(value: Any) -> str:
    """Python source for plain data (str, int, float, bool, None, lists, dicts). Raises RenderError otherwise."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RenderError(f"cannot write {value!r} as a Python literal: it would read as a name")
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are a subset of Python's, and double quotes read like the code around them.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise RenderError(f"cannot write a {type(value).__name__} as a Python literal: {value!r}")


def json_text(value: Any) -> str:
    """``value`` as indented JSON, non-ASCII kept (jinja's ``tojson`` HTML-escapes ``<`` and ``>``)."""
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


def _prompt(template: str, placeholder: str | None, question: str) -> str | None:
    if placeholder is None:
        return None
    # str.replace, not str.format: chat templates may hold other braces.
    return template.replace("{placeholders}", placeholder).replace("{question}", question)


def packaged_templates_dir() -> Path:
    """The templates shipped with vitcg (``vitcg/templates/``). Raises UsageError when they are not a folder on
    disk (:func:`vitcg.lang.folders.packaged_folder`)."""
    return packaged_folder("templates")


def shown_folder(folder: Path) -> str:
    """How generated files name a specs folder: ``vitcg/specs`` for the packaged one (its path in a checkout),
    else the folder's own name, so that the output does not depend on where the command runs."""
    if folder.resolve() == packaged_specs_dir().resolve():
        return "vitcg/specs"
    return folder.resolve().name


def spec_context(spec: Spec, folders: Sequence[Path] = ()) -> dict[str, Any]:
    """Plain data for one spec: ``Spec.to_json()`` plus ``supports`` and ``test_config``.

    ``file`` becomes ``<folder>/<path inside it>`` for the first of ``folders`` that holds it (the folder as
    :func:`shown_folder` names it), so the output does not depend on where the command runs.
    """
    data = spec.to_json()
    for folder in folders:
        try:
            relative = Path(spec.file).relative_to(folder)
        except ValueError:
            continue
        data["file"] = f"{shown_folder(folder)}/{relative.as_posix()}"
        break
    image, video = "image" in data["modalities"], "video" in data["modalities"]
    data["supports"] = {"image": image, "video": video, "mixed": image and video}
    tests = data["tests"]
    image_prompt = _prompt(tests["prompt_template"], tests["image_placeholder"], IMAGE_QUESTION) if image else None
    video_prompt = _prompt(tests["prompt_template"], tests["video_placeholder"], VIDEO_QUESTION) if video else None
    data["test_config"] = {
        "model": data["checkpoints"][0],
        "modalities": [m for m, p in (("image", image_prompt), ("video", video_prompt)) if p is not None],
        "image_prompt": image_prompt,
        "video_prompt": video_prompt,
        "num_video_frames": tests["num_video_frames"],
        "max_model_len": tests["max_model_len"],
        "needs_video_metadata": tests["needs_video_metadata"],
        "vllm_runner_kwargs": tests["runner_kwargs"],
        "compilation_config_overrides": {"encoder_cudagraph_token_budgets": tests["budgets"]},
        "marks": tests["marks"],
    }
    return data


def build_context(specs: Iterable[Spec], folders: Sequence[Path] = ()) -> dict[str, Any]:
    """The whole template context: ``header``, ``specs`` (sorted by name), ``specs_by_name``, ``model_types``,
    ``vocabulary`` (styles, providers, padding rules, dtypes: :func:`vitcg.lang.catalogue.vocabulary`) and
    ``gaps`` (model types no spec covers yet, with why: :data:`vitcg.lang.gaps.GAPS`)."""
    contexts = [spec_context(s, folders) for s in sorted(specs, key=lambda s: s.name)]
    return {
        "header": HEADER,
        "vocabulary": vocabulary(),
        "specs": contexts,
        "specs_by_name": {c["name"]: c for c in contexts},
        "model_types": sorted({t for c in contexts for t in c["model_types"]}),
        "gaps": [{"model_types": list(g.model_types), "reason": g.reason} for g in GAPS],
    }


def _owners(context: Mapping[str, Any]) -> dict[int, tuple[str, str, str]]:
    """id of every dict and list inside each spec's context -> (spec name, file, field path)."""
    owners: dict[int, tuple[str, str, str]] = {}

    def walk(node: Any, spec: dict, path: str) -> None:
        if isinstance(node, (dict, list)):
            owners[id(node)] = (spec["name"], spec["file"], path)
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                walk(child, spec, f"{path}.{key}" if path else str(key))

    for spec in context.get("specs", ()):
        walk(spec, spec, "")
    return owners


def _undefined_class(owners: Mapping[int, tuple[str, str, str]]) -> type[jinja2.StrictUndefined]:
    class SpecUndefined(jinja2.StrictUndefined):
        """StrictUndefined whose message names the spec and the field path a template asked for."""

        @property
        def _undefined_message(self) -> str:
            owner = owners.get(id(self._undefined_obj))
            if owner is None:
                return super()._undefined_message
            name, file, path = owner
            where = f"{path}.{self._undefined_name}" if path else str(self._undefined_name)
            return f"spec {name!r} ({file}) has no field {where!r}"

    return SpecUndefined


def _template_line(exc: BaseException, filename: str | None) -> int | None:
    # Jinja rewrites tracebacks so that template frames carry the template's file name and line.
    line = getattr(exc, "lineno", None)
    for frame in traceback.extract_tb(exc.__traceback__):
        if filename and frame.filename == filename:
            line = frame.lineno
    return line


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (Python's json module writes it for non-finite floats)")


def _check_output(name: str, where: str, text: str) -> None:
    if not has_header(name, text.splitlines()[:2]):
        raise RenderError(f"{where}: the output does not start with the generated-file header; "
                          f"write {{{{ header }}}} in the first line (for JSON: a \"_generated\" key first)")
    try:
        if name.endswith(".json"):
            json.loads(text, parse_constant=_no_constant)
        elif name.endswith(".py"):
            compile(text, name, "exec")
    except (ValueError, SyntaxError) as exc:
        raise RenderError(f"{where}: the output is not valid {Path(name).suffix[1:]}: {exc}") from None


def template_names(templates_dir: Path) -> list[str]:
    """Names of the templates in ``templates_dir`` (``NAME.j2``), sorted. Raises UsageError if there are none."""
    if not templates_dir.is_dir():
        raise UsageError(f"no such templates folder: {templates_dir}")
    names = sorted(p.name for p in templates_dir.iterdir() if p.is_file() and p.name.endswith(TEMPLATE_SUFFIX))
    if not names:
        raise UsageError(f"no templates (*{TEMPLATE_SUFFIX}) in {templates_dir}")
    return names


def render_templates(context: Mapping[str, Any], templates_dir: Path) -> dict[str, str]:
    """Render every template with ``context``: output name (``NAME`` of ``NAME.j2``) -> text.

    Raises RenderError naming the template (and the spec, for a missing field); UsageError when
    ``templates_dir`` holds no templates.
    """
    # Immutable: templates share one context, so none may change what the next one sees.
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=_undefined_class(_owners(context)),
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(cell=markdown_cell, py=python_literal, json=json_text)
    outputs: dict[str, str] = {}
    for template_name in template_names(templates_dir):
        where = (templates_dir / template_name).as_posix()
        filename = None
        try:
            template = env.get_template(template_name)
            filename = template.filename
            text = template.render(context)
        except jinja2.TemplateSyntaxError as exc:
            raise RenderError(f"{where}:{exc.lineno}: {exc.message}") from None
        except (jinja2.TemplateError, RenderError, TypeError, ValueError) as exc:
            line = _template_line(exc, filename)
            message = exc.message if isinstance(exc, jinja2.TemplateError) and exc.message else str(exc)
            raise RenderError(f"{where}" + (f":{line}" if line else "") + f": {message}") from None
        if not text.endswith("\n"):
            text += "\n"
        output = template_name[: -len(TEMPLATE_SUFFIX)]
        _check_output(output, where, text)
        outputs[output] = text
    return outputs


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


@dataclass(frozen=True)
class StaleFile:
    """One generated file that does not match what the templates render now."""

    path: Path
    reason: str
    """``differs``, ``missing`` or ``not produced by any template``."""


@dataclass
class GenerateResult:
    """What ``vitcg generate`` rendered and which files in the output folder were (or are) stale."""

    out_dir: Path
    spec_count: int
    rendered: dict[str, str] = field(default_factory=dict)
    stale: list[StaleFile] = field(default_factory=list)
    written: bool = False
    """True when stale files were rewritten or removed, False for ``--check``."""
    foreign: list[Path] = field(default_factory=list)
    """Entries of the output folder that vitcg did not generate: never written, never removed."""

    def text(self) -> str:
        """The report printed by the command: one line per stale file, then a summary line."""
        out = self.out_dir.as_posix().rstrip("/") + "/"
        specs = _count(self.spec_count, "spec")
        if not self.stale:
            return f"{out} is up to date ({_count(len(self.rendered), 'file')} from {specs})\n"
        lines = []
        for item in self.stale:
            if not self.written:
                lines.append(f"stale: {item.path.as_posix()}: {item.reason}")
            elif item.reason == "not produced by any template":
                lines.append(f"removed {item.path.as_posix()} ({item.reason})")
            else:
                lines.append(f"wrote {item.path.as_posix()} ({item.reason})")
        if self.written:
            lines.append(f"{out}: {_count(len(self.stale), 'file')} updated from {specs}")
        else:
            count = _count(len(self.stale), "file")
            lines.append(f"{out} is stale ({count}); run `vitcg generate` and commit the result")
        return "\n".join(lines) + "\n"


def is_generated(path: Path) -> bool:
    """True when ``path`` is a regular file (not a symlink) that carries :data:`HEADER` (:func:`has_header`)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as handle:
            # Bounded reads: a large binary file with no newline must not be read whole.
            head = [handle.readline(64 * 1024) for _ in range(2)]
    except OSError:
        return False
    return has_header(path.name, [line.decode("utf-8", errors="replace") for line in head])


def _entries(out_dir: Path) -> list[Path]:
    """What lies directly in ``out_dir`` (no recursion: subfolders are never ours), bytecode folders aside."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if not (p.name in IGNORED_DIRS and p.is_dir()))


def find_stale(rendered: Mapping[str, str], out_dir: Path) -> list[StaleFile]:
    """Files of ``out_dir`` that differ from ``rendered``, are missing, or were generated (they carry the
    header) but no template produces them any more; sorted. Other files are not stale: see :func:`foreign_files`."""
    stale = []
    for name, text in rendered.items():
        path = out_dir / name
        if not path.is_file():
            stale.append(StaleFile(path, "missing"))
        elif path.read_bytes() != text.encode("utf-8"):
            stale.append(StaleFile(path, "differs"))
    stale.extend(StaleFile(path, "not produced by any template")
                 for path in _entries(out_dir) if path.name not in rendered and is_generated(path))
    return sorted(stale, key=lambda s: s.path.as_posix())


def foreign_files(rendered: Mapping[str, str], out_dir: Path) -> list[Path]:
    """Entries directly in ``out_dir`` that vitcg did not generate and no template writes: files without the
    header, symlinks, subfolders. ``vitcg generate`` never touches them; sorted."""
    return [p for p in _entries(out_dir) if p.name not in rendered and not is_generated(p)]


def _foreign_error(out_dir: Path, foreign: list[Path]) -> UsageError:
    names = [p.as_posix() + ("/" if p.is_dir() and not p.is_symlink() else "") for p in foreign]
    shown = ", ".join(names[:SHOWN_NAMES]) + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES
                                              else "")
    return UsageError(f"{out_dir.as_posix()} holds files vitcg did not generate: {shown}; pick another --out "
                      "folder, or pass --force to write there anyway (they are left alone)")


def generate(folders: Sequence[Path] | None = None, templates_dir: Path | None = None,
             out_dir: Path = Path("registry"), *, check: bool = False, force: bool = False) -> GenerateResult:
    """Render every template from the specs of ``folders`` and compare with ``out_dir``.

    ``folders`` are layered as the registry rule says (:class:`vitcg.lang.SpecSource`: a later folder's spec
    replaces an earlier one of the same name); default :func:`vitcg.lang.spec_folders`, the packaged specs
    then ``$VITCG_SPECS_DIR``. ``templates_dir`` defaults to :func:`packaged_templates_dir`.

    Without ``check``, stale files are rewritten (atomically) and generated files that no template produces
    any more are removed; with it, nothing is written. Only files directly in ``out_dir`` that carry
    :data:`HEADER` (:func:`has_header`) are ever removed. An ``out_dir`` holding other files (:func:`foreign_files`) is
    refused unless ``force``, and even then those files are left alone. Returns the result (``stale`` lists
    what was or is stale). Raises SpecError for invalid specs, RenderError for a template that fails,
    UsageError for missing folders, an ``out_dir`` that holds other files, or a file that cannot be written.
    """
    folders = spec_folders() if folders is None else list(folders)
    _check_folders(folders, out_dir)
    # Bindings (imports of transformers classes) are `vitcg validate`'s job; skipping them keeps this torch-free.
    specs = SpecSource(folders, bindings=False).require_valid()
    templates_dir = packaged_templates_dir() if templates_dir is None else templates_dir
    rendered = render_templates(build_context(specs, folders), templates_dir)
    result = GenerateResult(out_dir, len(specs), rendered, find_stale(rendered, out_dir),
                            foreign=foreign_files(rendered, out_dir))
    if check:
        return result
    if result.foreign and not force:
        raise _foreign_error(out_dir, result.foreign)
    if result.stale:
        make_folder(out_dir)
        for item in result.stale:
            _refresh(item, rendered, out_dir)
        result.written = True
    return result


def _check_folders(folders: Sequence[Path], out_dir: Path) -> None:
    """Raise UsageError for a specs folder that is not there or an output folder that is a file."""
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"no such specs folder: {folder}")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output folder {out_dir} is a file")


def _refresh(item: StaleFile, rendered: Mapping[str, str], out_dir: Path) -> None:
    """Bring one stale file up to date: removed when no template produces it any more, else rewritten."""
    if item.reason == "not produced by any template":
        try:
            item.path.unlink()
        except OSError as exc:
            raise UsageError(f"cannot remove {item.path}: {exc.strerror or exc}") from None
    else:
        write_text_atomic(item.path, rendered[item.path.relative_to(out_dir).as_posix()])

