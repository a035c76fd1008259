"""Noisy sufficient statistics of a silo's records: the one-shot ``stats`` release (issue 40).

Each silo maps its records by a public, weight-free extractor (the ScatterNet, or a table's columns), then:

1. projects them on k orthonormal directions drawn from a **public** seed (:func:`projection`), so every silo
   works in one space of k values (Johnson-Lindenstrauss: the geometry is kept up to 1 ± O(√(log n / k)));
2. clips each projected record z to L2 norm C (``z · min(1, C/‖z‖)``; C fixed by the plan, never read from
   records);
3. releases, once, with Gaussian noise (:func:`release`):

   * the per-class sums  S_c = Σ_{y_i = c} z_i            (k values a class),
   * the class counts    N_c = |{i : y_i = c}|,
   * the second moments  M   = Σ_i z_i z_iᵀ                (a symmetric k × k matrix).

Sensitivity (:func:`sensitivities`). Under add/remove, one record moves one class's sum by z (‖z‖ ≤ C), one
count by 1 and M by z zᵀ, whose Frobenius norm is ‖z‖² ≤ C². M's noise is symmetric, E = σ_M (G + Gᵀ)/2 with G
i.i.d. N(0, 1): N(0, σ_M²) on the diagonal and N(0, σ_M²/2) above it, which is the Gaussian mechanism on the
vector (M_ii, √2 M_ij for i < j) whose L2 norm is exactly ‖M‖_F (Dwork, Talwar, Thakurta, Zhang 2014, "Analyze
Gauss", with the off-diagonal halved). The three parts together are one Gaussian mechanism on
(S/σ_S, N/σ_N, M/σ_M) with unit noise, whose add/remove sensitivity is

    μ² = C²/σ_S² + 1/σ_N² + C⁴/σ_M²                                                        (1)

so (μ being Dong, Roth and Su's Gaussian-DP parameter) the budget is μ² split in shares (s_S, s_N, s_M) that
sum to 1: σ_S = C/(μ√s_S), σ_N = 1/(μ√s_N), σ_M = C²/(μ√s_M). Under replace-one, a record z of class a
replaced by z' of class b moves the scaled vector by at most μ_r, where (with a = b: the sums move by z − z',
M by z zᵀ − z' z'ᵀ; maximized over ‖z‖, ‖z'‖ ≤ C and their inner product t, f(t) concave, t* = −σ_M²/(2σ_S²)):

    μ_r²/μ² = 2 s_S + 2 s_M + max(2 s_N, g),   g = s_S²/(2 s_M) if s_S ≤ 2 s_M else 2 s_S − 2 s_M     (2)

**Moments about the class means** (``centered``, the default since it halves M's noise for the same budget).
The second moments of z are dominated by the class means (‖μ_c‖ ≈ 0.6-0.9 C on Fashion-MNIST's ScatterNet
features, the residuals' median norm ≈ 0.6 C), so clipping the records to C spends M's budget on what the sums
already say. A silo instead releases, in order,

   (a) S and N with their noise, then computes its own noisy class means m̂_c = S̃_c / max(Ñ_c, 1)
       (post-processing of (a));
   (b) the within-class scatter M = Σ_i r_i r_iᵀ of the residuals r_i = z_i − m̂_{y_i} clipped to L2 norm C_r,
       with the same symmetric noise.

(b) is a Gaussian mechanism of sensitivity C_r² for any fixed m̂, so by adaptive composition of Gaussian DP
(Dong, Roth, Su 2022, Corollary 3.3) the pair is μ-GDP with

    μ² = C²/σ_S² + 1/σ_N² + C_r⁴/σ_M²                                                       (1')

and σ_M = C_r²/(μ√s_M). Under replace-one the residuals of z and z' no longer share z's direction, so the
parts are bounded apart: the sums move by ≤ 2C (same class) or C in two classes, the counts by 1 in two classes,
M by ‖r rᵀ − r' r'ᵀ‖_F ≤ √2 C_r² (r ⟂ r' of norm C_r, which z' = −z and ‖m̂‖ ≥ C_r reach):

    μ_r²/μ² = 2 s_S + 2 s_M + 2 max(s_S, s_N)                                              (3)

Pooled centered releases add their scatters (the silos' class means are taken as one: a label-skewed partition's
silos share the class-conditional laws; the between-silo spread of the means is left out).

Both relations' ε come from the one accountant (:mod:`ldpfl.mechanisms.accounting`): one Gaussian release of
noise multiplier 1/μ (add/remove) or 1/μ_r (replace-one), exact (the analytic Gaussian, Balle & Wang 2018).

Everything after the release (pooling, estimation, synthetic records, any model) is post-processing and costs
no privacy (Dwork & Roth 2014, Proposition 2.1). Only numpy is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import accounting
from .clipping import clip_l2_norm
from .validation import require_finite_positive

SHARES = (0.5, 0.05, 0.45)
"""Default split of μ² among (sums, counts, second moments): chosen on MNIST-5k (docs/RESULTS.md section 9)."""
PROJECTION_GENERATOR = "numpy PCG64 (public seed)"


@dataclass(frozen=True)
class Statistics:
    """Per-class sums (c, k), class counts (c,) and second moments (k, k) of projected, clipped records.

    ``centered``: the moments are the within-class scatter of residuals about the class means (eq. 1'), not
    Σ z zᵀ about the origin.
    """

    sums: np.ndarray
    counts: np.ndarray
    moments: np.ndarray
    centered: bool = False

    def __post_init__(self) -> None:
        """Check the shapes agree: sums (c, k), counts (c,), moments (k, k)."""
        c, k = np.shape(self.sums)
        if np.shape(self.counts) != (c,) or np.shape(self.moments) != (k, k):
            raise ValueError(f"statistics of {c} classes and width {k} need counts ({c},) and moments ({k}, {k}), "
                             f"got {np.shape(self.counts)} and {np.shape(self.moments)}")

    @property
    def classes(self) -> int:
        """c, the number of classes."""
        return int(np.shape(self.sums)[0])

    @property
    def width(self) -> int:
        """k, the projected width."""
        return int(np.shape(self.sums)[1])

    def scatter(self) -> np.ndarray:
        """Return the within-class scatter: the centered moments, or M − Σ_c S_c S_cᵀ / N_c (N_c floored at 1)."""
        if self.centered:
            return self.moments
        return self.moments - (self.sums.T / np.maximum(self.counts, 1.0)) @ self.sums

    def __add__(self, other: Statistics) -> Statistics:
        """Pool two releases: the statistics are sums, so pooling adds them (and their noise variances).

        Two releases about the origin stay so; otherwise their within-class scatters are added (centered).
        """
        sums, counts = self.sums + other.sums, self.counts + other.counts
        if not self.centered and not other.centered:
            return Statistics(sums, counts, self.moments + other.moments)
        return Statistics(sums, counts, self.scatter() + other.scatter(), centered=True)


@dataclass(frozen=True)
class NoiseScales:
    """σ of each part's Gaussian noise (σ_M on M's diagonal, σ_M/√2 above it) and μ, the add/remove GDP figure."""

    sums: float
    counts: float
    moments: float
    mu: float

    def __add__(self, other: NoiseScales) -> NoiseScales:
        """Return the noise of two pooled releases: independent, so variances add (μ is no longer one silo's)."""
        def pooled(a: float, b: float) -> float:
            return math.hypot(a, b)
        return NoiseScales(pooled(self.sums, other.sums), pooled(self.counts, other.counts),
                           pooled(self.moments, other.moments), math.nan)


def require_shares(shares: tuple[float, float, float]) -> tuple[float, float, float]:
    """Return ``shares`` as floats when there are three, each > 0, summing to 1 (to 1e-9)."""
    values = tuple(float(s) for s in shares)
    if len(values) != 3 or any(not math.isfinite(s) or s <= 0 for s in values) or abs(sum(values) - 1) > 1e-9:
        raise ValueError(f"shares must be three numbers > 0 (sums, counts, second moments) that add up to 1, "
                         f"got {shares!r}")
    return values[0], values[1], values[2]


def projection(features: int, width: int, seed: int) -> np.ndarray:
    """Return a (features, width) matrix with orthonormal columns drawn from the public ``seed``.

    The QR factor of a Gaussian matrix, its columns' signs fixed by R's diagonal so the law is Haar (Mezzadri
    2007, eq. 5.1). The seed is public (it is in the plan), so the draw uses numpy's PCG64, not the CSPRNG.
    """
    if not 1 <= width <= features:
        raise ValueError(f"width (k) must lie in [1, {features}] (the extractor's features), got {width!r}")
    gaussian = np.random.Generator(np.random.PCG64(seed)).standard_normal((features, width))
    q, r = np.linalg.qr(gaussian)
    return np.ascontiguousarray(q * np.sign(np.diag(r)), dtype=np.float64)


def project_and_clip(x: np.ndarray, basis: np.ndarray, clip: float) -> np.ndarray:
    """Return the records ``x`` (n, d) projected on ``basis`` (d, k) and clipped to L2 norm ``clip`` (float64)."""
    require_finite_positive("clip", clip)
    return clip_l2_norm(np.asarray(x, dtype=np.float64) @ basis, clip)


def statistics(z: np.ndarray, labels: np.ndarray, classes: int, *, moments: bool = True) -> Statistics:
    """Return the clean statistics of projected, clipped records ``z`` (n, k) with ``labels`` in [0, classes).

    ``moments=False`` leaves the second moments at zero (a centered release computes them about its means later).
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"labels must lie in [0, {classes - 1}], got values from {labels.min()} to {labels.max()}")
    one_hot = np.zeros((len(labels), classes))
    one_hot[np.arange(len(labels)), labels] = 1.0
    width = np.shape(z)[1]
    return Statistics(one_hot.T @ z, one_hot.sum(axis=0), z.T @ z if moments else np.zeros((width, width)))


def noise_scales(mu: float, clip: float, shares: tuple[float, float, float] = SHARES, *,
                 moments_clip: float | None = None) -> NoiseScales:
    """Return each part's σ for the add/remove GDP figure ``mu`` (eq. 1, 1'): σ_S = C/(μ√s_S), σ_N, σ_M.

    σ_M = C_M²/(μ√s_M), C_M being ``moments_clip`` (C_r, centered moments) or C.
    """
    require_finite_positive("mu", mu)
    require_finite_positive("clip", clip)
    moments_clip = clip if moments_clip is None else require_finite_positive("moments_clip", moments_clip)
    s_sums, s_counts, s_moments = require_shares(shares)
    return NoiseScales(clip / (mu * math.sqrt(s_sums)), 1.0 / (mu * math.sqrt(s_counts)),
                       moments_clip * moments_clip / (mu * math.sqrt(s_moments)), mu)


def replace_one_factor(shares: tuple[float, float, float] = SHARES, *, centered: bool = False) -> float:
    """Return μ_r/μ: how much farther a replaced record moves the scaled release than an added one (eq. 2, 3)."""
    s_sums, s_counts, s_moments = require_shares(shares)
    if centered:
        return math.sqrt(2 * s_sums + 2 * s_moments + 2 * max(s_sums, s_counts))
    same_class = s_sums**2 / (2 * s_moments) if s_sums <= 2 * s_moments else 2 * s_sums - 2 * s_moments
    return math.sqrt(2 * s_sums + 2 * s_moments + max(2 * s_counts, same_class))


def events(mu: float, shares: tuple[float, float, float] = SHARES, *,
           centered: bool = False) -> dict[str, accounting.GaussianEvent]:
    """Return the release's one Gaussian event under each relation: noise multiplier 1/μ (add/remove), 1/μ_r."""
    require_finite_positive("mu", mu)
    factor = replace_one_factor(shares, centered=centered)
    return {accounting.ADD_REMOVE: accounting.GaussianEvent(1.0 / mu),
            accounting.REPLACE_ONE: accounting.GaussianEvent(1.0 / (mu * factor))}


def epsilons(mu: float, delta: float, shares: tuple[float, float, float] = SHARES, *,
             centered: bool = False) -> dict[str, float]:
    """Return ``{relation: ε}`` of one release at ``delta`` (each relation's event, as a distance-1 Gaussian)."""
    return {relation: accounting.epsilon([event], delta, neighbours=accounting.ADD_REMOVE)
            for relation, event in events(mu, shares, centered=centered).items()}


def calibrate_mu(epsilon: float, delta: float, *, neighbours: str = accounting.ADD_REMOVE,
                 shares: tuple[float, float, float] = SHARES, centered: bool = False) -> float:
    """Return the largest μ whose release stays within (``epsilon``, ``delta``) under ``neighbours``."""
    multiplier = accounting.calibrate_gaussian(epsilon, delta)
    replace_one = accounting.require_neighbours(neighbours) == accounting.REPLACE_ONE
    factor = replace_one_factor(shares, centered=centered) if replace_one else 1
    return 1.0 / (multiplier * factor)


def symmetric_noise(width: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Return σ (G + Gᵀ)/2, G (width, width) i.i.d. N(0, 1): N(0, σ²) on the diagonal, N(0, σ²/2) off it."""
    g = rng.standard_normal((width, width))
    return sigma * (g + g.T) / 2.0


def release(clean: Statistics, scales: NoiseScales, rng: np.random.Generator) -> Statistics:
    """Return ``clean`` with each part's Gaussian noise drawn from ``rng`` (the silo's CSPRNG stream)."""
    return Statistics(clean.sums + scales.sums * rng.standard_normal(clean.sums.shape),
                      clean.counts + scales.counts * rng.standard_normal(clean.counts.shape),
                      clean.moments + symmetric_noise(clean.width, scales.moments, rng), clean.centered)


def noisy_means(released: Statistics) -> np.ndarray:
    """Return the class means m̂_c = S̃_c / max(Ñ_c, 1) a release of the sums and counts gives (c, k)."""
    return released.sums / np.maximum(released.counts, 1.0)[:, None]


def residual_moments(z: np.ndarray, labels: np.ndarray, means: np.ndarray, moments_clip: float) -> np.ndarray:
    """Return Σ_i r_i r_iᵀ, r_i = z_i − m̂_{y_i} clipped to L2 norm C_r (eq. 1' part b; a batch's: they add)."""
    residuals = clip_l2_norm(np.asarray(z, dtype=np.float64) - means[np.asarray(labels)], moments_clip)
    return residuals.T @ residuals


def release_first_part(clean: Statistics, scales: NoiseScales, rng: np.random.Generator) -> Statistics:
    """Return (a) of a centered release: ``clean``'s sums and counts with their noise, its moments still zero."""
    return Statistics(clean.sums + scales.sums * rng.standard_normal(clean.sums.shape),
                      clean.counts + scales.counts * rng.standard_normal(clean.counts.shape),
                      np.zeros_like(clean.moments), centered=True)


def release_second_part(first: Statistics, moments: np.ndarray, scales: NoiseScales,
                        rng: np.random.Generator) -> Statistics:
    """Return the centered release: ``first`` with the residual ``moments`` (about its own means) and their noise."""
    return Statistics(first.sums, first.counts, moments + symmetric_noise(first.width, scales.moments, rng),
                      centered=True)


__all__ = ["PROJECTION_GENERATOR", "SHARES", "NoiseScales", "Statistics", "calibrate_mu", "epsilons", "events",
           "noise_scales", "noisy_means", "project_and_clip", "projection", "release", "release_first_part",
           "release_second_part", "replace_one_factor", "require_shares", "residual_moments", "statistics",
           "symmetric_noise"]
