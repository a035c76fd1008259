"""Atomic, durable file writes: a temporary name in the same directory, fsync, rename, fsync the directory.

A reader never sees a half-written file under a final name: a crash leaves at most a hidden temporary
file (``.NAME.<pid>.<token>.tmp``), which the writer's next run may remove. The fsync of the file before
the rename and of the directory after it make the new name survive a power loss. A write that fails on a
full disk raises ``OSError(ENOSPC)`` naming the target, whatever the library raised (issue 24).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

TMP_MARK = ".tmp"


def temporary_path(target: str | os.PathLike[str], suffix: str = "") -> Path:
    """Return a fresh hidden temporary name next to ``target``.

    Parameters
    ----------
    target : path
        The final name.
    suffix : str
        Appended after ``.tmp`` (Keras insists on ``.keras``).

    Returns
    -------
    Path
        ``DIR/.NAME.<pid>.<token>.tmp<suffix>``, unique among this process's writes.
    """
    target = Path(target)
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_MARK}{suffix}")


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush ``path``'s data to stable storage."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename in it) to stable storage; a no-op where unsupported."""
    if os.name == "nt":  # pragma: no cover - Windows cannot open a directory
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Fsync ``tmp``, rename it to ``target`` (``os.replace``) and fsync the directory.

    Returns
    -------
    Path
        ``target``.
    """
    fsync_file(tmp)
    os.replace(tmp, target)
    fsync_directory(Path(target).parent)
    return Path(target)


def link_durably(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Fsync ``tmp`` and give it the name ``target`` only if no file has that name; fsync the directory.

    The rename that cannot replace: ``os.link`` fails atomically when ``target`` exists (so the check
    and the rename are one step, even against another process), then ``tmp`` is unlinked. Where the
    file system has no hard links, an existence check and ``os.replace`` are used instead.

    Raises
    ------
    FileExistsError
        ``target`` exists; ``tmp`` is left in place (the caller removes it).
    """
    fsync_file(tmp)
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError:  # pragma: no cover - no hard links here (some network and FAT file systems)
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "file exists", str(target)) from None
        os.replace(tmp, target)
    else:
        os.unlink(tmp)
    fsync_directory(Path(target).parent)
    return Path(target)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path for the caller to write; on success it replaces ``target`` durably.

    Leaving the block with an exception removes the temporary file and leaves ``target`` untouched.

    Parameters
    ----------
    target : path
        The final name; its directory is created if needed.
    suffix : str
        Appended to the temporary name (see :func:`temporary_path`).

    Yields
    ------
    Path
        Where to write.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(target, suffix)
    try:
        yield tmp
        replace_durably(tmp, target)
    except Exception as error:
        if disk_full(error, target.parent):  # checked before the temporary frees its space
            tmp.unlink(missing_ok=True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)


def free_bytes(directory: str | os.PathLike[str]) -> int | None:
    """Return the bytes an unprivileged writer may still use in ``directory``'s file system (None: unknown)."""
    try:
        info = os.statvfs(directory)
    except (AttributeError, OSError):  # pragma: no cover - no statvfs (Windows)
        return None
    return info.f_bavail * info.f_frsize


def disk_full(error: BaseException, directory: str | os.PathLike[str]) -> bool:
    """Return whether a failed write was (most likely) a full disk: ENOSPC, or no space left after any error.

    Libraries report a full disk their own way (torch: ``RuntimeError: [enforce fail at
    inline_container.cc...]``; HDF5: a generic write error); the free space tells.
    """
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    free = free_bytes(directory)
    return free is not None and free == 0


def atomic_write(target: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` on a temporary binary file, then replace ``target`` with it durably.

    Parameters
    ----------
    target : path
        The final name.
    write : callable
        Writes the content to the open binary handle.

    Returns
    -------
    Path
        ``target``.
    """
    with atomic_path(target) as tmp, open(tmp, "wb") as handle:
        write(handle)
    return Path(target)


def atomic_write_text(target: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically and durably; return ``target``."""
    return atomic_write(target, lambda handle: handle.write(text.encode("utf-8")))
