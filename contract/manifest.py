"""``manifest.json``: the finished client files of a run directory, with sha256, size, rows and label counts.

The writer lists complete files only and rewrites the manifest atomically (``ldpfl.contract.atomic``). No key
anywhere in it may name a seed.

Each entry carries its file's per-split label counts (``label_histograms``, issue 42 item 3), so that a coordinator
holding the manifest alone (a Flower SuperLink) can check the histogram a silo claims for DP-FedAW's weights. They
are the numbers the file's own ``label_histograms`` attribute holds, counts of the released labels: the manifest
repeats what the file already releases, and nothing new leaves the silo. A manifest written before them lists
none: its entries read with ``label_histograms`` None, and their claims go unchecked (bounded instead).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py

from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.client_reader import short_error
from ldpfl.contract.jsonout import json_default, refuse_seed_keys
from ldpfl.contract.layout import MANIFEST_NAME
from ldpfl.contract.names import name_problem
from ldpfl.contract.schema import (
    SCHEMA_VERSION,
    SPLITS,
    SUPPORTED_SCHEMA_VERSIONS,
    ClientMetadata,
    FormatError,
    utc_now,
)
from ldpfl.contract.small_files import MAX_SMALL_FILE_BYTES, SmallFileError, read_small_file

MANIFEST_SCHEMA = "ldpfl-manifest"
MAX_MANIFEST_BYTES = MAX_SMALL_FILE_BYTES
"""A manifest is read whole: the cap of plan.json (a 1 MiB manifest lists thousands of files)."""


RunInfo = Mapping[str, Any]
"""A manifest's run information as read (its JSON, every key but ``files``); its records are read from it by their
readers (``release_history``: :func:`ldpfl.contract.release_history.history_from_manifest`)."""


LabelHistograms = Mapping[str, list[int]]
"""Per-split label counts, as a client file's ``label_histograms`` attribute holds them (``{"train": [...], ...}``)."""


@dataclass(frozen=True)
class FileRecord:
    """One client file as the manifest lists it.

    ``label_histograms``: the file's per-split label counts (its attribute's, see the module docstring); None in a
    manifest written before they were listed.
    """

    client_index: int
    path: str
    sha256: str
    bytes: int
    rows: Mapping[str, int]
    label_histograms: LabelHistograms | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the entry as ``manifest.json`` lists it (no ``label_histograms`` key when there are none)."""
        entry = dataclasses.asdict(self) | {"rows": dict(self.rows)}
        if self.label_histograms is None:
            del entry["label_histograms"]
        else:
            entry["label_histograms"] = {s: list(h) for s, h in self.label_histograms.items()}
        return entry


@dataclass(frozen=True)
class Manifest:
    """A parsed ``manifest.json``: the run information (every key but ``files``) and the file list."""

    run_dir: Path
    info: RunInfo
    files: list[FileRecord]


def record_for(path: str | os.PathLike[str], client_index: int, sha256: str, rows: Mapping[str, int]) -> FileRecord:
    """Return the manifest entry of a committed file (its size and its label counts are read from it)."""
    path = Path(path)
    return FileRecord(client_index, path.name, sha256, path.stat().st_size, dict(rows), file_label_histograms(path))


def file_label_histograms(path: str | os.PathLike[str]) -> dict[str, list[int]] | None:
    """Return the label counts a client file's ``label_histograms`` attribute states; None if it cannot be read.

    The attribute is read as every reader reads it (``ClientMetadata.from_attrs``); a file that is not a valid
    client file has no counts to list (its entry then claims none, and the validator refuses the file itself).
    """
    if not Path(path).is_file():
        return None  # h5py would block on a FIFO (issue 24)
    try:
        with h5py.File(path, "r") as handle:
            metadata = ClientMetadata.from_attrs(handle.attrs, path)
    except (OSError, FormatError, KeyError, ValueError, TypeError):
        return None
    return histograms_of(metadata.label_histograms)


def histograms_of(histograms: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Return ``histograms`` (a file's attribute or a manifest's entry) as plain ints, by split."""
    return {str(split): [int(c) for c in counts] for split, counts in histograms.items()}


def with_label_histograms(record: FileRecord, histograms: Mapping[str, Sequence[int]]) -> FileRecord:
    """Return ``record`` listing ``histograms`` (a file's attribute), e.g. for an entry of an older manifest."""
    return dataclasses.replace(record, label_histograms=histograms_of(histograms))


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
        "files": [r.to_json() for r in sorted(records, key=lambda r: r.client_index)],
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
                            {k: int(v) for k, v in f["rows"].items()}, _read_histograms(f.get("label_histograms")))
                 for f in data.get("files", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise FormatError(path, f"malformed file entry ({short_error(error)})") from None
    for record in files:
        problem = name_problem(record.path)  # a name in the run directory, never a path (issue 24)
        if problem is not None:
            shown = record.path if len(record.path) <= 80 else record.path[:77] + "..."
            raise FormatError(path, f"file entry {shown!r} {problem} (it must name a file in the run directory)")
    info = {k: v for k, v in data.items() if k != "files"}
    return Manifest(Path(run_dir), info, files)


def _read_histograms(value: Any) -> dict[str, list[int]] | None:
    """Return a manifest entry's ``label_histograms`` (absent: None); ``ValueError`` when not counts per split."""
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= set(SPLITS):
        raise ValueError(f"'label_histograms' is not an object of per-split counts ({', '.join(SPLITS)})")
    out = {}
    for split, counts in value.items():
        if not isinstance(counts, list) or not all(type(c) is int and c >= 0 for c in counts):
            raise ValueError(f"'label_histograms' of split {split!r} is not a list of counts >= 0")
        out[split] = list(counts)
    return out
