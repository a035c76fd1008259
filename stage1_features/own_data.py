"""A user's own data in standard file formats, loaded into the ``Dataset`` that stage 1 exports.

``load_own_data(path, ...)`` reads one silo's records (issue 16: a hospital exports its own images or
table, never another silo's) with the ecosystem's readers and returns an :class:`OwnDataset`: the
``stage1_features.datasets.Dataset`` of the benchmark sets plus the class names. Formats, chosen by
the path (or ``data_format``):

* **image folder** (a directory): one subfolder per class holding PNG/JPEG (also BMP/GIF) files, as
  Keras' ``image_dataset_from_directory`` reads it; images are decoded by Pillow. Nested folders
  inside a class folder are searched too; hidden entries and other files are ignored, as Keras does.
  ``image_size=(height, width)`` resizes (Pillow, bilinear); without it every image must have the
  same size. ``color_mode`` ``grayscale`` (1 channel) or ``rgb`` (3 channels, alpha dropped); ``None``
  gives grayscale when every image is single-channel, else rgb.
* **NumPy** ``.npz``: the inputs under ``x_key`` and the labels under ``y_key``. Without them the
  keys ``x``, ``X``, ``images``, ``features`` (inputs) and ``y``, ``Y``, ``labels`` (labels) are
  looked for, and exactly one of each must be present. Object arrays are refused (no unpickling).
* **HDF5** ``.h5``/``.hdf5``: two datasets, found the same way (``x_key``/``y_key`` may be paths
  such as ``group/x``); read with h5py.
* **table** ``.csv`` / ``.csv.gz`` / ``.tsv`` (pandas) or ``.parquet`` (pandas with pyarrow): the
  labels in ``label_column`` (default: the one column of ``label``, ``labels``, ``y``, ``target``,
  ``class``); every other column is a feature and must be numeric (bool counts as 0/1).

Decisions:

* **Class order.** Integer labels (and whole-number floats, and bools as 0/1) are sorted numerically,
  string labels by Unicode code point (Python's ``sorted``), and image classes are the class folder
  names sorted the same way (Keras' order, which sorts the folder names as strings; a class folder
  without images is still a class, as in Keras). Class ``k`` of the dataset is the ``k``-th name of
  ``OwnDataset.class_names``; integer labels are named by their decimal text (``"0"``, ``"7"``).
  When ``classes`` is given (a shared plan's class list), it fixes the names and their order
  instead: each label, compared as text, must be one of them, and classes this silo lacks are fine.
* **Scaling** (``scale="auto"``), as the benchmark sets are scaled: ``uint8`` arrays and decoded
  images are pixels kept as ``uint8`` with ``pixel_scale = 1/255`` (``Dataset.features`` gives
  float32 in [0, 1]); tables are min-max scaled per column to [0, 1] as ``covtype`` (a constant
  column maps to 0); other numeric arrays are used as they are (float32), with a note when they leave
  [0, 1]. ``scale="minmax"`` min-max scales any input (per column for 2-D inputs, one range over all
  values for images and other arrays of 3 or more dimensions); ``scale="none"`` keeps values as they
  are. The ranges come from this silo's own records and are never written; a user who needs the
  preprocessing fixed before seeing the data (so that it is independent of any record, as the LDP
  definition assumes) scales the data beforehand and passes ``scale="none"``.
* Arrays of shape (N, H, W) are images with one channel: they become (N, H, W, 1), as MNIST does.

Every problem raises :class:`DataError` (a ``DatasetError``, so a ``ValueError``) whose one-line
message names the file and the problem; nothing is written by this module.

Imports numpy only; Pillow, pandas and h5py load inside the reader that needs them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mechanisms.base import ParameterError
from stage1_features.dataset_readers import DatasetError
from stage1_features.datasets import Dataset

IMAGE_FOLDER = "image-folder"
NPZ = "npz"
HDF5 = "hdf5"
CSV = "csv"
PARQUET = "parquet"
DATA_FORMATS = (IMAGE_FOLDER, NPZ, HDF5, CSV, PARQUET)
"""Formats ``load_own_data`` reads (``data_format``)."""

SUFFIXES = {".npz": NPZ, ".h5": HDF5, ".hdf5": HDF5, ".hdf": HDF5, ".csv": CSV, ".tsv": CSV, ".csv.gz": CSV,
            ".tsv.gz": CSV, ".parquet": PARQUET, ".pq": PARQUET}
"""File name endings and the format they stand for (a directory is an image folder)."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""Image files an image folder may hold (Keras' ``ALLOWLIST_FORMATS``), compared case-insensitively."""

COLOR_MODES = ("grayscale", "rgb")
SCALES = ("auto", "minmax", "none")

X_KEYS = ("x", "X", "images", "features")
"""Names looked for, in an ``.npz`` or HDF5 file, for the inputs when ``x_key`` is not given."""
Y_KEYS = ("y", "Y", "labels")
"""Names looked for the labels when ``y_key`` is not given."""
LABEL_COLUMNS = ("label", "labels", "y", "target", "class")
"""Column names looked for the labels of a table when ``label_column`` is not given."""

DEEP_MODES = ("I", "F")
"""Pillow modes of more than 8 bits per channel (also ``I;16*``): refused, since 8-bit conversion would clip."""

PIXEL_SCALE = 1 / 255
FINITE_CHECK_ROWS = 65_536  # rows per block when checking float inputs for NaN/inf (bounds the bool temporary)


class DataError(DatasetError, ParameterError):
    """A user's data file that cannot be used; the one-line message names the file and the problem.

    Options named in the message are marked as ```x_key``` (``ParameterError``), so the CLI shows them
    as its flags.

    Parameters
    ----------
    path : path
        The file or folder.
    problem : str
        What is wrong and, where it helps, what to do.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever a library's message held
        super().__init__(f"{path}: {self.problem}")


@dataclass(frozen=True, eq=False)
class OwnDataset(Dataset):
    """A ``Dataset`` read from the user's files, with the names of its classes.

    Attributes
    ----------
    class_names : tuple of str
        ``class_names[k]`` is the label value (as text) or class folder of class ``k``.
    data_format : str
        One of ``DATA_FORMATS``.
    path : str
        The file or folder read.
    scaling : str
        How the values were scaled, in words.
    notes : tuple of str
        Warnings worth showing to the user (e.g. values outside [0, 1]).
    """

    class_names: tuple[str, ...] = ()
    data_format: str = ""
    path: str = ""
    scaling: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes")

    @property
    def is_image(self) -> bool:
        """Return whether the samples are images (height, width, channels)."""
        return len(self.input_shape) == 3

    def label_counts(self) -> dict[str, int]:
        """Return the number of records of each class, by class name."""
        counts = np.bincount(self.y, minlength=self.num_classes)
        return {name: int(count) for name, count in zip(self.class_names, counts, strict=True)}


def default_extractor(dataset: Dataset) -> str:
    """Return the extractor ``auto`` stands for on a user's data: ``cifar-cnn`` for images, else ``none``.

    Images (height, width, channels) of at least 8×8 get the Fig. 4 net, the one LDPFL uses on every
    image set but MNIST (FMNIST, CIFAR-10, SVHN), which takes any size from 8×8 and any channel count;
    smaller images, tables and other arrays get ``none`` (the flattened raw inputs, as ``covtype``).
    """
    from stage1_features import cnn

    shape = tuple(dataset.input_shape)
    if len(shape) == 3 and min(shape[:2]) >= 8:
        return cnn.CIFAR_CNN
    return cnn.NO_EXTRACTOR


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return the format of ``path``: a directory is an image folder, a file is known by its name's ending.

    Raises
    ------
    DataError
        The path does not exist, or its ending is not one of ``SUFFIXES``.
    """
    path = Path(path)
    if path.is_dir():
        return IMAGE_FOLDER
    if not path.exists():
        raise DataError(path, "no such file or folder")
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):  # .csv.gz before .gz-less endings
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    raise DataError(path, f"unknown data format; expected a folder of class subfolders (images) or a file "
                          f"ending in {', '.join(SUFFIXES)}")


def load_own_data(path: str | os.PathLike[str], *, data_format: str | None = None, name: str | None = None,
                  x_key: str | None = None, y_key: str | None = None, label_column: str | None = None,
                  image_size: tuple[int, int] | None = None, color_mode: str | None = None,
                  classes: Sequence[str] | None = None, scale: str = "auto") -> OwnDataset:
    """Read a silo's records from ``path`` (see the module docstring for formats and decisions).

    Parameters
    ----------
    path : path
        An image folder, or an ``.npz``, HDF5, CSV/TSV or Parquet file.
    data_format : str, optional
        One of ``DATA_FORMATS``; default: from the path (:func:`detect_format`).
    name : str, optional
        The dataset name written to the files; default: the file or folder name without its ending.
    x_key, y_key : str, optional
        The arrays (``.npz``) or datasets (HDF5) of the inputs and the labels.
    label_column : str, optional
        The label column of a table.
    image_size : (int, int), optional
        (height, width) every image is resized to (image folders only).
    color_mode : {"grayscale", "rgb"}, optional
        Channels of the decoded images (image folders only); default: see the module docstring.
    classes : sequence of str, optional
        The class names and their order (a shared plan's); default: the sorted labels found.
    scale : {"auto", "minmax", "none"}
        How the values are scaled (module docstring).

    Returns
    -------
    OwnDataset
        The records, labels ``0 .. len(class_names) - 1`` and the class names.

    Raises
    ------
    DataError
        Unreadable or inconsistent input; the message names the file and the problem.
    ValueError
        An option that does not apply to the format or has a wrong value.
    """
    path = Path(path)
    fmt = detect_format(path) if data_format is None else data_format
    if fmt not in DATA_FORMATS:
        raise ValueError(f"data_format must be one of {', '.join(DATA_FORMATS)}, got {fmt!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if color_mode is not None and color_mode not in COLOR_MODES:
        raise ValueError(f"color_mode must be one of {', '.join(COLOR_MODES)}, got {color_mode!r}")
    size = _image_size(image_size)
    if fmt != IMAGE_FOLDER and (size is not None or color_mode is not None):
        raise ParameterError(f"`image_size` and `color_mode` apply to image folders only; {path} is {fmt}")
    if fmt not in (NPZ, HDF5) and (x_key is not None or y_key is not None):
        raise ParameterError(f"`x_key` and `y_key` apply to .npz and HDF5 files only; {path} is {fmt}")
    if fmt not in (CSV, PARQUET) and label_column is not None:
        raise ParameterError(f"`label_column` applies to tables (CSV, Parquet) only; {path} is {fmt}")
    wanted = _class_list(classes)
    if not path.exists():
        raise DataError(path, "no such file or folder")
    if fmt == IMAGE_FOLDER:
        if not path.is_dir():
            raise DataError(path, "an image folder must be a directory of class subfolders")
        x, y, class_names, source = _read_image_folder(path, size, color_mode, wanted)
        x_is_pixels = True
    else:
        if not path.is_file():
            raise DataError(path, f"expected a {fmt} file, found a directory")
        if fmt in (CSV, PARQUET):
            x, labels, source = _read_table(path, fmt, label_column)
            x_is_pixels = False
        else:
            reader = _read_npz if fmt == NPZ else _read_hdf5
            x, labels, source = reader(path, x_key, y_key)
            x = _sample_shape(path, x)
            x_is_pixels = x.dtype == np.uint8
        if x.shape[0] != labels.shape[0]:
            raise DataError(path, f"{x.shape[0]} inputs but {labels.shape[0]} labels")
        y, class_names = encode_labels(labels, path, wanted)
    if len(y) == 0:
        raise DataError(path, "holds no records")
    present = np.unique(y)
    if present.size < 2:
        only = class_names[int(present[0])]
        raise DataError(path, f"holds records of one class only ({only!r}); a classifier needs at least two")
    x, pixel_scale, scaling, notes = _scale(path, x, scale, x_is_pixels, table=fmt in (CSV, PARQUET))
    dataset_name = name if name is not None else default_name(path)
    return OwnDataset(dataset_name, x, y, len(class_names), tuple(x.shape[1:]), source, pixel_scale,
                      class_names=class_names, data_format=fmt, path=str(path), scaling=scaling, notes=notes)


# ---------------------------------------------------------------------------------------------------
# Options


def _image_size(image_size: Any) -> tuple[int, int] | None:
    if image_size is None:
        return None
    try:
        height, width = image_size
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (height, width), got {image_size!r}") from None
    for value in (height, width):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= 16384:
            raise ValueError(f"image_size must be two integers in [1, 16384], got {image_size!r}")
    return int(height), int(width)


def _class_list(classes: Sequence[str] | None) -> tuple[str, ...] | None:
    if classes is None:
        return None
    if isinstance(classes, str) or not all(isinstance(c, str) and c for c in classes):
        raise ValueError(f"classes must be a sequence of non-empty strings, got {classes!r}")
    names = tuple(classes)
    if len(set(names)) != len(names):
        raise ValueError(f"classes must not repeat a name, got {list(names)}")
    if len(names) < 2:
        raise ValueError(f"classes must name at least two classes, got {list(names)}")
    return names


def default_name(path: str | os.PathLike[str]) -> str:
    """Return the dataset name of a file or folder by default: its name without a known ending."""
    path = Path(path)
    name = path.name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or name
    return name


# ---------------------------------------------------------------------------------------------------
# Labels


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
    if kind in "iu":
        return values.astype(np.int64)
    if kind == "f":
        finite = np.isfinite(values)
        if not finite.all():
            raise DataError(path, f"{int((~finite).sum())} label(s) are missing or not finite (NaN/inf)")
        whole = values == np.round(values)
        if not whole.all():
            raise DataError(path, f"labels must be integers or text; found {values[~whole][0]!r}")
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


# ---------------------------------------------------------------------------------------------------
# Arrays (.npz, HDF5)


def _pick_key(path: Path, keys: Iterable[str], given: str | None, candidates: tuple[str, ...], what: str,
              option: str) -> str:
    keys = list(keys)
    if given is not None:
        if given not in keys:
            raise DataError(path, f"has no array {given!r} (`{option}`); it holds {_listed(keys)}")
        return given
    found = [k for k in candidates if k in keys]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(path, f"has none of {', '.join(map(repr, candidates))} for the {what}; it holds "
                              f"{_listed(keys)}: pass `{option}`")
    raise DataError(path, f"holds several arrays that could be the {what} ({', '.join(map(repr, found))}): "
                          f"pass `{option}`")


def _listed(keys: Sequence[str]) -> str:
    if not keys:
        return "nothing"
    shown = ", ".join(repr(k) for k in keys[:10])
    return shown + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")


def _read_npz(path: Path, x_key: str | None, y_key: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    import zipfile

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
        try:
            x, y = archive[xk], archive[yk]
        except ValueError as error:  # object arrays refused by allow_pickle=False
            raise DataError(path, f"arrays {xk!r}/{yk!r} are not numeric arrays ({error})") from None
        except (OSError, EOFError, zipfile.BadZipFile) as error:
            raise DataError(path, f"is not a readable .npz file ({type(error).__name__}: {error})") from None
    return x, y, f"NumPy archive {path} (inputs {xk!r}, labels {yk!r})"


def _read_hdf5(path: Path, x_key: str | None, y_key: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise DataError(path, f"is not a readable HDF5 file ({error})") from None
    with handle:
        if handle.attrs.get("schema") in ("ldpfl-features", b"ldpfl-features"):
            raise DataError(path, "is an ldpfl feature file (the output of an export), not input data")
        names: list[str] = []
        handle.visititems(lambda key, obj: names.append(key) if isinstance(obj, h5py.Dataset) else None)
        xk = _pick_key(path, names, x_key, X_KEYS, "inputs", "x_key")
        yk = _pick_key(path, names, y_key, Y_KEYS, "labels", "y_key")
        if xk == yk:
            raise DataError(path, f"the inputs and the labels are the same dataset {xk!r}")
        try:
            x = handle[xk][()]
            ydata = handle[yk]
            y = ydata.asstr()[()] if h5py.check_string_dtype(ydata.dtype) is not None else ydata[()]
        except (OSError, TypeError, ValueError) as error:
            raise DataError(path, f"cannot read its datasets {xk!r}/{yk!r} ({error})") from None
    return np.asarray(x), np.asarray(y), f"HDF5 file {path} (inputs {xk!r}, labels {yk!r})"


def _sample_shape(path: Path, x: np.ndarray) -> np.ndarray:
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


# ---------------------------------------------------------------------------------------------------
# Tables (CSV, Parquet)


def _read_table(path: Path, fmt: str, label_column: str | None) -> tuple[np.ndarray, np.ndarray, str]:
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
                                  f"`label_column` (columns: {_listed(columns)})")
        label_column = found[0]
    elif label_column not in columns:
        raise DataError(path, f"has no label column {label_column!r}; columns: {_listed(columns)}")
    features = [c for c in columns if c != label_column]
    if not features:
        raise DataError(path, f"has no feature columns besides the label column {label_column!r}")
    numeric = pd.api.types.is_numeric_dtype
    text = [c for c in features if not numeric(table[c].dtype)]
    if text:
        raise DataError(path, f"feature column(s) {_listed(text)} are not numeric; encode them as numbers "
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
        raise DataError(path, f"feature column(s) with missing values (NaN): {_listed(bad)}")
    x = table[features].to_numpy(dtype=np.float64)
    return x, y, f"{'Parquet' if fmt == PARQUET else 'CSV'} table {path} (labels {label_column!r}, " \
                 f"{len(features)} feature columns)"


# ---------------------------------------------------------------------------------------------------
# Image folders (Pillow)


def _image_files(folder: Path) -> list[Path]:
    """Image files under a class folder, recursively, sorted; hidden entries skipped."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root) / f for f in sorted(files)
                     if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES))
    return found


def _read_image_folder(folder: Path, size: tuple[int, int] | None, color_mode: str | None,
                       classes: tuple[str, ...] | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], str]:
    from PIL import Image, UnidentifiedImageError

    subfolders = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subfolders:
        loose = [p.name for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_SUFFIXES)]
        hint = " (its images must sit in one subfolder per class)" if loose else ""
        raise DataError(folder, f"holds no class subfolders{hint}")
    if classes is not None:
        unknown = [s for s in subfolders if s not in classes]
        if unknown:
            raise DataError(folder, f"class folder(s) {_listed(unknown)} not among the plan's classes "
                                    f"({', '.join(classes)})")
    names = classes if classes is not None else tuple(subfolders)
    files: list[Path] = []
    labels: list[np.ndarray] = []
    for name in subfolders:
        found = _image_files(folder / name)
        files.extend(found)
        labels.append(np.full(len(found), names.index(name), dtype=np.int64))
    if not files:
        raise DataError(folder, f"holds no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders "
                                f"{_listed(subfolders)}")
    resample = Image.Resampling.BILINEAR
    arrays: list[np.ndarray] = []
    first_size: tuple[tuple[int, int], Path] | None = None
    for file in files:
        try:
            with Image.open(file) as image:
                image.load()
                if image.mode in DEEP_MODES or image.mode.startswith("I;16"):
                    raise DataError(file, f"is a {image.mode} image (more than 8 bits per channel); convert "
                                          "it to 8-bit PNG/JPEG")
                mode = _pixel_mode(image, color_mode)
                decoded = image.convert(mode) if image.mode != mode else image
                if size is not None:
                    if decoded.size != (size[1], size[0]):
                        decoded = decoded.resize((size[1], size[0]), resample)
                elif first_size is None:
                    first_size = (decoded.size, file)
                elif decoded.size != first_size[0]:
                    (w0, h0), file0 = first_size
                    w1, h1 = decoded.size
                    raise DataError(folder, f"images have different sizes ({file0.relative_to(folder)} is "
                                            f"{h0}x{w0}, {file.relative_to(folder)} is {h1}x{w1}); pass "
                                            "`image_size`")
                arrays.append(np.asarray(decoded, dtype=np.uint8))
        except DataError:
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as error:
            raise DataError(file, f"unreadable image ({type(error).__name__}: {error})") from None
    channels = {a.ndim for a in arrays}
    if color_mode is None and channels == {2, 3}:  # mixed: grey images join the colour ones as R = G = B
        arrays = [np.repeat(a[..., np.newaxis], 3, axis=-1) if a.ndim == 2 else a for a in arrays]
    x = np.stack(arrays)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    y = np.concatenate(labels)
    h, w, c = x.shape[1:]
    resized = f", resized to {h}x{w}" if size is not None else ""
    source = (f"image folder {folder} ({len(files)} images in {len(subfolders)} class folders, "
              f"{'grayscale' if c == 1 else 'rgb'}{resized})")
    return x, y, names, source


def _pixel_mode(image: Any, color_mode: str | None) -> str:
    """Return the Pillow mode an image is converted to: ``L`` (grayscale) or ``RGB``."""
    if color_mode == "grayscale":
        return "L"
    if color_mode == "rgb":
        return "RGB"
    return "L" if image.getbands() in (("L",), ("1",), ("L", "A")) else "RGB"


# ---------------------------------------------------------------------------------------------------
# Values


def _check_finite(path: Path, x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        return
    flat = x.reshape(x.shape[0], -1)
    for start in range(0, flat.shape[0], FINITE_CHECK_ROWS):
        block = flat[start:start + FINITE_CHECK_ROWS]
        bad = ~np.isfinite(block)
        if bad.any():
            row = start + int(np.flatnonzero(bad.any(axis=1))[0])
            raise DataError(path, f"inputs hold NaN or infinite values (first in record {row}); "
                                  "fill or drop them before the export")


def _scale(path: Path, x: np.ndarray, scale: str, x_is_pixels: bool,
           table: bool) -> tuple[np.ndarray, float | None, str, tuple[str, ...]]:
    """Scale ``x`` as ``scale`` says; return (x, pixel_scale, description, notes)."""
    _check_finite(path, x)
    if scale == "auto" and x_is_pixels and x.dtype == np.uint8:
        return x, PIXEL_SCALE, "8-bit pixels / 255", ()
    if scale == "minmax" or (scale == "auto" and table):
        values = x.astype(np.float64, copy=False)
        if values.ndim == 2:
            low, high = values.min(axis=0), values.max(axis=0)
            how = "min-max per column over this silo's records"
        else:
            low, high = values.min(), values.max()
            how = "min-max over all values of this silo's records"
        span = np.where(high > low, high - low, 1.0)
        scaled = ((values - low) / span).astype(np.float32)
        np.clip(scaled, 0.0, 1.0, out=scaled)
        return scaled, None, how, ()
    out = np.asarray(x, dtype=np.float32)
    notes: tuple[str, ...] = ()
    if out.size:
        low, high = float(out.min()), float(out.max())
        if low < 0.0 or high > 1.0:
            notes = (f"{path}: input values span [{low:.6g}, {high:.6g}], not [0, 1] as the benchmark sets; "
                     "scale them beforehand or use min-max scaling (scale=minmax) if that is not intended",)
    return out, None, "as given (float32)", notes
