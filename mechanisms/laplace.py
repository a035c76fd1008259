"""laplace: Laplace noise on values clipped to [-c, c], sampled on a power-of-two grid (DMNS06).

``x + rng.laplace(scale)`` would leak x through the low-order bits of the float result (Mironov, CCS 2012).
Here x is clipped, rounded without bias to an integer multiple of the grid g = 2^-b
(``secure_noise.randomized_round``), integer discrete Laplace noise is added
(``secure_noise.discrete_laplace``), and the sum is released as an exact multiple of g.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .base import param
from .calibration_ldp import discrete_laplace_variance, laplace_scale
from .discrete_privacy import discrete_laplace_epsilon
from .ldp_common import BoundedMechanism
from .registry import register
from .report import PrivacyReport
from .secure_noise import MAX_NOISE_SCALE, MIN_LAPLACE_SCALE, SAMPLER_TV_PER_SAMPLE, add_discrete_laplace
from .validation import require_finite_positive, require_int_in_range

MAX_GRID_BITS = 40


@register
@dataclass(frozen=True)
class Laplace(BoundedMechanism):
    """Clip each value to [-c, c]; release (round(x/g) + DLap(t))·g with g = 2^-b.

    The user's ε is per record: a record of d values moves the rounded integers by at most
    Δ = d·2⌈c/g⌉ in L1 (each value lies in [-⌈c/g⌉, ⌈c/g⌉] after rounding), so the scale is set to
    t = Δ/ε grid units (DMNS06), and the exact ε per record is Δ/t (``discrete_privacy``), per value
    2⌈c/g⌉/t = ε/d. The output is unbiased (E = clipped x).
    """

    NAME: ClassVar[str] = "laplace"
    SOURCE: ClassVar[str] = "Dwork, McSherry, Nissim & Smith 2006 (Laplace), discrete on a 2^-b grid (secure_noise)"
    SUMMARY: ClassVar[str] = "clip to [-c, c], exact discrete Laplace noise on a power-of-2 grid, eps per record"

    epsilon: float = param(1.0, "ε of one whole record of d values: the noise scale is set from it (L1 "
                                "sensitivity 2c·d on the grid)")
    clip: float = param(1.0, "c, values are clipped to [-c, c] before the noise")
    grid_bits: int = param(12, "b, grid resolution: inputs are rounded without bias to multiples of 2^-b "
                               "(randomized rounding) and outputs lie on a fixed grid")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite_positive("clip (c)", self.clip)
        require_int_in_range("grid_bits (b)", self.grid_bits, 0, MAX_GRID_BITS)
        if not MIN_LAPLACE_SCALE <= self.scale <= MAX_NOISE_SCALE:
            raise ValueError(
                f"laplace: the noise scale d*2*ceil(c/g)/epsilon = {self.scale:.6g} grid steps (d={self.dim}, "
                f"c={self.clip!r}, g=2^-{self.grid_bits}, epsilon={self.epsilon!r}) must lie in "
                f"[2^-5, 2^44]; change grid_bits or clip")

    @property
    def bound(self) -> float:
        """C: inputs are clipped to [-c, c]."""
        return float(self.clip)

    @property
    def grid(self) -> float:
        """The grid step g = 2^-b."""
        return 2.0**-self.grid_bits

    @cached_property
    def value_sensitivity(self) -> int:
        """2⌈c/g⌉: how far one clipped, rounded value can move, in grid steps."""
        return 2 * math.ceil(self.clip / self.grid)

    @property
    def record_sensitivity(self) -> int:
        """d·2⌈c/g⌉: L1 sensitivity of a record, in grid steps."""
        return self.dim * self.value_sensitivity

    @cached_property
    def scale(self) -> float:
        """t, the discrete Laplace scale in grid steps (DMNS06: t = Δ/ε)."""
        return laplace_scale(self.epsilon, self.record_sensitivity)

    def _randomize_rows(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return add_discrete_laplace(t, self.scale * self.grid, self.grid, rng=rng)

    def expected_variance(self, x: np.ndarray) -> np.ndarray:
        """g²·(f(1 - f) + Var DLap(t)), f = frac(x/g): rounding plus noise, per value."""
        v = np.clip(np.asarray(x, dtype=np.float64), -self.clip, self.clip) / self.grid
        f = v - np.floor(v)
        return self.grid**2 * (f * (1.0 - f) + discrete_laplace_variance(self.scale))

    def sampled_delta(self, epsilon: float) -> float:
        """δ of the sampled law at the exact law's ε: (1 + e^ε)·d·2^-47 (``secure_noise.SAMPLER_TV_PER_SAMPLE``).

        A TV distance η between the sampled and the exact law of a record turns ε-DP into (ε, (1 + e^ε)·η)-DP:
        P'(S) ≤ P(S) + η ≤ e^ε Q(S) + η ≤ e^ε (Q'(S) + η) + η (docs/privacy.md, "What remains floating point").
        """
        return (1.0 + math.exp(epsilon)) * self.dim * SAMPLER_TV_PER_SAMPLE

    def report(self) -> PrivacyReport:
        """Return the report: exact ε = L1 sensitivity / t per record (discrete Laplace)."""
        per_record = discrete_laplace_epsilon(self.scale, self.record_sensitivity)
        per_value = discrete_laplace_epsilon(self.scale, self.value_sensitivity)
        return self._report(
            per_value, per_record, coordinate="value", record=self.record_name(),
            sensitivity=float(self.record_sensitivity) * self.grid, sigma=None,
            probabilities={"grid": self.grid, "scale_grid_steps": self.scale, "scale": self.scale * self.grid,
                           "value_sensitivity_grid_steps": self.value_sensitivity,
                           "record_sensitivity_grid_steps": self.record_sensitivity},
            notes=("epsilon is per record: scale t = d*2*ceil(c/g)/epsilon grid steps; exact epsilon = L1 "
                   "sensitivity / t (discrete Laplace, pure)",
                   "inputs are clipped to [-c, c]; outputs are exact multiples of g = 2^-b and unbiased",
                   f"the sampler's float acceptance tests put each value's noise law within 2^-47 of DLap(t) in "
                   f"total variation, a record's within d*2^-47 (docs/privacy.md); the figures are those of the "
                   f"exact law (pure, delta 0): the sampled law is (epsilon, (1 + e^epsilon)*d*2^-47 = "
                   f"{self.sampled_delta(per_record):.3g})-DP per record"),
            thresholds=False,
        )
