"""What a personalization writes on the silo: ``model.pt`` and ``personalization.json`` in its own folder.

::

    RUN_DIR/personalized/client_000.clear/
      model.pt               the personalized model, in the global model's format; trained_on["personalization"]
                             marks its method and whether it is local-only (epsilon = inf if shipped)
      personalization.json   the method, its settings, the accountant (dp), the interpolation weight and the
                             table it was chosen from, the own held-out accuracies (kept on the silo)

The model's record never holds the own-record figures: a released (``dp``) model carries only what its release
covers. Both files are written atomically, the model first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.jsonout import json_ready
from ldpfl.stage2_federate.model_file import save_model

from .records import PersonalizeError

FOLDER = "personalized"
MODEL = "model.pt"
SUMMARY = "personalization.json"

__all__ = ["FOLDER", "MODEL", "SUMMARY", "check_out", "default_out", "read_summary", "write_outputs"]


def default_out(run_dir: str | Path, client_index: int, method: str) -> Path:
    """Return ``RUN_DIR/personalized/client_NNN.METHOD``."""
    return Path(run_dir) / FOLDER / f"client_{client_index:03d}.{method}"


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an output folder that holds a personalization already (without ``overwrite``), or a file.

    Raises
    ------
    PersonalizeError
        ``out`` is a file, or holds ``model.pt`` or ``personalization.json``.
    """
    if out.exists() and not out.is_dir():
        raise PersonalizeError(f"`out` {out} is a file, not a folder")
    present = [name for name in (MODEL, SUMMARY) if (out / name).exists()]
    if present and not overwrite:
        raise PersonalizeError(f"`out` {out} already holds {', '.join(present)}: pass `overwrite`, or another `out`")


def write_outputs(out: Path, model: Any, trained_on: Mapping[str, Any], summary: Mapping[str, Any]) -> tuple[Path,
                                                                                                          Path]:
    """Write the model and the summary into ``out`` (created); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    model_path = save_model(out / MODEL, model, trained_on)
    summary_path = atomic_write_text(out / SUMMARY, json.dumps(json_ready(dict(summary)), indent=2) + "\n")
    return model_path, summary_path


def read_summary(folder: str | Path) -> dict[str, Any]:
    """Read an earlier personalization's ``personalization.json`` (``resume``).

    Raises
    ------
    PersonalizeError
        No such file, or not a JSON object.
    """
    path = Path(folder) / SUMMARY
    return read_json_object(path, f"`resume` {folder} holds no {SUMMARY} (the folder of an earlier DP "
                                  "personalization)", f"`resume` {path}")


def read_json_object(path: Path, missing: str, label: str) -> dict[str, Any]:
    """Return the JSON object at ``path``; ``PersonalizeError`` saying ``missing``, or that ``label`` is not one."""
    if not path.is_file():
        raise PersonalizeError(missing)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PersonalizeError(f"{label} is not readable JSON ({error})") from None
    if not isinstance(data, dict):
        raise PersonalizeError(f"{label} is not a JSON object")
    return data
