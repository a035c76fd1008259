"""The silos the coordinator refuses before round 1, on every engine (issue 42 item 4: one silo never stops a run).

A silo whose claim is refused (a file that does not verify, another file, other rows, a label histogram its labels
or the manifest do not bear out, an index another silo holds) is left out and named: a :class:`LeftOut` in
``config.json``'s and ``metrics.json``'s ``run.left_out``, a warning line, a line of the summary. The run goes on
while enough silos remain (:func:`enough_remain`), else it ends in one line naming every left-out silo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ldpfl.common.errors import LdpflError


@dataclass(frozen=True)
class LeftOut:
    """A silo the coordinator refused before round 1: its claimed client index, its file, and why."""

    index: int
    file: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Return the silo as ``config.json``'s (and ``metrics.json``'s) ``run.left_out`` lists it."""
        return {"client": self.index, "file": self.file, "reason": self.reason}

    def line(self) -> str:
        """Return the warning line of the silo (the CLI prints it, the status file carries it)."""
        return f"left out before round 1: {self.reason}"

    @classmethod
    def refused_file(cls, index: int, file: str, error: Exception) -> LeftOut:
        """Return the silo whose file ``file`` does not verify (``error``: ``PATH: problem``, sha256, structure ...)."""
        return cls(index, file, f"client {index}: {error}: the silo's file is refused")


class TooFewSilosError(LdpflError, ValueError):
    """Too few silos remain once those the coordinator refused are left out: the run cannot start."""


def needed_silos(listed: int, *, min_clients: int | None, clients_per_round: int | None) -> int:
    """Return how many silos a run needs before round 1: two (one is no federation), or more where asked.

    ``--min-clients-per-round`` and ``--clients-per-round`` ask for more; a run that lists one silo needs one.
    """
    return max(min_clients or 0, clients_per_round or 1, min(2, listed))


def enough_remain(kept: int, listed: int, left: Sequence[LeftOut], needed: int) -> None:
    """Raise :class:`TooFewSilosError` (one line naming every left-out silo) when fewer than ``needed`` remain."""
    if kept < max(needed, 1):
        named = "; ".join(x.reason for x in left)
        raise TooFewSilosError(f"{named}; with the refused left out {kept} of {listed} silos remain, fewer than "
                               f"the {max(needed, 1)} the run needs (two, or --min-clients-per-round, "
                               "--clients-per-round)")
