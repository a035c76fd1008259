"""RR: symmetric randomized response on every bit (LDPFL eqs. 5 and 15)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .bitflip import BitMechanism
from .calibration import BitClass, rr_probabilities
from .registry import register


@register
@dataclass(frozen=True)
class RR(BitMechanism):
    """Keep each bit with p = e^(ε/s)/(1 + e^(ε/s)), flip it otherwise."""

    NAME: ClassVar[str] = "rr"
    SOURCE: ClassVar[str] = "LDPFL eqs. 5, 15"
    SUMMARY: ClassVar[str] = "symmetric randomized response with budget ε/s per bit"

    def bit_classes(self) -> tuple[BitClass, ...]:
        """Return eq. 15's keep probability with budget ε/s per bit."""
        return rr_probabilities(self.epsilon, self.sensitivity)
