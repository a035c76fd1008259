"""Float statistics of float32 files: per-feature moments and, for PDPM, the share of each output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FloatStatistics:
    """Per-feature mean and std of a float32 file over all its rows (train and test)."""

    rows: int
    mean: np.ndarray  # (r,)
    std: np.ndarray  # (r,)
    minimum: float | None
    maximum: float | None
    non_finite: int
    outputs: Mapping[str, float] | None = None  # PDPM: its three output values (high, low, centre)
    output_fractions: Mapping[str, float] | None = None  # share of each output, plus "other"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: per-feature mean and std summarized by min, median and max."""
        def summary(a: np.ndarray) -> dict[str, float | None]:
            if not a.size or not np.isfinite(a).any():
                return {"min": None, "median": None, "max": None}
            return {"min": float(np.nanmin(a)), "median": float(np.nanmedian(a)), "max": float(np.nanmax(a))}

        return {"rows": self.rows, "features": int(self.mean.size), "mean_per_feature": summary(self.mean),
                "std_per_feature": summary(self.std), "minimum": self.minimum, "maximum": self.maximum,
                "non_finite_values": self.non_finite, "outputs": None if self.outputs is None else dict(self.outputs),
                "output_fractions": None if self.output_fractions is None else dict(self.output_fractions)}


class MomentAccumulator:
    """Streaming per-column count, mean and M2 (Chan et al. pairwise update), in float64."""

    def __init__(self, width: int):
        self.n = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, block: np.ndarray) -> None:
        """Add the rows of ``block`` (float64 arithmetic)."""
        block = block.astype(np.float64)
        n_b = block.shape[0]
        if not n_b:
            return
        mean_b = block.mean(axis=0)
        m2_b = ((block - mean_b) ** 2).sum(axis=0)
        total = self.n + n_b
        delta = mean_b - self.mean
        self.mean += delta * (n_b / total)
        self.m2 += m2_b + delta**2 * (self.n * n_b / total)
        self.n = total

    @property
    def std(self) -> np.ndarray:
        """Return the population standard deviation per column (NaN without rows)."""
        return np.sqrt(self.m2 / self.n) if self.n else np.full(self.mean.shape, np.nan)
