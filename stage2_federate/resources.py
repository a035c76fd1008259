"""Resource limits decided before any allocation: what a run needs against the memory the machine has.

A model is sized from its architecture alone (:func:`parameter_count_of`), so an impossible one
(``hidden`` 10^8, or 10^7 input features under the default 2048-unit layer) is refused with the figures
before torch allocates a byte of it. The memory available is the kernel's ``MemAvailable``
(``/proc/meminfo``), capped by the cgroup's limit when the process runs in one, else the free pages
``os.sysconf`` reports. Imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mechanisms.base import ParameterError

FLOAT32_BYTES = 4
MODEL_BUFFERS = 8
"""Parameter-sized float32 buffers a round holds besides the uploads: the model, its gradients, Adam's two
moments, the broadcast vector, the local vector, the perturbed upload being made, the aggregate."""

_MEMINFO = Path("/proc/meminfo")
_CGROUP_V2 = Path("/sys/fs/cgroup")


def _meminfo_available() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _sysconf_available() -> int | None:
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _cgroup_headroom() -> int | None:
    try:
        limit = (_CGROUP_V2 / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((_CGROUP_V2 / "memory.current").read_text().strip())
        return max(int(limit) - used, 0)
    except (OSError, ValueError):
        return None


def available_memory() -> tuple[int | None, str]:
    """Return the bytes of memory available to this process and where the figure comes from.

    Returns
    -------
    tuple
        (bytes or ``None`` when unknown, a short description of the source).
    """
    figure, source = _meminfo_available(), "MemAvailable in /proc/meminfo"
    if figure is None:
        figure, source = _sysconf_available(), "free pages per os.sysconf"
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


def parameter_count_of(input_width: int, hidden: Sequence[int], num_classes: int) -> int:
    """Return the parameters of ``input width -> hidden layers -> classes`` (weights and biases), exactly."""
    widths = [int(input_width), *(int(h) for h in hidden), int(num_classes)]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


def model_memory(parameters: int, clients_per_round: int) -> int:
    """Return a lower bound on the bytes a round needs: ``MODEL_BUFFERS`` + one upload per selected client."""
    return FLOAT32_BYTES * parameters * (MODEL_BUFFERS + max(int(clients_per_round), 1))


def require_memory(needed: int, what: str, advice: str, *, available: int | None = None,
                   source: str = "") -> None:
    """Refuse ``needed`` bytes beyond the memory available (``ParameterError`` with both figures).

    Parameters
    ----------
    needed : int
        Bytes the step would allocate.
    what : str
        What needs them (the start of the message).
    advice : str
        What to change (may mark parameters with backquotes).
    available : int, optional
        The figure to compare with; by default :func:`available_memory`. Unknown: no check.
    source : str
        Where ``available`` comes from, when given.
    """
    if available is None:
        available, source = available_memory()
    if available is None or needed <= available:
        return
    raise ParameterError(f"{what} needs at least {format_bytes(needed)} of memory, but only "
                         f"{format_bytes(available)} is available ({source or 'given'}); {advice}")


def check_model(input_width: int, hidden: Sequence[int], num_classes: int, clients_per_round: int, *,
                available: int | None = None, source: str = "") -> int:
    """Refuse a model whose training would not fit in memory, before it is built; return its parameter count.

    Raises
    ------
    ParameterError
        Naming the parameter count, the memory needed and the memory available.
    """
    parameters = parameter_count_of(input_width, hidden, num_classes)
    layers = " -> ".join(str(w) for w in (input_width, *hidden, num_classes))
    require_memory(model_memory(parameters, clients_per_round),
                   f"the model ({layers}: {parameters:,} parameters, {format_bytes(FLOAT32_BYTES * parameters)} "
                   f"as float32) with {clients_per_round} client upload(s) per round",
                   "choose smaller `hidden` layers (or 'none'), or fewer features",
                   available=available, source=source)
    return parameters
