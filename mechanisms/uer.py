"""UER: utility enhancing randomization (LDPFL Theorem 2, eq. 17), the default of stage 1."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import param
from .bitflip import BitMechanism
from .calibration import BitClass, uer_probabilities
from .registry import register
from .validation import require_finite_positive


@register
@dataclass(frozen=True)
class UER(BitMechanism):
    """Even and odd positions of the merged bit vector get different probabilities (eq. 17)."""

    NAME: ClassVar[str] = "uer"
    SOURCE: ClassVar[str] = "LDPFL Theorem 2, eq. 17"
    SUMMARY: ClassVar[str] = "utility enhancing randomization over the fixed-point bits"
    CLASS_NAMES: ClassVar[tuple[str, ...]] = ("even", "odd")

    alpha: float = param(10.0, "α, privacy budget coefficient")

    def __post_init__(self) -> None:
        """Validate α besides the bit mechanism's parameters."""
        super().__post_init__()
        require_finite_positive("alpha", self.alpha)

    def bit_classes(self) -> tuple[BitClass, ...]:
        """Return eq. 17's probabilities for the even and odd positions."""
        return uer_probabilities(self.epsilon, self.alpha, self.sensitivity)

    def position_classes(self) -> np.ndarray:
        """Map position i ∈ 2n (even, counted from 0) to class 0 and i ∈ 2n + 1 (odd) to class 1."""
        return np.arange(self.width, dtype=np.intp) % 2

    def extra_notes(self) -> tuple[str, ...]:
        """Note that eq. 17's even positions lose about ln(α) whatever ε is."""
        return (
            f"eq. 17 keeps an even-position 1 with probability alpha/(1+alpha) = {self.alpha / (1 + self.alpha):.4g} "
            f"whatever epsilon is: an even bit alone loses about ln(alpha) = {math.log(self.alpha):.3g} "
            "(see the per-class exact epsilons above), so the epsilon-LDP claim of eq. 18 does not follow "
            "from the probabilities of eq. 17",
        )
