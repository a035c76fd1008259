"""Readers of the raw dataset file formats, which come from the internet and are treated as untrusted.

* IDX (MNIST, Fashion-MNIST): the header is checked against limits before any data is read;
* CIFAR-10 python batches: unpickled by :class:`RestrictedUnpickler`, which resolves only the globals
  that rebuild a plain ndarray, so a file cannot run code.

numpy only.
"""

from __future__ import annotations

import gzip
import math
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from ldpfl.stage1_features.datasets.errors import DatasetError

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension
MAX_IDX_ITEMS = 10_000_000
MAX_IDX_SIDE = 4096
MAX_PICKLE_BYTES = 256 * 2**20  # a real CIFAR-10 batch is about 30 MiB


def open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, through gzip when its suffix is ``.gz``."""
    return cast(BinaryIO, gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb"))  # noqa: SIM115


READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError


# ---------------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)


def _read_exact(stream: BinaryIO, count: int) -> bytes:
    data = stream.read(count)
    if len(data) != count:
        raise EOFError(f"truncated: expected {count} bytes, found {len(data)}")
    return data


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse one IDX file of unsigned bytes (``.gz`` or raw) whose magic number must be ``magic``.

    The header is checked before any data is read: magic number, dimension count, sizes within
    limits; then exactly prod(dims) bytes must follow, and nothing after them.

    Parameters
    ----------
    path : Path
        The file; a ``.gz`` suffix means gzip.
    magic : int
        ``IDX_IMAGES_MAGIC`` (2051) or ``IDX_LABELS_MAGIC`` (2049); its low byte is the dimension count.

    Returns
    -------
    np.ndarray
        uint8 of the declared dimensions (read-only view of the bytes read).

    Raises
    ------
    ValueError, EOFError, OSError
        Wrong magic number, dimensions beyond the limits, truncated or trailing data, bad gzip stream.
    """
    ndim = magic & 0xFF
    with open_binary(path) as stream:
        found = int.from_bytes(_read_exact(stream, 4), "big")
        if found != magic:
            raise ValueError(f"bad magic number {found}, expected {magic}")
        dims = [int(d) for d in np.frombuffer(_read_exact(stream, 4 * ndim), dtype=">u4")]
        if dims[0] > MAX_IDX_ITEMS or any(d > MAX_IDX_SIDE for d in dims[1:]):
            raise ValueError(f"dimensions {dims} exceed the limits "
                             f"({MAX_IDX_ITEMS} items, side {MAX_IDX_SIDE})")
        data = _read_exact(stream, math.prod(dims))
        if stream.read(1):
            raise ValueError(f"trailing bytes after the {math.prod(dims)} declared by dimensions {dims}")
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


# ---------------------------------------------------------------------------------------------------
# CIFAR-10 python batches, read with a restricted unpickler


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles written by Python 3 use it for bytes, latin-1 only."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin-1")


_NUMPY_RECONSTRUCT = np.zeros(0).__reduce__()[0]  # numpy.(_)core.multiarray._reconstruct
SAFE_PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    # Python-2 era files (the official CIFAR-10 batches) name numpy.core; numpy 2 pickles name numpy._core.
    ("numpy.core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}
"""The only globals a CIFAR-10 batch may reference: enough to rebuild a plain ndarray, nothing more."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only ``SAFE_PICKLE_GLOBALS``.

    Unpickling runs whatever callables a file names, so a file from the internet could run code. Any
    other global (``os.system``, ``builtins.eval``, ``numpy.load`` …) raises ``DatasetError`` before it
    is imported. Persistent ids are refused by the base class.
    """

    def __init__(self, stream: BinaryIO, refuse: Callable[[str], DatasetError]):
        super().__init__(stream, encoding="bytes")  # Python-2 str -> bytes, as the CIFAR site says
        self._refuse = refuse

    def find_class(self, module: str, name: str) -> Any:
        """Return the global ``module.name`` when it is allowed; refuse anything else."""
        try:
            return SAFE_PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise self._refuse(f"refused to unpickle the global {module}.{name}") from None


def read_cifar_batch(path: Path, refuse: Callable[[str], DatasetError]) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch with ``RestrictedUnpickler``.

    Parameters
    ----------
    path : Path
        ``data_batch_i`` or ``test_batch``: a pickled dict with b'data' (n, 3072) uint8 and b'labels'.
    refuse : callable
        Turns a problem description into the ``DatasetError`` to raise (it adds the file and context).

    Returns
    -------
    x : np.ndarray
        uint8 (n, 32, 32, 3), channels last.
    labels : np.ndarray
        The labels as stored (checked by the caller).
    """
    size = path.stat().st_size
    if size > MAX_PICKLE_BYTES:
        raise refuse(f"{size} bytes, more than the {MAX_PICKLE_BYTES} a CIFAR-10 batch can be")
    try:
        with open(path, "rb") as stream:
            batch = RestrictedUnpickler(stream, refuse).load()
    except DatasetError:
        raise
    except Exception as error:  # noqa: BLE001  (any unpickling failure means a corrupt file)
        raise refuse(f"not a CIFAR-10 python batch ({type(error).__name__}: {error})") from None
    if not isinstance(batch, dict):
        raise refuse(f"holds a {type(batch).__name__}, expected a dict")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise refuse(f"entry 'data' must be uint8 of shape (n, 3072), got {got}")
    if not isinstance(labels, list | tuple | np.ndarray) or len(labels) != data.shape[0]:
        raise refuse(f"entry 'labels' must hold {data.shape[0]} labels")
    # Rows are channel-first (1024 red, 1024 green, 1024 blue, each row-major 32x32) -> (n, 32, 32, 3).
    x = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return x, np.asarray(labels)

