"""``manifest.json``: the finished client files of a run directory, with sha256, size and rows.

The writer lists complete files only and rewrites the manifest atomically (``ldpfl.contract.atomic``). No key
anywhere in it may name a seed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.client_reader import short_error
from ldpfl.contract.jsonout import json_default, refuse_seed_keys
from ldpfl.contract.layout import MANIFEST_NAME
from ldpfl.contract.names import name_problem
from ldpfl.contract.schema import SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS, FormatError, utc_now
from ldpfl.contract.small_files import MAX_SMALL_FILE_BYTES, SmallFileError, read_small_file

MANIFEST_SCHEMA = "ldpfl-manifest"
MAX_MANIFEST_BYTES = MAX_SMALL_FILE_BYTES
"""A manifest is read whole: the cap of plan.json (a 1 MiB manifest lists thousands of files)."""


RunInfo = Mapping[str, Any]
"""A manifest's run information as read (its JSON, every key but ``files``); its records are read from it by their
readers (``release_history``: :func:`ldpfl.contract.release_history.history_from_manifest`)."""


@dataclass(frozen=True)
class FileRecord:
    """One client file as the manifest lists it."""

    client_index: int
    path: str
    sha256: str
    bytes: int
    rows: Mapping[str, int]


@dataclass(frozen=True)
class Manifest:
    """A parsed ``manifest.json``: the run information (every key but ``files``) and the file list."""

    run_dir: Path
    info: RunInfo
    files: list[FileRecord]


def record_for(path: str | os.PathLike[str], client_index: int, sha256: str, rows: Mapping[str, int]) -> FileRecord:
    """Return the manifest entry of a committed file (its size is read from disk)."""
    path = Path(path)
    return FileRecord(client_index, path.name, sha256, path.stat().st_size, dict(rows))


def write_manifest(run_dir: str | os.PathLike[str], records: list[FileRecord], run_info: Mapping[str, Any]) -> Path:
    """Atomically and durably (re)write ``manifest.json`` listing ``records``.

    Parameters
    ----------
    run_dir : path
        The run directory.
    records : list of FileRecord
        The finished files (sorted by client index in the output).
    run_info : mapping
        Further keys (tool, config, privacy report, ...); must hold no key naming a seed.

    Returns
    -------
    Path
        The manifest's path.
    """
    refuse_seed_keys(run_info, "run_info")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "updated_utc": utc_now(),
        **dict(run_info),
        "files": [dataclasses.asdict(r) | {"rows": dict(r.rows)}
                  for r in sorted(records, key=lambda r: r.client_index)],
    }
    text = json.dumps(manifest, indent=2, sort_keys=True, default=json_default) + "\n"
    return atomic_write_text(Path(run_dir) / MANIFEST_NAME, text)


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``manifest.json`` of a run directory (``FormatError`` naming the problem)."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FormatError(path, "no manifest (is this an ldpfl export run directory?)")
    try:
        raw = read_small_file(path, "manifest", MAX_MANIFEST_BYTES)  # regular, at most 1 MiB (issue 24)
    except SmallFileError as error:
        raise FormatError(path, f"unreadable manifest ({str(error).removeprefix(f'{path}: ')})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(path, f"unreadable manifest ({short_error(error)})") from None
    except RecursionError:
        raise FormatError(path, "unreadable manifest (JSON nested too deeply)") from None
    if not isinstance(data, dict):
        raise FormatError(path, f"is a JSON {type(data).__name__}, not an object (not an ldpfl manifest)")
    if data.get("schema") != MANIFEST_SCHEMA:
        raise FormatError(path, f"attribute 'schema' is not {MANIFEST_SCHEMA!r}")
    if data.get("schema_version") not in SUPPORTED_SCHEMA_VERSIONS:
        raise FormatError(path, f"'schema_version' is {data.get('schema_version')!r}, expected one of "
                                f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}")
    try:
        files = [FileRecord(int(f["client_index"]), str(f["path"]), str(f["sha256"]), int(f["bytes"]),
                            {k: int(v) for k, v in f["rows"].items()}) for f in data.get("files", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise FormatError(path, f"malformed file entry ({short_error(error)})") from None
    for record in files:
        problem = name_problem(record.path)  # a name in the run directory, never a path (issue 24)
        if problem is not None:
            shown = record.path if len(record.path) <= 80 else record.path[:77] + "..."
            raise FormatError(path, f"file entry {shown!r} {problem} (it must name a file in the run directory)")
    info = {k: v for k, v in data.items() if k != "files"}
    return Manifest(Path(run_dir), info, files)
