"""Each noisy upload's distance from what the other silos predict for its label mix (issue 42, non-IID runs).

``outliers.noise_distances`` measures silo i against the others' median: right when honest silos share one mean
update, wrong when their label mixes differ. Under a label-skewed split (Dirichlet 0.1, shards) an honest silo's
mean clipped gradient is Σ_c π_ic·g_c, where π_i is its training label mix and g_c the mean clipped gradient of a
class-c record at the round's global model (within a class every silo's records follow one distribution). So,
coordinate by coordinate, an honest upload is

    u_i = β + Σ_c π_ic·Δ_c + e_i,     e_i ~ N(0, s_i²),                                        (1)

β the part every silo shares, Δ_c class c's departure from it and s_i the noise per coordinate that the silo's
training method puts in its upload (``silo_training.upload_noise_scales``). Δ_c is unknown; it is given a prior
Δ_c ~ N(0, τ_c²), one variance per class for all coordinates, and β a flat one. Then the n uploads of one
coordinate are Gaussian with covariance

    A = P·diag(τ²)·Pᵀ + diag(s²)                                                             (2)

(P the n × C matrix of label mixes) about a common mean. Silo i is compared with the best linear unbiased
prediction of its upload from the *other* silos (universal kriging, Cressie 1993 §3.4.5):

    μ_i = β̂ + kᵀ A₋ᵢ⁻¹ (u₋ᵢ − β̂·1),      β̂ = 1ᵀA₋ᵢ⁻¹u₋ᵢ / 1ᵀA₋ᵢ⁻¹1,
    v_i = k_ii + s_i² − kᵀ A₋ᵢ⁻¹ k + (1 − 1ᵀA₋ᵢ⁻¹k)² / 1ᵀA₋ᵢ⁻¹1,                                (3)

k = P₋ᵢ·diag(τ²)·π_i, k_ii = π_iᵀ diag(τ²) π_i. The variances come from the other silos too: the τ_c² that
maximize the restricted likelihood (REML, Patterson & Thompson 1971) of their uploads' d coordinates, which share
them, each capped by how far two classes' mean updates can be apart (``silo_training.upload_signal_bound``). Silo i's
own upload must not explain itself: fitted with it, one far upload among near-equal mixes is absorbed by a large
τ_c along their tiny differences. A class along which the others' mixes do not vary is not seen by their fit, so
every class is granted the largest variance they show (heterogeneity seen anywhere may be anywhere).

Under (1) the d residuals u_i − μ_i are N(0, v_i), so r_i = ‖u_i − μ_i‖ / √(d·v_i) is √(χ²_d / d): 1 within
√2/(2√d), the κ = 2 of ``outliers.noise_bound``, and below 1 where the variance granted exceeds the true one.
What it tells apart:

* an honest silo of a skewed mix among skewed silos (Dirichlet 0.1): the others' spread grants its mix room;
* a silo whose upload departs from what its *claimed* mix predicts among silos that agree (flipped or
  near-constant labels among IID silos): the others show no heterogeneity, so nothing covers the departure.

What it cannot: a silo alone in a mix the others do not vary along, among silos that agree, is judged as a
near-constant poisoner would be (an honest single-class silo among IID ones is named); a silo that forges its
histogram is judged by the forged mix (the histograms are those the plan holds, checked against the files or the
manifest where they can be, ``label_claims``); feature shift between silos is not in (1); and two poisoners can
raise the variance each other is granted.

Imports neither torch nor jax: numpy and scipy's optimizer on n × n matrices (n silos), whatever d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MixPrediction", "fit_class_variances", "mix_prediction"]

_LARGEST_RATIO = 1e6  # τ_c² / median s² at most, where no bound on the updates is given


@dataclass(frozen=True)
class MixPrediction:
    """Each silo's residual from its leave-one-out prediction (eq. 3) and that residual's variance per coordinate."""

    residual_norms: np.ndarray  # ‖u_i − μ_i‖
    variances: np.ndarray  # v_i, per coordinate
    class_variances: np.ndarray  # row i: the τ_c² silo i's prediction used (fitted without it)
    dim: int

    @property
    def units(self) -> np.ndarray:
        """r_i = ‖u_i − μ_i‖ / √(d·v_i): 1 for an honest silo under eq. 1."""
        return self.residual_norms / np.sqrt(self.dim * self.variances)


def _contrasts(n: int) -> np.ndarray:
    """Return an (n − 1) × n matrix of orthonormal rows orthogonal to 1: REML's error contrasts."""
    basis, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
    return basis[:, 1:].T


def fit_class_variances(uploads: np.ndarray, scales: np.ndarray, mixes: np.ndarray,
                        largest: float | None = None) -> np.ndarray:
    """Return the τ_c² of eq. 2 that maximize the restricted likelihood of the n uploads' d coordinates.

    With L the contrasts, Y = L·U holds d independent draws of N(0, Σ), Σ = L·A·Lᵀ; per coordinate the negative
    log-likelihood is f = ½(log det Σ + tr(Σ⁻¹·W)), W = YYᵀ/d, minimized over t_c = τ_c² / median s² ≥ 0
    (L-BFGS-B, from t = 0) with its gradient ∂f/∂t_c = ½·q_cᵀ(Σ⁻¹ − Σ⁻¹WΣ⁻¹)q_c·median s², q_c = L·p_c the
    contrasts of class c's column of P. A class along which the mixes do not vary leaves f flat in t_c, and its
    τ_c² stays 0: no heterogeneity is granted that the other silos do not show. ``largest``: an upper bound on
    every τ_c² (how far two classes' mean updates can be apart); without it, near-equal mixes (IID) could explain
    one far upload by a huge τ_c along their tiny differences.
    """
    from scipy.optimize import minimize  # lazy: only aggregation calls this, not the ClientApp

    n, dim = uploads.shape
    contrasts = _contrasts(n)
    projected = contrasts @ uploads
    scatter = projected @ projected.T / dim
    columns = contrasts @ mixes  # q_c as columns
    noise = contrasts @ np.diag(scales**2) @ contrasts.T
    unit = float(np.median(scales**2))

    def objective(ratio: np.ndarray) -> tuple[float, np.ndarray]:
        covariance = (columns * (unit * ratio)) @ columns.T + noise
        inverse = np.linalg.inv(covariance)
        _, log_det = np.linalg.slogdet(covariance)
        value = 0.5 * (log_det + float(np.sum(inverse * scatter)))
        middle = inverse - inverse @ scatter @ inverse
        return value, 0.5 * unit * np.einsum("kc,kl,lc->c", columns, middle, columns)

    top = _LARGEST_RATIO if largest is None else min(_LARGEST_RATIO, largest / unit)
    fitted = minimize(objective, np.zeros(mixes.shape[1]), jac=True, method="L-BFGS-B",
                      bounds=[(0.0, top)] * mixes.shape[1])
    return unit * fitted.x


def mix_prediction(uploads: Sequence[np.ndarray], scales: Sequence[float], mixes: Sequence[Sequence[float]], *,
                   largest_class_variance: float | None = None) -> MixPrediction:
    """Return each upload's residual from what the other silos predict for its label mix (eqs. 1-3).

    ``uploads``: the n silos' uploads (parameters or updates: β absorbs the global model); ``scales``: each
    silo's training noise per coordinate; ``mixes``: each silo's training label histogram (normalized here);
    ``largest_class_variance``: the cap on each τ_c² (``silo_training.upload_signal_bound``), per coordinate.

    A poisoned upload is in the fit and among the predictors of the others: where the mixes differ (non-IID) it
    can bend an honest silo's prediction past the bound too (docs/cross-silo.md); where they are alike, its weight
    in each prediction is about 1/(n − 1).

    Raises
    ------
    ValueError
        Fewer than 3 uploads, or scales or mixes of the wrong shape, not finite, or a histogram
        with no count.
    """
    rows = np.asarray(np.stack([np.ravel(u) for u in uploads]), dtype=np.float64)
    n, dim = rows.shape
    s = np.asarray(scales, dtype=np.float64)
    counts = np.asarray(mixes, dtype=np.float64)
    if n < 3:
        raise ValueError(f"uploads: a leave-one-out prediction needs at least 3 silos, got {n}")
    if s.shape != (n,) or not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"scales must be {n} finite numbers > 0 (one per upload), got {list(scales)!r}")
    if counts.ndim != 2 or counts.shape[0] != n or not np.all(np.isfinite(counts) & (counts >= 0)) \
            or np.any(counts.sum(axis=1) <= 0):
        raise ValueError(f"mixes must be {n} label histograms of counts >= 0, each with a count, got shape "
                         f"{counts.shape}")
    mix = counts / counts.sum(axis=1, keepdims=True)
    norms, variances, fitted = np.empty(n), np.empty(n), np.empty((n, mix.shape[1]))
    for i in range(n):
        others = np.delete(np.arange(n), i)
        # the variances are fitted without silo i too: its own upload must not explain itself
        # fitted without silo i (its own upload must not explain itself); a class along which the others' mixes do
        # not vary is not seen by their fit, so every class is granted the largest variance the others show
        tau2 = fitted[i] = np.full(mix.shape[1], float(np.max(
            fit_class_variances(rows[others], s[others], mix[others], largest_class_variance))))
        signal = (mix * tau2) @ mix.T  # P·diag(τ²)·Pᵀ
        a = signal[np.ix_(others, others)] + np.diag(s[others] ** 2)
        k = signal[others, i]
        a_inv_one, a_inv_k = np.linalg.solve(a, np.column_stack([np.ones(len(others)), k])).T
        total = float(a_inv_one.sum())  # 1ᵀA⁻¹1
        free = 1.0 - float(a_inv_k.sum())  # 1 − 1ᵀA⁻¹k: the part of μ_i that β̂ carries
        weights = a_inv_k + a_inv_one * free / total  # μ_i = weightsᵀ u₋ᵢ (eq. 3)
        gap = rows[i] - weights @ rows[others]
        norms[i] = math.sqrt(float(np.sum(gap * gap)))
        variances[i] = signal[i, i] + s[i] ** 2 - float(k @ a_inv_k) + free**2 / total
    return MixPrediction(norms, variances, fitted, dim)
