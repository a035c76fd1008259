"""Write small dataset files in the real on-disk formats, for tests.

Each ``write_*`` function draws its pixels and labels from the ``rng`` passed in, writes the files the
loader of ``ldpfl.stage1_features.datasets`` expects into ``directory`` (created if needed) and returns a
``GeneratedData`` whose ``x`` and ``y`` are what ``load_dataset`` must give back (train rows first,
then test rows, labels already mapped to 0..C-1).

    from dataset_files import write_idx_dataset
    data = write_idx_dataset(tmp_path, 20, 5, rng=np.random.default_rng(0))
    ds = load_dataset("mnist", tmp_path)
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IDX_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


@dataclass(frozen=True)
class GeneratedData:
    """What a loader must return for the files just written, and the files themselves."""

    x: np.ndarray
    y: np.ndarray
    files: tuple[Path, ...]


def _labels(rng: np.random.Generator, n: int, num_classes: int) -> np.ndarray:
    return rng.integers(0, num_classes, size=n, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------
# IDX (MNIST / Fashion-MNIST)


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 0x0000 08 <ndim>, big-endian dims, then the data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx_file(path: str | Path, array: np.ndarray, *, gz: bool | None = None) -> Path:
    """Write ``array`` as one IDX file; gzipped when ``gz`` (default: when ``path`` ends in .gz)."""
    path = Path(path)
    gz = path.suffix == ".gz" if gz is None else gz
    if gz and path.suffix != ".gz":
        path = path.with_name(path.name + ".gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def write_idx_dataset(directory: str | Path, n_train: int, n_test: int, shape: tuple[int, int] = (28, 28),
                      gz: bool = True, *, rng: np.random.Generator, num_classes: int = 10) -> GeneratedData:
    """The four MNIST-style IDX files (``train-images-idx3-ubyte[.gz]`` …) with random pixels and labels."""
    directory = Path(directory)
    xs, ys, files = [], [], []
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        y = _labels(rng, n, num_classes)
        images, labels = IDX_NAMES[split]
        files.append(write_idx_file(directory / images, x, gz=gz))
        files.append(write_idx_file(directory / labels, y.astype(np.uint8), gz=gz))
        xs.append(x)
        ys.append(y)
    return GeneratedData(np.concatenate(xs)[..., np.newaxis], np.concatenate(ys), tuple(files))


# ---------------------------------------------------------------------------------------------------
# CIFAR-10 python batches


class Python2Pickler(pickle._Pickler):
    """Writes pickles as Python 2's cPickle did for the CIFAR-10 site: every str/bytes as a byte string
    (BINSTRING opcodes) and numpy globals under their old ``numpy.core`` names."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_string(self, obj: str | bytes) -> None:
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    def save_py2_global(self, obj: object, name: str | None = None) -> None:
        module = obj.__module__.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())
        self.memoize(obj)

    dispatch[str] = save_py2_string
    dispatch[bytes] = save_py2_string
    dispatch[type] = save_py2_global
    dispatch[type(len)] = save_py2_global


def cifar_batch_bytes(x: np.ndarray, labels: np.ndarray, *, batch_label: str = "batch",
                      py2: bool = True) -> bytes:
    """One pickled CIFAR-10 batch for images ``x`` (n, 32, 32, 3): a dict with b'data' (n, 3072) uint8
    channel-first rows, b'labels' (list of int), b'batch_label' and b'filenames'.

    ``py2`` (default) imitates the published files; otherwise the pickle is Python 3's protocol 4.
    """
    data = np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), 3072), dtype=np.uint8)
    batch = {b"batch_label": batch_label.encode(), b"labels": [int(v) for v in labels], b"data": data,
             b"filenames": [f"img_{i}.png".encode() for i in range(len(x))]}
    if not py2:
        return pickle.dumps(batch, protocol=4)
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump(batch)
    return buffer.getvalue()


def write_cifar10_batches(directory: str | Path, n_per_batch: int, n_test: int | None = None, *,
                          rng: np.random.Generator, subdir: bool = True, py2: bool = True) -> GeneratedData:
    """``data_batch_1`` … ``data_batch_5`` with ``n_per_batch`` images each and ``test_batch`` with
    ``n_test`` (default ``n_per_batch``), inside ``directory/cifar-10-batches-py`` when ``subdir``."""
    folder = Path(directory) / "cifar-10-batches-py" if subdir else Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys, files = [], [], []
    for name in CIFAR_BATCHES:
        n = n_per_batch if name != "test_batch" or n_test is None else n_test
        x = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        y = _labels(rng, n, 10)
        path = folder / name
        path.write_bytes(cifar_batch_bytes(x, y, batch_label=name, py2=py2))
        xs.append(x)
        ys.append(y)
        files.append(path)
    return GeneratedData(np.concatenate(xs), np.concatenate(ys), tuple(files))


# ---------------------------------------------------------------------------------------------------
# SVHN (.mat, format 2)


def write_svhn_mat(directory: str | Path, n_train: int, n_test: int, n_extra: int = 0, *,
                   rng: np.random.Generator) -> GeneratedData:
    """``train_32x32.mat``, ``test_32x32.mat`` (and ``extra_32x32.mat`` when ``n_extra`` > 0) as the
    SVHN site ships them: X uint8 (32, 32, 3, n), y uint8 (n, 1) in 1..10 where 10 is the digit 0."""
    from scipy.io import savemat

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys, files = [], [], []
    splits = [("train", n_train), ("test", n_test)] + ([("extra", n_extra)] if n_extra else [])
    for split, n in splits:
        x = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        digits = _labels(rng, n, 10)
        stored = np.where(digits == 0, 10, digits).astype(np.uint8).reshape(n, 1)
        path = directory / f"{split}_32x32.mat"
        savemat(path, {"X": np.ascontiguousarray(np.moveaxis(x, 0, -1)), "y": stored})
        xs.append(x)
        ys.append(digits)
        files.append(path)
    return GeneratedData(np.concatenate(xs), np.concatenate(ys), tuple(files))


# ---------------------------------------------------------------------------------------------------
# Covertype (UCI CSV)

# Ranges of the 10 quantitative columns of covtype.info (elevation, aspect, slope, distances, hillshades).
COVTYPE_RANGES = ((1859, 3858), (0, 360), (0, 66), (0, 1397), (-173, 601), (0, 7117), (0, 254), (0, 254),
                  (0, 254), (0, 7173))


def covtype_table(n_rows: int, *, rng: np.random.Generator) -> np.ndarray:
    """An (n, 55) int table shaped like covtype.data: 10 quantitative columns, a one-hot of 4
    wilderness areas, a one-hot of 40 soil types, the cover type 1..7."""
    table = np.zeros((n_rows, 55), dtype=np.int64)
    low, high = np.array(COVTYPE_RANGES).T
    table[:, :10] = rng.integers(low, high + 1, size=(n_rows, 10))
    rows = np.arange(n_rows)
    table[rows, 10 + rng.integers(0, 4, size=n_rows)] = 1
    table[rows, 14 + rng.integers(0, 40, size=n_rows)] = 1
    table[:, 54] = rng.integers(1, 8, size=n_rows)
    return table


def write_covtype(directory: str | Path, n_rows: int, *, rng: np.random.Generator,
                  gz: bool = False) -> GeneratedData:
    """``covtype.data`` (or ``covtype.data.gz``) with ``n_rows`` rows; ``x`` is min-max scaled per column."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table = covtype_table(n_rows, rng=rng)
    text = "\n".join(",".join(map(str, row)) for row in table.tolist()) + "\n"
    path = directory / ("covtype.data.gz" if gz else "covtype.data")
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if gz else text.encode())
    features = table[:, :54].astype(np.float64)
    low, high = features.min(axis=0), features.max(axis=0)
    x = ((features - low) / np.where(high > low, high - low, 1)).astype(np.float32)
    return GeneratedData(x, table[:, 54] - 1, (path,))
