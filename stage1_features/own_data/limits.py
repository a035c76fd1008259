"""Limits on a user's data, checked from what a file declares before anything is decoded (issue 24).

An ``.npz`` header can declare a (10⁹, 784) array in a few bytes, a deflated member can expand a
thousandfold, an HDF5 file can declare (10⁹, 16) with no chunk written or point to ``/etc/passwd`` as
external storage, and a 923-KB PNG can decode to 81 megapixels. The readers of
``ldpfl.stage1_features.own_data`` call these checks first; each refuses with a ``DataError`` naming the
file:

* a non-regular file (a FIFO named ``x.png`` would block the reader; a device never ends);
* a member or dataset that expands more than ``MAX_EXPANSION`` to 1 from its stored bytes (decompress it,
  or save without compression), or that stores fewer bytes than it declares (a crafted or cut file);
* declared values that do not fit in the memory available: each value counts its own bytes plus two
  float32 copies (scaling, the CNN's input), ``ldpfl.contract.memory``;
* HDF5 external links, external storage and virtual datasets (client files refuse them too);
* an image of more than ``MAX_IMAGE_PIXELS`` pixels (read from its header).
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.memory import format_bytes, memory_shortfall
from ldpfl.contract.small_files import SmallFileError, check_regular
from ldpfl.stage1_features.own_data.errors import DataError

MAX_EXPANSION = 200
"""Largest ratio of declared to stored bytes of a compressed array (real data compresses far less)."""
MAX_IMAGE_PIXELS = 1 << 25
"""33.5 megapixels (about 5800 × 5800), read from the image header before it is decoded."""
WORKING_COPIES = 8
"""Bytes per value beyond its own: two float32 copies (scaling, the CNN's input)."""


def require_regular(path: Path) -> None:
    """Refuse a path that is not a regular file (FIFO, device, socket), before any reader opens it."""
    try:
        check_regular(path, "input")
    except SmallFileError as error:
        raise DataError(path, str(error).removeprefix(f"{path}: ")) from None


def require_memory(path: Path, what: str, values: int, itemsize: int) -> None:
    """Refuse ``values`` values of ``itemsize`` bytes that would not fit in the memory available."""
    needed = values * (itemsize + WORKING_COPIES)
    shortfall = memory_shortfall(needed)
    if shortfall is not None:
        raise DataError(path, f"{what} declares {values} values; reading it {shortfall}")


def _expansion(path: Path, what: str, declared: int, stored: int) -> None:
    if declared > MAX_EXPANSION * max(stored, 1) + (1 << 20):
        raise DataError(path, f"{what} expands from {format_bytes(stored)} to {format_bytes(declared)} (more than "
                              f"{MAX_EXPANSION}:1, a decompression bomb?); store it uncompressed")


def check_npz_members(path: Path, keys: list[str]) -> None:
    """Check the members of an ``.npz`` for ``keys`` from the zip directory and the ``.npy`` headers only.

    Raises
    ------
    DataError
        A member that expands too much, whose header declares more bytes than the member holds, or whose
        values do not fit in memory.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise DataError(path, f"is not a readable .npz file ({type(error).__name__}: {error})") from None
    with archive:
        members = {m.filename.removesuffix(".npy"): m for m in archive.infolist()}
        for key in keys:
            member = members.get(key)
            if member is None:
                continue
            what = f"array {key!r}"
            _expansion(path, what, member.file_size, member.compress_size)
            try:
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    reader = {(1, 0): np.lib.format.read_array_header_1_0,
                              (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if reader is None:
                        raise ValueError(f"unsupported .npy version {version}")
                    shape, _fortran, dtype = reader(stream, max_header_size=1 << 16)
                    header = stream.tell()
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                raise DataError(path, f"{what} has no readable .npy header ({error})") from None
            values = math.prod(shape)
            if dtype.hasobject:
                continue  # refused by allow_pickle=False when read
            declared = values * dtype.itemsize
            if member.file_size < header + declared:
                raise DataError(path, f"{what} declares shape {tuple(shape)} {dtype} ({format_bytes(declared)}) but "
                                      f"the archive holds {format_bytes(member.file_size)} for it (a crafted or cut "
                                      "file)")
            require_memory(path, what, values, dtype.itemsize)


def _walk_links(path: Path, group: Any, prefix: str = "") -> None:
    import h5py

    for key in group:
        link = group.get(key, getlink=True)
        full = f"{prefix}/{key}"
        if isinstance(link, h5py.ExternalLink):
            raise DataError(path, f"{full!r} is an external link to {link.filename!r} (refused: only objects "
                                  "inside the file are read)")
        if isinstance(link, h5py.HardLink):
            obj = group[key]
            if isinstance(obj, h5py.Group):
                _walk_links(path, obj, full)


def check_hdf5_file(path: Path, handle: Any) -> None:
    """Refuse external links anywhere in an open HDF5 file."""
    _walk_links(path, handle)


def check_hdf5_dataset(path: Path, name: str, dset: Any) -> None:
    """Refuse a virtual or externally stored dataset, unwritten chunks, a bomb, or one too large for memory."""
    what = f"dataset {name!r}"
    if dset.is_virtual:
        raise DataError(path, f"{what} is a virtual dataset (refused: its sources lie outside the file)")
    if dset.external:
        raise DataError(path, f"{what} uses external storage (refused: only data inside the file is read)")
    values = int(np.prod(dset.shape, dtype=np.int64)) if dset.shape is not None else 0
    itemsize = max(int(dset.dtype.itemsize), 1)
    declared = values * itemsize
    if declared:
        stored = int(dset.id.get_storage_size())
        filtered = dset.id.get_create_plist().get_nfilters() > 0
        if not filtered and stored < declared:
            raise DataError(path, f"{what} declares {dset.shape} {dset.dtype} ({format_bytes(declared)}) but stores "
                                  f"{format_bytes(stored)}: its chunks were never written (a crafted or cut file)")
        _expansion(path, what, declared, stored)
    require_memory(path, what, values, itemsize)


def check_image_header(file: Path, image: Any) -> None:
    """Refuse an image whose header declares more than ``MAX_IMAGE_PIXELS`` pixels (before it is decoded)."""
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(file, f"is a {height}x{width} image ({width * height} pixels, more than "
                              f"{MAX_IMAGE_PIXELS}); shrink it before export")


__all__ = ["MAX_EXPANSION", "MAX_IMAGE_PIXELS", "check_hdf5_dataset", "check_hdf5_file", "check_image_header",
           "check_npz_members", "require_memory", "require_regular"]
