"""PDPM: personalized three-output perturbation (PLDP-FL Algorithm 2, eq. 10)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import PARAMETERS, FederationWiring, param, require_generator
from .calibration import (
    UNIFORM_STEPS,
    pdpm_endpoint_counts,
    pdpm_exact_epsilon,
    pdpm_output_values,
    pdpm_position,
    pdpm_thresholds,
    pdpm_variance_bound,
)
from .clipping import clip_to_interval
from .real import RealMechanism, pure_report
from .registry import register
from .report import PrivacyReport
from .validation import require_finite, require_finite_positive


@register
@dataclass(frozen=True)
class PDPM(RealMechanism):
    """PDPM: clip into τ = [c - L/2, c + L/2], centre, and map to one of three values (eq. 10).

    The output is unbiased (eq. 12).
    """

    NAME: ClassVar[str] = "pdpm"
    SOURCE: ClassVar[str] = "PLDP-FL Algorithm 2, eq. 10"
    SUMMARY: ClassVar[str] = "three-output unbiased perturbation over a personal safe range"
    # PLDP Algorithm 1 line 19: Personalized(w_i,t) perturbs the local weights over the client's own
    # safe range τ_i = [c_i - L_i/2, c_i + L_i/2] (the paper takes τ_i around [-1, 1]).
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        PARAMETERS, "PLDP-FL PDPM over each client's safe range tau_i = [c_i - L_i/2, c_i + L_i/2]",
        ranges=("safe_range_length", "center"))

    safe_range_length: float = param(2.0, "L, length of the safe range τ", "-L")
    center: float = param(0.0, "c, midpoint of the safe range τ")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite_positive("safe_range_length (L)", self.safe_range_length)
        require_finite("center", self.center)
        pdpm_output_values(self.epsilon, self.safe_range_length)  # refuses an ε/L whose outputs overflow
        pdpm_variance_bound(self.epsilon, self.safe_range_length)

    @property
    def safe_range(self) -> tuple[float, float]:
        """τ = (c - L/2, c + L/2)."""
        half = self.safe_range_length / 2.0
        return self.center - half, self.center + half

    def output_values(self) -> tuple[float, float, float]:
        """Return the three possible outputs (high, low, centre)."""
        high, low = pdpm_output_values(self.epsilon, self.safe_range_length)
        return high + self.center, low + self.center, self.center

    def noise_scale(self) -> float:
        """Return the standard deviation implied by its variance bound (``pdpm_variance_bound``)."""
        return math.sqrt(pdpm_variance_bound(self.epsilon, self.safe_range_length))

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Perturb each value with eq. 10's three outputs (Algorithm 2), as a mixture of the endpoint laws.

        Eq. 10 is linear in t = 2v/L, so P(· | t) = (1+t)/2·P(· | +1) + (1-t)/2·P(· | -1): the sampler first
        picks the endpoint law (+1 with probability (1+t)/2), then the output from that law's fixed float
        thresholds. Whatever float rounding does to (1+t)/2, every input's law stays a mixture of the two
        endpoint laws the report is computed from (``pdpm_exact_epsilon``).
        """
        x = self.records(x)
        rng = require_generator(rng)
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        centred = clip_to_interval(x, *self.safe_range) - self.center  # Algorithm 2 l.1-6
        t = pdpm_position(centred, self.safe_range_length)
        right = rng.random(x.shape) < (1.0 + t) / 2.0  # exactly always at t = 1, never at t = -1
        (left_high, left_low), (right_high, right_low) = pdpm_thresholds(self.epsilon)
        u = rng.random(x.shape)
        high, low = pdpm_output_values(self.epsilon, self.safe_range_length)
        out = np.where(u < np.where(right, right_high, left_high), high,
                       np.where(u < np.where(right, right_low, left_low), low, 0.0))  # Algorithm 2 l.7-15
        return (out + self.center).astype(dtype)  # l.16

    def report(self) -> PrivacyReport:
        """Pure ε per coordinate from the counts the sampler really draws at t = ±1; dim × that per record."""
        high, low, mid = self.output_values()
        left, right = pdpm_endpoint_counts(self.epsilon)
        names = ("high", "low", "centre")
        return pure_report(
            self, pdpm_exact_epsilon(self.epsilon),
            probabilities={"outputs": {"high": high, "low": low, "centre": mid},
                           "safe_range": list(self.safe_range),
                           "sampled_at_lower_end": {n: c / UNIFORM_STEPS for n, c in zip(names, left, strict=True)},
                           "sampled_at_upper_end": {n: c / UNIFORM_STEPS for n, c in zip(names, right, strict=True)}},
            notes=("inputs outside the safe range are clipped into it first",
                   "exact epsilon from the probabilities really sampled: each end's law is drawn with a 53-bit "
                   "uniform against float thresholds (counts out of 2^53), and every input's law is a mixture "
                   "of the two ends; inf once e^eps/(e^eps+2) rounds to 1 (eps above about 37.4), where the upper "
                   "end always outputs high"),
        )
