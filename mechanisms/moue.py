"""MOUE: modified optimized unary encoding (LDPFL Theorem 1, eq. 16)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import param
from .bitflip import BitMechanism
from .calibration import BitClass, moue_probabilities
from .registry import register
from .validation import require_finite_positive


@register
@dataclass(frozen=True)
class MOUE(BitMechanism):
    """One class: P(1->1) = 1/(1+α), P(0->1) = 1/(1 + α e^(ε/s))."""

    NAME: ClassVar[str] = "moue"
    SOURCE: ClassVar[str] = "LDPFL Theorem 1, eq. 16"
    SUMMARY: ClassVar[str] = "modified OUE: heavy randomization of 1s for large α"

    alpha: float = param(10.0, "α, privacy budget coefficient")

    def __post_init__(self) -> None:
        """Validate α besides the bit mechanism's parameters."""
        super().__post_init__()
        require_finite_positive("alpha", self.alpha)

    def bit_classes(self) -> tuple[BitClass, ...]:
        """Return eq. 16's probabilities."""
        return moue_probabilities(self.epsilon, self.alpha, self.sensitivity)
