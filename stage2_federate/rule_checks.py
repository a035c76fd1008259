"""Refuse a robust rule that cannot act at the run's size (issue 42): it would silently be the plain mean.

A trimmed mean that trims nobody, a median of one or two uploads and a norm clipping of one upload change
nothing; each is refused in one line, as ε ≤ 0 is, naming the parameter and, for the trimmed mean, the smallest
β that trims one silo at the run's clients per round.
"""

from __future__ import annotations

import math

from ldpfl.common.errors import ParameterError

from . import aggregation as agg


def refuse_outlier_report(name: str, outlier_report: bool) -> None:
    """Refuse ``outlier_report`` for a robust rule, which reports the silos it discounts in every round already."""
    if outlier_report:
        raise ParameterError(f"`outlier_report`: aggregation {name!r} reports the silos it discounts or clips in "
                             "every round already; the option is for the non-robust rules (fedavg and kin)")


def check_coordinate_rule(name: str, clients: int) -> None:
    """Refuse a coordinate-wise rule (median, trimmed mean) over fewer than 3 clients per round: it drops nothing."""
    if clients < 3:
        raise ParameterError(f"aggregation {name!r} drops nothing with {clients} client(s) per round (it is then the "
                             "plain mean): it needs at least 3; use `aggregation` fedavg or norm-clipped, or more "
                             "`clients_per_round`")


def smallest_trim_fraction(clients: int) -> float:
    """Return the smallest β, rounded up to 3 decimals, for which ⌊β·n⌋ ≥ 1 at ``clients`` = n (β ≥ 1/n)."""
    return math.ceil(1000.0 / clients) / 1000.0


def check_trim_fraction(fraction: float, clients: int) -> None:
    """Refuse a β that trims no silo at ``clients`` per round, naming the smallest β that trims one."""
    if agg.trim_count(fraction, clients) == 0:
        raise ParameterError(f"`trim_fraction` {fraction:g} trims no silo with {clients} clients per round "
                             f"(floor({fraction:g} x {clients}) = 0: the plain mean); the smallest that trims one is "
                             f"{smallest_trim_fraction(clients):g}")


def check_clipping(name: str, clients: int) -> None:
    """Refuse norm clipping with one client per round: the bound is its own norm, nothing is clipped."""
    if clients < 2:
        raise ParameterError(f"aggregation {name!r} clips nothing with 1 client per round (the bound is its own "
                             "norm): use `aggregation` fedavg, or more `clients_per_round`")
