"""Bit statistics of packed-bit files: pure functions over arrays, and the densities they give per class.

For packed-bit files ``ldpfl inspect`` reports the density of 1s per class of bit positions (all, even,
odd, and each digit of the fixed-point encoding), next to the range the mechanism can produce and,
where ``/stats/input_bit_density`` is stored, the density it predicts. A density outside the range by
more than ``K_SE`` binomial standard errors means that the bits are not what the attributes say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

K_SE = 5.0  # tolerance of every density check, in binomial standard errors
DENSITY_ATOL = 1e-6  # float32 rounding of a stored density
INPUT_DENSITY_HINT = (
    "no unrandomized density stored: export with --store-input-density (stores a per-position aggregate "
    "of the unrandomized bits that the LDP guarantee does NOT cover), or compare against a "
    "--mechanism none export of the same client"
)

_LANE_MASK = np.uint64(0x0101010101010101)
_LANE_ROWS = 255  # a byte lane counts at most 255 ones before it would carry into its neighbour


def count_ones_per_position(packed: np.ndarray, width: int) -> np.ndarray:
    """Count the 1s at each of the first ``width`` bit positions, summed over the rows of ``packed``.

    ``packed`` is uint8 of shape (rows, bytes) as written by ``np.packbits`` (big-endian bit order).
    The rows are summed eight bytes at a time in uint64 lanes: for each bit k, ``(x >> k) & 0x01…01``
    leaves bit k of every byte in that byte's lowest bit, and up to 255 rows add without carries.

    Returns
    -------
    numpy.ndarray
        int64 counts of shape (width,).
    """
    packed = np.asarray(packed, dtype=np.uint8)
    rows, nbytes = packed.shape
    if width > nbytes * 8:
        raise ValueError(f"width {width} exceeds the {nbytes * 8} bits of a packed row")
    padded = -(-nbytes // 8) * 8
    if padded != nbytes:
        packed = np.concatenate([packed, np.zeros((rows, padded - nbytes), np.uint8)], axis=1)
    lanes = np.ascontiguousarray(packed).view(np.uint64)
    counts = np.zeros((8, padded), dtype=np.int64)  # counts[k, byte]: ones of bit k (0 = least significant)
    scratch = np.empty((min(rows, _LANE_ROWS), lanes.shape[1]), dtype=np.uint64)
    for start in range(0, rows, _LANE_ROWS):
        block = lanes[start:start + _LANE_ROWS]
        tmp = scratch[:len(block)]
        for k in range(8):
            np.right_shift(block, np.uint64(k), out=tmp)
            np.bitwise_and(tmp, _LANE_MASK, out=tmp)
            counts[k] += np.add.reduce(tmp, axis=0).view(np.uint8)
    # np.packbits puts position 8*b + j in bit 7 - j of byte b.
    return counts[::-1].T.reshape(-1)[:width]


def position_class_names(encoding_labels: Sequence[str]) -> list[str]:
    """Return the classes of bit positions reported: ``all``, ``even``, ``odd``, then each digit position."""
    return ["all", "even", "odd", *encoding_labels]


def reduce_per_class(values: np.ndarray, bits_per_value: int, *, how: str = "sum") -> np.ndarray:
    """Sum (or mean) a per-position array of shape (r*l,) over each class of :func:`position_class_names`.

    Positions are counted from 0 over the merged r*l bits; digit j of every value is position f*l + j.
    """
    values = np.asarray(values, dtype=np.float64)
    reduce = np.sum if how == "sum" else np.mean
    digits = values.reshape(-1, bits_per_value)
    return np.array([reduce(values), reduce(values[0::2]), reduce(values[1::2]), *reduce(digits, axis=0)])


def class_position_counts(features: int, bits_per_value: int) -> np.ndarray:
    """Positions per class of :func:`position_class_names`."""
    width = features * bits_per_value
    return np.array([width, (width + 1) // 2, width // 2, *([features] * bits_per_value)], dtype=np.int64)


def binomial_se(p: float, n: int) -> float:
    """Return the standard error of a density estimated from ``n`` bits of mean ``p`` (conservative for mixed p)."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n else math.inf


@dataclass(frozen=True)
class ClassDensity:
    """Density of 1s of one class of bit positions per split, with what the mechanism allows and predicts.

    ``low``/``high`` average the per-position bounds min/max(P(1|0), P(1|1)); ``predicted`` averages
    ``mechanism.expected_density(input_density)`` and describes the train split, the rows that
    ``/stats/input_bit_density`` is computed over. Each is ``None`` when unknown, as is the density of
    a split without rows.
    """

    name: str
    positions: int
    rows: Mapping[str, int]
    observed: Mapping[str, float | None]
    low: float | None = None
    high: float | None = None
    predicted: float | None = None
    deterministic: bool = False  # mechanism none: the train density must equal the prediction

    def bits(self, split: str) -> int:
        """Bits behind the density of ``split``: positions x rows."""
        return self.positions * self.rows.get(split, 0)

    @property
    def deviation_se(self) -> float | None:
        """(observed - predicted) on the train split, in binomial standard errors of the prediction."""
        observed = self.observed.get("train")
        if observed is None or self.predicted is None:
            return None
        se = binomial_se(self.predicted, self.bits("train"))
        diff = observed - self.predicted
        if self.deterministic or se == 0.0:  # only the float32 rounding of the stored density is allowed
            return 0.0 if abs(diff) <= DENSITY_ATOL else math.copysign(math.inf, diff)
        return diff / se

    def problems(self) -> list[str]:
        """Why this class contradicts the attributes (empty when it does not)."""
        out = []
        for split, observed in self.observed.items():
            if observed is None or self.low is None or self.high is None:
                continue
            bound = self.low if observed < self.low else self.high if observed > self.high else None
            n = self.bits(split)
            if bound is not None and abs(observed - bound) > K_SE * binomial_se(bound, n) + DENSITY_ATOL:
                out.append(f"class {self.name!r} ({split}): observed density {observed:.4g} lies outside the range "
                           f"[{self.low:.4g}, {self.high:.4g}] the mechanism can produce (by more than {K_SE:g} SE "
                           f"over {n} bits): the bits are not what the attributes say")
        z = self.deviation_se
        if z is not None and abs(z) > K_SE:
            out.append(f"class {self.name!r} (train): observed density {self.observed['train']:.4g} differs from "
                       f"the {self.predicted:.4g} predicted from /stats/input_bit_density by {z:+.1f} SE")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (with the deviation and whether the class is flagged)."""
        return {"name": self.name, "positions": self.positions, "rows": dict(self.rows),
                "observed": dict(self.observed), "low": self.low, "high": self.high, "predicted": self.predicted,
                "deterministic": self.deterministic, "deviation_se": self.deviation_se,
                "flagged": bool(self.problems())}


@dataclass(frozen=True)
class BitStatistics:
    """Density of 1s of a packed-bit file, per split and per class of bit positions."""

    rows: Mapping[str, int]
    features: int
    bits_per_value: int
    position_labels: tuple[str, ...]
    ones: Mapping[str, np.ndarray]  # split -> int64 (r*l,): 1s per position
    classes: tuple[ClassDensity, ...]
    input_density_stored: bool
    notes: tuple[str, ...] = ()

    @property
    def total_rows(self) -> int:
        """Return the rows over every split."""
        return int(sum(self.rows.values()))

    @property
    def total_ones(self) -> np.ndarray:
        """1s per position over every split, shape (r*l,)."""
        return np.asarray(np.sum(list(self.ones.values()), axis=0, dtype=np.int64))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the counts per position are left out)."""
        return {"rows": dict(self.rows), "features": self.features, "bits_per_value": self.bits_per_value,
                "position_labels": list(self.position_labels), "input_density_stored": self.input_density_stored,
                "classes": [c.to_dict() for c in self.classes], "notes": list(self.notes)}


def bit_statistics(ones: Mapping[str, np.ndarray], rows: Mapping[str, int], *, features: int, bits_per_value: int,
                   position_labels: Sequence[str], mechanism: Any | None,
                   input_density: np.ndarray | None) -> BitStatistics:
    """Return the per-class densities from per-position counts of 1s (one count array per split).

    The range and the prediction come from ``mechanism.expected_density`` (for ``none``, the identity,
    whose train density must equal the prediction exactly); ``mechanism`` is ``None`` when the
    attributes do not describe a usable bit mechanism.
    """
    width = features * bits_per_value
    n_pos = class_position_counts(features, bits_per_value)
    names = position_class_names(position_labels)
    observed = {split: reduce_per_class(ones[split], bits_per_value) / (n_pos * rows[split]) if rows[split] else None
                for split in ones}
    low = high = predicted = None
    notes: list[str] = []
    p10 = p11 = None
    if mechanism is not None:
        p10, p11 = mechanism.expected_density(np.zeros(width)), mechanism.expected_density(np.ones(width))
    if p10 is not None and p11 is not None:
        low = reduce_per_class(np.minimum(p10, p11), bits_per_value, how="mean")
        high = reduce_per_class(np.maximum(p10, p11), bits_per_value, how="mean")
        if input_density is not None and mechanism is not None:
            predicted = reduce_per_class(mechanism.expected_density(input_density), bits_per_value, how="mean")
    else:
        notes.append("no range or prediction: the attributes do not describe a usable bit mechanism")
    if input_density is None:
        notes.append(INPUT_DENSITY_HINT)
    deterministic = mechanism is not None and not mechanism.RANDOMIZES

    def pick(values: np.ndarray | None, i: int) -> float | None:
        return None if values is None else float(values[i])

    classes = tuple(
        ClassDensity(name, int(n_pos[i]), dict(rows), {s: pick(d, i) for s, d in observed.items()},
                     pick(low, i), pick(high, i), pick(predicted, i), deterministic=deterministic)
        for i, name in enumerate(names)
    )
    return BitStatistics(dict(rows), features, bits_per_value, tuple(position_labels),
                         {s: np.asarray(a, np.int64) for s, a in ones.items()}, classes, input_density is not None,
                         tuple(notes))
