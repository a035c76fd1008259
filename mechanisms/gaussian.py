"""Classic Gaussian perturbation after element-wise clipping (WU 3.1 with σ of eq. 7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import PARAMETERS, FederationWiring, param
from .calibration import gaussian_sigma_classic
from .real import ElementwiseClippedGaussian
from .registry import register
from .validation import require_finite_positive


@register
@dataclass(frozen=True)
class Gaussian(ElementwiseClippedGaussian):
    """Clip to [-c, c], add N(0, σ²) with σ = Δ·√(2 ln(1.25/δ))/ε.

    Δ defaults to 2c, the L2 sensitivity of one clipped coordinate (the paper's setting c = 4, Δ2 = 8).
    """

    NAME: ClassVar[str] = "gaussian"
    SOURCE: ClassVar[str] = "WU 3.1 clipping + eq. 7 sigma (classic Gaussian mechanism)"
    SUMMARY: ClassVar[str] = "element-wise clip to [-c, c], classic Gaussian noise"
    # WU 3.1 with the classic σ (eq. 7): clip the local parameters, add N(0, σ_i²).
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        PARAMETERS, "clip to [-c, c], classic Gaussian sigma (Wu eq. 7)",
        options={"clip": "clip", "delta": "delta", "sensitivity": "sensitivity"})

    sensitivity: float | None = param(None, "Δ, L2 sensitivity used in σ (default 2c)")

    def validate(self) -> None:
        """Check c and Δ."""
        super().validate()
        if self.sensitivity is not None:
            require_finite_positive("sensitivity", self.sensitivity)

    @property
    def calibration_sensitivity(self) -> float:
        """Δ in σ: the given sensitivity, or 2c."""
        return 2.0 * self.clip if self.sensitivity is None else float(self.sensitivity)

    @property
    def sigma(self) -> float:
        """σ = Δ·√(2 ln(1.25/δ))/ε (WU eq. 7)."""
        return gaussian_sigma_classic(self.epsilon, self.delta, self.calibration_sensitivity)
