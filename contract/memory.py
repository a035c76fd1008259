"""How much memory this process may still use, decided before a large allocation.

The figure is the memory the system can give without swapping, ``psutil.virtual_memory().available``
(the kernel's ``MemAvailable`` on Linux), capped by the cgroup's limit when the process runs in one
(cgroup v2 ``memory.max`` less ``memory.current``); ``None`` where neither is known (then no check
refuses anything).
"""

from __future__ import annotations

from pathlib import Path

import psutil

_CGROUP = Path("/sys/fs/cgroup")


def _system_available() -> int | None:
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, psutil.Error):  # psutil cannot read the figure on this system
        return None


def _cgroup_headroom() -> int | None:
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((_CGROUP / "memory.current").read_text().strip())
        return max(int(limit) - used, 0)
    except (OSError, ValueError):
        return None


def available_memory() -> tuple[int | None, str]:
    """Return the bytes of memory available to this process and where the figure comes from.

    Returns
    -------
    tuple
        (bytes, or ``None`` when unknown; a short description of the source).
    """
    figure, source = _system_available(), "available memory per psutil"
    headroom = _cgroup_headroom()
    if headroom is not None and (figure is None or headroom < figure):
        figure, source = headroom, "the cgroup's memory.max less memory.current"
    return figure, source


def format_bytes(count: float) -> str:
    """Return ``count`` bytes in binary units (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(count) < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def memory_shortfall(needed: int, available: int | None = None, source: str = "") -> str | None:
    """Say why ``needed`` bytes do not fit in the memory available, or return ``None`` when they do.

    Parameters
    ----------
    needed : int
        Bytes a step would allocate.
    available : int, optional
        The figure to compare with; by default :func:`available_memory`. Unknown: they fit.
    source : str
        Where ``available`` comes from, when given.

    Returns
    -------
    str or None
        ``"needs at least X of memory, but only Y is available (source)"``.
    """
    if available is None:
        available, source = available_memory()
    if available is None or needed <= available:
        return None
    return (f"needs at least {format_bytes(needed)} of memory, but only {format_bytes(available)} is available "
            f"({source or 'given'})")
