"""FedAdam: Adam on the server (Reddi et al. 2021, "Adaptive Federated Optimization", ICLR, Algorithm 2).

With Δ_t = W' − W the round's step (the strategy's model minus the broadcast one; the paper's average of the
clients' updates when the strategy is their mean):

    m_t = β1 m_{t−1} + (1 − β1) Δ_t
    v_t = β2 v_{t−1} + (1 − β2) Δ_t²
    x_{t+1} = x_t + η m_t / (√v_t + τ)        (element-wise)

with m_{−1} = 0 and v_{−1} = τ² (the paper's "v_{−1} ≥ τ²"), and no bias correction (the paper has none; Flower's
``FedAdam`` starts both moments at 0). Defaults: β1 = 0.9 and β2 = 0.99 (the paper's §5), τ = 1e-3 and
η = 1e-2 (inside the grids the paper tunes them over: tune them for a task). m and v are the state kept across
rounds, in float64; a round that kept the previous model leaves them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Parameter, ServerOptimizer, register, restored_arrays

FIRST_MOMENT = "m"
SECOND_MOMENT = "v"


@register
class FedAdam(ServerOptimizer):
    """Adam on the server's pseudo-gradient Δ = W' − W (Reddi et al. 2021, Algorithm 2)."""

    NAME = "fedadam"
    SOURCE = "Reddi et al. 2021 (ICLR), Algorithm 2 (FedAdam)"
    SUMMARY = "Adam on the server: W += lr m/(sqrt(v) + tau) over the rounds' steps"
    PARAMETERS = {
        "lr": Parameter(1e-2, 0.0, low_open=True, help="η, the server learning rate"),
        "beta1": Parameter(0.9, 0.0, 1.0, help="β1, the first moment's decay"),
        "beta2": Parameter(0.99, 0.0, 1.0, help="β2, the second moment's decay"),
        "tau": Parameter(1e-3, 0.0, low_open=True, help="τ, the adaptivity (and v's starting value τ²)"),
    }

    def __init__(self, **params: float) -> None:
        super().__init__(**params)
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def step(self, global_vector: np.ndarray, next_vector: np.ndarray, *, kept: bool = False) -> np.ndarray:
        """Return x + η m_t / (√v_t + τ) after the moments' updates (``next_vector`` itself when ``kept``)."""
        if kept:
            return next_vector
        lr, beta1, beta2, tau = (self.params[k] for k in ("lr", "beta1", "beta2", "tau"))
        x = np.asarray(global_vector, dtype=np.float64)
        delta = np.asarray(next_vector, dtype=np.float64) - x
        m = np.zeros_like(x) if self.m is None else self.m
        v = np.full_like(x, tau * tau) if self.v is None else self.v
        self.m = beta1 * m + (1.0 - beta1) * delta
        self.v = beta2 * v + (1.0 - beta2) * delta * delta
        return (x + lr * self.m / (np.sqrt(self.v) + tau)).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """Return ``{"m": m, "v": v}``, or nothing before the first step."""
        if self.m is None or self.v is None:
            return {}
        return {FIRST_MOMENT: self.m.copy(), SECOND_MOMENT: self.v.copy()}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Put back the moments of a :meth:`state`."""
        arrays = restored_arrays(self.NAME, state, (FIRST_MOMENT, SECOND_MOMENT))
        if arrays and set(arrays) != {FIRST_MOMENT, SECOND_MOMENT}:
            raise ValueError(f"server optimizer {self.NAME!r} keeps both moments m and v, got {', '.join(arrays)}")
        self.m, self.v = arrays.get(FIRST_MOMENT), arrays.get(SECOND_MOMENT)
