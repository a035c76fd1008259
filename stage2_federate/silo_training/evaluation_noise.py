"""What a silo's evaluation replies release in a DP-SGD run, and the Gaussian noise that makes them private.

In a DP-SGD run (``ldpfl federate --dp-sgd``) a silo's test records are its own clean records (local-only
files), disjoint from the training records that DP-SGD protects. Each evaluated round (every round, or every
K-th and the last with ``eval_every`` K: ``schedule``), the silo reports the global model's summed
cross-entropy and correct predictions on them (``round_record.SplitSums``). In clear, those sums are
functions of clean records that no guarantee covers. Here they leave through the Gaussian mechanism:

* each record's cross-entropy is clipped to [0, L] (:data:`LOSS_BOUND` nats), so one record moves the pair
  (correct, loss sum / L) by at most 1 in each coordinate: an L2 sensitivity of √2 under replace-one and under
  add/remove alike (the number of rows is public: the plan declares each split's size);
* each coordinate gets N(0, σ²) noise (the loss in units of L), drawn from the silo's own evaluation stream;
  R such releases compose to exactly one Gaussian mechanism of noise multiplier σ/(√2·√R) (Dong, Roth & Su
  2019, Corollary 3.3: μ-GDP composes as √(Σμ²)), which the one accountant composes
  (``ldpfl.mechanisms.privacy_events.GaussianEvent`` of R releases: :meth:`EvaluationNoise.event`). The
  sensitivity is √2 under either relation, so the figure is the same under both: it is computed as
  dp-accounting's add/remove Gaussian (whose replace-one figure would assume a replacement moves the sums twice
  as far, which a bounded count cannot);
* σ is calibrated so that every release the run may make (one per evaluated round: ⌈R / K⌉) stays within
  the silo's target ε at its δ (:func:`calibrate`); or, for a run whose DP-SGD σ was given rather than
  calibrated (it may be resumed with more rounds), σ is fixed so that one reply costs what one round of
  DP-SGD costs by the central limit theorem of Dong, Roth & Su (2019, Theorem 4: T steps of rate q and
  multiplier σ are about μ-GDP with μ = q·√(T·(e^{1/σ²} − 1))) (:func:`matched`): independent of the number
  of rounds, each reply then spent exactly as accounted however far the run goes. The silo rounds the count
  and clamps both sums to their ranges (post-processing).

The split between training and test records is drawn by the plan from the record indices alone, so the two
sets are disjoint whatever the records hold, and a silo's guarantee over all its records is the larger of the
two parts' figures at the same δ (parallel composition; McSherry 2009, Theorem 4).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.base import require_generator
from ldpfl.mechanisms.privacy_events import GaussianEvent
from ldpfl.mechanisms.validation import require_finite_positive
from ldpfl.stage2_federate.round_record import SplitSums

LOSS_BOUND = 10.0
"""Nats: each test record's cross-entropy is clipped to [0, LOSS_BOUND] before it is summed (the sum's range)."""
SENSITIVITY = math.sqrt(2.0)
"""L2 sensitivity of (correct, loss sum / LOSS_BOUND) to one record, under either neighbouring relation."""


@dataclass(frozen=True)
class EvaluationNoise:
    """One silo's evaluation noise: σ per coordinate (count units), the releases it was planned for, δ, the target.

    ``target_epsilon`` is stated under ``neighbours`` (None: σ matched to the DP-SGD's cost a round, no target); the
    Gaussian's figure is the same under both relations.
    """

    sigma: float
    planned_releases: int
    delta: float
    neighbours: str
    target_epsilon: float | None

    def __post_init__(self) -> None:
        """Validate σ, the target and δ; the relation is one the accountant knows."""
        require_finite_positive("sigma", self.sigma)
        if self.target_epsilon is not None:
            require_finite_positive("target_epsilon", self.target_epsilon)
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        accounting.require_neighbours(self.neighbours)

    def epsilon(self, releases: int) -> float:
        """Return ε at δ after ``releases`` evaluation replies (0 for none), under either relation."""
        return spent(self.sigma, releases, self.delta)

    def epsilons(self, releases: int) -> dict[str, float]:
        """Return ε under replace-one and add-remove at δ after ``releases`` evaluation replies (the same figure)."""
        eps = self.epsilon(releases)
        return {relation: eps for relation in accounting.NEIGHBOURS}

    def event(self, releases: int) -> GaussianEvent:
        """Return what ``releases`` replies release, as the accountant's event: Gaussians of multiplier σ/√2."""
        return replies(self.sigma, releases)

    def release(self, clipped_loss_sum: float, correct: int, rows: int, *, rng: np.random.Generator) -> SplitSums:
        """Return the noisy sums of one reply: N(0, σ²) on the count and N(0, (σL)²) on the clipped loss sum.

        ``clipped_loss_sum`` must be the sum of per-record losses clipped to [0, :data:`LOSS_BOUND`]
        (``model.evaluation_sums(..., loss_bound=LOSS_BOUND)``). The count is rounded and clamped to [0, rows],
        the loss sum clamped to [0, rows × L]: post-processing, which costs nothing.
        """
        require_generator(rng)
        noise = rng.normal(0.0, self.sigma, size=2)
        count = int(np.clip(np.rint(correct + noise[0]), 0, rows))
        loss = float(np.clip(clipped_loss_sum + LOSS_BOUND * noise[1], 0.0, rows * LOSS_BOUND))
        return SplitSums(loss, count, int(rows))


def replies(sigma: float, releases: int) -> GaussianEvent:
    """Return the event of ``releases`` replies at noise σ (count units): R Gaussians of multiplier σ/√2."""
    return GaussianEvent(sigma / SENSITIVITY, releases)


def spent(sigma: float, releases: int, delta: float) -> float:
    """ε at ``delta`` of ``releases`` replies: R Gaussians of multiplier σ/√2, composed by the accountant (above)."""
    if releases == 0:
        return 0.0
    return accounting.epsilon([replies(sigma, releases)], delta, neighbours=accounting.ADD_REMOVE)


MAX_EXPONENT = 700.0
"""1/σ² beyond this: e^{1/σ²} would overflow float64 (σ below 0.038)."""


def matched(noise_multiplier: float, sampling_probability: float, local_steps: int, delta: float, *,
            neighbours: str) -> EvaluationNoise:
    """Return the noise whose one reply is μ-GDP with μ = one round of DP-SGD's (the module's CLT), no target.

    Raises
    ------
    ValueError
        σ or q out of range, or σ so small that the round's μ overflows (each named).
    """
    require_finite_positive("noise_multiplier", noise_multiplier)
    require_finite_positive("sampling_probability", sampling_probability)
    exponent = 1.0 / noise_multiplier**2
    if exponent > MAX_EXPONENT:
        raise ValueError(f"noise_multiplier {noise_multiplier!r} is too small to match the evaluation noise to it")
    mu = sampling_probability * math.sqrt(local_steps * math.expm1(exponent))
    return EvaluationNoise(SENSITIVITY / mu, 0, float(delta), neighbours, None)


@functools.lru_cache(maxsize=64)
def calibrate(target_epsilon: float, delta: float, releases: int, *, neighbours: str) -> EvaluationNoise:
    """Return the noise whose ``releases`` replies spend at most ``target_epsilon`` at ``delta`` (smallest σ, 1e-9).

    Raises
    ------
    ValueError
        A target or δ out of range, fewer than one release, or an unknown relation (each named).
    """
    require_finite_positive("target_epsilon", target_epsilon)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
        raise ValueError(f"releases must be an integer >= 1, got {releases!r}")
    accounting.require_neighbours(neighbours)
    # R releases at multiplier m are one Gaussian at m/√R (the accountant's exact path): the one calibrator
    sigma = SENSITIVITY * accounting.calibrate_gaussian(float(target_epsilon), float(delta)) * math.sqrt(releases)
    return EvaluationNoise(sigma, releases, float(delta), neighbours, float(target_epsilon))
