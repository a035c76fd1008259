"""The ``stats`` release (issue 40): accounting, noise, a record's largest effect, the synthetic records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import statistics_model as sm
from ldpfl.mechanisms import sufficient_statistics as ss

DELTA = 1e-5
K_SE = 5.0  # tolerance in standard errors


# --------------------------------------------------------------------------------------------------
# Accounting: the one accountant's figure against dp-accounting composing the three parts itself.


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("shares", [ss.SHARES, (0.3, 0.02, 0.68), (1 / 3, 1 / 3, 1 / 3)])
def test_add_remove_epsilon_matches_dp_accounting_composing_the_parts(epsilon, shares) -> None:
    """Three Gaussian releases (sums, counts, moments) at σ_i/Δ_i composed by dp-accounting's PLD = ours."""
    import dp_accounting
    from dp_accounting import pld

    clip = 2.5
    mu = ss.calibrate_mu(epsilon, DELTA, shares=shares)
    scales = ss.noise_scales(mu, clip, shares)
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                   value_discretization_interval=1e-4)
    for sigma, sensitivity in ((scales.sums, clip), (scales.counts, 1.0), (scales.moments, clip**2)):
        accountant.compose(dp_accounting.GaussianDpEvent(sigma / sensitivity))
    theirs = accountant.get_epsilon(DELTA)
    ours = ss.epsilons(mu, DELTA, shares)["add-remove"]
    assert ours == pytest.approx(epsilon, abs=1e-6)
    # dp-accounting's discretized PLD is pessimistic: at most 1e-3 relative above the exact figure, never below.
    assert ours - 1e-9 <= theirs <= ours * (1 + 1e-3)


def test_calibrate_gaussian_round_trips_and_refuses() -> None:
    for epsilon in (0.1, 1.0, 3.0, 20.0):
        multiplier = accounting.calibrate_gaussian(epsilon, DELTA)
        spent = accounting.epsilon([accounting.GaussianEvent(multiplier)], DELTA, neighbours=accounting.ADD_REMOVE)
        assert spent <= epsilon + 1e-9
        assert spent == pytest.approx(epsilon, rel=1e-6)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="target_epsilon"):
            accounting.calibrate_gaussian(bad, DELTA)
    with pytest.raises(ValueError, match="delta"):
        accounting.calibrate_gaussian(1.0, 1.0)


def test_replace_one_is_larger_and_matches_its_sensitivity() -> None:
    mu = ss.calibrate_mu(3.0, DELTA)
    figures = ss.epsilons(mu, DELTA)
    assert figures["replace-one"] > figures["add-remove"]
    direct = accounting.epsilon([accounting.GaussianEvent(1 / (mu * ss.replace_one_factor()))], DELTA,
                                neighbours=accounting.ADD_REMOVE)
    assert figures["replace-one"] == pytest.approx(direct, rel=1e-12)
    mu_r = ss.calibrate_mu(3.0, DELTA, neighbours=accounting.REPLACE_ONE)
    assert ss.epsilons(mu_r, DELTA)["replace-one"] == pytest.approx(3.0, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# A record's largest effect, under clipping (eq. 1 and eq. 2 of the module).


def _scaled_distance(a: ss.Statistics, b: ss.Statistics, scales: ss.NoiseScales) -> float:
    """‖release(a) − release(b)‖ in units of each part's noise (M's off-diagonal counted with its σ_M/√2)."""
    d_moments = a.moments - b.moments
    upper = d_moments[np.triu_indices(a.width, 1)]
    return math.sqrt(np.sum((a.sums - b.sums) ** 2) / scales.sums**2
                     + np.sum((a.counts - b.counts) ** 2) / scales.counts**2
                     + (np.sum(np.diag(d_moments) ** 2) + 2 * np.sum(upper**2)) / scales.moments**2)


@pytest.mark.parametrize("shares", [ss.SHARES, (0.3, 0.02, 0.68), (0.8, 0.1, 0.1)])
def test_a_records_largest_effect_is_bounded_and_attained(shares) -> None:
    rng = np.random.default_rng(5)
    width, classes, clip = 6, 3, 1.5
    mu = 0.7
    scales = ss.noise_scales(mu, clip, shares)
    base_rows = rng.normal(size=(20, width)) * 3
    base = ss.project_and_clip(base_rows, np.eye(width), clip)
    labels = rng.integers(0, classes, 20)
    before = ss.statistics(base, labels, classes)
    worst_add, worst_replace = 0.0, 0.0
    for _ in range(300):  # random records (most beyond the clip) added, or replacing row 0
        record = ss.project_and_clip(rng.normal(size=(1, width)) * rng.uniform(0.1, 10), np.eye(width), clip)
        label = rng.integers(0, classes, 1)
        added = ss.statistics(np.vstack([base, record]), np.concatenate([labels, label]), classes)
        worst_add = max(worst_add, _scaled_distance(added, before, scales))
        replaced = ss.statistics(np.vstack([record, base[1:]]), np.concatenate([label, labels[1:]]), classes)
        worst_replace = max(worst_replace, _scaled_distance(replaced, before, scales))
    assert worst_add <= mu * (1 + 1e-9)
    assert worst_replace <= mu * ss.replace_one_factor(shares) * (1 + 1e-9)
    # The bounds are attained: a record on the clip (add/remove) ...
    edge = np.zeros((1, width))
    edge[0, 0] = clip
    added = ss.statistics(np.vstack([base, edge]), np.concatenate([labels, [0]]), classes)
    assert _scaled_distance(added, before, scales) == pytest.approx(mu, rel=1e-9)
    # ... and the worst replacement of eq. 2: another class and orthogonal, or the same class at t*.
    s_sums, s_counts, s_moments = shares
    first = np.zeros((1, width))
    first[0, 0] = clip
    t_star = max(-(clip**2), -scales.moments**2 / (2 * scales.sums**2))
    second = np.zeros((1, width))
    second[0, 0], second[0, 1] = t_star / clip, math.sqrt(clip**2 - (t_star / clip) ** 2)
    distances = []
    for other, other_label in ((np.roll(first, 1, axis=1), 1), (second, 0)):
        one = ss.statistics(np.vstack([first, base]), np.concatenate([[0], labels]), classes)
        two = ss.statistics(np.vstack([other, base]), np.concatenate([[other_label], labels]), classes)
        distances.append(_scaled_distance(one, two, scales))
    assert max(distances) == pytest.approx(mu * ss.replace_one_factor(shares), rel=1e-9)


def _centered(z: np.ndarray, labels: np.ndarray, classes: int, means: np.ndarray, residual_clip: float
              ) -> ss.Statistics:
    """The clean centered statistics for fixed (already released) class means: sums, counts, residual moments."""
    plain = ss.statistics(z, labels, classes, moments=False)
    return ss.Statistics(plain.sums, plain.counts, ss.residual_moments(z, labels, means, residual_clip), True)


@pytest.mark.parametrize("shares", [ss.SHARES, (0.3, 0.02, 0.68), (0.1, 0.3, 0.6)])
def test_a_records_largest_effect_on_a_centered_release_is_bounded_and_attained(shares) -> None:
    """Eq. 1' and 3: with the means of part (a) fixed, one record moves the scaled release ≤ μ (add/remove) and
    ≤ μ_r (replace-one), and both are reached."""
    rng = np.random.default_rng(8)
    width, classes, clip, residual_clip, mu = 6, 3, 1.5, 0.8, 0.7
    scales = ss.noise_scales(mu, clip, shares, moments_clip=residual_clip)
    base = ss.project_and_clip(rng.normal(size=(20, width)) * 3, np.eye(width), clip)
    labels = rng.integers(0, classes, 20)
    means = rng.normal(size=(classes, width))
    before = _centered(base, labels, classes, means, residual_clip)
    worst_add, worst_replace = 0.0, 0.0
    for _ in range(300):
        record = ss.project_and_clip(rng.normal(size=(1, width)) * rng.uniform(0.1, 10), np.eye(width), clip)
        label = rng.integers(0, classes, 1)
        added = _centered(np.vstack([base, record]), np.concatenate([labels, label]), classes, means, residual_clip)
        worst_add = max(worst_add, _scaled_distance(added, before, scales))
        replaced = _centered(np.vstack([record, base[1:]]), np.concatenate([label, labels[1:]]), classes, means,
                             residual_clip)
        worst_replace = max(worst_replace, _scaled_distance(replaced, before, scales))
    factor = ss.replace_one_factor(shares, centered=True)
    assert worst_add <= mu * (1 + 1e-9)
    assert worst_replace <= mu * factor * (1 + 1e-9)
    # Attained: a record on the clip whose residual reaches C_r (add/remove); z and z' = −z of one class about a
    # mean orthogonal to z with norm C (residuals orthogonal, both clipped to C_r), or two classes' records.
    means = np.zeros((classes, width))
    means[0, 1] = clip
    empty = _centered(np.zeros((0, width)), np.zeros(0, dtype=int), classes, means, residual_clip)
    edge = np.zeros((1, width))
    edge[0, 0] = clip
    one = _centered(edge, np.array([0]), classes, means, residual_clip)
    assert _scaled_distance(one, empty, scales) == pytest.approx(mu, rel=1e-9)
    distances = [_scaled_distance(one, _centered(-edge, np.array([0]), classes, means, residual_clip), scales),
                 _scaled_distance(one, _centered(np.roll(edge, 2, axis=1), np.array([1]), classes, means,
                                                 residual_clip), scales)]
    assert max(distances) == pytest.approx(mu * factor, rel=1e-9)


def test_a_centered_release_spends_what_its_noise_says() -> None:
    """Its two parts composed by dp-accounting's PLD (σ_i/Δ_i, with C_r for the moments) give the same ε."""
    import dp_accounting
    from dp_accounting import pld

    shares, clip, residual_clip = ss.SHARES, 2.0, 1.1
    mu = ss.calibrate_mu(3.0, DELTA, shares=shares, centered=True)
    scales = ss.noise_scales(mu, clip, shares, moments_clip=residual_clip)
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                   value_discretization_interval=1e-4)
    for sigma, sensitivity in ((scales.sums, clip), (scales.counts, 1.0), (scales.moments, residual_clip**2)):
        accountant.compose(dp_accounting.GaussianDpEvent(sigma / sensitivity))
    assert 3.0 - 1e-9 <= accountant.get_epsilon(DELTA) <= 3.0 * (1 + 1e-3)
    assert ss.epsilons(mu, DELTA, shares, centered=True)["add-remove"] == pytest.approx(3.0, abs=1e-6)
    replace_one = ss.calibrate_mu(3.0, DELTA, shares=shares, centered=True, neighbours=accounting.REPLACE_ONE)
    assert ss.epsilons(replace_one, DELTA, shares, centered=True)["replace-one"] == pytest.approx(3.0, abs=1e-6)


def test_pooling_centered_releases_adds_their_within_class_scatters() -> None:
    rng = np.random.default_rng(4)
    z = rng.normal(size=(60, 4))
    labels = rng.integers(0, 3, 60)
    raw = ss.statistics(z, labels, 3)
    means = raw.sums / raw.counts[:, None]
    centered = _centered(z, labels, 3, means, 1e9)
    assert np.allclose(centered.scatter(), raw.scatter())  # about the exact means: the same scatter
    assert (centered + centered).centered and np.allclose((centered + raw).moments, 2 * raw.scatter())
    assert not (raw + raw).centered and np.allclose((raw + raw).moments, 2 * raw.moments)


# --------------------------------------------------------------------------------------------------
# The noise the accountant assumes.


def test_noise_variance_is_what_the_accountant_assumes() -> None:
    """Each part's sample variance within K_SE standard errors of σ² (normal: se = σ²·√(2/(m−1)))."""
    rng = np.random.default_rng(11)
    width, classes = 40, 5
    scales = ss.noise_scales(0.9, 3.0)
    zero = ss.Statistics(np.zeros((classes, width)), np.zeros(classes), np.zeros((width, width)))
    draws = [ss.release(zero, scales, rng) for _ in range(200)]
    sums = np.stack([d.sums for d in draws]).ravel()
    counts = np.stack([d.counts for d in draws]).ravel()
    moments = np.stack([d.moments for d in draws])
    diagonal = np.stack([np.diag(m) for m in moments]).ravel()
    upper = moments[:, *np.triu_indices(width, 1)].ravel()
    for values, variance in ((sums, scales.sums**2), (counts, scales.counts**2),
                             (diagonal, scales.moments**2), (upper, scales.moments**2 / 2)):
        se = variance * math.sqrt(2 / (len(values) - 1))
        assert abs(np.var(values, ddof=1) - variance) < K_SE * se
        assert abs(np.mean(values)) < K_SE * math.sqrt(variance / len(values))
    assert np.array_equal(moments, np.transpose(moments, (0, 2, 1)))


def test_release_draws_from_the_generator_passed_in() -> None:
    clean = ss.Statistics(np.ones((2, 3)), np.ones(2), np.eye(3))
    scales = ss.noise_scales(1.0, 1.0)
    one = ss.release(clean, scales, np.random.default_rng(3))
    two = ss.release(clean, scales, np.random.default_rng(3))
    three = ss.release(clean, scales, np.random.default_rng(4))
    assert np.array_equal(one.moments, two.moments) and np.array_equal(one.sums, two.sums)
    assert not np.array_equal(one.sums, three.sums)


# --------------------------------------------------------------------------------------------------
# Projection, clipping, synthetic records.


def test_projection_is_orthonormal_public_and_seeded() -> None:
    basis = ss.projection(50, 8, 7)
    assert np.allclose(basis.T @ basis, np.eye(8), atol=1e-12)
    assert np.array_equal(basis, ss.projection(50, 8, 7))
    assert not np.array_equal(basis, ss.projection(50, 8, 8))
    with pytest.raises(ValueError, match=r"width \(k\)"):
        ss.projection(50, 51, 0)


def test_clipping_bounds_every_norm_and_keeps_short_records() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 20)) * rng.uniform(0, 3, (100, 1))
    z = ss.project_and_clip(x, np.eye(20), 2.0)
    norms = np.linalg.norm(z, axis=1)
    assert norms.max() <= 2.0 * (1 + 1e-12)
    short = np.linalg.norm(x, axis=1) <= 2.0
    assert np.allclose(z[short], x[short])


def test_statistics_refuse_labels_outside_the_classes() -> None:
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\]"):
        ss.statistics(np.zeros((2, 3)), np.array([0, 3]), 3)


def test_synthetic_records_are_a_function_of_the_statistics_and_the_seed() -> None:
    rng = np.random.default_rng(1)
    z = ss.project_and_clip(rng.normal(size=(300, 6)), np.eye(6), 1.0)
    labels = rng.integers(0, 3, 300)
    scales = ss.noise_scales(2.0, 1.0)
    released = ss.release(ss.statistics(z, labels, 3), scales, rng)
    model = sm.estimate(released, scales)
    rows, synthetic_labels = sm.synthetic_records(model, 42)
    again = sm.synthetic_records(sm.estimate(released, scales), 42)
    assert np.array_equal(rows, again[0]) and np.array_equal(synthetic_labels, again[1])
    assert not np.array_equal(rows, sm.synthetic_records(model, 43)[0])
    assert np.array_equal(np.bincount(synthetic_labels, minlength=3), np.rint(model.counts).astype(int))


def test_synthetic_records_follow_the_model() -> None:
    """Class means within K_SE standard errors of μ_c (se = √(Σ_jj / N_c)); covariance within 10 %."""
    width = 4
    a = np.random.default_rng(2).normal(size=(width, width))
    model = sm.GaussianModel(np.arange(12.0).reshape(3, width), np.full(3, 1 / 3), a @ a.T + np.eye(width),
                             np.full(3, 20_000.0))
    rows, labels = sm.synthetic_records(model, 0)
    for c in range(3):
        se = np.sqrt(np.diag(model.covariance) / 20_000)
        assert np.all(np.abs(rows[labels == c].mean(0) - model.means[c]) < K_SE * se)
    residual = rows - model.means[labels]
    assert np.allclose(np.cov(residual.T), model.covariance, rtol=0.1, atol=0.05)


def test_lda_on_clean_statistics_separates_gaussian_classes() -> None:
    """Two well-separated Gaussian classes: LDA from the statistics classifies as the Bayes rule does."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 4000)
    x = rng.normal(size=(4000, 3)) * 0.1 + np.where(labels[:, None] == 1, 0.3, -0.3)
    z = ss.project_and_clip(x, np.eye(3), 10.0)
    model = sm.estimate(ss.statistics(z, labels, 2), ss.NoiseScales(1, 1, 1e-12, math.nan))
    weights, biases = model.discriminant()
    predicted = np.argmax(z @ weights + biases, axis=1)
    bayes = (x.sum(1) > 0).astype(int)
    assert np.mean(predicted == bayes) > 0.999


def test_the_mechanism_releases_about_the_class_means_or_the_origin() -> None:
    """Both forms spend the target ε add/remove; the centered one refuses a one-part release and has no raw moments."""
    from ldpfl.mechanisms.gaussian_statistics import ORIGIN, GaussianStatistics

    rng = np.random.default_rng(6)
    z = rng.normal(size=(400, 8)) + np.repeat(np.eye(8)[:2] * 3, 200, axis=0)
    labels = np.repeat([0, 1], 200)
    centered, origin = GaussianStatistics(epsilon=2.0, width=8), GaussianStatistics(epsilon=2.0, width=8,
                                                                                   moments_about=ORIGIN)
    for mechanism in (centered, origin):
        assert mechanism.epsilons()["add-remove"] == pytest.approx(2.0, abs=1e-6)
    assert centered.epsilons()["replace-one"] > origin.epsilons()["replace-one"]  # eq. 3 against eq. 2
    assert centered.mu == pytest.approx(origin.mu, rel=1e-12)  # the same budget; M's noise scales with its clip²
    assert centered.scales(8).moments == pytest.approx(origin.scales(8).moments * 0.4**2, rel=1e-12)
    released = centered.release_records(z, labels, 2, rng=np.random.default_rng(1))
    assert released.statistics.centered and not origin.release_records(z, labels, 2, rng=rng).statistics.centered
    assert np.trace(released.statistics.moments) < np.trace(z.T @ z) / 2  # residual scatter, not Σ z zᵀ
    with pytest.raises(ValueError, match="two parts"):
        centered.release(ss.statistics(z, labels, 2), rng=rng)
