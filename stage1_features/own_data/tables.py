"""Reader of a user's table: CSV/TSV (pandas) or Parquet (pandas with pyarrow) (``ldpfl.stage1_features.own_data``).

The labels are in ``label_column`` (default: the one column named as in ``LABEL_COLUMNS``); every other
column is a feature and must be numeric (bool counts as 0/1). pandas loads on first use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ldpfl.stage1_features.own_data.errors import DataError, listed
from ldpfl.stage1_features.own_data.formats import CSV, PARQUET

LABEL_COLUMNS = ("label", "labels", "y", "target", "class")
"""Column names looked for the labels of a table when ``label_column`` is not given."""


def read_table(path: Path, fmt: str, label_column: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Read a CSV/TSV (``fmt`` ``csv``) or Parquet table: the feature columns as float64, and the labels.

    Returns
    -------
    (np.ndarray, np.ndarray, str)
        The inputs, the labels and a description of the source.

    Raises
    ------
    DataError
        Unreadable table, no or several label columns, non-numeric or missing feature values.
    """
    import pandas as pd

    try:
        if fmt == PARQUET:
            table = pd.read_parquet(path)
        else:
            sep = "\t" if ".tsv" in path.name.lower() else ","
            table = pd.read_csv(path, sep=sep)
    except ImportError as error:
        raise DataError(path, f"reading Parquet needs pyarrow (pip install pyarrow): {error}") from None
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise DataError(path, f"is not a readable {fmt.upper() if fmt == CSV else 'Parquet'} table "
                              f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None
    columns = [str(c) for c in table.columns]
    table.columns = columns
    if len(set(columns)) != len(columns):
        raise DataError(path, "has repeated column names")
    if label_column is None:
        found = [c for c in LABEL_COLUMNS if c in columns]
        if len(found) != 1:
            problem = "has no column" if not found else "has several columns"
            raise DataError(path, f"{problem} named {' / '.join(LABEL_COLUMNS)} for the labels; pass "
                                  f"`label_column` (columns: {listed(columns)})")
        label_column = found[0]
    elif label_column not in columns:
        raise DataError(path, f"has no label column {label_column!r}; columns: {listed(columns)}")
    features = [c for c in columns if c != label_column]
    if not features:
        raise DataError(path, f"has no feature columns besides the label column {label_column!r}")
    numeric = pd.api.types.is_numeric_dtype
    text = [c for c in features if not numeric(table[c].dtype)]
    if text:
        raise DataError(path, f"feature column(s) {listed(text)} are not numeric; encode them as numbers "
                              "or drop them")
    labels = table[label_column]
    if labels.isna().any():
        raise DataError(path, f"label column {label_column!r} has {int(labels.isna().sum())} missing value(s)")
    if numeric(labels.dtype) and not pd.api.types.is_bool_dtype(labels.dtype):
        y = labels.to_numpy(dtype=np.float64 if labels.dtype.kind == "f" else np.int64)
    elif pd.api.types.is_bool_dtype(labels.dtype):
        y = labels.to_numpy(dtype=bool)
    else:
        y = labels.astype(str).to_numpy(dtype=str)
    missing = table[features].isna().sum()
    if missing.any():
        bad = [f"{c} ({int(n)})" for c, n in missing.items() if n]
        raise DataError(path, f"feature column(s) with missing values (NaN): {listed(bad)}")
    x = table[features].to_numpy(dtype=np.float64)
    return x, y, f"{'Parquet' if fmt == PARQUET else 'CSV'} table {path} (labels {label_column!r}, " \
                 f"{len(features)} feature columns)"
