"""FedAvgM: server momentum (Hsu, Qi, Brown 2019, "Measuring the effects of non-identical data distribution", Alg. 1).

v ← β·v + Δ with Δ = W' − W the round's step, then W ← W + v; β = 0 is plain FedAvg (W ← W'). β is the
configuration's ``server_momentum``; the velocity v is the state kept across rounds (in the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from .base import ServerOptimizer, register, restored_arrays

if TYPE_CHECKING:
    from ldpfl.stage2_federate.config import FederationConfig

VELOCITY = "velocity"


@register
class FedAvgM(ServerOptimizer):
    """Server momentum: v ← β·v + (W' − W), W ← W + v (float32, as the model); W' itself when β = 0.

    A round that kept the previous model leaves v unchanged. v is created at the first step that moves the model.
    """

    NAME = "fedavgm"
    SOURCE = "Hsu, Qi, Brown 2019, Algorithm 1 (FedAvgM)"
    SUMMARY = "server momentum beta (`server_momentum`; 0: plain FedAvg)"

    def __init__(self, beta: float = 0.0, velocity: np.ndarray | None = None) -> None:
        super().__init__()
        self.beta = float(beta)
        self.velocity = velocity

    @classmethod
    def from_config(cls, config: FederationConfig) -> FedAvgM:
        """Return FedAvgM with β = ``server_momentum`` (it takes no ``server_params``)."""
        cls.checked(config.server_params)
        return cls(float(config.server_momentum))

    def step(self, global_vector: np.ndarray, next_vector: np.ndarray, *, kept: bool = False) -> np.ndarray:
        """Return W + v after v ← β·v + (W' − W) (``next_vector`` itself when β = 0 or ``kept``)."""
        if self.beta == 0.0 or kept:
            return next_vector
        step = np.asarray(next_vector, dtype=np.float32) - np.asarray(global_vector, dtype=np.float32)
        self.velocity = step if self.velocity is None else np.float32(self.beta) * self.velocity + step
        return (np.asarray(global_vector, dtype=np.float32) + self.velocity).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """Return ``{"velocity": v}``, or nothing before the first step."""
        return {} if self.velocity is None else {VELOCITY: self.velocity.copy()}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Put back the velocity of a :meth:`state`."""
        self.velocity = restored_arrays(self.NAME, state, (VELOCITY,)).get(VELOCITY)
