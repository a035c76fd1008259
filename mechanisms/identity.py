"""``none``: no randomization. Its report says so (exact ε = inf)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import PACKED_BITS, PARAMETERS, FederationWiring, Mechanism
from .registry import register
from .report import PrivacyReport


@register
@dataclass(frozen=True)
class NoRandomization(Mechanism):
    """Returns a copy of its input; marks the output non-private."""

    NAME: ClassVar[str] = "none"
    SOURCE: ClassVar[str] = "non-private baseline"
    DOMAIN: ClassVar[str] = "any"
    SUMMARY: ClassVar[str] = "no randomization (non-private)"
    FEATURE_FORMAT: ClassVar[str] = PACKED_BITS  # stage 1 stores the fixed-point bits as they are
    RANDOMIZES: ClassVar[bool] = False
    # LDPFL Algorithm 1 line 20: clients send their parameters; LDPFL's privacy is in the features.
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        PARAMETERS, "no model perturbation (LDPFL: privacy is in the features)", budget=False)

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return a copy of ``x``."""
        return np.array(x, copy=True)

    def expected_density(self, input_density: np.ndarray) -> np.ndarray:
        """Return the input density: the identity keeps every bit."""
        return np.array(input_density, dtype=np.float64)

    def report(self) -> PrivacyReport:
        """Report exact ε = inf: the output is not private."""
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters={}, nominal_epsilon=None, nominal_delta=0.0,
            exact_epsilon_per_coordinate=math.inf, exact_epsilon_per_record=math.inf, exact_delta=0.0,
            coordinate="coordinate", record="record", notes=("output is NOT private",),
        )
