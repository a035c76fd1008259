"""A silo's local-only clean test file (``client_NNN.local.h5``), read and matched to its client file. Torch-free.

``ldpfl export --keep-clean-test`` writes one beside each client file: the same records and release as the
client's test split, UNRANDOMIZED (mechanism ``none``, attribute ``local_only``); for a ``stats:K`` release, whose
shared file holds no test rows, the silo's clean test records projected and clipped as its statistics were.
Evaluating a model on them is what a silo does when it predicts on its own records, which releases nothing (issue
17 item 4). Both the round loop (``data.load_clean_test``, in torch) and the closed-form head (``closed_form``, in
numpy) read them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import local_file_name
from ldpfl.contract.released_statistics import is_statistics_file
from ldpfl.contract.schema import ClientMetadata, FormatError

MISSING = ("missing: --eval-clean needs the local-only clean test file of every client "
           "(ldpfl export --keep-clean-test)")


@dataclass(frozen=True)
class CleanTest:
    """A client's clean test records as stored (float32 rows, or packed bits) and their int64 labels."""

    features: np.ndarray
    labels: np.ndarray
    metadata: ClientMetadata


def clean_file_path(client_path: Path, index: int) -> Path:
    """Return the local-only clean test file of client ``index`` (beside its client file)."""
    return Path(client_path).parent / local_file_name(index)


def read_clean_test(client_path: Path, index: int, own: ClientMetadata, test_rows: int) -> CleanTest:
    """Return client ``index``'s clean test split, checked against its client file (``own``, ``test_rows``).

    The file must validate, be local-only, and match the client file: dataset, release, index, classes, width,
    format and, except for a ``stats:K`` release (whose shared file holds no test rows), the test split's rows.

    Raises
    ------
    FormatError
        No such file, or a file that does not match (the message says which attributes).
    """
    path = clean_file_path(client_path, index)
    if not path.is_file():
        raise FormatError(path, MISSING)
    clean = read_client_file(path, splits=("test",))
    meta = clean.metadata
    expected = {"local_only": True, "dataset": own.dataset, "release": own.release, "client_index": index,
                "num_classes": own.num_classes, "feature_width": own.feature_width,
                "feature_format": own.feature_format}
    found = {"local_only": meta.local_only, "dataset": meta.dataset, "release": meta.release,
             "client_index": meta.client_index, "num_classes": meta.num_classes,
             "feature_width": meta.feature_width, "feature_format": meta.feature_format}
    wrong = [f"{k} is {found[k]!r}, expected {v!r}" for k, v in expected.items() if found[k] != v]
    if len(clean.labels["test"]) != test_rows and not is_statistics_file(own):  # stats:K: no test rows
        wrong.append(f"it holds {len(clean.labels['test'])} test rows, the client file {test_rows}")
    if wrong:
        raise FormatError(path, f"does not match {Path(client_path).name}: {'; '.join(wrong)}")
    return CleanTest(np.ascontiguousarray(clean.features["test"]),
                     np.ascontiguousarray(clean.labels["test"], dtype=np.int64), meta)


__all__ = ["MISSING", "CleanTest", "clean_file_path", "read_clean_test"]
