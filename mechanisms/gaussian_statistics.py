"""``gaussian-stats``: one release of a dataset's noisy sufficient statistics, and synthetic records drawn from it.

The mechanism of ``ldpfl export --release stats:K`` (issue 40). Its maths is in
:mod:`ldpfl.mechanisms.sufficient_statistics` (what is released, its sensitivity and accounting) and
:mod:`ldpfl.mechanisms.statistics_model` (what the release says: the class-conditional Gaussian, synthetic
records). Unlike the per-record mechanisms, it randomizes a *dataset*: a record's whole influence is on the three
released statistics, and a synthetic record is post-processing of them.

:meth:`GaussianStatistics.release_records` releases labelled records (stage 1 calls it per silo); the generic
:meth:`GaussianStatistics.randomize` releases a batch as one class and returns as many synthetic rows, so the
registry's contract holds. ε is the target under ``neighbours`` (default add/remove, the DP-SGD literature's);
the report's exact per-record ε is the replace-one figure (the project's convention), the add/remove one beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import accounting
from . import statistics_model as model
from . import sufficient_statistics as stats
from .base import FLOAT32, Mechanism, param, require_generator
from .clipping import clip_l2_norm
from .registry import register
from .report import PrivacyReport
from .validation import require_epsilon, require_finite_positive, require_open_unit_interval, require_records

CLIP_FRACTION = 0.6
"""The default clip C = 0.6·√k: a GroupNorm'd ScatterNet record of r values has norm ≤ √r, so its projection on
k of r orthonormal directions about √k; 0.6 was chosen on MNIST-5k's validation records (docs/RESULTS.md
section 9) and clips nearly every record (a normalization)."""
RESIDUAL_FRACTION = 0.4
"""The default clip of a residual about its class mean, C_r = 0.4·C: MNIST-5k's validation records cannot tell
0.4-0.8 apart, so it was chosen on Fashion-MNIST's validation records at ε = 3 (docs/RESULTS.md section 9; the
residuals' median norm is about 0.6 C there, and 0.4-0.6 lie within 0.2 pp)."""
CLASS_MEANS, ORIGIN = "class-means", "origin"
"""What the released second moments are taken about (``moments_about``): see sufficient_statistics, eq. 1'."""
STATISTICS_DOMAIN = "statistics"
SYNTHETIC_KEY_BOUND = 2**53
"""The synthetic records' public key is drawn uniformly below this from the silo's stream, after the noise (2^53:
exact in any JSON reader's doubles)."""


@dataclass(frozen=True)
class Released:
    """One release: the noisy statistics, the noise it carries, and the public key of its synthetic records."""

    statistics: stats.Statistics
    scales: stats.NoiseScales
    synthetic_key: int


@register
@dataclass(frozen=True)
class GaussianStatistics(Mechanism):
    """Per-class sums, class counts and second moments of clipped records, each with Gaussian noise, once."""

    NAME: ClassVar[str] = "gaussian-stats"
    SOURCE: ClassVar[str] = ("sufficient-statistics perturbation (Dwork, Talwar, Thakurta, Zhang 2014), exact "
                             "analytic Gaussian accounting (Balle & Wang 2018)")
    DOMAIN: ClassVar[str] = STATISTICS_DOMAIN
    SUMMARY: ClassVar[str] = ("one release of noisy per-class sums, counts and second moments; synthetic records "
                              "drawn from them")
    FEATURE_FORMAT: ClassVar[str] = FLOAT32
    RECORD_PARAMETER: ClassVar[str | None] = "width"

    epsilon: float = param(1.0, "target epsilon of the whole release, under `neighbours`")
    delta: float = param(1e-5, "delta of the whole release")
    width: int | None = param(None, "k, the projected values per record (the release's size)")
    clip: float | None = param(None, "L2 clip C of a projected record (default 0.6*sqrt(k))")
    sums_share: float = param(stats.SHARES[0], "share of the budget (mu^2) spent on the per-class sums")
    counts_share: float = param(stats.SHARES[1], "share of the budget spent on the class counts")
    moments_share: float = param(stats.SHARES[2], "share of the budget spent on the second moments")
    projection_key: int = param(0, "public key of the random orthonormal projection (numpy PCG64)")
    shrinkage: float = param(model.SHRINKAGE, "ridge of the estimated covariance, in noise edges")
    moments_about: str = param(CLASS_MEANS, "second moments about the release's own noisy class-means (the "
                                            "default: the noise falls with C_r^2) or about the origin")
    residual_clip: float | None = param(None, "L2 clip C_r of a residual about its class mean (default 0.4*C)")
    neighbours: str = param(accounting.ADD_REMOVE, "the relation epsilon is stated under: add-remove or replace-one")

    def __post_init__(self) -> None:
        """Validate ε, δ, k, C, the shares, the key, the shrinkage and the relation."""
        require_epsilon(self.epsilon)
        require_open_unit_interval("delta", self.delta)
        if self.width is not None and (isinstance(self.width, bool) or not isinstance(self.width, int)
                                       or self.width < 1):
            raise ValueError(f"width must be an integer >= 1, got {self.width!r}")
        if self.clip is not None:
            require_finite_positive("clip", self.clip)
        stats.require_shares(self.shares)
        if isinstance(self.projection_key, bool) or not isinstance(self.projection_key, int) \
                or self.projection_key < 0:
            raise ValueError(f"projection_key must be an integer >= 0, got {self.projection_key!r}")
        if not math.isfinite(self.shrinkage) or self.shrinkage < 0:
            raise ValueError(f"shrinkage must be a finite number >= 0, got {self.shrinkage!r}")
        accounting.require_neighbours(self.neighbours)
        if self.moments_about not in (CLASS_MEANS, ORIGIN):
            raise ValueError(f"moments_about must be {CLASS_MEANS!r} or {ORIGIN!r}, got {self.moments_about!r}")
        if self.residual_clip is not None:
            require_finite_positive("residual_clip", self.residual_clip)

    @property
    def shares(self) -> tuple[float, float, float]:
        """(s_S, s_N, s_M): the budget μ² split among sums, counts and second moments."""
        return (self.sums_share, self.counts_share, self.moments_share)

    @property
    def centered(self) -> bool:
        """Whether the second moments are about the release's own class means (eq. 1' of sufficient_statistics)."""
        return self.moments_about == CLASS_MEANS

    def clip_for(self, width: int) -> float:
        """Return C for records of ``width`` values: the given clip, else 0.6·√width."""
        return float(self.clip) if self.clip is not None else CLIP_FRACTION * math.sqrt(width)

    def moments_clip_for(self, width: int) -> float:
        """Return the clip of what enters the second moments: C_r (centered; default 0.4·C), else C."""
        if not self.centered:
            return self.clip_for(width)
        return float(self.residual_clip) if self.residual_clip is not None else RESIDUAL_FRACTION * self.clip_for(width)

    @property
    def mu(self) -> float:
        """μ, the add/remove Gaussian-DP figure the target (ε, δ) allows (exact analytic Gaussian)."""
        return stats.calibrate_mu(self.epsilon, self.delta, neighbours=self.neighbours, shares=self.shares,
                                  centered=self.centered)

    def scales(self, width: int) -> stats.NoiseScales:
        """Return each part's σ for records of ``width`` values (eq. 1, 1' of sufficient_statistics)."""
        return stats.noise_scales(self.mu, self.clip_for(width), self.shares, moments_clip=self.moments_clip_for(width))

    def epsilons(self) -> dict[str, float]:
        """Return the release's ε under each relation at δ."""
        return stats.epsilons(self.mu, self.delta, self.shares, centered=self.centered)

    def clipped(self, z: np.ndarray) -> np.ndarray:
        """Return projected records ``z`` (n, k) clipped to L2 norm C (float64): the release's feature map."""
        z = np.asarray(z, dtype=np.float64)
        return clip_l2_norm(z, self.clip_for(int(z.shape[-1])))

    def clean_statistics(self, z: np.ndarray, labels: np.ndarray, classes: int) -> stats.Statistics:
        """Return the statistics of projected records ``z`` (n, k) clipped to C (a batch's: they add up)."""
        return stats.statistics(self.clipped(z), labels, classes)

    def release(self, clean: stats.Statistics, *, rng: np.random.Generator) -> Released:
        """Return ``clean`` (of records clipped to C) with the noise drawn from ``rng``, then the synthetic key.

        Moments about the origin only: a centered release needs the records again (:meth:`release_first`).
        """
        if self.centered:
            raise ValueError("a release of moments about the class means is made in two parts (release_first, "
                             "then release_second over the same records)")
        rng = require_generator(rng)
        scales = self.scales(clean.width)
        noisy = stats.release(clean, scales, rng)
        return Released(noisy, scales, int(rng.integers(SYNTHETIC_KEY_BOUND)))

    def release_first(self, clean: stats.Statistics, *, rng: np.random.Generator) -> stats.Statistics:
        """Return part (a) of a centered release: ``clean``'s sums and counts with their noise (eq. 1')."""
        return stats.release_first_part(clean, self.scales(clean.width), require_generator(rng))

    def residual_moments(self, z: np.ndarray, labels: np.ndarray, first: stats.Statistics) -> np.ndarray:
        """Return Σ r rᵀ of projected records ``z`` clipped to C, r about ``first``'s noisy means clipped to C_r."""
        width = int(np.shape(z)[-1])
        return stats.residual_moments(self.clipped(z), labels, stats.noisy_means(first), self.moments_clip_for(width))

    def release_second(self, first: stats.Statistics, moments: np.ndarray, *,
                       rng: np.random.Generator) -> Released:
        """Return the centered release: part (b), the residual ``moments`` with their noise, then the key."""
        rng = require_generator(rng)
        scales = self.scales(first.width)
        return Released(stats.release_second_part(first, moments, scales, rng), scales,
                        int(rng.integers(SYNTHETIC_KEY_BOUND)))

    def release_records(self, z: np.ndarray, labels: np.ndarray, classes: int, *,
                        rng: np.random.Generator) -> Released:
        """Clip projected records ``z`` (n, k), release their statistics with noise from ``rng``, draw the key."""
        clean = self.clean_statistics(z, labels, classes)
        if not self.centered:
            return self.release(clean, rng=rng)
        first = self.release_first(clean, rng=rng)
        return self.release_second(first, self.residual_moments(z, labels, first), rng=rng)

    def synthetic(self, released: Released) -> tuple[np.ndarray, np.ndarray]:
        """Return the synthetic records (float64) and labels the release gives (a function of it and its key)."""
        fitted = model.estimate(released.statistics, released.scales, shrinkage=self.shrinkage)
        return model.synthetic_records(fitted, released.synthetic_key)

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Release the batch ``x`` as one class and return as many synthetic rows (shape and dtype kept).

        The rows are drawn from the release's class-conditional Gaussian (round(N) of them, then cut or
        repeated cyclically to the batch's size, which keeps the shape without looking at n again).
        """
        x = require_records(self.NAME, x, self.width, "width")
        rows = x.reshape(-1, x.shape[-1])
        if len(rows) == 0:
            return np.array(x, copy=True)
        released = self.release_records(rows, np.zeros(len(rows), dtype=np.int64), 1, rng=rng)
        synthetic, _ = self.synthetic(released)
        if len(synthetic) == 0:
            synthetic = released.statistics.sums[:1] / max(float(released.statistics.counts[0]), 1.0)
        picked = synthetic[np.arange(len(rows)) % len(synthetic)]
        return picked.reshape(x.shape).astype(x.dtype)

    def report(self) -> PrivacyReport:
        """Report the release's ε under both relations (exact analytic Gaussian), σ of each part and the clip."""
        figures = self.epsilons()
        width = self.width
        scales = None if width is None else self.scales(width)
        sigmas = {} if scales is None else {"sigma_sums": scales.sums, "sigma_counts": scales.counts,
                                            "sigma_moments": scales.moments}
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters=self.parameters(),
            nominal_epsilon=self.epsilon, nominal_delta=self.delta,
            exact_epsilon_per_coordinate=figures[accounting.REPLACE_ONE],
            exact_epsilon_per_record=figures[accounting.REPLACE_ONE],
            exact_delta=self.delta, coordinate="statistic", record="record (its clipped projection and its label)",
            sigma=None if scales is None else scales.moments, sensitivity=None if width is None else
            self.moments_clip_for(width) ** 2,
            probabilities={"mu_add_remove": self.mu, "epsilon_add_remove": figures[accounting.ADD_REMOVE],
                           "epsilon_replace_one": figures[accounting.REPLACE_ONE],
                           "replace_one_factor": stats.replace_one_factor(self.shares, centered=self.centered),
                           **sigmas},
            notes=(
                "one release of the per-class sums (sensitivity C), class counts (1) and second moments of the "
                "projected records clipped to L2 norm C, each with Gaussian noise; " + (
                    "the second moments are those of the residuals about the release's own noisy class means, "
                    "clipped to C_r (sensitivity C_r^2, Frobenius; adaptive composition)" if self.centered else
                    "the second moments are about the origin (sensitivity C^2, Frobenius)")
                + "; labels are covered (the statistics are per class); synthetic records are post-processing",
                f"exact epsilon {figures[accounting.ADD_REMOVE]:.4g} under add/remove and "
                f"{figures[accounting.REPLACE_ONE]:.4g} under replace-one at delta {self.delta:g} (analytic "
                "Gaussian, Balle & Wang 2018; replace-one moves the release by mu_r = "
                f"{stats.replace_one_factor(self.shares, centered=self.centered):.4f} mu)",
                "continuous Gaussian noise from the silo's CSPRNG stream (as DP-SGD's), not the lattice sampler",
            ),
        )


__all__ = ["CLASS_MEANS", "CLIP_FRACTION", "ORIGIN", "RESIDUAL_FRACTION", "STATISTICS_DOMAIN", "GaussianStatistics",
           "Released"]
