"""OUE: optimized unary encoding (LDPFL eqs. 11-13) over the fixed-point bit layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .bitflip import BitMechanism
from .calibration import BitClass, oue_probabilities
from .registry import register


@register
@dataclass(frozen=True)
class OUE(BitMechanism):
    """p = 1/2 and q = 1/(1 + e^(2ε/s)): each of the s/2 bit pairs gets ε' = 2ε/s."""

    NAME: ClassVar[str] = "oue"
    SOURCE: ClassVar[str] = "LDPFL eqs. 11-13"
    SUMMARY: ClassVar[str] = "optimized unary encoding applied bit-wise"

    def bit_classes(self) -> tuple[BitClass, ...]:
        """Return OUE's probabilities with budget ε/s per bit."""
        return oue_probabilities(self.epsilon, self.sensitivity)
