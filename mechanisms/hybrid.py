"""hybrid: the Hybrid Mechanism (WXY19 Section III-C) with k-of-d dimension sampling (WXY19 Algorithm 4).

Each reported value goes through PM (on the integer grid of ``piecewise``) with probability α and through
Duchi et al.'s one-value mechanism (WXY19 Algorithm 1, outputs ±B) otherwise, with
α = 1 - e^(-ε/2) for ε > ε* ≈ 0.61 and α = 0 below (then HM is Duchi's mechanism alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .calibration_ldp import (
    HYBRID_EPSILON_STAR,
    THRESHOLD_SCALE,
    PiecewiseGrid,
    duchi_1d_bound,
    duchi_1d_minus_probability,
    duchi_1d_variance,
    hybrid_alpha,
    hybrid_variance,
    log_ratio,
    piecewise_grid,
    quantize64,
)
from .ldp_common import bernoulli64, probability_thresholds
from .piecewise import SampledMechanism, piecewise_probabilities, sample_piecewise
from .registry import register
from .report import PrivacyReport


@register
@dataclass(frozen=True)
class Hybrid(SampledMechanism):
    """HM (WXY19 III-C), k-of-d sampled (Algorithm 4); both branches are unbiased, so HM is.

    Sampling: the branch is a 64-bit threshold Bernoulli (α quantized, 0 kept as 0). The Duchi branch
    outputs -B iff u < T(t) with T(t) = round(P(-B | t)·2^64), P(-B | t) = 1/2 - tanh(ε/2)·t/2; T is
    monotone in t, so its extremes are at t = ±1.

    Exact ε of one value: the branch probability does not depend on the input and the two branches'
    outputs are distinct values (checked: ``branches_overlap``), so the worst ratio is the larger of the
    two branches' exact ratios (PM's grid ratio; Duchi's T(-1)/T(1) and (2^64 - T(1))/(2^64 - T(-1))).
    If ±B fell on PM's grid the same number is an upper bound, and the report says so.
    """

    NAME: ClassVar[str] = "hybrid"
    SOURCE: ClassVar[str] = "Wang et al. ICDE 2019 Sec. III-C (HM: PM + Duchi Algorithm 1) with Algorithm 4"
    SUMMARY: ClassVar[str] = "Hybrid Mechanism (PM or Duchi per value), k of d values per record, unbiased"

    @cached_property
    def alpha_threshold(self) -> int:
        """T with P(PM branch) = T/2^64 (0 when α = 0)."""
        return quantize64(hybrid_alpha(self.epsilon_per_value), allow_zero=True)

    @property
    def alpha(self) -> float:
        """The sampled probability of the PM branch, T/2^64."""
        return self.alpha_threshold / THRESHOLD_SCALE

    @cached_property
    def grid(self) -> PiecewiseGrid:
        """PM's integer layout at budget ε/k."""
        return piecewise_grid(self.epsilon_per_value, self.grid_bits)

    @cached_property
    def duchi_bound(self) -> float:
        """B of the Duchi branch (before the d/k scaling)."""
        return duchi_1d_bound(self.epsilon_per_value)

    def _duchi_thresholds(self, t: np.ndarray) -> np.ndarray:
        return probability_thresholds(duchi_1d_minus_probability(t, self.epsilon_per_value))

    @cached_property
    def duchi_epsilon(self) -> float:
        """Exact ε of the Duchi branch from the thresholds at t = -1 and t = 1."""
        low, high = (int(v) for v in self._duchi_thresholds(np.array([1.0, -1.0])))  # T(1) <= T(-1)
        return max(log_ratio(high, low), log_ratio(THRESHOLD_SCALE - low, THRESHOLD_SCALE - high))

    @cached_property
    def branches_overlap(self) -> bool:
        """Whether ±B (Duchi branch) is also a value of PM's grid (then the outputs are not distinct)."""
        if self.alpha_threshold == 0:
            return False
        j = round(self.duchi_bound / self.grid.step)
        return abs(j) <= self.grid.half_range and j * self.grid.step == self.duchi_bound

    @cached_property
    def value_epsilon(self) -> float:
        """Exact ε of one reported value (see the class docstring)."""
        if self.alpha_threshold == 0:
            return self.duchi_epsilon
        return max(self.grid.epsilon, self.duchi_epsilon)

    def output_range(self) -> tuple[float, float]:
        """Return [-h, h]: h is the larger of PM's extreme grid point and Duchi's B, both scaled by d/k.

        PM's grid counts only when its branch is ever taken (α > 0); the unsampled values are 0.
        """
        pm = self.grid.half_range * (self.grid.step * self.scale) if self.alpha_threshold else 0.0
        high = max(pm, self.duchi_bound * self.scale)
        return -high, high

    def _randomize_values(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(t.size, dtype=np.float64)
        use_pm = bernoulli64(self.alpha_threshold, t.size, rng)
        pm = np.flatnonzero(use_pm)
        out[pm] = sample_piecewise(t[pm], self.grid, self.grid_bits, rng) * (self.grid.step * self.scale)
        du = np.flatnonzero(~use_pm)  # WXY19 Algorithm 1 on the rest
        minus = bernoulli64(self._duchi_thresholds(t[du]), du.size, rng)
        b = self.duchi_bound * self.scale
        out[du] = np.where(minus, -b, b)
        return out

    def value_variance(self, t: np.ndarray) -> np.ndarray:
        """α Var_PM(grid) + (1 - α) (B² - t²), with the sampled α."""
        a = self.alpha
        pm = self.grid.variance(t) if self.alpha_threshold else 0.0
        return a * pm + (1.0 - a) * duchi_1d_variance(t, self.epsilon_per_value)

    def report(self) -> PrivacyReport:
        """Return the report: per value the larger branch ε, per record k times it."""
        eps = self.epsilon_per_value
        probabilities: dict[str, object] = {
            "alpha": self.alpha, "alpha_formula": hybrid_alpha(eps), "epsilon_star": HYBRID_EPSILON_STAR,
            "duchi_B": self.duchi_bound, "duchi_exact_epsilon": self.duchi_epsilon,
            "paper_variance_at_t1": float(hybrid_variance(1.0, eps)),
        }
        if self.alpha_threshold:
            probabilities["piecewise"] = piecewise_probabilities(self.grid, eps, self.grid_bits,
                                                                 self.grid.step * self.scale)
        notes = [*self.sampling_notes(),
                 f"per value: PM branch with probability alpha = {self.alpha:.6g} "
                 f"(0 when epsilon/k <= epsilon* = {HYBRID_EPSILON_STAR:.4f}), Duchi's +-B otherwise; exact epsilon "
                 "= the larger of the two branches' exact epsilons"]
        if self.branches_overlap:
            notes.append("+-B lies on PM's grid: the reported epsilon is an upper bound (the mixture's is lower)")
        return self._report(
            self.value_epsilon, self.k * self.value_epsilon,
            coordinate=f"reported value (budget epsilon/k = {eps:.6g})", record=self.record_name(),
            probabilities=probabilities, notes=tuple(notes),
        )
