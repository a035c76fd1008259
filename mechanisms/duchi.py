"""duchi: the multidimensional mechanism of Duchi, Jordan & Wainwright (DJW18 4.2), as WXY19 Algorithm 3."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .calibration_ldp import (
    THRESHOLD_SCALE,
    duchi_bound,
    duchi_c_d,
    duchi_keep_probability,
    duchi_variance,
    log_ratio,
    quantize64,
)
from .ldp_common import BoundedMechanism, bernoulli64, random_signs
from .registry import register
from .report import PrivacyReport


@register
@dataclass(frozen=True)
class Duchi(BoundedMechanism):
    """x ∈ [-1, 1]^d -> t* ∈ {-B, B}^d, unbiased (E[t*] = x), ε-LDP for the whole vector.

    WXY19 Algorithm 3: (1) draw v ∈ {-1, 1}^d with P(v_j = 1) = 1/2 + x_j/2; (2) T+ = {t* : t*·v ≥ 0},
    T- = {t* : t*·v ≤ 0}; (3) u = 1 with probability π = e^ε/(e^ε + 1); (4, 5) return a uniform tuple of T+
    if u = 1, of T- otherwise; B = (e^ε + 1)/(e^ε - 1)·C_d (``calibration_ldp.duchi_c_d``).

    Ties (t*·v = 0, only for even d) belong to both halves: that is the reading under which the even-d C_d,
    (2^(d-1) + binom(d, d/2)/2)/binom(d-1, d/2), counts |T+| and makes the output unbiased (tested).

    Sampling, vectorized: s is a uniform sign vector (raw bits). For odd d there are no ties, and s ↦ -s
    is a bijection between {s·v < 0} and {s·v > 0}: taking s if σ s·v > 0, else -s (σ = ±1 for T±) is
    uniform on the chosen half. For even d a draw with σ s·v < 0 is rejected and redrawn (ties are kept):
    uniform on the half with its ties, acceptance ≥ 1/2, rounds over the rejected rows only.

    Exact ε: u = 0 iff w < T for a uniform 64-bit word w with T = round(2^64/(e^ε + 1)); the kernel from v gives each
    tuple probability (1 - T/2^64)/N, T/(2^64 N) or 1/N (ties), N = |T±|. The output law for x is a mixture
    of these over v, and at the vertices x ∈ {-1, 1}^d, v = x deterministically, so the worst ratio is
    exactly (2^64 - T)/T.
    """

    NAME: ClassVar[str] = "duchi"
    SOURCE: ClassVar[str] = "Duchi, Jordan & Wainwright JASA 2018 Sec. 4.2; Wang et al. ICDE 2019 Algorithm 3"
    SUMMARY: ClassVar[str] = "Duchi et al.'s multidimensional mechanism: x in [-1,1]^d -> {-B, B}^d, unbiased"

    @cached_property
    def flip_threshold(self) -> int:
        """T with P(u = 0) = T/2^64 (sample from T-), the quantized 1/(e^ε + 1)."""
        return quantize64(1.0 / (1.0 + math.exp(self.epsilon)))

    @cached_property
    def output_bound(self) -> float:
        """B, the magnitude of every output value."""
        return duchi_bound(self.epsilon, self.dim)

    def output_values(self) -> tuple[float, ...]:
        """Return the two values every output coordinate takes, (-B, B)."""
        return (-self.output_bound, self.output_bound)

    def _randomize_rows(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        rows, d = t.shape
        v = rng.random(t.shape) < (1.0 + t) / 2.0  # line 1: P(v_j = +1) = 1/2 + t_j/2 (exactly 1 or 0 at ±1)
        lower = bernoulli64(self.flip_threshold, rows, rng)  # line 3: u = 0 -> sample from T-
        sigma = np.where(lower, -1, 1)
        s = random_signs(rows, d, rng)
        if d % 2:
            signed = sigma * (2 * np.count_nonzero(s == v, axis=1) - d)
            s ^= (signed < 0)[:, None]  # lines 4-5: reflect into the chosen half (no ties for odd d)
        else:
            pending = np.flatnonzero(sigma * (2 * np.count_nonzero(s == v, axis=1) - d) < 0)
            while pending.size:  # reject and redraw: uniform on the half including its ties
                fresh = random_signs(pending.size, d, rng)
                s[pending] = fresh
                agree = 2 * np.count_nonzero(fresh == v[pending], axis=1) - d
                pending = pending[sigma[pending] * agree < 0]
        return np.where(s, self.output_bound, -self.output_bound)

    def expected_variance(self, x: np.ndarray) -> np.ndarray:
        """B² - x_j² per coordinate (each output is ±B with mean x_j)."""
        return duchi_variance(np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0), self.epsilon, self.dim)

    def report(self) -> PrivacyReport:
        """Return the report: exact ε = ln((2^64 - T)/T) for the whole vector."""
        t = self.flip_threshold
        exact = log_ratio(THRESHOLD_SCALE - t, t)
        return self._report(
            exact, exact, coordinate="record (the d values are released jointly)", record=self.record_name(),
            probabilities={"p_upper_half": (THRESHOLD_SCALE - t) / THRESHOLD_SCALE,
                           "p_upper_half_formula": duchi_keep_probability(self.epsilon),
                           "flip_threshold": str(t), "B": self.output_bound, "C_d": duchi_c_d(self.dim)},
            notes=("inputs are clipped to [-1, 1]^d; outputs are in {-B, B}^d with E[output] = input",
                   "exact epsilon = ln(pi/(1-pi)) with the sampled pi, attained at the vertices of the cube",
                   "one record = the whole vector: the d values share one epsilon (no split per coordinate)"),
        )
