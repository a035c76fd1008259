"""Which silos a rule discounted or clipped each round, and by how much (issue 42): a typed record and its math.

Every robust rule returns, with its aggregate, an :class:`OutlierReport`: one :class:`SiloDiscount` per
aggregated silo, which the round's record writes (``metrics.json``'s ``outliers``) and the run's summary reads
(:func:`persistent_outliers`). Two figures describe each silo:

* ``discount`` in [0, 1], what the rule did to it, scaled so that 0 is what it does to a typical honest silo:

  - coordinate-wise rules (``median``, ``trimmed-mean``, which keep the values between the k-th smallest and the
    k-th largest of every coordinate): 1 − s_i / e, where s_i is the share of coordinates whose value of silo i
    was kept (a value tied with the band's edge counts as kept) and e = (n − 2k) / n the share an exchangeable
    silo keeps on average (clipped at 0);
  - ``norm-clipped``: 1 − min(1, C / ‖u_i‖), the fraction of its update the clipping took away;
  - FedAvg's optional report (``outlier_report``): 0, the mean counts every silo in full.

* ``distance``: ‖u_i − m‖ / D, where m is the round's coordinate-wise median of the uploads and D the lower
  median of the n distances ‖u_j − m‖ (1: a typical silo; see :data:`OUTLIER_BOUND`). The median is taken over the
  uploads themselves: shifting every upload by the global model changes no distance, so parameters and updates give
  the same figure.

* ``noise_distance`` (runs whose silos' training states the noise it puts in each upload: ``silo_training``'s
  ``upload_noise_scales``): the silo's distance from the others' coordinate-wise median in units of what that
  training noise alone puts there, relative to the round's typical silo (:func:`noise_distances`; 1: a typical
  silo), with its own bound ``noise_bound`` (:func:`noise_bound`).

A silo is *named* in the round:

* in a run of a noisy training method (the strategy was given each silo's upload noise:
  ``silo_training.upload_noise_scales``), when its ``noise_distance`` exceeds its ``noise_bound``, whatever the rule
  (its discount is still reported). The raw distance and the discount cannot tell noise from poison there: a silo's
  training noise may scale as 1/n_i (``SiloTraining.upload_noise``), so small honest silos sit far from the median,
  and a poison smaller than the noise in every coordinate is kept by the median's band (docs/RESULTS.md
  section 11);
* otherwise when its discount reaches :data:`DISCOUNT_BOUND` (a robust rule), or, in FedAvg's report, when its
  distance exceeds :data:`OUTLIER_BOUND`.

A silo named in more than half of the rounds in which it was aggregated is named in the run's summary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .label_mix_reference import mix_prediction

DISCOUNT_BOUND = 0.5
"""A robust rule names a silo whose discount reaches this: it counted at most half as much as a typical silo."""

OUTLIER_BOUND = 3.0
"""FedAvg's outlier report flags a silo more than this many times as far from the round's median as a typical silo.

For n honest silos whose updates are a common mean plus independent noise of one scale (a noisy training method's
Gaussian noise, the sampling noise of IID silos), ‖u_i − m‖² is a sum of d coordinates with the same expectation for
every silo, so the ratio concentrates at 1 with a relative spread of order 1/√d (a few per cent at d ≥ 1000). The
bound 3 leaves honest heterogeneity (non-IID silos) a factor of 3; a silo it does not flag can pull the mean at most
3·D/n further from the median than a typical silo does. See docs/cross-silo.md.
"""

NOISE_Z = 7.5
"""z of the noise bound: a silo is named when its noise distance exceeds 1 + z·√κ_i / (2√d) (:func:`noise_bound`).

Under pure training noise a silo's squared distance r_i² (:func:`noise_distances`) is a mean of d independent
per-coordinate terms of mean 1 and variance κ_i (2 when the reference carries no noise: the chi-square), so r_i is 1
within a standard deviation σ_i = √κ_i / (2√d) (1/√(2d) for κ = 2: the chi distribution's concentration), and normal
to within a skewness of order √(8/d) (0.014 at d = 39,700; valid for d ≥ 1000). Dividing by the round's median r_j
moves the standard deviation of the ratio to 0.4-1.1 σ_i (measured: 3, 5 and 10 silos of equal and of 17-fold
unequal noise, d = 39,700, 300 rounds each; ``tests/unit/test_noise_outliers.py`` checks ≤ 1.25). With a margin
for a ratio as spread as 1.4 σ_i, z = 7.5 is ≥ 5.36 standard deviations above 1: P(N(0, 1) > 5.36) = 4.2e-8 per
honest silo and round, < 1e-6 per round for up to 23 silos (at the measured ≤ 1.1 σ_i: 6.8 of them, P < 1e-11).

The price: a poison b is named when it adds ‖b‖² ≥ ((1 + 7.5·√κ_i/(2√d))² − 1)·d·v_i to the silo's expected
squared distance d·v_i, i.e. ‖b‖ ≥ 0.23 √(d·v_i) at d = 39,700 (0.25 of its noise norm s_i√d with 10 equal silos).
"""

DISCOUNTED, CLIPPED, FLAGGED = "discounted", "clipped", "flagged"


@dataclass(frozen=True)
class SiloDiscount:
    """What one round's rule did to one silo's upload (see the module docstring)."""

    client: int
    discount: float
    distance: float
    named: bool
    noise_distance: float | None = None  # noisy training: r_i / median_j r_j (:func:`noise_distances`), else None
    noise_bound: float | None = None  # noisy training: the bound it is named past (:func:`noise_bound`), else None
    mix_distance: float | None = None  # noisy training, ≥ 3 silos: its label-mix distance (:func:`mix_distances`)

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as written in ``metrics.json`` (the noise figures only where the training states them)."""
        row: dict[str, Any] = {"client": self.client, "discount": round(self.discount, 6),
                               "distance": round(self.distance, 6), "named": self.named}
        if self.noise_distance is not None and self.noise_bound is not None:
            row |= {"noise_distance": round(self.noise_distance, 6), "noise_bound": round(self.noise_bound, 6)}
        if self.mix_distance is not None:
            row["mix_distance"] = round(self.mix_distance, 6)
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> SiloDiscount:
        """Read an entry written by :meth:`to_dict`."""
        noise, bound, mix = row.get("noise_distance"), row.get("noise_bound"), row.get("mix_distance")
        return cls(int(row["client"]), float(row["discount"]), float(row["distance"]), bool(row["named"]),
                   None if noise is None else float(noise), None if bound is None else float(bound),
                   None if mix is None else float(mix))


@dataclass(frozen=True)
class OutlierReport:
    """A round's report: the rule's action (discounted, clipped or flagged) and each aggregated silo's figures."""

    action: str
    silos: tuple[SiloDiscount, ...]
    noise_median: float | None = None  # noisy training: the round's median r_j (1 when the noise model holds)

    @property
    def named(self) -> tuple[int, ...]:
        """The silos named in the round."""
        return tuple(s.client for s in self.silos if s.named)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as written in a round's row (``outliers``)."""
        row: dict[str, Any] = {"action": self.action, "named": list(self.named),
                               "silos": [s.to_dict() for s in self.silos]}
        if self.noise_median is not None:
            row["noise_median"] = round(self.noise_median, 6)
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> OutlierReport:
        """Read a report written by :meth:`to_dict`."""
        median = row.get("noise_median")
        return cls(str(row["action"]), tuple(SiloDiscount.from_dict(s) for s in row["silos"]),
                   None if median is None else float(median))


def _rows(uploads: Sequence[np.ndarray]) -> np.ndarray:
    return np.stack([np.asarray(u, dtype=np.float64) for u in uploads])


def median_distances(uploads: Sequence[np.ndarray]) -> np.ndarray:
    """Return ‖u_i − m‖ / D for each upload (m: coordinate-wise median, D: lower median of the distances)."""
    rows = _rows(uploads)
    distances = np.linalg.norm(rows - np.median(rows, axis=0), axis=1)
    ordered = np.sort(distances)
    scale = ordered[(len(ordered) - 1) // 2]
    if not scale > 0:  # half the silos sit on the median (identical uploads): the largest distance sets the scale
        scale = ordered[-1] if ordered[-1] > 0 else 1.0
    return distances / scale


def kept_discounts(uploads: Sequence[np.ndarray], trimmed: int) -> np.ndarray:
    """Return 1 − s_i / e for each upload when ``trimmed`` values are dropped at each end of every coordinate.

    s_i: the share of coordinates in which silo i's value lies in the kept band [k-th smallest, k-th largest]
    (ties with an edge count as kept); e = (n − 2k) / n. Clipped to [0, 1].
    """
    rows = _rows(uploads)
    n = rows.shape[0]
    if not 0 <= trimmed <= (n - 1) // 2:
        raise ValueError(f"trimmed must lie in [0, {(n - 1) // 2}] for {n} uploads, got {trimmed!r}")
    ordered = np.sort(rows, axis=0)
    kept = (rows >= ordered[trimmed]) & (rows <= ordered[n - 1 - trimmed])
    expected = (n - 2 * trimmed) / n
    return np.clip(1.0 - kept.mean(axis=1) / expected, 0.0, 1.0)


GRID_POINTS = 4001
"""Points of the log-spaced grid on which :func:`order_statistic_moments` integrates (relative error < 1e-7)."""


@functools.lru_cache(maxsize=256)
def order_statistic_moments(scales: tuple[float, ...], k: int) -> tuple[float, float]:
    """Return E[M²] and E[M⁴] for M the k-th smallest (1-based) of independent X_j ~ N(0, s_j²), j over ``scales``.

    P(M ≤ x) = P(#{j: X_j ≤ x} ≥ k), the tail of a Poisson-binomial count with p_j = Φ(x/s_j) (computed by the
    usual recursion over j). For an even p, E[M^p] = ∫_0^∞ p·x^(p−1)·(P(M > x) + P(M < −x)) dx, integrated by
    the trapezoid rule in ln x from 1e-6·min s_j to 40·max s_j (the rest is below 1e-12 of the result).
    """
    from scipy.special import ndtr  # lazy: only aggregation calls this, not the ClientApp

    s = np.asarray(scales, dtype=np.float64)
    if s.size == 0 or not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"scales must be finite numbers > 0, got {scales!r}")
    if not 1 <= k <= s.size:
        raise ValueError(f"k must lie in [1, {s.size}] for {s.size} scales, got {k!r}")
    t = np.linspace(math.log(1e-6 * s.min()), math.log(40.0 * s.max()), GRID_POINTS)
    x = np.exp(t)

    def at_least_k_below(y: np.ndarray) -> np.ndarray:
        count = np.zeros((y.size, s.size + 1))
        count[:, 0] = 1.0
        for scale in s:
            p = ndtr(y / scale)[:, None]
            count[:, 1:] = count[:, 1:] * (1 - p) + count[:, :-1] * p
            count[:, 0] *= 1 - p[:, 0]
        return count[:, k:].sum(axis=1)

    tails = (1.0 - at_least_k_below(x)) + at_least_k_below(-x)  # P(M > x) + P(M < -x)
    moments = [float(np.trapezoid(p * x**p * tails, t)) for p in (2, 4)]  # dx = x dt
    return moments[0], moments[1]


def noise_bound(kappa: float, dim: int, z: float = NOISE_Z) -> float:
    """Return 1 + z·√κ / (2√d): a silo's noise distance past it is named (:data:`NOISE_Z`)."""
    return 1.0 + z * math.sqrt(kappa) / (2.0 * math.sqrt(dim))


@dataclass(frozen=True)
class NoiseDistances:
    """Each silo's distance from the others' median in units of its expected noise distance (one round)."""

    units: np.ndarray  # r_i = ‖u_i − m_−i‖ / √(d·v_i): 1 for a silo of pure noise
    norms: np.ndarray  # √(d·v_i): the distance pure noise puts between silo i and the others' median
    ratios: np.ndarray  # r_i / median_j r_j: 1 for a typical silo
    bounds: np.ndarray  # noise_bound(κ_i, d)
    median: float  # median_j r_j

    @property
    def named(self) -> np.ndarray:
        """Which silos are past their bound."""
        return self.ratios > self.bounds


def noise_distances(uploads: Sequence[np.ndarray], scales: Sequence[float], z: float = NOISE_Z) -> NoiseDistances:
    """Return each upload's distance from the others' median in units of its training noise (docs/cross-silo.md).

    The reference of silo i is m_−i, the coordinate-wise lower median of the *other* n − 1 uploads (their median
    for an even n), so silo i's noise is independent of it. If every silo's upload is a common mean plus its own
    Gaussian noise of scale s_j per coordinate (``SiloTraining.upload_noise``), each coordinate
    of u_i − m_−i is s_i·z − M with z ~ N(0, 1) independent of M, the k-th smallest of the others' noises; so

        E‖u_i − m_−i‖² = d·v_i,  v_i = s_i² + E[M²],
        κ_i = Var[(s_i z − M)²] / v_i² = (3 s_i⁴ + 6 s_i² E[M²] + E[M⁴]) / v_i² − 1

    (:func:`order_statistic_moments`), and r_i = ‖u_i − m_−i‖ / √(d·v_i) is 1 within √κ_i / (2√d). A poison b
    adds ‖b‖² to the squared distance: it shows against √(d·v_i), the silo's own noise norm s_i√d for a silo
    noisier than the others' median (v_i ≈ s_i²), but the median's noise for the least noisy (largest) silos.
    The ratio r_i / median_j r_j (1 for a typical silo) is compared with :func:`noise_bound`; with fewer than 2
    uploads no silo is compared (all ratios 1).
    """
    rows = _rows(uploads)
    n, dim = rows.shape
    s = np.asarray(scales, dtype=np.float64)
    if s.shape != (n,) or not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"scales must be {n} finite numbers > 0 (one per upload), got {list(scales)!r}")
    if n < 2:
        return NoiseDistances(np.ones(n), s * math.sqrt(dim), np.ones(n), np.full(n, noise_bound(2.0, dim, z)), 1.0)
    k = n // 2  # 1-based: the lower median of the n − 1 others
    ordered = np.partition(rows, (k - 1, k), axis=0)
    low, high = ordered[k - 1], ordered[k]
    units, norms, kappas = np.empty(n), np.empty(n), np.empty(n)
    for i in range(n):
        # the k-th smallest of the others: the k-th of all when silo i lies above it, else the (k + 1)-th
        reference = np.where(rows[i] <= low, high, low)
        m2, m4 = order_statistic_moments(tuple(np.delete(s, i).tolist()), k)
        v = s[i] ** 2 + m2
        kappas[i] = (3 * s[i] ** 4 + 6 * s[i] ** 2 * m2 + m4) / v**2 - 1
        gap = rows[i] - reference
        norms[i] = math.sqrt(dim * v)
        units[i] = math.sqrt(float(np.sum(gap * gap))) / norms[i]  # not BLAS' dot: it spins on busy cores
    median = float(np.median(units))
    ratios = units / median if median > 0 else np.ones(n)
    return NoiseDistances(units, norms, ratios, np.array([noise_bound(kappa, dim, z) for kappa in kappas]), median)


def mix_distances(uploads: Sequence[np.ndarray], scales: Sequence[float], mixes: Sequence[Sequence[int]],
                  signal_bound: float | None = None) -> tuple[np.ndarray, float]:
    """Return each silo's label-mix distance r_i and its bound (``label_mix_reference``).

    r_i is silo i's distance from what the other silos predict for its training label mix, in units of what that
    prediction and its training noise leave (``label_mix_reference.mix_prediction``): at most about 1 for an honest
    silo (√(χ²_d / d) when the heterogeneity granted is the true one, less where it is more), so its bound is
    :func:`noise_bound` with κ = 2; not divided by the round's median, which a generous variance would lower.
    ``signal_bound``: ``silo_training.upload_signal_bound``, which caps each class variance at (2B)²/d.
    """
    dim = int(np.asarray(uploads[0]).size)
    cap = None if signal_bound is None else (2.0 * signal_bound) ** 2 / dim
    return mix_prediction(uploads, scales, mixes, largest_class_variance=cap).units, noise_bound(2.0, dim)


def report(clients: Sequence[int], uploads: Sequence[np.ndarray], discounts: Sequence[float] | np.ndarray | None,
           action: str, *, noise_scales: Mapping[int, float] | None = None,
           label_mixes: Mapping[int, Sequence[int]] | None = None, signal_bound: float | None = None) -> OutlierReport:
    """Return the round's report over ``clients`` (``discounts`` None: FedAvg's report, names by distance).

    ``noise_scales``: each silo's training noise per coordinate (``silo_training.upload_noise_scales``); given, silos
    are named by their noise distance (:func:`noise_distances`) instead of their discount or distance. ``label_mixes``:
    each silo's training label histogram; given too, with 3 silos or more, a silo is named only when its label mix
    does not explain that distance either (:func:`mix_distances`, its class variances capped by ``signal_bound``): an
    honest silo of a skewed mix is far from the others' median, but not from what they predict for its mix.
    """
    distances = median_distances(uploads)
    taken = np.zeros(len(clients)) if discounts is None else np.asarray(discounts, dtype=np.float64)
    if noise_scales is not None:
        scales = [noise_scales[c] for c in clients]
        noise = noise_distances(uploads, scales)
        named, mixed = noise.named, np.full(len(clients), np.nan)
        if label_mixes is not None and len(clients) >= 3:
            mixed, mix_bound = mix_distances(uploads, scales, [label_mixes[c] for c in clients], signal_bound)
            named = named & (mixed > mix_bound)
        silos = [SiloDiscount(int(c), float(x), float(r), bool(flag), float(t), float(b),
                              None if math.isnan(m) else float(m))
                 for c, x, r, flag, t, b, m in zip(clients, taken, distances, named, noise.ratios, noise.bounds,
                                                   mixed, strict=True)]
        return OutlierReport(action, tuple(silos), noise.median)
    named = distances > OUTLIER_BOUND if discounts is None else taken >= DISCOUNT_BOUND
    return OutlierReport(action, tuple(SiloDiscount(int(c), float(x), float(r), bool(flag))
                                       for c, x, r, flag in zip(clients, taken, distances, named, strict=True)))


@dataclass(frozen=True)
class PersistentOutlier:
    """A silo named in more than half of the rounds in which it was aggregated (the run's summary)."""

    client: int
    action: str
    named_rounds: int
    rounds: int
    mean_discount: float
    mean_distance: float
    mean_noise_distance: float | None = None  # noisy training: its mean noise distance (named by it), else None

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as written (``metrics.json``'s ``named_outliers``, ``--json``)."""
        row: dict[str, Any] = {"client": self.client, "action": self.action, "named_rounds": self.named_rounds,
                               "rounds": self.rounds, "mean_discount": round(self.mean_discount, 6),
                               "mean_distance": round(self.mean_distance, 6)}
        if self.mean_noise_distance is not None:
            row["mean_noise_distance"] = round(self.mean_noise_distance, 6)
        return row

    def line(self, *, noise: str) -> str:
        """Return the summary's line on the silo; ``noise``: its training noise (``silo_training.UPLOAD_NOISE``)."""
        how = f"mean discount {self.mean_discount:.2f}, " if self.action != FLAGGED else ""
        if self.mean_noise_distance is not None:  # named by its distance in units of its own training noise
            return (f"silo {self.client}: {self.action} in {self.named_rounds} of the {self.rounds} rounds it was "
                    f"aggregated in ({how}mean distance {self.mean_noise_distance:.3f} x the typical silo's from "
                    f"the median in units of its own {noise})")
        return (f"silo {self.client}: {self.action} in {self.named_rounds} of the {self.rounds} rounds it was "
                f"aggregated in ({how}mean distance {self.mean_distance:.2f} x the typical silo's from the median)")


def persistent_outliers(reports: Sequence[OutlierReport | None]) -> list[PersistentOutlier]:
    """Return the silos named in more than half of the rounds whose report holds them, by client index."""
    seen: dict[int, list[SiloDiscount]] = {}
    action = ""
    for one in reports:
        if one is None:
            continue
        action = one.action
        for silo in one.silos:
            seen.setdefault(silo.client, []).append(silo)
    named = []
    for client in sorted(seen):
        entries = seen[client]
        count = sum(s.named for s in entries)
        if 2 * count > len(entries):
            noise = [s.noise_distance for s in entries if s.noise_distance is not None]
            named.append(PersistentOutlier(client, action, count, len(entries),
                                           float(np.mean([s.discount for s in entries])),
                                           float(np.mean([s.distance for s in entries])),
                                           float(np.mean(noise)) if noise else None))
    return named
