"""Gaussian model perturbation with σ from Wu et al. eq. 4 (IID setting)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import PARAMETERS, FederationWiring, param
from .calibration import gaussian_sigma_wu_eq4
from .real import ElementwiseClippedGaussian
from .registry import register
from .validation import require_int_in_range, require_open_unit_interval


@register
@dataclass(frozen=True)
class GaussianWu(ElementwiseClippedGaussian):
    """Clip to [-c, c] (WU 3.1), add N(0, σ²) with σ = √(4q²R/(1-q))·(2 ln(1/δ)/ε² + 1/ε) (eq. 4).

    Defaults are the paper's Fashion-MNIST IID setting (5.2.1): δ = 1/1000, q = 0.9, R = 20, c = 2.
    Eq. 4 does not involve c, so the exact ε per release depends on how c compares with σ.
    """

    NAME: ClassVar[str] = "gaussian-wu"
    SOURCE: ClassVar[str] = "WU 3.1 clipping + eq. 4 sigma"
    SUMMARY: ClassVar[str] = "element-wise clip, Gaussian noise with Wu et al.'s eq. 4 sigma"
    # WU 3.1: clip the local model parameters, add N(0, σ_i²) with σ_i of eq. 4 (R = the run's rounds).
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        PARAMETERS, "clip to [-c, c], Gaussian noise with Wu eq. 4 sigma (R = rounds)",
        options={"clip": "clip", "delta": "delta", "sample_rate": "sample_rate"}, rounds="rounds")

    delta: float = param(1e-3, "δ_i = 1/|D_i| in the paper, in (0, 1)")
    clip: float = param(2.0, "c, element-wise clipping bound")
    sample_rate: float = param(0.9, "q, client sampling probability in (0, 1)")
    rounds: int = param(20, "R, number of federation rounds")

    def validate(self) -> None:
        """Check c, q and R."""
        super().validate()
        require_open_unit_interval("sample_rate", self.sample_rate)
        require_int_in_range("rounds", self.rounds, 1)

    @property
    def sigma(self) -> float:
        """σ of WU eq. 4."""
        return gaussian_sigma_wu_eq4(self.epsilon, self.delta, self.sample_rate, self.rounds)

    def gaussian_notes(self) -> tuple[str, ...]:
        """Say what eq. 4 is meant for and what the figure covers."""
        return ("eq. 4 is stated for R rounds with sampling rate q; the exact figure is one release of "
                "one client's clipped vector, without amplification by sampling",)
