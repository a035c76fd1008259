"""``none``: no randomization. Its report says so (exact ε = inf)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Mechanism
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

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> np.ndarray:
        return np.array(x, copy=True)

    def report(self) -> PrivacyReport:
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters={}, nominal_epsilon=None, nominal_delta=0.0,
            exact_epsilon_per_coordinate=math.inf, exact_epsilon_per_record=math.inf, exact_delta=0.0,
            coordinate="coordinate", record="record", notes=("output is NOT private",),
        )
