"""Values an encoding clamped at export (issue 42 item 6): the record a client file carries, and the export's bound.

The fixed-point encoding of a bit release (LDPFL eq. 14, ``mechanisms.encoding``) saturates |x| at 2^m - 2^-n,
also under ``none``; ``gaussian``, ``gaussian-wu``, ``ldpsign`` and ``laplace`` clip each value to [-c, c], the
bounded mechanisms (``duchi``, ``piecewise``, ``hybrid``) to [-1, 1] and ``pdpm`` to its safe range. A value
beyond that interval reaches the file as the interval's end: a column at 1e30, or a whole silo at float32's
largest value, becomes a column of extreme but valid-looking values. ``ldpfl export`` counts such values per
column (``ldpfl.stage1_features.export.clamping``) and

* refuses the export, naming the column and its count, when one column has more than ``MAX_CLAMPED_SHARE`` of
  its values clamped (nothing of that client is kept);
* below it, writes the count into the file as the attribute ``clamped_values`` (this record, as JSON) where it
  releases nothing the file does not already release: in files whose values are not randomized (mechanism
  ``none``, ε = ∞, and local-only files). A randomized file does not carry it: an exact count of the clear
  records would escape the file's ε (its release guarantee covers the randomized values only).

``ldpfl inspect`` shows the record and flags a count past ``MAX_CLAMPED_SHARE``, and a shareable private file
that carries the attribute. Imports nothing of ldpfl.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_CLAMPED_SHARE = 0.5
"""The largest share of one column's values an export may clamp. Past it the column carries almost nothing but
the interval's end (a column at 1e30, a silo at float32's maximum), and the export is refused naming it; an honest
column that trips it needs a wider interval (more integer bits, a larger clip or safe range)."""

_KEYS = ("low", "high", "rows", "values", "columns", "worst_column", "worst_count")


@dataclass(frozen=True)
class ClampedValues:
    """How many values of a client file's rows the encoding clamped into [``low``, ``high``].

    Attributes
    ----------
    low, high : float
        The interval the encoding or mechanism clamps each value to.
    rows : int
        The rows counted (train and test).
    values : int
        The values clamped, over every column.
    columns : int
        The columns with at least one clamped value.
    worst_column : int
        The column with the most clamped values (0 when none was clamped).
    worst_count : int
        Its clamped values.
    """

    low: float
    high: float
    rows: int
    values: int
    columns: int
    worst_column: int
    worst_count: int

    def __post_init__(self) -> None:
        """Refuse counts that contradict each other (``ValueError`` quoting them)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"clamped_values interval [{self.low}, {self.high}] is not a finite interval")
        counts = (self.rows, self.values, self.columns, self.worst_column, self.worst_count)
        if min(counts) < 0 or self.worst_count > self.rows or self.worst_count > self.values or \
                (self.values > 0) != (self.columns > 0) or self.values > self.worst_count * self.columns:
            raise ValueError(f"clamped_values counts (rows, values, columns, worst column, its count) = {counts} "
                             "contradict each other")

    @property
    def worst_share(self) -> float:
        """Return the share of the worst column's values that were clamped (0 without rows)."""
        return self.worst_count / self.rows if self.rows else 0.0

    @property
    def past_bound(self) -> bool:
        """Return whether the worst column is past ``MAX_CLAMPED_SHARE``."""
        return self.worst_share > MAX_CLAMPED_SHARE

    def describe(self) -> str:
        """Return the record on one line: ``12 values in 3 columns clamped into [-15.97, 15.97]; worst ...``."""
        head = f"{self.values} values in {self.columns} columns clamped into [{self.low:.6g}, {self.high:.6g}]"
        if not self.values:
            return f"no value clamped into [{self.low:.6g}, {self.high:.6g}] over {self.rows} rows"
        return (f"{head}; worst column {self.worst_column}: {self.worst_count} of {self.rows} rows "
                f"({self.worst_share:.2%}; bound {MAX_CLAMPED_SHARE:.0%})")

    def to_dict(self) -> dict[str, Any]:
        """Return the attribute's JSON object."""
        return {key: getattr(self, key) for key in _KEYS}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any] | ClampedValues) -> ClampedValues:
        """Read the attribute's JSON object (``ValueError`` naming a missing or malformed key); a record is kept."""
        if isinstance(value, ClampedValues):
            return value
        if not isinstance(value, Mapping):
            raise ValueError("clamped_values is not a JSON object")
        missing = [key for key in _KEYS if key not in value]
        if missing:
            raise ValueError(f"clamped_values lacks {', '.join(missing)}")
        try:
            ints = {key: _int(value[key]) for key in _KEYS[2:]}
            return cls(float(value["low"]), float(value["high"]), **ints)
        except (TypeError, OverflowError) as error:
            raise ValueError(f"clamped_values is malformed ({error})") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


__all__ = ["MAX_CLAMPED_SHARE", "ClampedValues"]
