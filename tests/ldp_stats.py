"""Statistics shared by the low-dimensional LDP mechanism tests (test_ldp_mechanisms*.py).

Tolerances are K_SE standard errors (binomial, or normal from the sample's own moments), with fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np

K_SE = 5.0
DRAWS = 200_000
LDP_NAMES = ("krr", "oue-label", "duchi", "piecewise", "hybrid", "laplace")


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1.0 - p) / n)


def assert_unbiased(y: np.ndarray, x: np.ndarray, variance: np.ndarray) -> None:
    """Column means of y (n, d) within K_SE standard errors sqrt(Var/n) of the inputs x (d,)."""
    se = np.sqrt(np.asarray(variance) / y.shape[0])
    z = (y.mean(axis=0) - x) / se
    assert np.all(np.abs(z) <= K_SE), z


def assert_variance(y: np.ndarray, variance: np.ndarray) -> None:
    """Column sample variances within K_SE standard errors of the closed form; SE from the sample's own
    fourth central moment, sqrt((m4 - s^4)/n) (asymptotically normal)."""
    centred = y - y.mean(axis=0)
    s2 = (centred**2).mean(axis=0)
    m4 = (centred**4).mean(axis=0)
    se = np.sqrt(np.maximum(m4 - s2**2, 0.0) / y.shape[0])
    assert np.all(np.abs(s2 - variance) <= K_SE * se), (s2, variance, se)


def log_ratio_with_se(hits_a: int, hits_b: int, n: int) -> tuple[float, float]:
    """ln(p̂_a/p̂_b) for two binomial proportions over n draws each, and its delta-method SE."""
    pa, pb = hits_a / n, hits_b / n
    return math.log(pa / pb), math.sqrt((1 - pa) / (n * pa) + (1 - pb) / (n * pb))
