"""The silo's own clean records for personalization: its training and held-out splits, read on the silo. Torch-free.

Personalization trains on the records the silo holds in clear, never on a randomized release:

* a local-only client file (``ldpfl export --local-only``: clean features and true labels) is read itself;
* for a randomized (or released-statistics) client file, the silo's local-only clean file ``client_NNN.local.h5``
  beside it, when that file holds training records matching the client file's feature space;
* else (:class:`NoCleanRecords`: ``ldpfl export --keep-clean-test`` keeps only the test records, and a ``stats:K``
  file holds synthetic rows) the job reruns the silo's export pipeline on its own data (``ldpfl.silo``: extractor,
  release point, a ``stats:K`` release's projection and clipping, encoding, no mechanism) and hands the clean
  rows to :func:`from_rows`. That is the app's work (it composes stage 1); without the data the job is refused,
  saying what is needed.

The interpolation weight is chosen by cross-fitting over the training records (:func:`fold_assignment`: each
record is scored by an alone model trained without its fold); the held-out test split is used for the own-record
evaluation alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import client_file_name, client_files, local_file_name
from ldpfl.contract.released_statistics import is_statistics_file
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms.base import PACKED_BITS, require_generator

__all__ = ["NoCleanRecords", "OwnRecords", "PersonalizeError", "fold_assignment", "from_rows", "own_records"]


class PersonalizeError(ParameterError):
    """Inputs personalization cannot use (a ``ValueError``: the CLI's exit code 2, one line; nothing written)."""


class NoCleanRecords(PersonalizeError):
    """A randomized or ``stats:K`` client file without a clean local file holding training records beside it."""


@dataclass(frozen=True)
class OwnRecords:
    """A silo's clean records as stored (float32 rows or packed bits) and its client file's identity."""

    client_index: int
    client_file: Path
    source: Path | str  # the file the rows came from, or how they were rebuilt
    metadata: ClientMetadata
    file_sha256: str
    train_features: np.ndarray
    train_labels: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray

    @property
    def packed(self) -> bool:
        """Return whether the rows are packed bits (unpacked in torch before the model)."""
        return self.metadata.feature_format == PACKED_BITS

    @property
    def width(self) -> int:
        """Return the model's input width."""
        return self.metadata.feature_width


_MATCHED = ("dataset", "release", "num_classes", "feature_width", "feature_format", "client_index")


def own_records(run_dir: str | Path, client_index: int) -> OwnRecords:
    """Read client ``client_index``'s clean training and test records from ``run_dir`` (module docstring).

    Raises
    ------
    PersonalizeError
        No such directory or client file, a randomized file without a matching clean local file holding training
        records, or no training records.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PersonalizeError(f"{run_dir} is not a directory (the silo's export run directory)")
    files = client_files(run_dir)
    if client_index not in files:
        present = ", ".join(str(i) for i in sorted(files)) or "none"
        raise PersonalizeError(f"{run_dir} has no {client_file_name(client_index)} (client files there: {present}); "
                               "check `client_index`")
    path = files[client_index]
    with open_client_file(path) as (_handle, meta, _rows):
        pass
    source = path
    if not meta.local_only:
        source = run_dir / local_file_name(client_index)
        what = f"released statistics ({meta.release})" if is_statistics_file(meta) else "a randomized release"
        needed = (f"{path.name} holds {what} (mechanism {meta.mechanism!r}); personalization trains "
                  f"on the silo's clean records: it needs the silo's local-only clean file {source.name} with its "
                  "training records (export the silo's clean features with `local_only`), or its data to rebuild "
                  "them")
        if not source.is_file():
            raise NoCleanRecords(f"{needed}; there is none in {run_dir}")
    data = read_client_file(source)
    clean = data.metadata
    if source != path:
        wrong = [f"{key} is {getattr(clean, key)!r}, the client file's {getattr(meta, key)!r}" for key in _MATCHED
                 if getattr(clean, key) != getattr(meta, key)]
        if not clean.local_only:
            wrong.insert(0, "it is not marked local_only")
        if wrong:
            raise PersonalizeError(f"{source} is not the clean version of {path.name}: {'; '.join(wrong)}")
        if not len(data.labels["train"]):
            raise NoCleanRecords(f"{needed}; {source.name} holds test records only (ldpfl export "
                                 "--keep-clean-test)")
    if not len(data.labels["train"]):
        raise PersonalizeError(f"{source} holds no training records to personalize on")
    return OwnRecords(client_index, path, source, meta, sha256_file(path),
                      np.ascontiguousarray(data.features["train"]), np.asarray(data.labels["train"], np.int64),
                      np.ascontiguousarray(data.features["test"]), np.asarray(data.labels["test"], np.int64))


def from_rows(run_dir: str | Path, client_index: int, train: tuple[np.ndarray, np.ndarray],
              test: tuple[np.ndarray, np.ndarray], source: str) -> OwnRecords:
    """Return the silo's records from clean rows it rebuilt (``source`` says how), checked against its client file.

    Raises
    ------
    PersonalizeError
        No such client file, rows of another width or format than the file's, or no training row.
    """
    path = client_files(Path(run_dir)).get(client_index)
    if path is None:
        raise PersonalizeError(f"{run_dir} has no {client_file_name(client_index)}; check `client_index`")
    with open_client_file(path) as (_handle, meta, _rows):
        pass
    packed = meta.feature_format == PACKED_BITS
    width = (meta.feature_width + 7) // 8 if packed else meta.feature_width
    for name, (features, labels) in (("training", train), ("test", test)):
        if features.ndim != 2 or features.shape[1] != width or len(features) != len(labels) or (
                features.dtype != (np.uint8 if packed else np.float32)):
            raise PersonalizeError(f"the silo's rebuilt {name} rows ({features.dtype}, {features.shape}) are not "
                                   f"{path.name}'s ({meta.feature_format}, width {meta.feature_width})")
    if not len(train[1]):
        raise PersonalizeError(f"{source} holds no training records to personalize on")
    return OwnRecords(client_index, path, source, meta, sha256_file(path), np.ascontiguousarray(train[0]),
                      np.asarray(train[1], np.int64), np.ascontiguousarray(test[0]), np.asarray(test[1], np.int64))


def fold_assignment(records: int, folds: int, rng: np.random.Generator) -> np.ndarray:
    """Return each training record's fold in 0..folds-1: a random permutation dealt in turn (sizes differ by ≤ 1).

    Raises
    ------
    PersonalizeError
        Fewer than two records, or fewer than two folds.
    """
    require_generator(rng)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise PersonalizeError(f"`folds` must be an integer >= 2, got {folds!r}")
    if records < 2:
        raise PersonalizeError(f"choosing on held-out folds needs at least 2 training records, got {records}")
    fold = np.empty(records, dtype=np.int64)
    fold[rng.permutation(records)] = np.arange(records) % min(folds, records)
    return fold
