"""ldpsign (Wu et al. eqs. 6-7) and sign aggregation (eqs. 9, 10, 13, 16)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import param, require_generator
from .calibration import gaussian_sigma_classic, ldpsign_epsilon_per_coordinate
from .clipping import clip_elementwise
from .real import RealMechanism, pure_report
from .registry import register
from .report import PrivacyReport
from .validation import require_finite_positive, require_open_unit_interval, require_real_array


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

    delta: float = param(1e-5, "δ used in σ (eq. 7), in (0, 1)")
    clip: float = param(4.0, "c, element-wise clipping bound")
    l2_sensitivity: float | None = param(None, "Δ2 in eq. 7 (default 2c)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_open_unit_interval("delta", self.delta)
        require_finite_positive("clip", self.clip)
        if self.l2_sensitivity is not None:
            require_finite_positive("l2_sensitivity", self.l2_sensitivity)

    @property
    def sigma(self) -> float:
        sensitivity = 2.0 * self.clip if self.l2_sensitivity is None else self.l2_sensitivity
        return gaussian_sigma_classic(self.epsilon, self.delta, sensitivity)

    def probability_of_plus_one(self, x: np.ndarray) -> np.ndarray:
        """Φ(p/σ) for clipped entries p (eq. 6)."""
        from scipy import special  # lazy: keeps `import mechanisms` fast

        return special.ndtr(clip_elementwise(np.asarray(x, dtype=np.float64), self.clip) / self.sigma)

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        x = require_real_array(x)
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        uniforms = require_generator(rng).random(x.shape)
        plus = uniforms < self.probability_of_plus_one(x)
        return (plus.astype(dtype) * 2 - 1).astype(dtype, copy=False)

    def report(self) -> PrivacyReport:
        per_coordinate = ldpsign_epsilon_per_coordinate(self.clip, self.sigma)
        return pure_report(
            self, per_coordinate, sigma=self.sigma,
            notes=("the nominal (epsilon, delta) calibrates sigma; the sign output is pure LDP with the "
                   "exact epsilon shown (delta = 0)",),
        )


def sign(x: np.ndarray) -> np.ndarray:
    """Eq. 9: -1, 0 or +1 per entry."""
    return np.sign(x)


def sign_aggregate(updates: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Eqs. 10, 13, 16: sign of the (weighted) mean of the clients' sign vectors.

    ``updates`` has shape (clients, ...). ``weights`` (one per client) gives eq. 13; equal weights give
    eqs. 10 and 16 (the mean over the selected clients).
    """
    updates = np.asarray(updates, dtype=np.float64)
    if weights is None:
        return sign(updates.mean(axis=0))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != updates.shape[:1] or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(
            f"weights must be {updates.shape[0]} non-negative numbers with a positive sum, got {weights!r}"
        )
    return sign(np.tensordot(w / w.sum(), updates, axes=1))
