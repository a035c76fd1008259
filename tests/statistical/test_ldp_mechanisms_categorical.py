"""Sampling of the categorical LDP mechanisms (issue 17): krr and oue-label.

Empirical rates, unbiased frequency estimators and endpoint probability ratios, with tolerances of K_SE
standard errors (tests/ldp_stats.py) and fixed seeds.
"""

from __future__ import annotations

import numpy as np
from ldp_stats import DRAWS, K_SE, binomial_se, log_ratio_with_se

from ldpfl import mechanisms as mech

# --------------------------------------------------------------------------------------------------
# krr.


def test_krr_keep_and_other_rates() -> None:
    m = mech.create_mechanism("krr", epsilon=1.0, categories=5)
    x = np.repeat(np.arange(5), DRAWS // 5 * 2)
    y = m.randomize_labels(x, rng=mech.default_rng(11))
    assert y.shape == x.shape and y.dtype == x.dtype
    for v in range(5):
        out = y[x == v]
        n = out.size
        counts = np.bincount(out, minlength=5)
        assert abs(counts[v] / n - m.p_keep) <= K_SE * binomial_se(m.p_keep, n)
        for other in set(range(5)) - {v}:  # uniform over the k - 1 other values
            assert abs(counts[other] / n - m.p_other) <= K_SE * binomial_se(m.p_other, n)


def test_krr_endpoint_ratio_is_e_to_the_epsilon() -> None:
    """P(y = 0 | x = 0) / P(y = 0 | x = 1) = e^ε within its standard error, and never above it."""
    m = mech.create_mechanism("krr", epsilon=2.0, categories=4)
    n = DRAWS
    y0 = m.randomize_labels(np.zeros(n, dtype=np.int64), rng=mech.default_rng(1))
    y1 = m.randomize_labels(np.ones(n, dtype=np.int64), rng=mech.default_rng(2))
    ratio, se = log_ratio_with_se(int((y0 == 0).sum()), int((y1 == 0).sum()), n)
    exact = m.report().exact_epsilon_per_record
    assert abs(ratio - exact) <= K_SE * se
    for out in range(4):  # every output's ratio is at most e^ε (within SE)
        r, s = log_ratio_with_se(int((y0 == out).sum()), int((y1 == out).sum()), n)
        assert abs(r) <= exact + K_SE * s


def test_krr_one_hot_matches_labels_and_estimator_is_unbiased() -> None:
    m = mech.create_mechanism("krr", epsilon=1.0, categories=6)
    labels = mech.default_rng(3).integers(0, 6, size=DRAWS)
    one_hot = np.eye(6, dtype=np.float32)[labels]
    y = m.randomize(one_hot, rng=mech.default_rng(4))
    assert y.shape == one_hot.shape and y.dtype == np.float32
    y_labels = m.randomize_labels(labels, rng=mech.default_rng(4))
    np.testing.assert_array_equal(y, np.eye(6, dtype=np.float32)[y_labels])
    # ĉ(v) = (C(v) - nq)/(p - q); Var C(v) = n_v p(1-p) + (n - n_v) q(1-q).
    true = np.bincount(labels, minlength=6)
    est = m.estimate_counts(y_labels)
    p, q = m.p_keep, m.p_other
    var = (true * p * (1 - p) + (DRAWS - true) * q * (1 - q)) / (p - q) ** 2
    assert np.all(np.abs(est - true) <= K_SE * np.sqrt(var))
    # debias maps each report to (y - q)/(p - q): summed over the reports it is the count estimate.
    np.testing.assert_allclose(m.debias(y).sum(axis=0), m.estimate_counts(y_labels), rtol=1e-9)


# --------------------------------------------------------------------------------------------------
# oue-label.


def test_oue_label_bit_rates() -> None:
    m = mech.create_mechanism("oue-label", epsilon=1.0, categories=8)
    labels = mech.default_rng(5).integers(0, 8, size=DRAWS)
    bits = m.randomize_labels(labels, rng=mech.default_rng(6))
    assert bits.shape == (DRAWS, 8) and bits.dtype == np.uint8 and set(np.unique(bits)) <= {0, 1}
    own = bits[np.arange(DRAWS), labels]
    assert abs(own.mean() - m.p) <= K_SE * binomial_se(m.p, own.size)
    others = bits[np.eye(8, dtype=bool)[labels] == 0]
    assert others.size == 7 * DRAWS
    assert abs(others.mean() - m.q) <= K_SE * binomial_se(m.q, others.size)
    # Each position alone, too.
    for v in range(8):
        col = bits[labels != v, v]
        assert abs(col.mean() - m.q) <= K_SE * binomial_se(m.q, col.size)


def test_oue_label_estimator_and_endpoint_ratio() -> None:
    m = mech.create_mechanism("oue-label", epsilon=2.0, categories=3)
    labels = mech.default_rng(7).integers(0, 3, size=DRAWS)
    bits = m.randomize(np.eye(3, dtype=np.uint8)[labels], rng=mech.default_rng(8))
    assert bits.dtype == np.uint8
    true = np.bincount(labels, minlength=3)
    p, q = m.p, m.q
    var = (true * p * (1 - p) + (DRAWS - true) * q * (1 - q)) / (p - q) ** 2
    assert np.all(np.abs(m.estimate_counts(bits) - true) <= K_SE * np.sqrt(var))
    # Worst output (1 at position 0, 0 at position 1) for inputs 0 and 1: ratio p(1-q)/((1-p)q) = e^ε.
    y0 = m.randomize_labels(np.zeros(DRAWS, dtype=np.int64), rng=mech.default_rng(9))
    y1 = m.randomize_labels(np.ones(DRAWS, dtype=np.int64), rng=mech.default_rng(10))
    hit0 = int(((y0[:, 0] == 1) & (y0[:, 1] == 0)).sum())
    hit1 = int(((y1[:, 0] == 1) & (y1[:, 1] == 0)).sum())
    ratio, se = log_ratio_with_se(hit0, hit1, DRAWS)
    assert abs(ratio - m.report().exact_epsilon_per_record) <= K_SE * se
