"""Validating and reading a client file.

Readers check the structure against limits *before* reading any data: expected objects only, hard
links only, no external storage or virtual datasets, no filter but Fletcher-32, declared shapes within
limits. Any failure raises ``FormatError`` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ldpfl.contract import released_statistics
from ldpfl.contract.memory import format_bytes, memory_shortfall
from ldpfl.contract.schema import MAX_ROWS, MAX_SPLIT_BYTES, SPLITS, ClientMetadata, FormatError
from ldpfl.contract.small_files import not_regular_reason
from ldpfl.mechanisms.base import PACKED_BITS

KNOWN_FILTERS = {h5py.h5z.FILTER_FLETCHER32: "fletcher32"}
ALLOWED_GROUPS = {"train", "test", "stats", released_statistics.GROUP}


def short_error(error: BaseException, limit: int = 200) -> str:
    """Return ``error``'s message on one line, at most ``limit`` characters."""
    return " ".join(str(error).split())[:limit]


def _check_dataset(path: Path, name: str, dset: h5py.Dataset) -> None:
    if not isinstance(dset, h5py.Dataset):
        raise FormatError(path, f"{name!r} is a {type(dset).__name__}, expected a dataset")
    if dset.is_virtual:
        raise FormatError(path, f"dataset {name!r} is a virtual dataset (refused)")
    if dset.external:
        raise FormatError(path, f"dataset {name!r} uses external storage (refused)")
    plist = dset.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        code = plist.get_filter(i)[0]
        if code not in KNOWN_FILTERS:
            raise FormatError(path, f"dataset {name!r} uses unknown filter id {code} (only fletcher32 is allowed)")
    if dset.ndim not in (1, 2) or any(s > MAX_ROWS * 100 for s in dset.shape):
        raise FormatError(path, f"dataset {name!r} declares shape {dset.shape}, beyond the limits")
    if dset.dtype.kind not in "biuf":
        raise FormatError(path, f"dataset {name!r} has dtype {dset.dtype}, not a number type")


def _check_storage(path: Path, name: str, dset: h5py.Dataset) -> None:
    """Refuse a dataset that stores fewer bytes than it declares: chunks never written (a crafted or cut file).

    Client files are written whole with no compression (Fletcher-32 only adds 4 bytes per chunk), so
    their storage is at least the declared size. A file that declares gigabytes in a few kilobytes
    would otherwise make a reader allocate the declared size and read fill values.
    """
    declared = int(np.prod(dset.shape, dtype=np.int64)) * dset.dtype.itemsize
    if declared == 0:
        return
    stored = int(dset.id.get_storage_size())
    if stored < declared:
        raise FormatError(path, f"dataset {name!r} declares {dset.shape} {dset.dtype} ({format_bytes(declared)}) "
                                f"but stores only {format_bytes(stored)}: its chunks were never written (an "
                                "incomplete or crafted file)")


def _walk_links(path: Path, group: h5py.Group, prefix: str = "") -> None:
    for key in group:
        link = group.get(key, getlink=True)
        full = f"{prefix}/{key}"
        if not isinstance(link, h5py.HardLink):
            raise FormatError(path, f"{full!r} is a {type(link).__name__} (only objects inside the file are allowed)")
        obj = group[key]
        if isinstance(obj, h5py.Group):
            _walk_links(path, obj, full)


def check_structure(path: str | os.PathLike[str], handle: h5py.File, metadata: ClientMetadata) -> dict[str, int]:
    """Validate the objects, links, filters, dtypes and declared shapes of an open file.

    Returns
    -------
    dict
        Rows per split.

    Raises
    ------
    FormatError
        The first problem found.
    """
    path = Path(path)
    _walk_links(path, handle)
    extra = set(handle) - ALLOWED_GROUPS
    if extra:
        raise FormatError(path, f"unexpected objects {sorted(extra)} at the file root")
    expected_dtype = np.dtype(np.uint8) if metadata.feature_format == PACKED_BITS else np.dtype(np.float32)
    rows: dict[str, int] = {}
    for split in SPLITS:
        if split not in handle or not isinstance(handle[split], h5py.Group):
            raise FormatError(path, f"missing group {split!r}")
        group = handle[split]
        if set(group) != {"features", "labels"}:
            raise FormatError(path, f"group {split!r} holds {sorted(group)}, expected ['features', 'labels']")
        features, labels = group["features"], group["labels"]
        for name, dset in ((f"{split}/features", features), (f"{split}/labels", labels)):
            _check_dataset(path, name, dset)
        if features.dtype != expected_dtype:
            raise FormatError(path, f"dataset '{split}/features' has dtype {features.dtype}, expected "
                                    f"{expected_dtype} for feature_format {metadata.feature_format!r}")
        if labels.dtype.kind not in "iu" or labels.dtype.itemsize > 8:
            raise FormatError(path, f"dataset '{split}/labels' has dtype {labels.dtype}, expected an integer type")
        if features.ndim != 2 or features.shape[1] != metadata.stored_width:
            raise FormatError(path, f"dataset '{split}/features' has shape {features.shape}, expected "
                                    f"(rows, {metadata.stored_width})")
        if labels.shape != (features.shape[0],):
            raise FormatError(path, f"dataset '{split}/labels' has shape {labels.shape}, "
                                    f"expected ({features.shape[0]},)")
        declared_bytes = features.shape[0] * features.shape[1] * features.dtype.itemsize
        if features.shape[0] > MAX_ROWS or declared_bytes > MAX_SPLIT_BYTES:
            raise FormatError(path, f"dataset '{split}/features' declares {features.shape[0]} rows, beyond the limits")
        for name, dset in ((f"{split}/features", features), (f"{split}/labels", labels)):
            _check_storage(path, name, dset)
        rows[split] = int(features.shape[0])
    if "stats" in handle:
        stats = handle["stats"]
        if not isinstance(stats, h5py.Group):
            raise FormatError(path, f"'stats' is a {type(stats).__name__}, expected a group")
        if set(stats) - {"input_bit_density"}:
            raise FormatError(path, f"group 'stats' holds unexpected objects {sorted(set(stats))}")
        if "input_bit_density" in stats:
            _check_dataset(path, "stats/input_bit_density", stats["input_bit_density"])
            if stats["input_bit_density"].shape != (metadata.feature_width,):
                raise FormatError(path, "dataset 'stats/input_bit_density' has the wrong shape")
            _check_storage(path, "stats/input_bit_density", stats["input_bit_density"])
    released_statistics.check_group(path, handle, metadata)
    if released_statistics.GROUP in handle:
        for name in released_statistics.DATASETS:
            full = f"{released_statistics.GROUP}/{name}"
            _check_dataset(path, full, handle[full])
            _check_storage(path, full, handle[full])
    return rows


@contextlib.contextmanager
def open_client_file(path: str | os.PathLike[str]) -> Iterator[tuple[h5py.File, ClientMetadata, dict[str, int]]]:
    """Open and validate a client file; yield (h5py file, metadata, rows per split).

    Every failure (not HDF5, truncated, corrupted metadata, wrong schema, refused structure) raises
    ``FormatError`` with a one-line message.
    """
    path = Path(path)
    if not path.is_file():
        raise FormatError(path, not_regular_reason(path))  # a FIFO would block h5py (issue 24)
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise FormatError(path, f"not a readable HDF5 file ({short_error(error)})") from None
    try:
        try:
            metadata = ClientMetadata.from_attrs(handle.attrs, path)
            rows = check_structure(path, handle, metadata)
        except (OSError, KeyError, RuntimeError) as error:
            raise FormatError(path, f"corrupted HDF5 structure ({short_error(error)})") from None
        yield handle, metadata, rows
    finally:
        handle.close()


@dataclass(frozen=True)
class ClientData:
    """One client's features and labels per split, as stored (packed bits stay packed)."""

    path: Path
    metadata: ClientMetadata
    features: Mapping[str, np.ndarray]
    labels: Mapping[str, np.ndarray]
    input_bit_density: np.ndarray | None = None

    @property
    def rows(self) -> dict[str, int]:
        """Return the rows read per split."""
        return {split: len(labels) for split, labels in self.labels.items()}


def declared_bytes(handle: h5py.File, splits: tuple[str, ...] = SPLITS) -> int:
    """Return the bytes that reading ``splits`` whole allocates (features, labels as int64), from declared shapes."""
    total = 0
    for split in splits:
        features, labels = handle[split]["features"], handle[split]["labels"]
        total += int(np.prod(features.shape, dtype=np.int64)) * features.dtype.itemsize
        total += int(labels.shape[0]) * (labels.dtype.itemsize + 8)
    return total


def read_client_file(path: str | os.PathLike[str], splits: tuple[str, ...] = SPLITS) -> ClientData:
    """Validate and read whole splits (HDF5 verifies the checksum of every chunk read).

    The memory the splits need (from their declared shapes) is compared with the memory available
    before anything is read; for files of any size, read in blocks (:func:`verify_client_data`,
    :func:`iter_feature_chunks`).
    """
    with open_client_file(path) as (handle, metadata, _rows):
        shortfall = memory_shortfall(declared_bytes(handle, splits))
        if shortfall is not None:
            raise FormatError(path, f"reading splits {list(splits)} whole {shortfall}; read it in row blocks")
        try:
            features = {s: handle[s]["features"][()] for s in splits}
            labels = {s: handle[s]["labels"][()].astype(np.int64) for s in splits}
            density = handle["stats"]["input_bit_density"][()] if "stats" in handle and \
                "input_bit_density" in handle["stats"] else None
        except OSError as error:
            raise FormatError(path, f"data failed its checksum or could not be read ({short_error(error)})") from None
        for s in splits:
            if labels[s].size and (labels[s].min() < 0 or labels[s].max() >= metadata.num_classes):
                raise FormatError(path, f"labels of split {s!r} fall outside [0, {metadata.num_classes})")
    return ClientData(Path(path), metadata, features, labels, density)


def verify_client_data(path: str | os.PathLike[str],
                       block_bytes: int = 16 << 20) -> tuple[ClientMetadata, dict[str, int]]:
    """Validate a client file and read every chunk of it in row blocks (memory O(block), whatever its size).

    HDF5 verifies each chunk's Fletcher-32 checksum as it is read; labels must lie in ``[0, num_classes)``.

    Returns
    -------
    tuple
        The metadata and the rows per split.

    Raises
    ------
    FormatError
        The structure, a checksum or a label.
    """
    with open_client_file(path) as (handle, metadata, rows):
        for split in SPLITS:
            features, labels = handle[split]["features"], handle[split]["labels"]
            row_bytes = max(1, int(np.prod(features.shape[1:], dtype=np.int64)) * features.dtype.itemsize)
            step = max(1, block_bytes // row_bytes)
            for start in range(0, rows[split], step):
                try:
                    features[start:start + step]
                    block = labels[start:start + step]
                except OSError as error:
                    raise FormatError(path, f"split {split!r} rows {start}:{start + step} failed their checksum or "
                                            f"could not be read ({short_error(error)})") from None
                if block.size and (block.min() < 0 or block.max() >= metadata.num_classes):
                    raise FormatError(path, f"labels of split {split!r} fall outside [0, {metadata.num_classes})")
        if "stats" in handle and "input_bit_density" in handle["stats"]:
            try:
                handle["stats"]["input_bit_density"][()]
            except OSError as error:
                raise FormatError(path, f"dataset 'stats/input_bit_density' failed its checksum or could not be "
                                        f"read ({short_error(error)})") from None
    return metadata, rows


def iter_feature_chunks(handle: h5py.File, split: str, rows_per_chunk: int = 4096) -> Iterator[np.ndarray]:
    """Yield the stored features of ``split`` in row blocks (bounded memory)."""
    dset = handle[split]["features"]
    for start in range(0, dset.shape[0], rows_per_chunk):
        yield dset[start:start + rows_per_chunk]
