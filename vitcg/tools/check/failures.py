"""Why model code failed under a step of ``vitcg check``: the step, the place in the model's code, and the spec field
most likely at fault, in one wording for both stages (the spec stage, :mod:`.cases`; the end-to-end stage,
:mod:`.vlm`).

A wrong spec makes transformers fail deep in its own code (``mat1 and mat2 shapes cannot be multiplied``, an
embedding's ``index out of range in self``), where the bare exception names neither the spec nor the model. Each
step wraps what it runs in :func:`step`, which re-raises such an exception as :class:`StepFailed`: ``STEP failed:
Type: message at modeling_x.py:LINE in FUNCTION; check FIELD``. vitcg's own errors already say where to look and
pass through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ...errors import UsageError, VitcgError

MAX_MESSAGE = 1000
"""An exception's message is kept whole up to this many characters (its lines joined): a transformers validator
says which validator on its first line and why on the next (``Class validation error for validator
'validate_architecture':`` then ``ValueError: The hidden size (64) is not a multiple of ...``), so a first line
alone says nothing. Longer messages (a tensor printed whole) are cut, ending in ``...``."""
MAX_CHAIN = 5
"""Causes followed from an exception to the one its message wraps (a validator's error wraps the ``ValueError`` the
config's own ``validate_architecture`` raised)."""
MAX_IDS = 5
"""Out-of-vocabulary token ids named by an embedding failure; more are counted."""


class StepFailed(VitcgError):
    """Model or processor code failed inside a step of ``vitcg check``; the message names the step, the place and
    the spec field to check."""


def describe(exc: BaseException) -> str:
    """``Type: message``, the message whole on one line (at most :data:`MAX_MESSAGE` characters); a
    :class:`StepFailed` is its own message, and vitcg's own errors keep their lines (a list of diagnostics); an
    exception without a message says where it was raised."""
    if isinstance(exc, StepFailed):
        return str(exc)
    if isinstance(exc, VitcgError) and str(exc).strip():
        return f"{type(exc).__name__}: {str(exc).strip()}"
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if not text:
        frames = traceback.extract_tb(exc.__traceback__)
        raised = f" at {frame(frames[-1])}" if frames else ""
        return f"{type(exc).__name__} (no message) raised{raised}"
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE - 3].rsplit(" ", 1)[0] + "..."
    return f"{type(exc).__name__}: {text}"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    chain = [exc]
    while len(chain) < MAX_CHAIN:
        cause = chain[-1].__cause__ or chain[-1].__context__
        if cause is None or cause in chain:
            break
        chain.append(cause)
    return chain


def where(exc: BaseException) -> str:
    """`` at FILE:LINE in FUNCTION`` of the innermost frame of the model's code (a file of ``transformers.models``)
    that ``exc``, or an exception it wraps, passed through: where the spec meets the model. The frame that raised
    it follows when it lies elsewhere (torch, a helper). Empty without a traceback."""
    import transformers.models

    models = os.path.dirname(os.path.abspath(transformers.models.__file__)) + os.sep
    raised, model = None, None
    for link in _chain(exc):
        frames = _frames(link)
        if not frames:
            continue
        raised = raised or frames[-1]
        model = _innermost_in(frames, models) or model
    if raised is None:
        return ""
    if model is None:
        return f" at {frame(raised)}"
    return f" at {frame(model)}" + ("" if model == raised else f" (raised at {frame(raised)})")


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback, outermost first, without a torch function mode's: vitcg's host-sync
    guard re-raises what the kernel raised, which is not a place to look."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [f for f in frames if f.name != "__torch_function__"] or frames


def _innermost_in(frames: list[traceback.FrameSummary], folder: str) -> traceback.FrameSummary | None:
    """The innermost of ``frames`` whose file lies under ``folder``; None when none does."""
    return next((f for f in reversed(frames) if os.path.abspath(f.filename).startswith(folder)), None)


def frame(summary: traceback.FrameSummary) -> str:
    """``FILE:LINE in FUNCTION``, the file's name without its folder."""
    return f"{os.path.basename(summary.filename)}:{summary.lineno} in {summary.name}"


def token_fields(config: Any) -> dict[str, int]:
    """The integer token-id fields of a VLM ``config`` and its sub-configs (``image_token_id``,
    ``text_config.eos_token_id``...), dotted name -> value."""
    fields: dict[str, int] = {}

    def walk(value: Any, prefix: str, depth: int) -> None:
        for name, field in vars(value).items():
            if hasattr(field, "to_dict") and depth < 2:
                walk(field, f"{prefix}{name}.", depth + 1)
            elif (isinstance(field, int) and not isinstance(field, bool)
                  and re.search(r"(token_id|token_index|_id)$", name)):
                fields[prefix + name] = field
    if config is not None:
        walk(config, "", 0)
    return fields


def embedding_overflow(exc: BaseException, config: Any = None) -> str | None:
    """What an ``IndexError: index out of range in self`` from an embedding lookup read: the token ids at or above
    the embedding's vocabulary size and the ``config`` fields (:func:`token_fields`) holding them, or None when
    ``exc`` is no such failure."""
    if not isinstance(exc, IndexError) or "index out of range" not in str(exc):
        return None
    lookup = _embedding_frame(exc.__traceback__)
    if lookup is None:
        return None
    ids, weight = lookup.f_locals.get("input"), lookup.f_locals.get("weight")
    try:
        size = int(weight.shape[0])
        wrong = sorted({int(i) for i in ids.flatten().tolist() if int(i) >= size})
    except (AttributeError, TypeError, ValueError, IndexError):
        return None
    if not wrong:
        return None
    shown = ", ".join(map(str, wrong[:MAX_IDS])) + (f" and {len(wrong) - MAX_IDS} more" if len(wrong) > MAX_IDS else "")
    named = [f"{name} = {value}" for name, value in token_fields(config).items() if value in wrong]
    held = f" ({', '.join(named)})" if named else ""
    return f"token ids >= the embedding's vocabulary size {size}: {shown}{held}"


def _embedding_frame(tb: TracebackType | None) -> Any:
    """The innermost frame of ``torch.nn.functional.embedding`` in ``tb``, or None."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "embedding" and code.co_filename.endswith(os.path.join("nn", "functional.py")):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


SHAPES = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
MISSING_ARGUMENT = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)$", re.MULTILINE)
"""Python's message for a call without a required argument (``forward() missing 1 required positional argument:
'grid_thw'``): the call was given too few arguments, whatever the step would otherwise suspect."""


def _refined(exc: BaseException, likely: str, config: Any, vocabulary: str, widths: str | None) -> tuple[str, str]:
    """``(what was wrong, what to check)`` for failures whose cause the message itself tells: an embedding lookup
    of token ids past the vocabulary (``vocabulary``: the spec fields that set it), a call missing a required
    argument (the spec's arguments), a matrix product whose rows are narrower or wider than its weight takes
    (``widths``: the spec fields that shape the rows, where the step knows them). Otherwise no detail and
    ``likely``."""
    overflow = embedding_overflow(exc, config)
    if overflow:
        return f": {overflow}", vocabulary
    missing = MISSING_ARGUMENT.search(str(exc)) if isinstance(exc, TypeError) else None
    if missing:
        return "", (f"encoder.args (the eager call) and the buffers' arg (the captured call): the call misses "
                    f"{missing.group(1)}")
    shapes = SHAPES.search(str(exc))
    if shapes and shapes.group(2) != shapes.group(3):
        return f": the rows reaching this layer are {shapes.group(2)} wide, its weight takes {shapes.group(3)}", \
            widths or likely
    return "", likely


@contextlib.contextmanager
def step(what: str, likely: str, *, config: Any = None, widths: str | None = None,
         vocabulary: str = "tests.vlm.placeholder and tests.vlm.config (text_config.vocab_size and the token ids: "
                           "the tiny vocabulary must hold every id the prompt uses)") -> Iterator[None]:
    """Model code failing inside the block raises :class:`StepFailed`: ``WHAT failed: Type: message at FILE:LINE in
    FUNCTION; check LIKELY``. ``config``: the model config whose token-id fields an embedding failure names;
    ``vocabulary``: the spec fields to check then; ``widths``: the spec fields to check when a layer gets rows of
    the wrong width. vitcg's own errors pass through unchanged."""
    try:
        yield
    except (VitcgError, UsageError):
        raise
    except Exception as exc:  # noqa: BLE001 - the model and processor code may fail in any way
        detail, check = _refined(exc, likely, config, vocabulary, widths)
        raise StepFailed(f"{what} failed: {describe(exc)}{where(exc)}{detail}; check {check}") from None
