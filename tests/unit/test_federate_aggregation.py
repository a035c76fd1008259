"""Stage-2 aggregation: the pure functions and every strategy against hand-computed arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.stage2_federate import aggregation as agg
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.strategies import (
    SignAggregation,
    StrategyOptions,
    create_strategy,
    strategy_names,
)

X = [np.array([1.0, -2.0, 3.0], dtype=np.float32),
     np.array([3.0, 2.0, -1.0], dtype=np.float32),
     np.array([-1.0, 0.0, 1.0], dtype=np.float32)]


def clients(rows=(10, 30, 60), histograms=((5, 5), (10, 0), (3, 1))):
    return [ClientDescription.in_memory(i, r, h) for i, (r, h) in enumerate(zip(rows, histograms, strict=True))]


def make(name, options=None, sigmas=(1.0, 2.0, 4.0)):
    """Strategy ``name`` over the three :func:`clients`, whose perturbations add noise of σ_i ``sigmas``."""
    return create_strategy(name, clients(), options or StrategyOptions(), dict(enumerate(sigmas)))


# --------------------------------------------------------------------------------------------------
# Pure functions.


def test_mean_is_ldpfl_line_21() -> None:
    out = agg.mean(X)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [1.0, 0.0, 1.0])


def test_weighted_average_hand_computed() -> None:
    # (1·x0 + 3·x1 + 0·x2) / 4 = ([1,-2,3] + [9,6,-3]) / 4
    np.testing.assert_allclose(agg.weighted_average(X, [1.0, 3.0, 0.0]), [2.5, 1.0, 0.0])
    # A 2-D array of rows works as well as a list: ([1,-2,3] + [3,2,-1] + 2·[-1,0,1]) / 4
    np.testing.assert_allclose(agg.weighted_average(np.stack(X), [1, 1, 2]), [0.5, 0.0, 1.0])


@pytest.mark.parametrize("weights", [[1, 1], [1, -1, 1], [0, 0, 0], [1, math.nan, 1]])
def test_weighted_average_refuses_bad_weights(weights) -> None:
    with pytest.raises(ValueError, match="weights must be 3 finite numbers"):
        agg.weighted_average(X, weights)


def test_weighted_average_refuses_empty_and_ragged() -> None:
    with pytest.raises(ValueError, match="at least one"):
        agg.weighted_average([], [])
    with pytest.raises(ValueError, match="differ in shape"):
        agg.weighted_average([np.zeros(2), np.zeros(3)], [1, 1])


def test_sample_size_weights_fedaw_eq2() -> None:
    np.testing.assert_allclose(agg.sample_size_weights([10, 30, 60]), [0.1, 0.3, 0.6])


def test_inverse_sigma_weights_wu_eq11_and_eq14() -> None:
    # ρ = (1, 1/2, 1/4), Σρ = 7/4 → α = (4/7, 2/7, 1/7)
    np.testing.assert_allclose(agg.inverse_sigma_weights([1.0, 2.0, 4.0]), [4 / 7, 2 / 7, 1 / 7])
    with pytest.raises(ValueError, match="sigmas must be"):
        agg.inverse_sigma_weights([1.0, 0.0])


def test_probability_selection_mask_is_p_greater_than_omega() -> None:
    p = [4 / 7, 2 / 7, 1 / 7]
    assert agg.probability_selection_mask(p, 0.2).tolist() == [True, True, False]
    assert agg.probability_selection_mask(p, 0.6).tolist() == [False, False, False]  # why ω is redrawn
    with pytest.raises(ValueError, match="omega"):
        agg.probability_selection_mask(p, 1.5)


def test_draw_omega_always_selects_someone_and_is_uniform_below_max_p() -> None:
    p = np.array([4 / 7, 2 / 7, 1 / 7])
    rng = mech.default_rng(3)
    omegas = np.array([agg.draw_omega(p, rng) for _ in range(20_000)])
    assert omegas.min() >= 0.0 and omegas.max() < p.max()
    assert all(agg.probability_selection_mask(p, w).any() for w in omegas[:500])
    # Uniform on [0, 4/7): P(client 1 selected) = P(ω < 2/7) = 1/2, P(client 2) = 1/4 (5 binomial SEs).
    for threshold, expected in ((2 / 7, 0.5), (1 / 7, 0.25)):
        share = np.mean(omegas < threshold)
        assert abs(share - expected) < 5 * math.sqrt(expected * (1 - expected) / omegas.size)
    # Same generator state → same ω.
    assert agg.draw_omega(p, mech.default_rng(9)) == agg.draw_omega(p, mech.default_rng(9))


def test_sign_functions_wu_eqs_9_10_13() -> None:
    np.testing.assert_array_equal(agg.sign(np.array([-0.5, 0.0, 2.0])), [-1.0, 0.0, 1.0])
    votes = [np.array([1, 1, -1, 1.0]), np.array([1, -1, -1, -1.0]), np.array([-1, -1, 1, 1.0])]
    np.testing.assert_array_equal(agg.sign(agg.mean(votes)), [1, -1, -1, 1])  # eq. 10 majority
    # eq. 13 with α = (0.1, 0.1, 0.8): client 2 outweighs the others.
    np.testing.assert_array_equal(agg.sign(agg.weighted_average(votes, [0.1, 0.1, 0.8])), [-1, -1, 1, 1])
    np.testing.assert_array_equal(agg.sign(agg.mean(votes[:2])), [1, 0, -1, 0])  # ties give 0
    # A zero weight removes a client: (1, 0, 1) over the first and third votes.
    np.testing.assert_array_equal(agg.sign(agg.weighted_average(votes, [1, 0, 1])), [0, 0, 0, 1])


def test_apply_update_keeps_the_dtype() -> None:
    g = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    out = agg.apply_update(g, np.array([1.0, -1.0, 0.0]))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [1.5, -0.5, 0.5])


def test_label_similarity_weights_fedaw_eqs_7_8() -> None:
    # (5,5) is uniform → 1; (10,0) → cos((1,0),(.5,.5)) = 1/√2; (3,1) → (0.75·0.5+0.25·0.5)/(|(.75,.25)|·|(.5,.5)|)
    expected = [1.0, 1 / math.sqrt(2), 0.5 / (math.sqrt(0.75**2 + 0.25**2) * math.sqrt(0.5))]
    np.testing.assert_allclose(agg.label_similarity_weights([(5, 5), (10, 0), (3, 1)]), expected)


@pytest.mark.parametrize(("fraction", "total", "expected"), [(0.7, 10, 7), (0.7, 100, 70), (0.3, 10, 3),
                                                              (0.05, 10, 1), (1.0, 4, 4), (0.57, 100, 57)])
def test_fraction_count_pldp_line_4(fraction, total, expected) -> None:
    assert agg.fraction_count(fraction, total) == expected


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_fraction_count_refuses_out_of_range(fraction) -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        agg.fraction_count(fraction, 10)


# --------------------------------------------------------------------------------------------------
# Strategies.


def uploads():
    return dict(enumerate(X))


def test_registry_names_and_unknown_name() -> None:
    assert strategy_names() == ["fedavg", "weighted", "probability", "fraction", "fedaw", "median", "trimmed-mean",
                                "norm-clipped"]
    with pytest.raises(ValueError, match="unknown aggregation 'krum'; valid names: fedavg"):
        make("krum")


def test_fedavg_plain_and_sample_weighted() -> None:
    rng = mech.default_rng(0)
    plain = make("fedavg").aggregate(None, uploads(), rng=rng)
    np.testing.assert_allclose(plain.vector, [1.0, 0.0, 1.0])
    assert plain.used == (0, 1, 2) and plain.weights == pytest.approx((1 / 3,) * 3)
    weighted = make("fedavg", StrategyOptions(sample_weighted=True))
    result = weighted.aggregate(None, uploads(), rng=rng)
    # 0.1·x0 + 0.3·x1 + 0.6·x2
    np.testing.assert_allclose(result.vector, [0.1 + 0.9 - 0.6, -0.2 + 0.6, 0.3 - 0.3 + 0.6], atol=1e-6)
    assert result.weights == pytest.approx((0.1, 0.3, 0.6))


def test_weighted_wu_eq12_over_the_received_clients() -> None:
    strategy = make("weighted")
    result = strategy.aggregate(None, uploads(), rng=mech.default_rng(0))
    np.testing.assert_allclose(result.vector, (4 * X[0] + 2 * X[1] + 1 * X[2]) / 7, rtol=1e-6)
    assert result.weights == pytest.approx((4 / 7, 2 / 7, 1 / 7))
    # Client 0 missing (dropped): α renormalized over clients 1 and 2 → (2/3, 1/3).
    partial = strategy.aggregate(None, {1: X[1], 2: X[2]}, rng=mech.default_rng(0))
    np.testing.assert_allclose(partial.vector, (2 * X[1] + X[2]) / 3, rtol=1e-6)


@pytest.mark.parametrize("name", ["weighted", "probability"])
def test_noise_weighted_strategies_need_a_noise_scale(name) -> None:
    with pytest.raises(ValueError, match=r"needs a noise scale per client.*perturbation 'none'"):
        make(name, sigmas=(None, None, None))


def test_probability_wu_eq15_with_the_same_omega_by_hand() -> None:
    strategy = make("probability")
    assert list(strategy.probabilities.values()) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    for seed in range(20):
        omega = (4 / 7) * mech.default_rng(seed).random()  # what draw_omega draws from the same state
        chosen = [i for i, p in enumerate([4 / 7, 2 / 7, 1 / 7]) if p > omega]
        result = strategy.aggregate(None, uploads(), rng=mech.default_rng(seed))
        assert result.info["omega"] == pytest.approx(omega)
        assert list(result.used) == chosen
        np.testing.assert_allclose(result.vector, np.mean([X[i] for i in chosen], axis=0), rtol=1e-6)


def test_probability_when_only_low_probability_clients_arrive() -> None:
    # Only client 2 (P = 1/7) arrived: ω ~ U[0, 1/7) always selects it.
    strategy = make("probability")
    for seed in range(10):
        result = strategy.aggregate(None, {2: X[2]}, rng=mech.default_rng(seed))
        assert result.used == (2,)
        np.testing.assert_allclose(result.vector, X[2])


def test_fraction_selects_gamma_n_distinct_clients() -> None:
    ten = [ClientDescription.in_memory(i, 10, (1, 1)) for i in range(10)]
    strategy = create_strategy("fraction", ten, StrategyOptions(fraction=0.7))
    rng = mech.default_rng(5)
    draws = [strategy.select(r, rng) for r in range(200)]
    assert all(len(d) == 7 == len(set(d)) and d == sorted(d) for d in draws)
    counts = np.bincount(np.concatenate(draws), minlength=10)
    assert counts.min() > 0.7 * 200 - 5 * math.sqrt(200 * 0.21)  # each client in about 70% of rounds
    result = strategy.aggregate(None, uploads(), rng=rng)
    np.testing.assert_allclose(result.vector, [1.0, 0.0, 1.0])


def test_fraction_option_checks() -> None:
    with pytest.raises(ValueError, match="needs fraction γ"):
        make("fraction")
    with pytest.raises(ParameterError, match="give fraction, not clients_per_round") as error:
        make("fraction", StrategyOptions(clients_per_round=2, fraction=0.5))
    assert error.value.parameters == ("fraction", "clients_per_round")
    assert error.value.render(lambda n: "--" + n.replace("_", "-")).endswith("give --fraction, not --clients-per-round")
    with pytest.raises(ValueError, match="^fraction applies to aggregation 'fraction' only, not 'fedavg'"):
        make("fedavg", StrategyOptions(fraction=0.5))
    with pytest.raises(ValueError, match="^sample_weighted applies to aggregation 'fedavg' only, not 'weighted'"):
        make("weighted", StrategyOptions(sample_weighted=True))


def test_fedaw_eq10_hand_computed() -> None:
    g = np.array([1.0, 1 / math.sqrt(2), 0.5 / (math.sqrt(0.625) * math.sqrt(0.5))])
    result = make("fedaw").aggregate(None, uploads(), rng=mech.default_rng(0))
    np.testing.assert_allclose(result.vector, (g[0] * X[0] + g[1] * X[1] + g[2] * X[2]) / g.sum(), rtol=1e-6)
    assert result.weights == pytest.approx(tuple(g / g.sum()))


def test_k_of_n_selection() -> None:
    strategy = create_strategy("fedavg", [ClientDescription.in_memory(i, 10, (1,)) for i in range(10)],
                               StrategyOptions(clients_per_round=9))
    rng = mech.default_rng(1)
    picks = [strategy.select(r, rng) for r in range(50)]
    assert all(len(p) == 9 == len(set(p)) for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # the random one left out changes
    every = make("fedavg")
    assert every.select(1, rng) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"clients per round must be an integer in \[1, 3\]"):
        make("fedavg", StrategyOptions(clients_per_round=4))


def test_nobody_received_gives_no_vector() -> None:
    for name in ("fedavg", "weighted", "probability", "fedaw"):
        result = make(name).aggregate(None, {}, rng=mech.default_rng(0))
        assert result.vector is None and result.used == ()


# fedavg: column sums 1, -1, -1, 1 (eq. 10); weighted α ∝ (4, 2, 1): 5, 1, -5, 3 (eq. 13).
@pytest.mark.parametrize(("name", "expected"), [("fedavg", [1, -1, -1, 1]), ("weighted", [1, 1, -1, 1])])
def test_sign_wrapper_wu_eqs_10_and_13(name, expected) -> None:
    votes = {0: np.array([1, 1, -1, 1.0]), 1: np.array([1, -1, -1, -1.0]), 2: np.array([-1, -1, 1, 1.0])}
    wrapped = SignAggregation(make(name))
    result = wrapped.aggregate(None, votes, rng=mech.default_rng(0))
    np.testing.assert_array_equal(result.vector, expected)
    assert result.info["signed"] is True
    assert wrapped.select(1, mech.default_rng(0)) == [0, 1, 2]


# --------------------------------------------------------------------------------------------------
# Robust aggregation and the weight cap (issue 31), on hand-computed arrays.

X4 = [*X, np.array([100.0, -100.0, 0.0], dtype=np.float32)]


def test_coordinate_median_takes_the_middle_value_of_each_coordinate() -> None:
    out = agg.coordinate_median(X)  # coordinates (1, 3, -1), (-2, 2, 0), (3, -1, 1)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(agg.coordinate_median(X4), [2.0, -1.0, 0.5])  # even n: the mean of the middle two


def test_trimmed_mean_drops_floor_beta_n_at_each_end() -> None:
    # sorted coordinates: (-1, 1, 3, 100), (-100, -2, 0, 2), (-1, 0, 1, 3); beta 0.25 of 4 drops one at each end
    np.testing.assert_allclose(agg.trimmed_mean(X4, 0.25), [2.0, -1.0, 0.5])
    np.testing.assert_allclose(agg.trimmed_mean(X, 0.0), agg.mean(X))  # beta 0: the mean
    assert [agg.trim_count(0.2, 5), agg.trim_count(0.4, 3), agg.trim_count(0.49, 2), agg.trim_count(0.3, 10)] == \
        [1, 1, 0, 3]
    with pytest.raises(ValueError, match=r"trim fraction beta must lie in \[0, 0.5\), got 0.5"):
        agg.trimmed_mean(X, 0.5)


def test_norm_clipping_scales_each_update_to_the_bound() -> None:
    np.testing.assert_allclose(agg.clip_to_norm(np.array([3.0, 4.0]), 1.0), [0.6, 0.8])
    np.testing.assert_array_equal(agg.clip_to_norm(np.array([3.0, 4.0]), 10.0), [3.0, 4.0])
    updates = [np.array([3.0, 4.0]), np.array([0.0, 1.0]), np.array([0.0, 2.0])]  # norms 5, 1, 2: median 2
    mean, bound = agg.norm_clipped_mean(updates, np.ones(3))
    assert bound == 2.0
    np.testing.assert_allclose(mean, [(1.2 + 0 + 0) / 3, (1.6 + 1 + 2) / 3])
    mean, bound = agg.norm_clipped_mean(updates, np.ones(3), bound=1.0)
    np.testing.assert_allclose(mean, [0.6 / 3, 2.8 / 3])


def test_cap_weights_water_fills_and_renormalizes() -> None:
    np.testing.assert_allclose(agg.cap_weights([0.9, 0.05, 0.05], 0.5), [0.5, 0.25, 0.25])
    np.testing.assert_allclose(agg.cap_weights([1, 1, 1, 97], 0.3), [0.7 / 3] * 3 + [0.3])
    # 0.5 is capped; 0.3 then gets 0.39 and is capped too; the last takes the rest
    np.testing.assert_allclose(agg.cap_weights([0.5, 0.3, 0.2], 0.35), [0.35, 0.35, 0.3])
    np.testing.assert_allclose(agg.cap_weights([1, 2], 0.4), [0.5, 0.5])  # below 1/n: equal weights
    np.testing.assert_allclose(agg.cap_weights([1, 2, 3], 1.0), [1 / 6, 2 / 6, 3 / 6])  # cap 1: unchanged
    with pytest.raises(ValueError, match=r"the weight cap must lie in \(0, 1\], got 0"):
        agg.cap_weights([1, 1], 0)


def test_robust_strategies_and_the_capped_fedavg() -> None:
    rng = mech.default_rng(0)
    median = make("median").aggregate(None, uploads(), rng=rng)
    np.testing.assert_array_equal(median.vector, [1.0, 0.0, 1.0])
    assert median.used == (0, 1, 2) and median.weights == pytest.approx((1 / 3,) * 3)
    four = [ClientDescription.in_memory(i, 10, (5, 5)) for i in range(4)]
    trimmed = create_strategy("trimmed-mean", four, StrategyOptions(trim_fraction=0.25)).aggregate(
        None, dict(enumerate(X4)), rng=rng)
    np.testing.assert_allclose(trimmed.vector, [2.0, -1.0, 0.5])
    five = [ClientDescription.in_memory(i, 10, (5, 5)) for i in range(5)]  # 0.2 x 4 trims nobody: refused (issue 42)
    assert create_strategy("trimmed-mean", five).describe()["trim_fraction"] == 0.2  # Flower's default beta
    # norm-clipped over uploaded parameters: updates (upload - global) are clipped, the mean added back
    glob = np.array([1.0, 1.0], dtype=np.float32)
    ups = {0: glob + np.array([3.0, 4.0], dtype=np.float32), 1: glob + np.array([0.0, 1.0], dtype=np.float32),
           2: glob + np.array([0.0, 2.0], dtype=np.float32)}
    clipped = make("norm-clipped").aggregate(glob, ups, rng=rng)
    np.testing.assert_allclose(clipped.vector, [1.0 + 0.4, 1.0 + 4.6 / 3], rtol=1e-6)
    assert clipped.info["clip_norm"] == pytest.approx(2.0) and clipped.vector.dtype == np.float32
    updates = {k: v - glob for k, v in ups.items()}  # uploaded updates: clipped as they are
    as_updates = make("norm-clipped", StrategyOptions(target="update")).aggregate(
        glob, updates, rng=rng)
    np.testing.assert_allclose(as_updates.vector, [0.4, 4.6 / 3], rtol=1e-6)
    # fedavg n_k/n weights (0.1, 0.3, 0.6) capped at 0.4: 0.6 -> 0.4, then 0.45 -> 0.4, the rest 0.2
    capped = make("fedavg", StrategyOptions(sample_weighted=True, max_client_weight=0.4)
                             ).aggregate(None, uploads(), rng=rng)
    assert capped.weights == pytest.approx((0.2, 0.4, 0.4))
    np.testing.assert_allclose(capped.vector, [1.0, 0.4, 0.6], rtol=1e-6)
