"""No command writes onto its own input or onto a released artifact (issue 24 item 2).

``ldpfl inspect RUN --plot RUN/client_000.h5`` would replace a released client file by a PNG, and
``ldpfl predict EXPORT --out EXPORT/manifest.json`` the manifest by predictions; both used to exit 0.
:func:`check_write_target` refuses such a target before anything is computed, with one line naming the
option and what the target is. It refuses a target that

* is the same file as one of the command's inputs (``os.path.samefile``: hard and symbolic links too);
* is a file of a run directory (a directory holding ``manifest.json``): the manifest, the plan, the
  partition, a client file, a local-only file, a client CNN (``client_XXX.keras``);
* is a federation output (``model.pt``, ``checkpoint.pt``, ``metrics.json``, ``metrics.csv``,
  ``config.json``, ``accuracy.png``) beside a ``model.pt``, ``checkpoint.pt`` or ``metrics.json``, as
  ``ldpfl federate`` writes them (in ``RUN/federation/`` or its ``--out``).

A new file anywhere, or an existing file that is none of these, may be written (atomically, by
``ldpfl.contract.atomic``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from ldpfl.common.errors import ParameterError
from ldpfl.contract.layout import (
    CLIENT_FILE_RE,
    LOCAL_FILE_RE,
    MANIFEST_NAME,
    METRICS_JSON,
    PARTITION_FILE,
)
from ldpfl.contract.plan import PLAN_FILE

CLIENT_MODEL_RE = re.compile(r"^client_(\d{3,})\.keras$")
FEDERATION_OUTPUTS = ("model.pt", "checkpoint.pt", METRICS_JSON, "metrics.csv", "config.json", "accuracy.png")
"""What ``ldpfl federate`` writes (``stage2_federate.outputs.OUTPUT_NAMES``)."""
_FEDERATION_MARKS = ("model.pt", "checkpoint.pt", METRICS_JSON)


class WriteTargetError(ParameterError):
    """An output path that is an input of the command or an artifact of a run; nothing was written."""


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare the path as given
        return path.absolute()


def protected_artifact(target: str | os.PathLike[str]) -> str | None:
    """Return what ``target`` is when it is an artifact of a run (module docstring), else ``None``."""
    path = _resolved(Path(target))
    name, folder = path.name, path.parent
    if (folder / MANIFEST_NAME).is_file():
        if name == MANIFEST_NAME:
            return f"the manifest of run directory {folder}"
        if name == PLAN_FILE:
            return f"the plan of run directory {folder}"
        if name == PARTITION_FILE:
            return f"the partition of run directory {folder}"
        if CLIENT_FILE_RE.match(name):
            return f"a client file of run directory {folder}"
        if LOCAL_FILE_RE.match(name):
            return f"a local-only file of run directory {folder}"
        if CLIENT_MODEL_RE.match(name):
            return f"a client CNN of run directory {folder}"
    if name in FEDERATION_OUTPUTS and any((folder / mark).is_file() for mark in _FEDERATION_MARKS):
        return f"an output of the federation in {folder}"
    return None


def check_write_target(target: str | os.PathLike[str], option: str,
                       inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Refuse to write ``target`` when it is an input of the command or an artifact of a run.

    Parameters
    ----------
    target : path
        The file the command is about to write.
    option : str
        The parameter that named it (``plot``, ``out``), marked in the message so the CLI shows its flag.
    inputs : iterable of path or None
        The files and directories the command reads (``None`` entries are skipped). A directory input
        protects the files directly in it that :func:`protected_artifact` names, like any run directory.

    Raises
    ------
    WriteTargetError
        The one-line refusal; nothing has been written.
    """
    path = Path(target)
    if path.exists():
        for source in inputs:
            if source is None:
                continue
            try:
                same = os.path.samefile(path, source)
            except OSError:
                same = False
            if same:
                raise WriteTargetError(f"`{option}` {path} is an input of this command ({source}); writing there "
                                       "would overwrite it: choose another path")
    what = protected_artifact(path)
    if what is not None:
        raise WriteTargetError(f"`{option}` {path} is {what}; writing there would overwrite it: choose another "
                               "path")


__all__ = ["FEDERATION_OUTPUTS", "WriteTargetError", "check_write_target", "protected_artifact"]
