"""DP-FedAW (Tan et al.): Gaussian perturbation (eq. 9) and cosine-similarity weights (eqs. 7, 8).

Decisions: the paper leaves δ and S_f to the implementer. Defaults here are δ = 1e-5 and S_f = 2.0.
S_f is enforced by clipping each record's L2 norm to S_f/2, so any two records lie within S_f.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import param
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

    sensitivity: float = param(2.0, "S_f, L2 sensitivity of one record (clip norm S_f/2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite_positive("sensitivity", self.sensitivity)

    @property
    def sigma(self) -> float:
        return gaussian_sigma_classic(self.epsilon, self.delta, self.sensitivity)

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        return clip_l2_norm(x, self.sensitivity / 2.0)

    def coordinate_sensitivity(self) -> float:
        return self.sensitivity

    def record_sensitivity(self) -> float | None:
        return self.sensitivity

    def record_name(self) -> str:
        return "record (L2-clipped vector)"


def cosine_similarity(p: np.ndarray, q: np.ndarray) -> float:
    """DP-FedAW eq. 7: P·Q / (|P| |Q|); 0 when either vector is zero."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    denominator = np.linalg.norm(p) * np.linalg.norm(q)
    return 0.0 if denominator == 0.0 else float(p @ q / denominator)


def label_distribution_weight(label_counts: np.ndarray, reference: np.ndarray | None = None) -> float:
    """DP-FedAW eq. 8: g = W(G, S), the cosine similarity between a client's label distribution G
    and the balanced distribution S (uniform over the classes unless ``reference`` is given)."""
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 0):
        raise ValueError(f"label_counts must be a non-empty 1-D array of counts >= 0, got {label_counts!r}")
    total = counts.sum()
    distribution = counts / total if total > 0 else counts
    balanced = np.full_like(distribution, 1.0 / distribution.size) if reference is None else np.asarray(reference)
    return cosine_similarity(distribution, balanced)
