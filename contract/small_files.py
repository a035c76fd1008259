"""Reading a small input file whole: a regular file only, its size capped before a byte is read (issue 24).

Plans, manifests and ``@file`` options are read whole into memory. A FIFO (which would block the reader),
a device (``/dev/zero`` never ends) or a sparse file of gigabytes must fail at once: the file is opened
without blocking, ``fstat`` of the open descriptor must say it is a regular file no larger than the cap,
and at most ``cap + 1`` bytes are read (a file that grows while it is read is still refused).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ldpfl.common.errors import LdpflError

MAX_SMALL_FILE_BYTES = 1 << 20
"""The cap of plan.json, manifest.json and ``@file`` options: 1 MiB."""


class SmallFileError(LdpflError, ValueError):
    """A small input that is missing, not a regular file, too large or unreadable; the message names it."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


def file_kind(mode: int) -> str:
    """Return a word for what a non-regular file is (``stat`` mode): directory, FIFO, device, socket."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_regular_reason(path: str | os.PathLike[str]) -> str:
    """Return why ``path`` is no regular file: ``no such file``, or what it is (a FIFO, a device, ...)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "no such file"
    return "not a regular file" if stat.S_ISREG(mode) else f"is {file_kind(mode)}, not a regular file"


def check_regular(path: str | os.PathLike[str], what: str = "input") -> os.stat_result:
    """Return ``os.stat`` of ``path`` when it is a regular file (links followed); raise :class:`SmallFileError` if not.

    Call it before a library opens the file itself (h5py, Pillow, numpy), so that a FIFO never blocks.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SmallFileError(path, f"{what} not found") from None
    except OSError as error:
        raise SmallFileError(path, f"cannot read the {what} ({error.strerror or error})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SmallFileError(path, f"{what} is {file_kind(info.st_mode)}, not a regular file")
    return info


def read_small_file(path: str | os.PathLike[str], what: str = "file", cap: int = MAX_SMALL_FILE_BYTES) -> bytes:
    """Return the bytes of the regular file ``path`` of at most ``cap`` bytes.

    Parameters
    ----------
    path : path
        The file.
    what : str
        What it is (``"plan"``, ``"manifest"``), named in errors.
    cap : int
        The largest size accepted, in bytes.

    Raises
    ------
    SmallFileError
        Missing, unreadable, not a regular file (FIFO, device, directory, socket) or larger than ``cap``.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise SmallFileError(path, f"{what} not found") from None
    except OSError as error:
        raise SmallFileError(path, f"cannot read the {what} ({error.strerror or error})") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise SmallFileError(path, f"{what} is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > cap:
            raise SmallFileError(path, f"{what} is {info.st_size} bytes, larger than the {cap}-byte cap")
        try:
            raw = handle.read(cap + 1)
        except OSError as error:
            raise SmallFileError(path, f"cannot read the {what} ({error.strerror or error})") from None
    if len(raw) > cap:
        raise SmallFileError(path, f"{what} is larger than the {cap}-byte cap")
    return raw


__all__ = ["MAX_SMALL_FILE_BYTES", "SmallFileError", "check_regular", "file_kind", "not_regular_reason",
           "read_small_file"]
