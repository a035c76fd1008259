"""What an export keeps beside its client files for later runs: the partition and the saved CNNs' names.

``partition.npz`` holds each client's rows of the pooled dataset and its hold-out split (IV-C); a resumed export
reads it back, and ``--from-models`` reuses it with the CNNs saved as ``client_XXX.keras``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.atomic import atomic_path
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import PARTITION_FILE, client_stem
from ldpfl.stage1_features.export.errors import ExportError

MODEL_SUFFIX = ".keras"
MODEL_FILE_RE = re.compile(r"^client_(\d{3,})\.keras$")
START_OVER = "start over with `overwrite`"


def model_file_name(index: int) -> str:
    """Return ``client_XXX.keras``, next to ``client_XXX.h5`` (``save_models=True``)."""
    return client_stem(index) + MODEL_SUFFIX


HOLDOUT_KEYS = ("_train", "_test")


def save_partition(run_dir: Path, clients: list[np.ndarray],
                   holdouts: list[tuple[np.ndarray, np.ndarray]] | None = None) -> str:
    """Write ``partition.npz`` atomically and return its sha256.

    ``client_000`` … hold each client's int64 row indices in the pool; with ``holdouts``,
    ``client_000_train`` / ``client_000_test`` … hold each client's hold-out split (IV-C), in the row order
    of its file (``--from-models`` reuses them).
    """
    arrays: dict[str, Any] = {client_stem(i): np.asarray(c, dtype=np.int64) for i, c in enumerate(clients)}
    for i, parts in enumerate(holdouts or ()):
        arrays |= {client_stem(i) + key: np.asarray(part, dtype=np.int64) for key, part in zip(HOLDOUT_KEYS, parts,
                                                                                                strict=True)}
    with atomic_path(run_dir / PARTITION_FILE) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
        digest = sha256_file(tmp)
    return digest


def load_holdouts(run_dir: Path, count: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Return each client's stored (train, test) rows, or None when ``partition.npz`` has none (older runs)."""
    path = run_dir / PARTITION_FILE
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = [[client_stem(i) + key for key in HOLDOUT_KEYS] for i in range(count)]
            if not all(key in data.files for pair in keys for key in pair):
                return None
            return [(np.asarray(data[a], dtype=np.int64), np.asarray(data[b], dtype=np.int64)) for a, b in keys]
    except (OSError, ValueError) as error:
        raise ExportError(f"{path} is unreadable ({error})") from None


def load_partition(run_dir: Path, count: int, pool_size: int, sha256: str | None) -> list[np.ndarray]:
    """Read back ``partition.npz`` and check it against the manifest and the dataset."""
    path = run_dir / PARTITION_FILE
    if not path.is_file():
        raise ExportError(f"{path} is missing, so the run cannot be resumed with the same partition; {START_OVER}")
    if sha256 is not None and sha256_file(path) != sha256:
        raise ExportError(f"{path} does not match the manifest's sha256; {START_OVER}")
    try:
        with np.load(path, allow_pickle=False) as data:
            clients = [np.asarray(data[client_stem(i)], dtype=np.int64) for i in range(count)]
    except (OSError, KeyError, ValueError) as error:
        raise ExportError(f"{path} is unreadable ({error}); {START_OVER}") from None
    joined = np.concatenate(clients) if clients else np.empty(0, dtype=np.int64)
    if joined.size and (joined.min() < 0 or joined.max() >= pool_size or np.unique(joined).size != joined.size):
        raise ExportError(f"{path} does not describe disjoint clients of a {pool_size}-record pool; {START_OVER}")
    return clients
