"""Label values of a user's data to classes ``0 .. K-1`` (``ldpfl.stage1_features.own_data``'s class order).

Integer labels (and whole-number floats up to 2^53 in magnitude, and bools as 0/1) are sorted numerically,
string labels by Unicode code point; a fixed class list (a shared plan's) sets the names and their order
instead. A float label beyond 2^53, or an unsigned one beyond the int64 range, is refused: it is no exact
integer, and distinct labels could merge into one class (issue 24).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from ldpfl.stage1_features.own_data.errors import DataError

MAX_EXACT_FLOAT = 2.0**53
"""The largest magnitude up to which every integer is a float64 (IEEE 754: a 53-bit significand)."""


def encode_labels(labels: np.ndarray, path: str | os.PathLike[str],
                  classes: Sequence[str] | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map label values to classes ``0 .. K-1`` in the documented order (module docstring).

    Parameters
    ----------
    labels : np.ndarray
        One label per record: integers, whole-number floats, bools or strings.
    path : path
        The file, named in errors.
    classes : sequence of str, optional
        Fixed class names and order; each label (as text) must be one of them.

    Returns
    -------
    (np.ndarray, tuple of str)
        int64 labels and the class names.

    Raises
    ------
    DataError
        Labels of another shape or type, missing (NaN/None) or fractional values, or a label that is
        not in ``classes``.
    """
    values = np.asarray(labels)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise DataError(path, f"labels must be one value per record, got shape {values.shape}")
    values = _label_values(values, path)
    unique, inverse = np.unique(values, return_inverse=True)  # numeric order for numbers, code points for text
    found = tuple(str(v) for v in unique.tolist())
    if classes is None:
        return inverse.astype(np.int64).reshape(-1), found
    index = {name: k for k, name in enumerate(classes)}
    unknown = [v for v in found if v not in index]
    if unknown:
        shown = ", ".join(repr(v) for v in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise DataError(path, f"label(s) {shown} not among the plan's classes ({', '.join(classes)})")
    mapping = np.array([index[v] for v in found], dtype=np.int64)
    return mapping[inverse.reshape(-1)], tuple(classes)


def _label_values(values: np.ndarray, path: str | os.PathLike[str]) -> np.ndarray:
    """Labels as an int64 or a str array (bools as 0/1, whole floats as ints, bytes decoded)."""
    kind = values.dtype.kind
    if kind == "b":
        return values.astype(np.int64)
    if kind == "u" and values.size and int(values.max()) > np.iinfo(np.int64).max:
        raise DataError(path, f"label {int(values.max())} exceeds the int64 range; store the labels as text")
    if kind in "iu":
        return values.astype(np.int64)
    if kind == "f":
        finite = np.isfinite(values)
        if not finite.all():
            raise DataError(path, f"{int((~finite).sum())} label(s) are missing or not finite (NaN/inf)")
        whole = values == np.round(values)
        if not whole.all():
            raise DataError(path, f"labels must be integers or text; found {values[~whole][0]!r}")
        inexact = np.abs(values) > MAX_EXACT_FLOAT  # beyond 2^53 a float is no exact integer label (issue 24)
        if inexact.any():
            raise DataError(path, f"label {values[inexact][0]!r} is a float beyond 2^53, where floats are no longer "
                                  "exact integers (distinct labels could merge); store the labels as integers or "
                                  "text")
        return values.astype(np.int64)
    if kind == "S":
        try:
            return np.char.decode(values, "utf-8").astype(str)
        except UnicodeDecodeError:
            raise DataError(path, "labels are bytes that are not UTF-8 text") from None
    if kind == "U":
        return values
    if kind == "O":
        items = values.tolist()
        if all(isinstance(v, bytes) for v in items):
            return _label_values(np.array(items, dtype=bytes), path)
        if all(isinstance(v, str) for v in items):
            return np.array(items, dtype=str)
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items):
            return np.array(items, dtype=np.int64)
        missing = sum(1 for v in items if v is None or (isinstance(v, float) and math.isnan(v)))
        if missing:
            raise DataError(path, f"{missing} label(s) are missing")
        raise DataError(path, "labels mix types; use integers or text")
    raise DataError(path, f"labels have dtype {values.dtype}; use integers or text")
