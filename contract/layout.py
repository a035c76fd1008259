"""The names inside a run directory, defined once.

::

    RUN_DIR/
      manifest.json            the finished client files with their sha256 (``ldpfl.contract.manifest``)
      client_000.h5 ...        one HDF5 file per client (``ldpfl.contract.schema``)
      partition.npz            ldpfl export: each client's rows of the pooled dataset
      client_000.local.h5 ...  ldpfl export --keep-clean-test: UNRANDOMIZED test records, local only
      federation/metrics.json  ldpfl federate: config, privacy and metrics per round

Names that start with ``.`` are temporary files or locks; readers ignore them.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST_NAME = "manifest.json"
PARTITION_FILE = "partition.npz"
FEDERATION_DIR = "federation"
METRICS_JSON = "metrics.json"
METRICS_PATH = Path(FEDERATION_DIR) / METRICS_JSON
"""``federation/metrics.json``, relative to the run directory."""

CLIENT_FILE_SUFFIX = ".h5"
CLIENT_FILE_RE = re.compile(r"^client_(\d{3,})\.h5$")
"""A client file's name: ``client_`` and at least three digits (the client index), then ``.h5``."""
LOCAL_FILE_SUFFIX = ".local.h5"
LOCAL_FILE_RE = re.compile(r"^client_(\d{3,})\.local\.h5$")
"""A local-only file (``ldpfl export --keep-clean-test``): the client's UNRANDOMIZED test records, never shared;
not a client file of the run (the validator and the manifest's ``files`` leave it out)."""


def client_file_name(index: int) -> str:
    """Return the file name of client ``index``: ``client_000.h5``, ``client_001.h5``, ..."""
    return f"client_{index:03d}{CLIENT_FILE_SUFFIX}"


def client_stem(index: int) -> str:
    """Return ``client_XXX``: the stem shared by a client's files (``.h5``, ``.keras``)."""
    return client_file_name(index).removesuffix(CLIENT_FILE_SUFFIX)


def local_file_name(index: int) -> str:
    """Return the name of client ``index``'s local-only file: ``client_000.local.h5``."""
    return client_stem(index) + LOCAL_FILE_SUFFIX


def is_local_file(name: str) -> bool:
    """Return whether ``name`` is a local-only file name (``client_NNN.local.h5``)."""
    return LOCAL_FILE_RE.match(name) is not None


def client_index_from_name(name: str) -> int | None:
    """Return the client index that a file name states, or ``None`` when it is no client file name."""
    match = CLIENT_FILE_RE.match(name)
    return int(match.group(1)) if match else None


def client_files(run_dir: str | Path) -> dict[int, Path]:
    """Return the client files present in ``run_dir`` under their final names, by client index."""
    return {index: path for path in Path(run_dir).iterdir()
            if (index := client_index_from_name(path.name)) is not None}


def is_hidden(name: str) -> bool:
    """Return whether ``name`` is a temporary file or a lock (it starts with ``.``)."""
    return name.startswith(".")
