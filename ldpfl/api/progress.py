"""The progress callback of the jobs: ``progress(Progress(...))`` after each unit of work.

Units: the clients of an export, the rounds of a federation, the records of a prediction; inspect, plan
and gather report their start and their end (one step each). A callback is optional; the tqdm bars of
the command line are a separate switch (``progress_bars``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` units of ``job`` are finished (``total`` None: not known).

    Attributes
    ----------
    job : str
        ``export``, ``plan``, ``gather``, ``federate``, ``predict`` or ``inspect``.
    unit : str
        What is counted: ``client``, ``round``, ``record`` or ``step``.
    done : int
        Units finished so far.
    total : int or None
        Units the job will finish.
    message : str
        A short note on the last unit (for example the round's test accuracy).
    """

    job: str
    unit: str
    done: int
    total: int | None
    message: str = ""

    def __str__(self) -> str:
        """Return one line, e.g. ``federate: 2/10 rounds (test accuracy 0.8123)``."""
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        note = f" ({self.message})" if self.message else ""
        return f"{self.job}: {count} {self.unit}s{note}"


ProgressCallback = Callable[[Progress], None]
"""What a job's ``progress`` argument takes: a function of one :class:`Progress` (``print`` will do)."""


class Bar(Protocol):
    """What a job updates as records are done (a tqdm bar has this method)."""

    def update(self, n: int = 1) -> object:
        """Count ``n`` more units done."""


def report(callback: ProgressCallback | None, job: str, unit: str, done: int, total: int | None,
           message: str = "") -> None:
    """Call ``callback`` with a :class:`Progress` (nothing when it is None)."""
    if callback is not None:
        callback(Progress(job, unit, done, total, message))


@dataclass
class Tally:
    """A counter with tqdm's ``update(n)`` that passes each count to a callback and to an optional bar."""

    callback: ProgressCallback | None
    job: str
    unit: str
    total: int | None
    bar: Bar | None = None
    done: int = 0

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done; tell the bar and the callback."""
        self.done += int(n)
        if self.bar is not None:
            self.bar.update(n)
        report(self.callback, self.job, self.unit, self.done, self.total)


__all__ = ["Bar", "Progress", "ProgressCallback", "Tally", "report"]
