"""The closed-form head (``stage2_federate.closed_form``, issue 40 item 2): LDA on pooled statistics, by hand.

The head fitted on the pooled CLEAN statistics of two silos' records is Fisher's linear discriminant of the union
of their records, computed here directly with numpy (class means, the pooled within-class covariance over n - c,
Σ⁻¹ μ_c and -½ μ_cᵀ Σ⁻¹ μ_c + log π_c), with and without the ridge; and its evaluation sums are the cross-entropy
and the correct predictions of those scores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms.gaussian_statistics import Released
from ldpfl.mechanisms.statistics_model import MIN_RIDGE
from ldpfl.mechanisms.sufficient_statistics import NoiseScales, statistics
from ldpfl.stage2_federate.closed_form import fit_lda
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.reply_checks import ReplyLimits, check_evaluations
from ldpfl.stage2_federate.round_record import ClientEvaluation, SplitSums

CLASSES, WIDTH = 3, 5


def records(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``rows`` records of three Gaussian classes in WIDTH dimensions (correlated, shifted means)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=rows)
    mix = rng.normal(size=(WIDTH, WIDTH))
    return rng.normal(size=(rows, WIDTH)) @ mix + 1.5 * np.eye(CLASSES, WIDTH)[labels], labels


def numpy_lda(z: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Return LDA's weights (K, c) and biases (c,) of the records, the pooled covariance plus ``ridge`` I.

    The ridge is at least ``statistics_model.MIN_RIDGE`` times the covariance's mean eigenvalue (its trace / K).
    """
    n = len(y)
    counts = np.array([np.sum(y == c) for c in range(CLASSES)], dtype=np.float64)
    means = np.stack([z[y == c].mean(axis=0) for c in range(CLASSES)])
    centred = z - means[y]
    pooled = centred.T @ centred / (n - CLASSES)
    ridge = max(ridge, MIN_RIDGE * np.trace(pooled) / WIDTH)
    covariance = pooled + ridge * np.eye(WIDTH)
    inverse = np.linalg.inv(covariance)
    weights = inverse @ means.T
    biases = np.array([-0.5 * means[c] @ inverse @ means[c] + math.log(counts[c] / n) for c in range(CLASSES)])
    return weights, biases


@pytest.mark.parametrize("shrinkage", [0.0, 0.5])
def test_the_head_on_pooled_clean_statistics_is_numpy_lda_on_the_records(shrinkage: float) -> None:
    (z1, y1), (z2, y2) = records(1, 300), records(2, 200)
    scales = NoiseScales(1.0, 1.0, 1.0, 1.0)  # no noise drawn; the ridge's unit comes from σ_M
    silos = [Released(statistics(z, y, CLASSES), scales, 0) for z, y in ((z1, y1), (z2, y2))]
    head = fit_lda(silos, shrinkage)
    z, y = np.concatenate([z1, z2]), np.concatenate([y1, y2])
    # the pooled σ_M is √2 (two silos' noise variances add); the edge is σ_M / (n - c) · √(2K)
    edge = math.sqrt(2.0) / (len(y) - CLASSES) * math.sqrt(2.0 * WIDTH)
    assert head.noise_edge == pytest.approx(edge, rel=1e-12) and head.records == len(y)
    weights, biases = numpy_lda(z, y, shrinkage * edge)
    assert head.weights.dtype == np.float32 and head.weights.shape == (WIDTH, CLASSES)
    np.testing.assert_allclose(head.weights, weights, rtol=2e-5, atol=2e-5 * np.abs(weights).max())
    np.testing.assert_allclose(head.biases, biases, rtol=2e-5, atol=2e-5 * np.abs(biases).max())
    scores = z @ head.weights.astype(np.float64) + head.biases
    shifted = scores - scores.max(axis=1, keepdims=True)
    loss = -np.sum(shifted[np.arange(len(y)), y] - np.log(np.exp(shifted).sum(axis=1)))
    sums = head.sums(z, y)
    assert sums.rows == len(y) and sums.correct == int(np.sum(scores.argmax(axis=1) == y))
    assert sums.loss_sum == pytest.approx(loss, rel=1e-9)
    assert sums.correct / sums.rows > 0.6  # the classes are separable enough for LDA to find them


def test_the_ridge_grows_with_the_shrinkage() -> None:
    z, y = records(3, 200)
    silo = Released(statistics(z, y, CLASSES), NoiseScales(1.0, 1.0, 50.0, 1.0), 0)
    norms = [float(np.linalg.norm(fit_lda([silo], s).weights)) for s in (0.0, 1.0, 10.0)]
    assert norms[0] > norms[1] > norms[2]  # more ridge, smaller weights


def test_the_head_and_its_shrinkage_are_checked_with_the_configuration() -> None:
    assert FederationConfig().head == "mlp" and not FederationConfig().closed_form
    assert FederationConfig(head="lda", shrinkage=0.0).closed_form
    for fields, named in [({"head": "qda"}, {"head"}), ({"shrinkage": 0.2}, {"shrinkage", "head"}),
                          ({"head": "lda", "shrinkage": -1.0}, {"shrinkage"}),
                          ({"head": "lda", "shrinkage": math.nan}, {"shrinkage"}),
                          ({"head": "lda", "dp_sgd": True, "noise_multiplier": 1.0}, {"head", "dp_sgd"}),
                          ({"head": "lda", "perturbation": "ldpsign"}, {"head", "perturbation"})]:
        with pytest.raises(ParameterError) as refused:
            FederationConfig(**fields)
        assert set(refused.value.parameters) == named, refused.value


def test_a_stats_silos_clean_rows_are_checked_only_where_the_server_knows_them() -> None:
    report = ClientEvaluation(0, SplitSums(0.0, 0, 0), SplitSums(12.5, 20, 30))  # stats:K: no test row, 30 clean
    known = ReplyLimits(dim=1, target="parameters", test_rows={0: 0})
    accepted, rejected = check_evaluations([report], known, clean=True)
    assert not accepted and "covers 30 rows, its test split holds 0" in rejected[0][1]
    unknown = ReplyLimits(dim=1, target="parameters", test_rows={0: 0}, clean_rows={0: None})
    assert check_evaluations([report], unknown, clean=True) == ((report,), ())
    bad = ClientEvaluation(0, SplitSums(0.0, 0, 0), SplitSums(12.5, 31, 30))  # the sums themselves still checked
    assert "claims 31 correct of 30 rows" in check_evaluations([bad], unknown, clean=True)[1][0][1]
