"""Writing a client file: rows streamed into a temporary file, committed by a durable rename.

Datasets are chunked by rows (about 1 MiB) with the Fletcher-32 checksum filter, and the file uses the
latest HDF5 format so its metadata carries checksums too. A half-written file never carries a final
name (``ldpfl.contract.atomic``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import h5py
import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.atomic import disk_full, link_durably, replace_durably, temporary_path
from ldpfl.contract.clamped import ClampedValues
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.released_statistics import write_release
from ldpfl.contract.schema import SPLITS, ClientMetadata
from ldpfl.mechanisms.base import PACKED_BITS
from ldpfl.mechanisms.gaussian_statistics import Released

CHUNK_BYTES = 1 << 20


def rows_per_chunk(row_bytes: int, rows: int) -> int:
    """Return the rows of one HDF5 chunk: about ``CHUNK_BYTES``, at least 1, at most ``rows``."""
    return int(max(1, min(rows, CHUNK_BYTES // max(row_bytes, 1))))


class ClientFileExists(ParameterError, FileExistsError):
    """A client file is already there: a writer never replaces one unless told to (``overwrite``).

    A ``ParameterError`` (its message marks ```overwrite```, which the CLI spells ``--overwrite``) and a
    ``FileExistsError``.
    """

    def __init__(self, path: str | os.PathLike[str], *, appeared: bool = False) -> None:
        self.filename = str(path)
        when = "appeared while this one was being written (another export process?)" if appeared else "exists"
        ParameterError.__init__(self, f"{path} {when}; it is kept, never replaced: rerun to adopt it if it is "
                                      "this run's, or start over with `overwrite`")

    def __str__(self) -> str:
        """Return the message with plain parameter names (not ``OSError``'s errno form)."""
        return self.render(lambda name: name)


class ClientFileWriter:
    """Stream the rows of one client file into a temporary file; ``commit`` renames it into place.

    Use as a context manager: leaving the block with an exception (or without ``commit``) removes the
    temporary file.

    Parameters
    ----------
    path : path
        The final name (``client_XXX.h5``).
    metadata : ClientMetadata
        The root attributes.
    rows : mapping
        Rows per split (a split not given has 0 rows).
    input_bit_density : numpy.ndarray, optional
        ``/stats/input_bit_density`` when already known.
    overwrite : bool
        Replace an existing file at ``path``.
    """

    def __init__(self, path: str | os.PathLike[str], metadata: ClientMetadata, rows: Mapping[str, int], *,
                 input_bit_density: np.ndarray | None = None, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ClientFileExists(self.path)
        self.overwrite = overwrite
        metadata.check(self.path)
        self.metadata = metadata
        self.rows = {split: int(rows.get(split, 0)) for split in SPLITS}
        self.tmp_path = temporary_path(self.path)
        self._file = h5py.File(self.tmp_path, "w", libver="latest")
        self._committed = False
        dtype = np.uint8 if metadata.feature_format == PACKED_BITS else np.float32
        width = metadata.stored_width
        for split, count in self.rows.items():
            group = self._file.create_group(split)
            for name, shape, dt in (("features", (count, width), dtype), ("labels", (count,), np.int32)):
                row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dt).itemsize
                chunks = (rows_per_chunk(row_bytes, max(count, 1)), *shape[1:])
                group.create_dataset(name, shape=shape, dtype=dt, chunks=chunks, fletcher32=True,
                                     maxshape=(None, *shape[1:]) if count == 0 else None)
        if input_bit_density is not None:
            self.write_input_bit_density(input_bit_density)
        for key, value in metadata.to_attrs().items():
            self._file.attrs[key] = value

    def write_input_bit_density(self, input_bit_density: np.ndarray) -> None:
        """Store /stats/input_bit_density (float32, shape (r*l,)); for densities known only after streaming."""
        density = np.asarray(input_bit_density, dtype=np.float32)
        if density.shape != (self.metadata.feature_width,):
            raise ValueError(f"input_bit_density must have shape ({self.metadata.feature_width},), got {density.shape}")
        self._file.require_group("stats").create_dataset("input_bit_density", data=density, fletcher32=True,
                                                         chunks=density.shape)

    def write_clamped_values(self, clamped: ClampedValues) -> None:
        """Set the root attribute ``clamped_values`` (known only after the rows are streamed; ``contract.clamped``)."""
        self.metadata = dataclasses.replace(self.metadata, clamped_values=clamped)
        self._file.attrs["clamped_values"] = self.metadata.to_attrs()["clamped_values"]

    def write_released_statistics(self, released: Released) -> None:
        """Store the ``/released_statistics`` group of a ``stats:K`` release (``contract.released_statistics``)."""
        write_release(self._file, released)

    def write_rows(self, split: str, start: int, features: np.ndarray, labels: np.ndarray) -> None:
        """Write ``features`` (packed bits or float32, as the metadata says) and ``labels`` at row ``start``."""
        stop = start + len(features)
        if len(labels) != len(features) or stop > self.rows[split]:
            raise ValueError(f"rows {start}:{stop} of split {split!r} do not fit {self.rows[split]} rows")
        group = self._file[split]
        group["features"][start:stop] = features
        group["labels"][start:stop] = labels

    def commit(self) -> str:
        """Close, fsync and rename into place (then fsync the directory); return the file's sha256.

        Without ``overwrite`` the rename cannot replace a file that appeared meanwhile (written by another
        process): ``ClientFileExists`` is raised and the temporary file removed.
        """
        self._file.close()
        digest = sha256_file(self.tmp_path)
        if self.overwrite:
            replace_durably(self.tmp_path, self.path)
        else:
            try:
                link_durably(self.tmp_path, self.path)
            except FileExistsError:
                self.abort()
                raise ClientFileExists(self.path, appeared=True) from None
        self._committed = True
        return digest

    def abort(self) -> None:
        """Close and remove the temporary file (the final name is left as it was)."""
        with contextlib.suppress(Exception):
            self._file.close()
        self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> ClientFileWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        full = isinstance(exc, Exception) and disk_full(exc, self.path.parent)  # before abort frees the space
        if exc_type is not None or not self._committed:
            self.abort()
        if full:  # HDF5 says "Can't write data"; the user needs the reason and the path (issue 24)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from exc


def write_client_file(path: str | os.PathLike[str], metadata: ClientMetadata,
                      splits: Mapping[str, tuple[np.ndarray, np.ndarray]], *,
                      input_bit_density: np.ndarray | None = None, overwrite: bool = False) -> str:
    """Write a whole client file from in-memory (features, labels) per split; return its sha256."""
    rows = {split: len(splits[split][0]) if split in splits else 0 for split in SPLITS}
    with ClientFileWriter(path, metadata, rows, input_bit_density=input_bit_density, overwrite=overwrite) as writer:
        for split, (features, labels) in splits.items():
            writer.write_rows(split, 0, features, labels)
        return writer.commit()
