"""Readers of a user's arrays: NumPy ``.npz`` archives and HDF5 files (``ldpfl.stage1_features.own_data``).

The inputs and the labels are found under ``x_key``/``y_key``, or else under the one name of ``X_KEYS`` /
``Y_KEYS`` the file holds. Object arrays are refused (no unpickling); h5py loads on first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ldpfl.stage1_features.own_data.errors import DataError, listed
from ldpfl.stage1_features.own_data.limits import (
    check_hdf5_dataset,
    check_hdf5_file,
    check_npz_members,
    require_regular,
)

X_KEYS = ("x", "X", "images", "features")
"""Names looked for, in an ``.npz`` or HDF5 file, for the inputs when ``x_key`` is not given."""
Y_KEYS = ("y", "Y", "labels")
"""Names looked for the labels when ``y_key`` is not given."""


def _pick_key(path: Path, keys: Iterable[str], given: str | None, candidates: tuple[str, ...], what: str,
              option: str) -> str:
    keys = list(keys)
    if given is not None:
        if given not in keys:
            raise DataError(path, f"has no array {given!r} (`{option}`); it holds {listed(keys)}")
        return given
    found = [k for k in candidates if k in keys]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(path, f"has none of {', '.join(map(repr, candidates))} for the {what}; it holds "
                              f"{listed(keys)}: pass `{option}`")
    raise DataError(path, f"holds several arrays that could be the {what} ({', '.join(map(repr, found))}): "
                          f"pass `{option}`")


def read_npz(path: Path, x_key: str | None, y_key: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Read the inputs and the labels of an ``.npz`` archive (no pickled objects).

    Returns
    -------
    (np.ndarray, np.ndarray, str)
        The inputs, the labels and a description of the source.

    Raises
    ------
    DataError
        Unreadable file, missing or ambiguous keys, object arrays.
    """
    import zipfile

    require_regular(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except ValueError as error:  # a pickled file refused by allow_pickle=False, a malformed header
        raise DataError(path, f"is not a readable .npz of numeric arrays ({error})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as error:
        raise DataError(path, f"is not a readable .npz file ({type(error).__name__}: {error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(path, "is a single .npy array, not an .npz archive of named arrays")
    with archive:
        keys = list(archive.files)
        xk = _pick_key(path, keys, x_key, X_KEYS, "inputs", "x_key")
        yk = _pick_key(path, keys, y_key, Y_KEYS, "labels", "y_key")
        if xk == yk:
            raise DataError(path, f"the inputs and the labels are the same array {xk!r}")
        check_npz_members(path, [xk, yk])  # declared shapes and zip sizes before a byte is decoded (issue 24)
        try:
            x, y = archive[xk], archive[yk]
        except ValueError as error:  # object arrays refused by allow_pickle=False
            raise DataError(path, f"arrays {xk!r}/{yk!r} are not numeric arrays ({error})") from None
        except (OSError, EOFError, zipfile.BadZipFile) as error:
            raise DataError(path, f"is not a readable .npz file ({type(error).__name__}: {error})") from None
    return x, y, f"NumPy archive {path} (inputs {xk!r}, labels {yk!r})"


def read_hdf5(path: Path, x_key: str | None, y_key: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Read the inputs and the labels of an HDF5 file (``x_key``/``y_key`` may be paths such as ``group/x``).

    Returns
    -------
    (np.ndarray, np.ndarray, str)
        The inputs, the labels and a description of the source.

    Raises
    ------
    DataError
        Unreadable file, an ldpfl feature file, missing or ambiguous datasets.
    """
    import h5py

    require_regular(path)
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise DataError(path, f"is not a readable HDF5 file ({error})") from None
    with handle:
        if handle.attrs.get("schema") in ("ldpfl-features", b"ldpfl-features"):
            raise DataError(path, "is an ldpfl feature file (the output of an export), not input data")
        check_hdf5_file(path, handle)  # no external links; storage, virtual datasets and sizes below (issue 24)
        names: list[str] = []
        handle.visititems(lambda key, obj: names.append(key) if isinstance(obj, h5py.Dataset) else None)
        xk = _pick_key(path, names, x_key, X_KEYS, "inputs", "x_key")
        yk = _pick_key(path, names, y_key, Y_KEYS, "labels", "y_key")
        if xk == yk:
            raise DataError(path, f"the inputs and the labels are the same dataset {xk!r}")
        for key in (xk, yk):
            check_hdf5_dataset(path, key, handle[key])
        try:
            x = handle[xk][()]
            ydata = handle[yk]
            y = ydata.asstr()[()] if h5py.check_string_dtype(ydata.dtype) is not None else ydata[()]
        except (OSError, TypeError, ValueError) as error:
            raise DataError(path, f"cannot read its datasets {xk!r}/{yk!r} ({error})") from None
    return np.asarray(x), np.asarray(y), f"HDF5 file {path} (inputs {xk!r}, labels {yk!r})"


def sample_shape(path: Path, x: np.ndarray) -> np.ndarray:
    """Check the inputs' dtype and rank; (N, H, W) images get a channel axis."""
    if x.dtype.kind not in "biuf":
        raise DataError(path, f"inputs have dtype {x.dtype}; expected numbers")
    if x.ndim < 2:
        raise DataError(path, f"inputs must have a record axis and at least one feature axis, got shape {x.shape}")
    if x.ndim == 3:
        x = x[..., np.newaxis]
    if x.dtype.kind == "b":
        x = x.astype(np.float32)
    return x
