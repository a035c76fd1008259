"""DP-FedAW (Tan et al.): Gaussian perturbation (eq. 9) and cosine-similarity weights (eqs. 7, 8).

Decisions: the paper leaves δ and S_f to the implementer. Defaults here are δ = 1e-5 and S_f = 2.0.
S_f is enforced by clipping each record's L2 norm to S_f/2, so any two records lie within S_f. The noise is
sampled exactly on a grid g (``real.GaussianBase``): the record is clipped to a norm slightly below S_f/2
first, so that after rounding to the grid its norm is still at most S_f/2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import UPDATE, FederationWiring, param
from .calibration import gaussian_sigma_classic
from .clipping import clip_l2_norm
from .real import GaussianBase
from .registry import register
from .validation import require_finite_positive


@register
@dataclass(frozen=True)
class FedAWGaussian(GaussianBase):
    """Clip the record's L2 norm to S_f/2, add N(0, σ²) with σ = S_f·√(2 ln(1.25/δ))/ε (Theorem 1)."""

    NAME: ClassVar[str] = "fedaw-gaussian"
    SOURCE: ClassVar[str] = "DP-FedAW eq. 9, Theorem 1"
    SUMMARY: ClassVar[str] = "L2-norm clip, Gaussian noise calibrated to S_f"
    # DP-FedAW eq. 9 perturbs the locally updated weights; clipping the L2 norm of the whole parameter
    # vector to S_f/2 would destroy the model, so the clip and the noise apply to the round's update,
    # as DP-FedAvg does.
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        UPDATE, "L2 clip of the update to S_f/2, Gaussian noise (DP-FedAW eq. 9)",
        options={"delta": "delta", "sensitivity": "sensitivity"})

    sensitivity: float = param(2.0, "S_f, L2 sensitivity of one record (clip norm S_f/2)")

    GRID_BOUND_BITS: ClassVar[int | None] = 24  # g ≤ (S_f/2)·2^-24: the rounding slack √d·g stays tiny

    def validate(self) -> None:
        """Check S_f."""
        super().validate()
        require_finite_positive("sensitivity", self.sensitivity)

    @property
    def sigma(self) -> float:
        """σ = S_f·√(2 ln(1.25/δ))/ε (Theorem 1)."""
        return gaussian_sigma_classic(self.epsilon, self.delta, self.sensitivity)

    def input_bound(self) -> float:
        """Return S_f/2, the clip norm."""
        return self.sensitivity / 2.0

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        """Clip each record's L2 norm to S_f/2 (eq. 9's sensitivity S_f)."""
        return clip_l2_norm(x, self.sensitivity / 2.0)

    def lattice_input(self, x: np.ndarray) -> np.ndarray:
        """Clip each record (in float64) to the norm S_f/2·(1 - 2^-20) - √d·g.

        Randomized rounding moves each of the d coordinates by less than g, so the record by less than √d·g
        in L2, and the rounded record's norm stays at most S_f/2; the 2^-20 margin covers the float error of
        the norm (≤ d·2^-53 relative). Any two rounded records then lie within S_f/g grid steps.
        """
        x = np.asarray(x, dtype=np.float64)
        d = x.shape[-1] if x.ndim else 1
        radius = self.sensitivity / 2.0 * (1.0 - 2.0**-20) - math.sqrt(d) * self.grid
        if radius <= 0.0:
            raise ValueError(f"records of {d} coordinates are too long for the grid {self.grid!r} and "
                             f"sensitivity={self.sensitivity!r}")
        return clip_l2_norm(x, radius)

    def coordinate_sensitivity_steps(self) -> int:
        """⌊S_f/g⌋: one coordinate of two rounded records of norm ≤ S_f/2 differs by at most S_f/g."""
        return math.floor(self.sensitivity / self.grid)

    def record_sensitivity_steps(self) -> float:
        """S_f/g, whatever d is."""
        return self.sensitivity / self.grid

    def record_name(self) -> str:
        """How the report names one record."""
        return "record (L2-clipped vector)"


def cosine_similarity(p: np.ndarray, q: np.ndarray) -> float:
    """DP-FedAW eq. 7: P·Q / (|P| |Q|); 0 when either vector is zero."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    denominator = np.linalg.norm(p) * np.linalg.norm(q)
    return 0.0 if denominator == 0.0 else float(p @ q / denominator)


def label_distribution_weight(label_counts: np.ndarray, reference: np.ndarray | None = None) -> float:
    """Compute DP-FedAW eq. 8: g = W(G, S), the weight of a client's label distribution G.

    W is the cosine similarity between G and the balanced distribution S (uniform over the classes unless
    ``reference`` is given).
    """
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 0):
        raise ValueError(f"label_counts must be a non-empty 1-D array of counts >= 0, got {label_counts!r}")
    total = counts.sum()
    distribution = counts / total if total > 0 else counts
    balanced = np.full_like(distribution, 1.0 / distribution.size) if reference is None else np.asarray(reference)
    return cosine_similarity(distribution, balanced)
