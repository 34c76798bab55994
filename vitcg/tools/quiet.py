"""Warnings that transformers and torch emit while a spec is checked, kept for its report instead of printed.

A check builds dozens of tiny models; their libraries warn about missing optional kernels, deprecated
generation arguments and config defaults (`causal_conv1d_fn is falling back ...`). Printed as they come, they
interleave with the results of every spec; kept, ``vitcg check`` shows them beside the spec that raised them
when it fails, or with ``--verbose``. Two channels are caught: Python's ``warnings`` (torch's ``TORCH_WARN``
arrives there too) and the ``transformers`` logger (its ``logger.warning`` and ``warning_once``).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


class _ToList(logging.Handler):
    """Appends each record to the list ``warnings.catch_warnings(record=True)`` fills, so both channels keep
    the order in which they spoke."""

    def __init__(self, caught: list) -> None:
        super().__init__()
        self.caught = caught

    def emit(self, record: logging.LogRecord) -> None:
        self.caught.append(record)


def _line(entry: warnings.WarningMessage | logging.LogRecord) -> str:
    if isinstance(entry, logging.LogRecord):
        return f"[{entry.name.split('.')[0]}] {entry.getMessage()}"
    return f"{entry.category.__name__}: {entry.message} ({Path(entry.filename).name}:{entry.lineno})"


class Kept:
    """What :func:`kept_warnings` caught, filled as the block runs."""

    def __init__(self, caught: list) -> None:
        self._caught = caught

    def lines(self) -> list[str]:
        """One line per distinct warning, in the order first seen; a repeated one ends in ``(Nx)``."""
        counts = Counter(_line(entry).strip() for entry in self._caught)
        return [text if n == 1 else f"{text} ({n}x)" for text, n in counts.items()]


@contextlib.contextmanager
def kept_warnings() -> Iterator[Kept]:
    """Within the block, Python warnings (every occurrence: the filter is ``always``, so a warning already
    shown for an earlier spec is kept for this one too) and the ``transformers`` logger's records at its
    level are kept, not printed. The logger's handlers and the warning filters are restored on exit."""
    from transformers.utils import logging as hf_logging

    library = hf_logging.get_logger()  # the library's root logger, configured with its stderr handler
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handlers, propagate = library.handlers[:], library.propagate
        for handler in handlers:
            library.removeHandler(handler)
        kept = _ToList(caught)
        library.addHandler(kept)
        library.propagate = False
        try:
            yield Kept(caught)
        finally:
            library.removeHandler(kept)
            for handler in handlers:
                library.addHandler(handler)
            library.propagate = propagate
