"""ldpsign (Wu et al. eqs. 6-7); its sign aggregation (eqs. 9, 10, 13, 16) is stage 2's ``SignAggregation``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import UPDATE, FederationWiring, param, require_generator
from .calibration import (
    UNIFORM_STEPS,
    gaussian_sigma_classic,
    ldpsign_endpoint_counts,
    ldpsign_epsilon_per_coordinate,
    ldpsign_plus_one_thresholds,
)
from .clipping import clip_elementwise
from .real import RealMechanism, pure_report
from .registry import register
from .report import PrivacyReport
from .validation import require_finite_positive, require_open_unit_interval


@register
@dataclass(frozen=True)
class LDPSign(RealMechanism):
    """Each clipped entry p becomes +1 with probability Φ(p/σ), else -1 (eq. 6).

    σ = Δ2·√(2 ln(1.25/δ))/ε (eq. 7). Defaults follow the paper's non-IID setting (5.3.1):
    δ = 1e-5, c = 4, Δ2 = 8. The output is a sign, a post-processing of p + N(0, σ²), and with inputs
    in [-c, c] it is pure ε'-LDP per coordinate with ε' = ln(Φ(c/σ)/Φ(-c/σ)).
    """

    NAME: ClassVar[str] = "ldpsign"
    SOURCE: ClassVar[str] = "WU eqs. 6-7"
    SUMMARY: ClassVar[str] = "randomized sign with P(+1) = Phi(p/sigma)"
    # WU eqs. 6-7 applied to the update; the server steps W ← W + η_s·sign(mean) (signSGD with majority
    # vote, WU ref. [19]). Literal eq. 10 (sign mode ``literal``) perturbs the parameters, W ← sign(mean).
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        UPDATE, "randomized sign of the update (Wu eqs. 6-7), sign aggregation (eqs. 10/13/16)",
        options={"clip": "clip", "delta": "delta", "sensitivity": "l2_sensitivity"}, sign_aggregation=True)

    delta: float = param(1e-5, "δ used in σ (eq. 7), in (0, 1)")
    clip: float = param(4.0, "c, element-wise clipping bound")
    l2_sensitivity: float | None = param(None, "Δ2 in eq. 7 (default 2c)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_open_unit_interval("delta", self.delta)
        require_finite_positive("clip", self.clip)
        if self.l2_sensitivity is not None:
            require_finite_positive("l2_sensitivity", self.l2_sensitivity)
        self.sigma  # refuses an ε whose σ overflows  # noqa: B018

    @property
    def sigma(self) -> float:
        """σ = Δ2·√(2 ln(1.25/δ))/ε (eq. 7)."""
        sensitivity = 2.0 * self.clip if self.l2_sensitivity is None else self.l2_sensitivity
        return gaussian_sigma_classic(self.epsilon, self.delta, sensitivity)

    def noise_scale(self) -> float:
        """σ of eq. 7, whose sign is released."""
        return float(self.sigma)

    def probability_of_plus_one(self, x: np.ndarray) -> np.ndarray:
        """Φ(p/σ) for clipped entries p (eq. 6)."""
        from scipy import special  # lazy: keeps `import mechanisms` fast

        return special.ndtr(clip_elementwise(np.asarray(x, dtype=np.float64), self.clip) / self.sigma)

    def output_values(self) -> tuple[float, float]:
        """Return the two values every output coordinate takes, (-1, +1) (eq. 6)."""
        return -1.0, 1.0

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Return +1 with probability Φ(p/σ), else -1 (eq. 6), as a mixture of the two endpoint laws.

        Any Bernoulli(q) with Φ(-c/σ) ≤ q ≤ Φ(c/σ) is the mixture β·Bernoulli(Φ(c/σ)) + (1-β)·Bernoulli(Φ(-c/σ))
        with β = (q - Φ(-c/σ))/(Φ(c/σ) - Φ(-c/σ)). The sampler draws the endpoint law with probability β, then
        the sign against that law's fixed float threshold, so every input's law stays a mixture of the two
        endpoint laws that the report is computed from (``ldpsign_epsilon_per_coordinate``).
        """
        x = self.records(x)
        rng = require_generator(rng)
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        low, high = ldpsign_plus_one_thresholds(self.clip, self.sigma)
        q = self.probability_of_plus_one(x)
        beta = np.clip((q - low) / (high - low), 0.0, 1.0) if high > low else np.full(x.shape, 0.5)
        upper = rng.random(x.shape) < beta  # exactly always at p = c, never at p = -c
        plus = rng.random(x.shape) < np.where(upper, high, low)
        return (plus.astype(dtype) * 2 - 1).astype(dtype, copy=False)

    def report(self) -> PrivacyReport:
        """Pure ε per coordinate from the counts the sampler really draws at p = ±c; dim × that per record."""
        per_coordinate = ldpsign_epsilon_per_coordinate(self.clip, self.sigma)
        low, high = ldpsign_endpoint_counts(self.clip, self.sigma)
        return pure_report(
            self, per_coordinate, sigma=self.sigma,
            probabilities={"sampled_p_plus_one": {"at_minus_c": low[0] / UNIFORM_STEPS,
                                                  "at_plus_c": high[0] / UNIFORM_STEPS}},
            notes=("the nominal (epsilon, delta) calibrates sigma; the sign output is pure LDP with the "
                   "exact epsilon shown (delta = 0)",
                   "exact epsilon from the probabilities really sampled (53-bit uniform against float "
                   "thresholds at p = -c and p = +c, every input a mixture of the two): inf once Phi(c/sigma) "
                   "rounds to 1 (c/sigma above about 8.3), where p = c always gives +1"),
        )

