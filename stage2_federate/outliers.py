"""Which silos a rule discounted or clipped each round, and by how much (issue 42): a typed record and its math.

Every robust rule returns, with its aggregate, an :class:`OutlierReport`: one :class:`SiloDiscount` per
aggregated silo, which the round's record writes (``metrics.json``'s ``outliers``) and the run's summary reads
(:func:`persistent_outliers`). Two figures describe each silo:

* ``discount`` in [0, 1], what the rule did to it, scaled so that 0 is what it does to a typical honest silo:

  - coordinate-wise rules (``median``, ``trimmed-mean``, which keep the values between the k-th smallest and the
    k-th largest of every coordinate): 1 − s_i / e, where s_i is the share of coordinates whose value of silo i
    was kept (a value tied with the band's edge counts as kept) and e = (n − 2k) / n the share an exchangeable
    silo keeps on average (clipped at 0);
  - ``norm-clipped``: 1 − min(1, C / ‖u_i‖), the fraction of its update the clipping took away;
  - FedAvg's optional report (``outlier_report``): 0, the mean counts every silo in full.

* ``distance``: ‖u_i − m‖ / D, where m is the round's coordinate-wise median of the uploads and D the lower
  median of the n distances ‖u_j − m‖ (1: a typical silo; see :data:`OUTLIER_BOUND`). The median is taken over the
  uploads themselves: shifting every upload by the global model changes no distance, so parameters and updates give
  the same figure.

A silo is *named* in the round when its discount reaches :data:`DISCOUNT_BOUND` (a robust rule), or, in FedAvg's
report, when its distance exceeds :data:`OUTLIER_BOUND`. A silo named in more than half of the rounds in which it
was aggregated is named in the run's summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DISCOUNT_BOUND = 0.5
"""A robust rule names a silo whose discount reaches this: it counted at most half as much as a typical silo."""

OUTLIER_BOUND = 3.0
"""FedAvg's outlier report flags a silo more than this many times as far from the round's median as a typical silo.

For n honest silos whose updates are a common mean plus independent noise of one scale (DP-SGD's Gaussian noise,
the sampling noise of IID silos), ‖u_i − m‖² is a sum of d coordinates with the same expectation for every silo,
so the ratio concentrates at 1 with a relative spread of order 1/√d (a few per cent at d ≥ 1000). The bound 3
leaves honest heterogeneity (non-IID silos) a factor of 3; a silo it does not flag can pull the mean at most
3·D/n further from the median than a typical silo does. See docs/cross-silo.md.
"""

DISCOUNTED, CLIPPED, FLAGGED = "discounted", "clipped", "flagged"


@dataclass(frozen=True)
class SiloDiscount:
    """What one round's rule did to one silo's upload (see the module docstring)."""

    client: int
    discount: float
    distance: float
    named: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as written in ``metrics.json``."""
        return {"client": self.client, "discount": round(self.discount, 6), "distance": round(self.distance, 6),
                "named": self.named}


@dataclass(frozen=True)
class OutlierReport:
    """A round's report: the rule's action (discounted, clipped or flagged) and each aggregated silo's figures."""

    action: str
    silos: tuple[SiloDiscount, ...]

    @property
    def named(self) -> tuple[int, ...]:
        """The silos named in the round."""
        return tuple(s.client for s in self.silos if s.named)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as written in a round's row (``outliers``)."""
        return {"action": self.action, "named": list(self.named), "silos": [s.to_dict() for s in self.silos]}

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> OutlierReport:
        """Read a report written by :meth:`to_dict`."""
        return cls(str(row["action"]), tuple(SiloDiscount(int(s["client"]), float(s["discount"]),
                                                          float(s["distance"]), bool(s["named"]))
                                             for s in row["silos"]))


def _rows(uploads: Sequence[np.ndarray]) -> np.ndarray:
    return np.stack([np.asarray(u, dtype=np.float64) for u in uploads])


def median_distances(uploads: Sequence[np.ndarray]) -> np.ndarray:
    """Return ‖u_i − m‖ / D for each upload (m: coordinate-wise median, D: lower median of the distances)."""
    rows = _rows(uploads)
    distances = np.linalg.norm(rows - np.median(rows, axis=0), axis=1)
    ordered = np.sort(distances)
    scale = ordered[(len(ordered) - 1) // 2]
    if not scale > 0:  # half the silos sit on the median (identical uploads): the largest distance sets the scale
        scale = ordered[-1] if ordered[-1] > 0 else 1.0
    return distances / scale


def kept_discounts(uploads: Sequence[np.ndarray], trimmed: int) -> np.ndarray:
    """Return 1 − s_i / e for each upload when ``trimmed`` values are dropped at each end of every coordinate.

    s_i: the share of coordinates in which silo i's value lies in the kept band [k-th smallest, k-th largest]
    (ties with an edge count as kept); e = (n − 2k) / n. Clipped to [0, 1].
    """
    rows = _rows(uploads)
    n = rows.shape[0]
    if not 0 <= trimmed <= (n - 1) // 2:
        raise ValueError(f"trimmed must lie in [0, {(n - 1) // 2}] for {n} uploads, got {trimmed!r}")
    ordered = np.sort(rows, axis=0)
    kept = (rows >= ordered[trimmed]) & (rows <= ordered[n - 1 - trimmed])
    expected = (n - 2 * trimmed) / n
    return np.clip(1.0 - kept.mean(axis=1) / expected, 0.0, 1.0)


def report(clients: Sequence[int], uploads: Sequence[np.ndarray], discounts: Sequence[float] | np.ndarray | None,
           action: str) -> OutlierReport:
    """Return the round's report over ``clients`` (``discounts`` None: FedAvg's report, names by distance)."""
    distances = median_distances(uploads)
    if discounts is None:
        silos = [SiloDiscount(int(c), 0.0, float(r), bool(r > OUTLIER_BOUND)) for c, r in zip(clients, distances,
                                                                                            strict=True)]
    else:
        silos = [SiloDiscount(int(c), float(x), float(r), bool(x >= DISCOUNT_BOUND))
                 for c, x, r in zip(clients, discounts, distances, strict=True)]
    return OutlierReport(action, tuple(silos))


@dataclass(frozen=True)
class PersistentOutlier:
    """A silo named in more than half of the rounds in which it was aggregated (the run's summary)."""

    client: int
    action: str
    named_rounds: int
    rounds: int
    mean_discount: float
    mean_distance: float

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as written (``metrics.json``'s ``named_outliers``, ``--json``)."""
        return {"client": self.client, "action": self.action, "named_rounds": self.named_rounds,
                "rounds": self.rounds, "mean_discount": round(self.mean_discount, 6),
                "mean_distance": round(self.mean_distance, 6)}

    def line(self) -> str:
        """Return the summary's line on the silo."""
        how = f"mean discount {self.mean_discount:.2f}, " if self.action != FLAGGED else ""
        return (f"silo {self.client}: {self.action} in {self.named_rounds} of the {self.rounds} rounds it was "
                f"aggregated in ({how}mean distance {self.mean_distance:.2f} x the typical silo's from the median)")


def persistent_outliers(reports: Sequence[OutlierReport | None]) -> list[PersistentOutlier]:
    """Return the silos named in more than half of the rounds whose report holds them, by client index."""
    seen: dict[int, list[SiloDiscount]] = {}
    action = ""
    for one in reports:
        if one is None:
            continue
        action = one.action
        for silo in one.silos:
            seen.setdefault(silo.client, []).append(silo)
    named = []
    for client in sorted(seen):
        entries = seen[client]
        count = sum(s.named for s in entries)
        if 2 * count > len(entries):
            named.append(PersistentOutlier(client, action, count, len(entries),
                                           float(np.mean([s.discount for s in entries])),
                                           float(np.mean([s.distance for s in entries]))))
    return named
