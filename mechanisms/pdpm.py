"""PDPM: personalized three-output perturbation (PLDP-FL Algorithm 2, eq. 10)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import param, require_generator
from .calibration import pdpm_exact_epsilon, pdpm_output_values, pdpm_probabilities
from .clipping import clip_to_interval
from .real import RealMechanism, pure_report
from .registry import register
from .report import PrivacyReport
from .validation import require_finite, require_finite_positive, require_real_array


@register
@dataclass(frozen=True)
class PDPM(RealMechanism):
    """Inputs are clipped into τ = [c - L/2, c + L/2], centred, and mapped to one of three values
    with the probabilities of eq. 10; the output is unbiased (eq. 12)."""

    NAME: ClassVar[str] = "pdpm"
    SOURCE: ClassVar[str] = "PLDP-FL Algorithm 2, eq. 10"
    SUMMARY: ClassVar[str] = "three-output unbiased perturbation over a personal safe range"

    safe_range_length: float = param(2.0, "L, length of the safe range τ", "-L")
    center: float = param(0.0, "c, midpoint of the safe range τ")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite_positive("safe_range_length (L)", self.safe_range_length)
        require_finite("center", self.center)

    @property
    def safe_range(self) -> tuple[float, float]:
        half = self.safe_range_length / 2.0
        return self.center - half, self.center + half

    def output_values(self) -> tuple[float, float, float]:
        """The three possible outputs (high, low, centre)."""
        high, low = pdpm_output_values(self.epsilon, self.safe_range_length)
        return high + self.center, low + self.center, self.center

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        x = require_real_array(x)
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        centred = clip_to_interval(x.astype(np.float64), *self.safe_range) - self.center  # Algorithm 2 l.1-6
        p_high, p_low = pdpm_probabilities(centred, self.epsilon, self.safe_range_length)
        u = require_generator(rng).random(x.shape)
        high, low = pdpm_output_values(self.epsilon, self.safe_range_length)
        out = np.where(u < p_high, high, np.where(u < p_high + p_low, low, 0.0))  # Algorithm 2 l.7-15
        return (out + self.center).astype(dtype)  # l.16

    def report(self) -> PrivacyReport:
        high, low, mid = self.output_values()
        return pure_report(
            self, pdpm_exact_epsilon(self.epsilon, self.safe_range_length),
            probabilities={"outputs": {"high": high, "low": low, "centre": mid},
                           "safe_range": list(self.safe_range)},
            notes=("inputs outside the safe range are clipped into it first",),
        )
