"""piecewise: the Piecewise Mechanism (WXY19 Algorithm 2) with k-of-d dimension sampling (WXY19 Algorithm 4).

PM's output is continuous in the paper. A float output drawn as ``l + (r - l)·U`` would carry the input in
its low-order bits (Mironov, CCS 2012), and its exact density ratio would be that of the floats, not of the
real numbers. So PM is sampled here on a fixed integer grid (``calibration_ldp.PiecewiseGrid``): the input
is rounded without bias to i/n (n = 2^b), the window is chosen with an integer-threshold Bernoulli, and a
point is drawn uniformly in the chosen region with exact bounded integers. Every output is j·step for an
integer j, and the exact ε comes from that discrete law.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .base import param
from .calibration_ldp import (
    PiecewiseGrid,
    piecewise_c,
    piecewise_grid,
    piecewise_variance,
    piecewise_window_probability,
    sampled_dimensions,
    sampled_variance,
)
from .ldp_common import BoundedMechanism, bernoulli64, randomized_round, sample_dimensions
from .registry import register
from .report import PrivacyReport
from .validation import require_int_in_range

MAX_GRID_BITS = 30


def sample_piecewise(t: np.ndarray, grid: PiecewiseGrid, grid_bits: int, rng: np.random.Generator) -> np.ndarray:
    """PM on integers: int64 j ∈ [-M, M] for values t ∈ [-1, 1] (one entry per value).

    i = randomized_round(t, 2^-b) ∈ [-n, n]; outside the window with probability T/2^64; then a uniform
    point: j = i - h + U(w) in the window, else U(2n) mapped onto [-M, i - h - 1] ∪ [i + h + 1, M].
    """
    n, h, m = grid.n, grid.half_window, grid.half_range
    i = randomized_round(t, 2.0**-grid_bits, rng=rng)
    outside = bernoulli64(grid.outside_threshold, t.size, rng)
    u = rng.integers(0, np.where(outside, 2 * n, grid.window))
    # Outside: the i + n points below the window come first (j = u - M), then the n - i points above it.
    return np.where(outside, np.where(u < i + n, u - m, u - n + h + 1), i - h + u)


@dataclass(frozen=True)
class SampledMechanism(BoundedMechanism):
    """Report k of the d values of each record (WXY19 Algorithm 4).

    The k values are chosen uniformly without replacement; each is randomized with budget ε/k and scaled
    by d/k, and the other d - k outputs are 0. Every output is unbiased.
    """

    grid_bits: int = param(16, "b, grid resolution: inputs are rounded without bias to multiples of 2^-b "
                               "(randomized rounding) and outputs lie on a fixed grid")
    sampled_dims: int | None = param(None, "k, values each record reports, each with budget ε/k "
                                           "(default max(1, min(d, floor(ε/2.5))), WXY19 Algorithm 4)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int_in_range("grid_bits (b)", self.grid_bits, 1, MAX_GRID_BITS)
        if self.sampled_dims is not None:
            require_int_in_range(f"sampled_dims (k, at most d = {self.dim})", self.sampled_dims, 1, self.dim)

    @property
    def k(self) -> int:
        """Values reported per record."""
        return sampled_dimensions(self.epsilon, self.dim) if self.sampled_dims is None else self.sampled_dims

    @property
    def epsilon_per_value(self) -> float:
        """ε/k, the budget of each reported value."""
        return self.epsilon / self.k

    @property
    def scale(self) -> float:
        """d/k, the factor that keeps the sampled outputs unbiased."""
        return self.dim / self.k

    def _randomize_rows(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        rows, d = t.shape
        k = self.k
        if k == d:
            return self._randomize_values(t.reshape(-1), rng).reshape(rows, d)
        index = sample_dimensions(rows, d, k, rng)  # Algorithm 4, line 2
        row = np.arange(rows)[:, None]
        out = np.zeros((rows, d), dtype=np.float64)
        out[row, index] = self._randomize_values(t[row, index].reshape(-1), rng).reshape(rows, k)  # lines 3-6
        return out

    def _randomize_values(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        """Randomize a flat array of values in [-1, 1] with budget ε/k; return them scaled by d/k."""
        raise NotImplementedError

    def value_variance(self, t: np.ndarray) -> np.ndarray:  # pragma: no cover
        """Variance of one reported value (before the d/k scaling) given t."""
        raise NotImplementedError

    def expected_variance(self, x: np.ndarray) -> np.ndarray:
        """Var of each output coordinate given x: (d/k)(Var[t*] + x²) - x² (WXY19 Algorithm 4)."""
        t = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
        return sampled_variance(self.value_variance(t), t, self.dim, self.k)

    def sampling_notes(self) -> tuple[str, ...]:
        """Return the report notes on the k-of-d sampling."""
        return (f"each record reports k = {self.k} of its d = {self.dim} values (WXY19 Algorithm 4), each with "
                f"epsilon/k = {self.epsilon_per_value:.6g}, scaled by d/k = {self.scale:.6g}; the others are 0",
                "per record = k x the exact epsilon of one reported value (the choice of values does not "
                "depend on the data)",
                "inputs are clipped to [-1, 1]^d; every output is unbiased")


@register
@dataclass(frozen=True)
class Piecewise(SampledMechanism):
    """PM (WXY19 Algorithm 2) on an integer grid, k-of-d sampled (Algorithm 4); see the module docstring.

    Outputs are exact multiples of ``output_step``: j·step·d/k with j ∈ [-M, M]. The variance of one
    reported value tends to Lemma 1's t²/(e^(ε/2) - 1) + (e^(ε/2) + 3)/(3 (e^(ε/2) - 1)²) as b grows
    (``PiecewiseGrid.variance`` gives it exactly for the grid).
    """

    NAME: ClassVar[str] = "piecewise"
    SOURCE: ClassVar[str] = "Wang et al. ICDE 2019 Algorithm 2 (PM) with Algorithm 4 (k-of-d sampling)"
    SUMMARY: ClassVar[str] = "Piecewise Mechanism on an exact grid, k of d values per record, unbiased"

    @cached_property
    def grid(self) -> PiecewiseGrid:
        """PM's integer layout at budget ε/k."""
        return piecewise_grid(self.epsilon_per_value, self.grid_bits)

    @cached_property
    def output_step(self) -> float:
        """Every output is an integer multiple of this: step·d/k."""
        return self.grid.step * self.scale

    def output_range(self) -> tuple[float, float]:
        """Return [-M·step·d/k, M·step·d/k]: the grid's extreme points, scaled (the unsampled values are 0)."""
        high = self.grid.half_range * self.output_step
        return -high, high

    def _randomize_values(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return sample_piecewise(t, self.grid, self.grid_bits, rng) * self.output_step

    def value_variance(self, t: np.ndarray) -> np.ndarray:
        """Return the grid PM's exact variance of one value (``PiecewiseGrid.variance``)."""
        return self.grid.variance(t)

    def report(self) -> PrivacyReport:
        """Return the report: per value the grid's exact ε, per record k times it."""
        g, eps = self.grid, self.epsilon_per_value
        return self._report(
            g.epsilon, self.k * g.epsilon, coordinate=f"reported value (budget epsilon/k = {eps:.6g})",
            record=self.record_name(),
            probabilities=piecewise_probabilities(g, eps, self.grid_bits, self.output_step),
            notes=(*self.sampling_notes(),
                   "PM is sampled on integers: input rounded to i/2^b, window {i-h..i+h} vs the 2n other points "
                   "chosen with a 64-bit threshold, a uniform point in the chosen region; exact epsilon = "
                   "ln(p_high/p_low) of that discrete law"),
        )


def piecewise_probabilities(g: PiecewiseGrid, eps: float, grid_bits: int, output_step: float) -> dict:
    """Describe PM's grid for a report (shared with hybrid)."""
    return {
        "grid": {"grid_bits": grid_bits, "n": g.n, "half_window_h": g.half_window, "half_range_M": g.half_range,
                 "output_step": output_step},
        "p_window": 1.0 - g.p_outside, "p_window_formula": piecewise_window_probability(eps),
        "p_high_point": g.p_high, "p_low_point": g.p_low, "outside_threshold": str(g.outside_threshold),
        "continuous_C": piecewise_c(eps), "lemma1_variance_at_t1": float(piecewise_variance(1.0, eps)),
        "grid_variance_at_t1": float(g.variance(1.0)),
        "exact_epsilon_per_value": g.epsilon,
    }
