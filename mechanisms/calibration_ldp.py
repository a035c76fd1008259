"""Calibration of the low-dimensional LDP mechanisms: the papers' formulas as pure functions.

The randomizers (krr, oue-label, duchi, piecewise, hybrid, laplace), their privacy reports, the tests
and the benchmark all call these; no formula is written twice. Paper keys:

* KOV14: Kairouz, Oh & Viswanath, "Extremal mechanisms for local differential privacy", NIPS 2014
  (k-ary randomized response).
* WBLJ17: Wang, Blocki, Li & Jha, "Locally differentially private protocols for frequency estimation",
  USENIX Security 2017: Section 3 (pure protocols and their estimator), Section 4.1 (direct encoding,
  "GRR"), Section 4.3 (unary encoding, OUE).
* DJW18: Duchi, Jordan & Wainwright, "Minimax optimal procedures for locally private estimation",
  JASA 113 (2018), Section 4.2 (the L∞-ball mechanism).
* WXY19: Wang, Xiao, Yang, Zhao, Hui, Shin, Shin & Yu, "Collecting and analyzing multidimensional data
  with local differential privacy", ICDE 2019 (full version arXiv:1907.00782): Algorithm 1 (Duchi et al.
  for one value), Algorithm 2 (Piecewise Mechanism, PM), Algorithm 3 (Duchi et al. for d values),
  Section III-C (Hybrid Mechanism, HM), Algorithm 4 (k-of-d dimension sampling), Lemma 1 (PM variance).
* DMNS06: Dwork, McSherry, Nissim & Smith, "Calibrating noise to sensitivity", TCC 2006 (Laplace).

The paper texts are not in /work/shared/papers; formulas are cited by section, algorithm and lemma, and
each is checked by tests/statistical/test_ldp_mechanisms.py (unbiasedness, variance, probability ratios).

Quantization. Every sampler compares a uniform 64-bit word u (uniform on [0, 2^64)) with an integer
threshold T: the event has probability exactly T / 2^64. ``quantize64`` picks T for a probability p and
keeps 1 <= T <= 2^64 - 1, so both outcomes stay possible and the exact ε stays finite. Each privacy
report computes its ε from these integers, not from the real-valued p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

THRESHOLD_BITS = 64
THRESHOLD_SCALE = 1 << THRESHOLD_BITS  # 2^64, a Python int: exact

# --------------------------------------------------------------------------------------------------
# Quantized probabilities.


def quantize64(p: float, *, allow_zero: bool = False) -> int:
    """Return the integer threshold T with P(u < T) = T / 2^64 closest to ``p``, clamped to [1, 2^64 - 1].

    ``allow_zero`` keeps T = 0 for p = 0 (an event that must never happen, e.g. HM's PM branch below ε*).
    """
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"a probability must lie in [0, 1], got {p!r}")
    t = round(p * THRESHOLD_SCALE)  # p * 2^64 is exact in floating point; round() gives a Python int
    low = 0 if allow_zero and p == 0.0 else 1
    return int(min(max(t, low), THRESHOLD_SCALE - 1))


def log_ratio(numerator: int | float, denominator: int | float) -> float:
    """Return ln(a / b) for positive numbers (Python ints of any size keep full precision); inf when b = 0."""
    if denominator == 0:
        return math.inf
    return math.log(numerator) - math.log(denominator)


# --------------------------------------------------------------------------------------------------
# k-ary randomized response (GRR / direct encoding).


def grr_probabilities(epsilon: float, k: int) -> tuple[float, float]:
    """Return (p, q) of k-ary randomized response (KOV14 k-RR; WBLJ17 Section 4.1, direct encoding).

    Keep the value with p = e^ε / (e^ε + k - 1); report each other value with q = 1 / (e^ε + k - 1).
    Written with e^-ε so that nothing overflows.
    """
    r = math.exp(-epsilon)
    denominator = 1.0 + (k - 1) * r
    return 1.0 / denominator, r / denominator


def grr_change_probability(epsilon: float, k: int) -> float:
    """Return 1 - p = (k - 1) q = (k - 1) / (e^ε + k - 1), the probability of a change (WBLJ17 4.1)."""
    r = math.exp(-epsilon)
    return (k - 1) * r / (1.0 + (k - 1) * r)


def grr_epsilon(p_keep: float, p_other: float) -> float:
    """Return ε = ln(p / q) of k-RR with keep probability p and per-other-value probability q (WBLJ17 4.1).

    Every output y is the input with probability p and any other value with q, so the worst ratio
    P(y | x) / P(y | x') is p / q (for y = x).
    """
    return log_ratio(p_keep, p_other)


def grr_variance(epsilon: float, k: int, n: int) -> float:
    """Return the variance of GRR's count estimate of a value over n reports (WBLJ17 4.1, dominant term).

    Var = n (e^ε + k - 2) / (e^ε - 1)^2.
    """
    return n * (math.exp(epsilon) + k - 2) / math.expm1(epsilon) ** 2


# --------------------------------------------------------------------------------------------------
# Optimized unary encoding of one categorical value.


def oue_label_probabilities(epsilon: float) -> tuple[float, float]:
    """Return (p, q) of OUE (WBLJ17 Section 4.3, optimized unary encoding).

    The value's own bit is 1 with p = 1/2, every other bit with q = 1 / (e^ε + 1).
    """
    return 0.5, 1.0 / (math.exp(epsilon) + 1.0)


def unary_epsilon(p: float, q: float) -> float:
    """Return ε = ln(p (1 - q) / ((1 - p) q)) of unary encoding (WBLJ17 Section 4.3).

    Two inputs differ in two positions; the worst output has a 1 at the first and a 0 at the second.
    """
    if p <= q:
        raise ValueError(f"unary encoding needs p > q, got p={p!r}, q={q!r}")
    return log_ratio(p * (1.0 - q), (1.0 - p) * q)


def unary_epsilon_exact(t_p: int, t_q: int) -> float:
    """Return :func:`unary_epsilon` for p = t_p / 2^64 and q = t_q / 2^64, computed in exact integers."""
    return log_ratio(t_p * (THRESHOLD_SCALE - t_q), (THRESHOLD_SCALE - t_p) * t_q)


def oue_variance(epsilon: float, n: int) -> float:
    """Return the variance of OUE's count estimate of a value over n reports (WBLJ17 4.3, dominant term).

    Var = n 4 e^ε / (e^ε - 1)^2.
    """
    return n * 4.0 * math.exp(epsilon) / math.expm1(epsilon) ** 2


def frequency_estimate(counts: np.ndarray, n: int, p: float, q: float) -> np.ndarray:
    """Return the unbiased count estimate of every value (WBLJ17 Section 3, pure protocols).

    ĉ(v) = (C(v) - n q) / (p - q) from the support counts C of n reports. For GRR, C(v) counts the
    reports equal to v; for OUE, the reports whose bit v is 1.
    """
    return (np.asarray(counts, dtype=np.float64) - n * q) / (p - q)


# --------------------------------------------------------------------------------------------------
# Duchi et al. for one value (WXY19 Algorithm 1) and for d values (WXY19 Algorithm 3, DJW18 4.2).


def duchi_1d_bound(epsilon: float) -> float:
    """Return B = (e^ε + 1) / (e^ε - 1): the two outputs are ±B (WXY19 Algorithm 1, line 2)."""
    return 1.0 + 2.0 / math.expm1(epsilon)


def duchi_1d_minus_probability(t: np.ndarray | float, epsilon: float) -> np.ndarray:
    """Return P(output = -B | t) = 1/2 - (e^ε - 1) / (2 (e^ε + 1)) · t (WXY19 Algorithm 1, line 1).

    (e^ε - 1)/(e^ε + 1) = tanh(ε/2). Every step is monotone in t, so the quantized thresholds are too.
    """
    return 0.5 - (0.5 * math.tanh(epsilon / 2.0)) * np.asarray(t, dtype=np.float64)


def duchi_1d_variance(t: np.ndarray | float, epsilon: float) -> np.ndarray:
    """Return Var[t* | t] = B^2 - t^2 of WXY19 Algorithm 1 (E[t*] = t and t*^2 = B^2)."""
    return duchi_1d_bound(epsilon) ** 2 - np.asarray(t, dtype=np.float64) ** 2


def duchi_keep_probability(epsilon: float) -> float:
    """Return π = e^ε / (e^ε + 1), the probability of sampling from T+ (WXY19 Algorithm 3, line 3)."""
    return 1.0 / (1.0 + math.exp(-epsilon))


_EXACT_BINOMIAL_UP_TO = 4096


def duchi_c_d(d: int) -> float:
    """Return C_d of WXY19 Algorithm 3 (DJW18 4.2.3).

        C_d = 2^(d-1) / binom(d-1, (d-1)/2)                    for odd d,
        C_d = (2^(d-1) + binom(d, d/2)/2) / binom(d-1, d/2)    for even d.

    For even d, binom(d, d/2) = 2 binom(d-1, d/2), so C_d = 2^(d-1)/binom(d-1, d/2) + 1; in both cases
    the binomial is binom(d-1, floor((d-1)/2)). Exact integers up to d = 4096, log-gamma beyond.
    """
    m = (d - 1) // 2
    if d <= _EXACT_BINOMIAL_UP_TO:
        ratio = (1 << (d - 1)) / math.comb(d - 1, m)
    else:
        ratio = math.exp((d - 1) * math.log(2.0) - math.lgamma(d) + math.lgamma(m + 1) + math.lgamma(d - m))
    return ratio + (1.0 if d % 2 == 0 else 0.0)


def duchi_bound(epsilon: float, d: int) -> float:
    """Return B = (e^ε + 1)/(e^ε - 1) · C_d, the output magnitude of WXY19 Algorithm 3 ({-B, B}^d)."""
    return duchi_1d_bound(epsilon) * duchi_c_d(d)


def duchi_variance(t: np.ndarray | float, epsilon: float, d: int) -> np.ndarray:
    """Return the per-coordinate variance B^2 - t_j^2 of WXY19 Algorithm 3 (outputs ±B, mean t_j)."""
    return duchi_bound(epsilon, d) ** 2 - np.asarray(t, dtype=np.float64) ** 2


# --------------------------------------------------------------------------------------------------
# Piecewise Mechanism (WXY19 Algorithm 2), Hybrid Mechanism (WXY19 III-C), k-of-d sampling (Algorithm 4).


def piecewise_c(epsilon: float) -> float:
    """Return C = (e^(ε/2) + 1) / (e^(ε/2) - 1); PM outputs lie in [-C, C] (WXY19 Algorithm 2)."""
    return 1.0 + 2.0 / math.expm1(epsilon / 2.0)


def piecewise_interval(t: np.ndarray | float, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Return PM's high-probability interval [l(t), r(t)] (WXY19 Algorithm 2).

    l(t) = (C + 1)/2 · t - (C - 1)/2 and r(t) = l(t) + C - 1.
    """
    c = piecewise_c(epsilon)
    left = (c + 1.0) / 2.0 * np.asarray(t, dtype=np.float64) - (c - 1.0) / 2.0
    return left, left + c - 1.0


def piecewise_window_probability(epsilon: float) -> float:
    """Return P(t* ∈ [l(t), r(t)]) = e^(ε/2) / (e^(ε/2) + 1) (WXY19 Algorithm 2, line 2)."""
    return 1.0 / (1.0 + math.exp(-epsilon / 2.0))


def piecewise_variance(t: np.ndarray | float, epsilon: float) -> np.ndarray:
    """Return Var[t* | t] = t^2 / (e^(ε/2) - 1) + (e^(ε/2) + 3) / (3 (e^(ε/2) - 1)^2) (WXY19 Lemma 1)."""
    e1 = math.expm1(epsilon / 2.0)
    t = np.asarray(t, dtype=np.float64)
    return t**2 / e1 + (e1 + 4.0) / (3.0 * e1**2)


# ε* of WXY19 III-C: below it HM is Duchi et al.'s solution alone (α = 0); ε* ≈ 0.61.
HYBRID_EPSILON_STAR = math.log(
    (-5.0 + 2.0 * (6353.0 - 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)
     + 2.0 * (6353.0 + 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)) / 27.0
)


def hybrid_alpha(epsilon: float) -> float:
    """Return α, HM's probability of PM: 1 - e^(-ε/2) for ε > ε* ≈ 0.61, else 0 (WXY19 Section III-C)."""
    return -math.expm1(-epsilon / 2.0) if epsilon > HYBRID_EPSILON_STAR else 0.0


def hybrid_variance(t: np.ndarray | float, epsilon: float) -> np.ndarray:
    """Return HM's variance α Var_PM(t) + (1 - α) Var_Duchi(t) (WXY19 III-C; both branches are unbiased)."""
    alpha = hybrid_alpha(epsilon)
    return alpha * piecewise_variance(t, epsilon) + (1.0 - alpha) * duchi_1d_variance(t, epsilon)


def sampled_dimensions(epsilon: float, d: int) -> int:
    """Return k = max(1, min(d, floor(ε / 2.5))), the values each record reports (WXY19 Algorithm 4, line 1)."""
    return max(1, min(d, math.floor(epsilon / 2.5)))


def sampled_variance(variance_1d: np.ndarray | float, t: np.ndarray | float, d: int, k: int) -> np.ndarray:
    """Return the variance of one output coordinate of WXY19 Algorithm 4.

    The coordinate is (d/k)·t* with probability k/d and 0 otherwise, so Var = (d/k)(Var[t*] + t^2) - t^2.
    """
    t = np.asarray(t, dtype=np.float64)
    return (d / k) * (np.asarray(variance_1d, dtype=np.float64) + t**2) - t**2


@dataclass(frozen=True)
class PiecewiseGrid:
    """PM (WXY19 Algorithm 2) sampled on integers, so its output carries no floating-point side channel.

    The input t ∈ [-1, 1] is first rounded without bias to i/n (i ∈ [-n, n], n = 2^b). The output is an
    integer j ∈ [-M, M], M = n + h, released as j·step. Given i, the *window* {i - h, ..., i + h}
    (w = 2h + 1 points, PM's [l(t), r(t)]) is chosen with probability 1 - T/2^64, the 2n points outside
    it with probability T/2^64, and a point is drawn uniformly inside the chosen region.

    This is PM's layout on a grid: the continuous window has half-width (C - 1)/2 and its centre moves
    as (C + 1)/2 · t, so in units of the centre's step 1/n the half-width is n (C - 1)/(C + 1) =
    n e^(-ε/2): h = round(n e^(-ε/2)). The window probability is chosen so that a window point is
    e^ε times as likely as an outside point, as in PM (p vs p/e^ε), and step makes the output unbiased:
    E[j | i] = (p_high - p_low) w i, so step = 1 / (n (p_high - p_low) w).
    """

    n: int
    half_window: int
    outside_threshold: int  # T: P(outside the window) = T / 2^64

    @property
    def window(self) -> int:
        """W = 2h + 1, the points of the window."""
        return 2 * self.half_window + 1

    @property
    def half_range(self) -> int:
        """M: outputs are the integers in [-M, M]."""
        return self.n + self.half_window

    @property
    def p_outside(self) -> float:
        """Probability of landing outside the window (T / 2^64)."""
        return self.outside_threshold / THRESHOLD_SCALE

    @property
    def p_high(self) -> float:
        """Probability of each window point."""
        return (THRESHOLD_SCALE - self.outside_threshold) / THRESHOLD_SCALE / self.window

    @property
    def p_low(self) -> float:
        """Probability of each point outside the window."""
        return self.outside_threshold / THRESHOLD_SCALE / (2 * self.n)

    @cached_property
    def epsilon(self) -> float:
        """Exact ε: max over inputs i, i' and outputs j of P(j | i) / P(j | i') = p_high / p_low.

        Some output is in the window of i = n and outside the window of i = -n (h < n), so the
        maximum is attained; computed in exact integers: 2n (2^64 - T) / (w T).
        """
        return log_ratio(2 * self.n * (THRESHOLD_SCALE - self.outside_threshold),
                         self.window * self.outside_threshold)

    @cached_property
    def step(self) -> float:
        """Output value per integer step, so that E[j·step | i] = i / n."""
        from fractions import Fraction

        p_window = Fraction(THRESHOLD_SCALE - self.outside_threshold, THRESHOLD_SCALE)
        p_out = Fraction(self.outside_threshold, THRESHOLD_SCALE)
        slope = p_window - p_out * self.window / (2 * self.n)  # (p_high - p_low)·w
        return float(1 / (self.n * slope))

    def variance(self, t: np.ndarray | float) -> np.ndarray:
        """Var[j·step | t] for t ∈ [-1, 1], including the randomized rounding of t to i/n (exact).

        E[j^2 | i] = p_low Σ_{|j|<=M} j^2 + (p_high - p_low)(w i^2 + Σ_{|m|<=h} m^2), with
        Σ_{|j|<=M} j^2 = M(M+1)(2M+1)/3; rounding gives E[i^2] = (nt)^2 + f(1 - f), f = frac(nt).
        """
        t = np.asarray(t, dtype=np.float64)
        a = t * self.n
        f = a - np.floor(a)
        expected_i2 = a**2 + f * (1.0 - f)
        m, h = self.half_range, self.half_window
        sum_all = m * (m + 1) * (2 * m + 1) / 3.0
        sum_window = h * (h + 1) * (2 * h + 1) / 3.0
        second = self.p_low * sum_all + (self.p_high - self.p_low) * (self.window * expected_i2 + sum_window)
        return self.step**2 * second - t**2


def piecewise_grid(epsilon: float, grid_bits: int) -> PiecewiseGrid:
    """Return PM's integer layout at budget ε, inputs rounded to multiples of 2^-b (see PiecewiseGrid).

    P(outside) = 2n / (w e^ε + 2n) makes p_high / p_low = e^ε; written as 2n e^-ε / (w + 2n e^-ε).
    """
    n = 1 << grid_bits
    h = round(n * math.exp(-epsilon / 2.0))
    h = min(h, n - 1)  # keep the windows of i = -n and i = n apart (h < n): the ratio e^ε is then attained
    w = 2 * h + 1
    r = 2 * n * math.exp(-epsilon)
    return PiecewiseGrid(n, h, quantize64(r / (w + r)))


# --------------------------------------------------------------------------------------------------
# Laplace.


def laplace_scale(epsilon: float, sensitivity: float) -> float:
    """Return the scale Δ / ε: Laplace noise of that scale on an L1-sensitivity-Δ query is ε-DP (DMNS06)."""
    return sensitivity / epsilon


def discrete_laplace_variance(scale: float) -> float:
    """Return the variance 2 e^(-1/s) / (1 - e^(-1/s))^2 of the discrete Laplace P(k) ∝ exp(-|k|/s)."""
    r = math.exp(-1.0 / scale)
    return 2.0 * r / (-math.expm1(-1.0 / scale)) ** 2
