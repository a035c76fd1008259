"""What released statistics say about the records: a class-conditional Gaussian with a pooled covariance.

Post-processing of :mod:`ldpfl.mechanisms.sufficient_statistics` releases (no privacy cost). From pooled noisy
statistics (S, N, M) of n = Σ_c N_c records:

* class means μ_c = S_c / N_c and priors π_c = N_c / n (each N_c floored at 1: a noisy count may be ≤ 0);
* the within-class covariance Σ = (M − Σ_c S_c S_cᵀ / N_c) / (n − c) (Fisher's pooled scatter), or M / (n − c)
  when M is already about the class means (a centered release);
* M's noise is σ_M (G + Gᵀ)/2, a Wigner matrix: its spectrum fills [−τ√(2k), τ√(2k)] with τ = σ_M/(n − c)
  (the semicircle law: off-diagonal variance τ²/2, Anderson, Guionnet, Zeitouni 2010, Theorem 2.1.1), so
  Σ's eigenvalues below that edge are noise. Σ is regularized to Σ + λ I with λ = ``shrinkage`` · τ√(2k)
  (at least ``MIN_RIDGE`` times the mean eigenvalue) after its eigenvalues are floored at 0 (a covariance is
  positive semi-definite);
* Fisher's linear discriminant (LDA): class scores z Σ⁻¹ μ_c − ½ μ_cᵀ Σ⁻¹ μ_c + log π_c (Hastie, Tibshirani,
  Friedman 2009, eq. 4.10);
* synthetic records (:func:`synthetic_records`): round(N_c) draws of N(μ_c, Σ) per class from a recorded public
  seed, a deterministic function of the statistics and the seed.

Only numpy is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .sufficient_statistics import NoiseScales, Statistics

SHRINKAGE = 0.1
"""Default λ in units of the noise's spectral edge τ√(2k): chosen on the validation records of MNIST-5k and of
Fashion-MNIST's silos (docs/RESULTS.md section 9)."""
MIN_RIDGE = 1e-2
"""The ridge's floor, in units of the mean eigenvalue of the estimated covariance (whatever the noise): chosen on
MNIST-5k's validation records with silos of 150 and 360 records (never worse than 0 there; 0.1 is)."""


@dataclass(frozen=True)
class GaussianModel:
    """Class means (c, k), their priors (c,), the regularized pooled covariance (k, k) and the counts it used."""

    means: np.ndarray
    priors: np.ndarray
    covariance: np.ndarray
    counts: np.ndarray

    def discriminant(self) -> tuple[np.ndarray, np.ndarray]:
        """Return LDA's weights (k, c) and biases (c,): Σ⁻¹ μ_c and −½ μ_cᵀ Σ⁻¹ μ_c + log π_c."""
        weights = np.linalg.solve(self.covariance, self.means.T)
        biases = -0.5 * np.einsum("ck,kc->c", self.means, weights) + np.log(self.priors)
        return weights, biases


def noise_edge(scales: NoiseScales, records: float, classes: int, width: int) -> float:
    """Return τ√(2k), the spectral radius of the covariance's noise (τ = σ_M / (n − c))."""
    return scales.moments / max(records - classes, 1.0) * math.sqrt(2.0 * width)


def estimate(stats: Statistics, scales: NoiseScales, *, shrinkage: float = SHRINKAGE) -> GaussianModel:
    """Return the class-conditional Gaussian the (pooled) ``stats`` estimate, λ = ``shrinkage`` noise edges."""
    if not math.isfinite(shrinkage) or shrinkage < 0:
        raise ValueError(f"shrinkage must be a finite number >= 0, got {shrinkage!r}")
    counts = np.maximum(stats.counts, 1.0)
    records = float(counts.sum())
    means = stats.sums / counts[:, None]
    scatter = stats.scatter()
    covariance = (scatter + scatter.T) / (2.0 * max(records - stats.classes, 1.0))
    values, vectors = np.linalg.eigh(covariance)
    ridge = shrinkage * noise_edge(scales, records, stats.classes, stats.width)
    # at least MIN_RIDGE of the mean variance: at a large ε the noise edge vanishes, and a covariance of few records
    # (n not far above k) is near singular, which LDA's inverse amplifies
    floor = max(ridge, MIN_RIDGE * max(float(np.mean(np.maximum(values, 0.0))), 1e-300))
    covariance = (vectors * (np.maximum(values, 0.0) + floor)) @ vectors.T
    return GaussianModel(means, counts / records, (covariance + covariance.T) / 2.0, counts)


def synthetic_records(model: GaussianModel, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return round(N_c) draws of N(μ_c, Σ) per class (float64 rows, int64 labels) from the public ``seed``.

    x = μ_c + L g with L Σ's Cholesky factor and g i.i.d. N(0, I) from numpy's PCG64 at ``seed``, class by class
    in order: the same model and seed give the same records.
    """
    counts = np.rint(model.counts).astype(np.int64)
    factor = np.linalg.cholesky(model.covariance)
    rng = np.random.Generator(np.random.PCG64(seed))
    labels = np.repeat(np.arange(len(counts)), counts)
    rows = rng.standard_normal((len(labels), model.covariance.shape[0])) @ factor.T + model.means[labels]
    return rows, labels


__all__ = ["MIN_RIDGE", "SHRINKAGE", "GaussianModel", "estimate", "noise_edge", "synthetic_records"]
