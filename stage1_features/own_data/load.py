"""A user's own data in standard file formats, loaded into the ``Dataset`` that stage 1 exports.

``load_own_data(path, ...)`` reads one silo's records (issue 16: a hospital exports its own images or
table, never another silo's) with the ecosystem's readers and returns an :class:`OwnDataset`: the
``ldpfl.stage1_features.datasets.loaders.Dataset`` of the benchmark sets plus the class names. Formats, chosen by
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

The readers live in one module per family of this package: ``images`` (image folders), ``arrays``
(``.npz``, HDF5), ``tables`` (CSV, Parquet); ``labels`` maps label values to classes.
They import numpy only; Pillow, pandas and h5py load inside the reader that needs them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.stage1_features.datasets.loaders import Dataset
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.own_data.arrays import read_hdf5, read_npz, sample_shape
from ldpfl.stage1_features.own_data.errors import DataError
from ldpfl.stage1_features.own_data.formats import (
    COLOR_MODES,
    CSV,
    DATA_FORMATS,
    HDF5,
    IMAGE_FOLDER,
    NPZ,
    PARQUET,
    SCALES,
    SUFFIXES,
)
from ldpfl.stage1_features.own_data.images import read_image_folder
from ldpfl.stage1_features.own_data.labels import encode_labels
from ldpfl.stage1_features.own_data.limits import require_regular
from ldpfl.stage1_features.own_data.tables import read_table

PIXEL_SCALE = 1 / 255
FINITE_CHECK_ROWS = 65_536  # rows per block when checking float inputs for NaN/inf (bounds the bool temporary)


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
        x, y, class_names, source = read_image_folder(path, size, color_mode, wanted)
        x_is_pixels = True
    else:
        if path.is_dir():
            raise DataError(path, f"expected a {fmt} file, found a directory")

        require_regular(path)  # a FIFO or a device would block or never end (issue 24)
        if fmt in (CSV, PARQUET):
            x, labels, source = read_table(path, fmt, label_column)
            x_is_pixels = False
        else:
            reader = read_npz if fmt == NPZ else read_hdf5
            x, labels, source = reader(path, x_key, y_key)
            x = sample_shape(path, x)
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
        with np.errstate(over="ignore", invalid="ignore"):
            width = np.asarray(high - low)
        if not np.all(np.isfinite(width)):
            column = int(np.flatnonzero(~np.isfinite(width.reshape(-1)))[0])
            where = f"column {column}" if values.ndim == 2 else "the values"
            lo, hi = (float(np.asarray(v).reshape(-1)[column]) for v in (low, high))
            raise DataError(path, f"min-max scaling cannot scale {where}: its range [{lo:.6g}, {hi:.6g}] is wider than "
                                  "the largest float64 (high - low overflows); rescale those values (e.g. divide "
                                  "them by a power of ten) before the export")
        span = np.where(high > low, width, 1.0)
        scaled = ((values - low) / span).astype(np.float32)
        np.clip(scaled, 0.0, 1.0, out=scaled)
        return scaled, None, how, ()
    with np.errstate(over="ignore"):
        out = np.asarray(x, dtype=np.float32)
    if out.size and not np.all(np.isfinite(out)):
        raise DataError(path, f"input values beyond float32's range (±{float(np.finfo(np.float32).max):.4g}) cannot "
                              "be used as given; scale them beforehand or use min-max scaling (scale=minmax)")
    notes: tuple[str, ...] = ()
    if out.size:
        low, high = float(out.min()), float(out.max())
        if low < 0.0 or high > 1.0:
            notes = (f"{path}: input values span [{low:.6g}, {high:.6g}], not [0, 1] as the benchmark sets; "
                     "scale them beforehand or use min-max scaling (scale=minmax) if that is not intended",)
    return out, None, "as given (float32)", notes
