"""Where specs come from: the folder shipped inside the package, then the user's folders, in override order.

The rule, one place for every caller (``vitcg.accelerate``, every command): the packaged specs
(``vitcg/specs/``, installed with the package) come first; then each entry of ``$VITCG_SPECS_DIR``
(``os.pathsep``-separated, in order); then the folders the caller passes (``specs=`` of ``vitcg.accelerate``,
``--specs DIR`` of the commands, in order). A spec in a later folder replaces the spec of the same ``name``
from an earlier one (:class:`vitcg.lang.SpecSource` logs it at INFO, naming both files); two specs of one name
inside one folder stay an error naming both files.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import UsageError

log = logging.getLogger(__name__)
_WARNED: set[str] = set()
"""Entries of ``$VITCG_SPECS_DIR`` already logged as skipped."""

ENV_VAR = "VITCG_SPECS_DIR"
"""Environment variable naming user spec folders, ``os.pathsep``-separated; they come after the packaged specs."""


def packaged_folder(name: str) -> Path:
    """The folder ``name`` shipped inside the vitcg package (``specs``, ``templates``) as a directory on disk.

    A regular or editable install gives a real directory. Raises UsageError when it is not one (vitcg
    imported from a zip archive, or a build that left the folder out)."""
    folder = importlib.resources.files("vitcg") / name
    if not isinstance(folder, Path) or not folder.is_dir():
        raise UsageError(f"vitcg's packaged {name}/ folder is not a directory on disk ({folder}); install vitcg "
                         "from a wheel or a checkout (pip install vitcg), not from a zip archive")
    return folder


def packaged_specs_dir() -> Path:
    """The specs shipped with vitcg (``vitcg/specs/``). Raises UsageError as :func:`packaged_folder`."""
    return packaged_folder("specs")


def environment_folders(*, skip_missing: bool = False) -> list[Path]:
    """The entries of ``$VITCG_SPECS_DIR`` in order, empty entries skipped. Raises UsageError for an entry that is
    not a folder: a typo there would otherwise silently drop the user's specs. With ``skip_missing`` (a host
    loading specs, where the user's folder must not stop the model), such an entry is skipped instead, logged at
    WARNING once per process (a host loads specs for each model it builds)."""
    folders = []
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if not entry:
            continue
        if not Path(entry).is_dir():
            message = f"${ENV_VAR} names {entry!r}, which is not a folder"
            if not skip_missing:
                raise UsageError(message)
            if entry not in _WARNED:
                _WARNED.add(entry)
                log.warning("%s: its specs are skipped", message)
            continue
        folders.append(Path(entry))
    return folders


def spec_folders(extra: Iterable[str | Path] = (), *, skip_missing: bool = False) -> list[Path]:
    """The registry's folders in override order: :func:`packaged_specs_dir`, then :func:`environment_folders`
    (``skip_missing`` goes to it), then ``extra`` (the caller's folders). A folder named twice keeps its later
    place, where it wins. Raises UsageError as those two functions do."""
    folders = [packaged_specs_dir(), *environment_folders(skip_missing=skip_missing), *map(Path, extra)]
    keys = [_key(f) for f in folders]
    return [f for i, f in enumerate(folders) if _key(f) not in keys[i + 1:]]


def _key(folder: Path) -> Path:
    try:
        return folder.resolve()
    except OSError:
        return folder.absolute()


def folder_label(folder: str | Path) -> str:
    """How messages name a folder: ``vitcg/specs/`` for the packaged one (its site-packages path says little),
    else the path as given with a trailing slash (a file as given)."""
    path = Path(folder)
    try:
        packaged = path.resolve() == packaged_specs_dir().resolve()
    except (OSError, UsageError):
        packaged = False
    if packaged:
        return "vitcg/specs/"
    return f"{path}/" if path.is_dir() else str(path)
