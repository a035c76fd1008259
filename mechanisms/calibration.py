"""Calibration: the papers' probability and noise formulas as pure functions.

The randomizers, their privacy reports, the tests and ``ldpfl inspect`` all call these; no formula is
written twice. Paper keys: LDPFL = Chamikara et al. (004), WU = Wu, Xu, Zhu (000),
PLDP = Shen et al. (002), FEDAW = Tan et al. (003).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .discrete_privacy import epsilon_upper_bracket

# scipy loads inside the Gaussian functions only: importing it costs ~0.5 s, and `ldpfl inspect` must start fast.

# --------------------------------------------------------------------------------------------------
# Bit mechanisms. A bit class is described by P(out=1 | in=1) and P(out=1 | in=0).


@dataclass(frozen=True)
class BitClass:
    """Output probabilities of one class of bit positions."""

    name: str
    p_one_given_one: float
    p_one_given_zero: float

    @property
    def p_keep_one(self) -> float:
        """P(1 -> 1)."""
        return self.p_one_given_one

    @property
    def p_keep_zero(self) -> float:
        """P(0 -> 0)."""
        return 1.0 - self.p_one_given_zero


def per_bit_sensitivity_budget(epsilon: float, sensitivity: float) -> float:
    """ε / s: the budget share of one bit when s bits may differ (LDPFL eq. 15, Theorem 1 proof)."""
    return epsilon / sensitivity


def rr_probabilities(epsilon: float, sensitivity: float) -> tuple[BitClass]:
    """Symmetric randomized response, LDPFL eqs. 5 and 15: keep with p = e^(ε/s) / (1 + e^(ε/s))."""
    t = per_bit_sensitivity_budget(epsilon, sensitivity)
    keep = 1.0 / (1.0 + math.exp(-t))  # = e^t / (1 + e^t), written to stay finite for large t
    return (BitClass("all", keep, 1.0 - keep),)


def oue_probabilities(epsilon: float, sensitivity: float) -> tuple[BitClass]:
    """Optimized unary encoding, LDPFL eqs. 11-12: p = 1/2, q = 1/(1 + e^ε').

    OUE's ε = ln(p(1-q)/((1-p)q)) (eq. 13) covers a pair of differing bits (sensitivity 2). Over a
    layout where s bits may differ, each of the s/2 pairs gets ε' = 2ε/s.
    """
    pair_budget = 2.0 * per_bit_sensitivity_budget(epsilon, sensitivity)
    return (BitClass("all", 0.5, 1.0 / (1.0 + math.exp(pair_budget))),)


def moue_probabilities(epsilon: float, alpha: float, sensitivity: float) -> tuple[BitClass]:
    """Return the probabilities of modified OUE, LDPFL Theorem 1 (eq. 16).

    Read from the proof's product: P(1->1) = 1/(1+α) and P(0->0) = α e^(ε/s) / (1 + α e^(ε/s)),
    so P(0->1) = 1/(1 + α e^(ε/s)).
    """
    a_e = alpha * math.exp(per_bit_sensitivity_budget(epsilon, sensitivity))
    return (BitClass("all", 1.0 / (1.0 + alpha), 1.0 / (1.0 + a_e)),)


def uer_probabilities(epsilon: float, alpha: float, sensitivity: float) -> tuple[BitClass, BitClass]:
    """Return the probabilities of utility enhancing randomization, LDPFL Theorem 2 (eq. 17).

    Decision (eq. 17 is garbled in the text): "Pr[B[v1]=1|v1]" is read as P(1->1) and
    "Pr[B[v2]=0|v1]" as P(0->0), both per class of position i of the merged bit vector:
      even i: P(1->1) = α/(1+α),     P(0->0) = α e^(ε/s)/(1 + α e^(ε/s))
      odd  i: P(1->1) = 1/(1+α³),    P(0->0) = α e^(ε/s)/(1 + α e^(ε/s))
    Positions are counted from 0 over the r·l bits of a record. These probabilities keep a bit with
    odds ≈ α : 1 whatever ε is, so the ε that they provide is far above the nominal one
    (see ``bit_epsilon`` and docs/privacy.md).
    """
    a_e = alpha * math.exp(per_bit_sensitivity_budget(epsilon, sensitivity))
    p_zero_to_one = 1.0 / (1.0 + a_e)
    even = BitClass("even", alpha / (1.0 + alpha), p_zero_to_one)
    odd = BitClass("odd", 1.0 / (1.0 + alpha**3), p_zero_to_one)
    return even, odd


def bit_epsilon(p_one_given_one: float, p_one_given_zero: float) -> float:
    """Exact ε of one randomized bit: max over outputs of |ln P(o | 1) / P(o | 0)|.

    This is the LDP definition (eq. 3) applied to a single bit whose input may be 0 or 1. It is
    infinite when an output is possible for one input and impossible for the other.
    """
    return _max_log_ratio(((p_one_given_one, p_one_given_zero), (1.0 - p_one_given_one, 1.0 - p_one_given_zero)))


def _max_log_ratio(pairs: Iterable[tuple[float, float]]) -> float:
    """Return max over (a, b) of |ln a - ln b| (equal pairs skipped); ∞ when only one of a pair is 0."""
    worst = 0.0
    for a, b in pairs:
        if a == b:
            continue
        if a == 0 or b == 0:
            return math.inf
        worst = max(worst, abs(math.log(a) - math.log(b)))
    return worst


# --------------------------------------------------------------------------------------------------
# Gaussian noise.


def _finite_sigma(sigma: float, formula: str, epsilon: float) -> float:
    """Return σ if it is finite and > 0, else refuse the ε that made it overflow (or vanish)."""
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ValueError(f"epsilon={epsilon!r} is out of range for {formula}: sigma = {sigma!r} is not a finite "
                         "number > 0")
    return sigma


def gaussian_sigma_classic(epsilon: float, delta: float, sensitivity: float) -> float:
    """Compute the classic Gaussian mechanism's σ = Δ·√(2 ln(1.25/δ))/ε.

    WU eq. 7, FEDAW eq. 6 and Theorem 1 (with Δ = S_f). The classic proof covers ε < 1. An ε so small
    that σ overflows is refused with a ValueError.
    """
    if not epsilon > 0.0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    with np.errstate(over="ignore"):
        sigma = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    return _finite_sigma(sigma, "the classic Gaussian sigma (WU eq. 7)", epsilon)


def gaussian_sigma_wu_eq4(epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    """Compute WU eq. 4: σ = √(4 q² R / (1 - q)) · (2 ln(1/δ)/ε² + 1/ε); log is read as natural log.

    Written as (2 ln(1/δ)/ε + 1)/ε so that a tiny ε overflows to inf (refused with a ValueError) instead of
    dividing by ε² = 0.
    """
    if not epsilon > 0.0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    try:
        sigma = math.sqrt(4.0 * sample_rate**2 * rounds / (1.0 - sample_rate)) * (
            (2.0 * math.log(1.0 / delta) / epsilon + 1.0) / epsilon
        )
    except OverflowError:
        sigma = math.inf
    return _finite_sigma(sigma, "WU eq. 4", epsilon)


def gaussian_delta_for_epsilon(epsilon: float, sigma: float, sensitivity: float) -> float:
    """Tight δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8).

    δ(ε) = Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ).
    """
    from scipy import special

    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(special.ndtr(a - b) - math.exp(epsilon + special.log_ndtr(-a - b)))


def gaussian_exact_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
    """Smallest ε with δ(ε) <= δ for N(0, σ²) noise on a query of L2 sensitivity Δ (tight analysis)."""
    from scipy import optimize

    if sensitivity == 0.0:
        return 0.0
    if sigma == 0.0:
        return math.inf
    if gaussian_delta_for_epsilon(0.0, sigma, sensitivity) <= delta:
        return 0.0
    high = epsilon_upper_bracket(lambda e: gaussian_delta_for_epsilon(e, sigma, sensitivity), delta)
    if math.isinf(high):
        return math.inf
    return float(
        optimize.brentq(lambda e: gaussian_delta_for_epsilon(e, sigma, sensitivity) - delta, 0.0, high,
                        xtol=1e-12, rtol=1e-10)
    )


# --------------------------------------------------------------------------------------------------
# What a 53-bit uniform compared with a float threshold really samples.

UNIFORM_STEPS = 2**53
"""``Generator.random`` returns j·2^-53 for a uniform integer j in [0, 2^53)."""


def uniform_below_count(threshold: float | np.ndarray) -> np.ndarray:
    """Count the j in [0, 2^53) with j·2^-53 < threshold: P(U < threshold) = count / 2^53, exactly.

    The count is ⌈threshold·2^53⌉ for a threshold in [0, 1] (threshold·2^53 is exact in float64), 0 below
    and 2^53 above.
    """
    t = np.clip(np.asarray(threshold, dtype=np.float64), 0.0, 1.0)
    return np.ceil(t * UNIFORM_STEPS).astype(np.int64)


def categorical_counts(thresholds: tuple[float, ...]) -> tuple[int, ...]:
    """Output counts (out of 2^53) of a sampler that returns category i for the first i with U < thresholds[i].

    The last category takes the rest. Exact integers: P(category i) = count_i / 2^53.
    """
    edges = [int(c) for c in uniform_below_count(np.asarray(thresholds, dtype=np.float64))]
    counts, previous = [], 0
    for edge in edges:
        edge = max(edge, previous)
        counts.append(edge - previous)
        previous = edge
    counts.append(UNIFORM_STEPS - previous)
    return tuple(counts)


def counts_epsilon(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Compute the exact pure ε between two output distributions given as counts out of 2^53.

    ε = max over outputs o of |ln a_o - ln b_o|; ∞ when an output is possible under one and impossible
    under the other.
    """
    return _max_log_ratio(zip(a, b, strict=True))


# --------------------------------------------------------------------------------------------------
# ldpsign, WU eq. 6.


def ldpsign_plus_one_thresholds(clip: float, sigma: float) -> tuple[float, float]:
    """Φ(-c/σ) and Φ(c/σ) in float64: P(+1) at the two ends of the clipped range [-c, c] (WU eq. 6)."""
    from scipy import special

    return float(special.ndtr(-clip / sigma)), float(special.ndtr(clip / sigma))


def ldpsign_endpoint_counts(clip: float, sigma: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """Count (out of 2^53) the outputs (+1, -1) that ldpsign really samples at p = -c and p = +c.

    ``LDPSign.randomize`` samples every p as a mixture of these two endpoint laws (see there), so they
    are the extreme output distributions over all inputs.
    """
    low, high = ldpsign_plus_one_thresholds(clip, sigma)
    return categorical_counts((low,)), categorical_counts((high,))  # type: ignore[return-value]


def ldpsign_epsilon_per_coordinate(clip: float, sigma: float) -> float:
    """Exact pure ε of ldpsign as sampled, on inputs clipped to [-c, c] (WU eq. 6).

    The formula is ln(Φ(c/σ)/Φ(-c/σ)) (P(+1 | p) = Φ(p/σ) is monotone in p, and either output gives the
    same worst ratio). What the sampler draws is each endpoint's Bernoulli through a 53-bit uniform, so the
    ε is computed from those counts: ∞ when Φ(c/σ) rounds to 1 (c/σ ≳ 8.3) and the output -1 can no longer
    occur at p = c.
    """
    low, high = ldpsign_endpoint_counts(clip, sigma)
    return counts_epsilon(low, high)


# --------------------------------------------------------------------------------------------------
# PDPM, PLDP eq. 10 / Algorithm 2.


def pdpm_output_values(epsilon: float, length: float) -> tuple[float, float]:
    """Return the two non-zero outputs of PDPM (before adding back the centre c).

    high = L(e^ε + 3) / (2(e^ε - 1)),  low = -L(e^ε + 1) / (e^ε - 1), computed divided through by e^ε
    (1 - e^-ε as -expm1(-ε)) so that neither a large nor a small ε loses precision. An ε so small that they
    overflow is refused with a ValueError.
    """
    if not epsilon > 0.0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    inv, one_minus_inv = math.exp(-epsilon), -math.expm1(-epsilon)
    with np.errstate(over="ignore"):
        high, low = length * (1.0 + 3.0 * inv) / (2.0 * one_minus_inv), -length * (1.0 + inv) / one_minus_inv
    if not (math.isfinite(high) and math.isfinite(low)):
        raise ValueError(f"epsilon={epsilon!r} is too small for PDPM with L={length!r}: its outputs "
                         "L(e^eps + 3)/(2(e^eps - 1)) overflow")
    return high, low


def pdpm_probabilities(v: np.ndarray, epsilon: float, length: float) -> tuple[np.ndarray, np.ndarray]:
    """P(high | v) and P(low | v) of PLDP eq. 10 for centred inputs v in [-L/2, L/2].

    P(0 | v) equals P(low | v) (third line of eq. 10). Written with t = 2v/L in [-1, 1] as
    P(high) = ((1 + t) e^ε + (1 - t)) / (2(e^ε + 2)) and P(low) = ((1 - t) e^ε + (3 + t)) / (4(e^ε + 2)),
    which equals eq. 10 term by term but sums only non-negative terms, so large ε loses no precision.
    """
    t = pdpm_position(v, length)
    e = math.exp(epsilon)
    p_high = ((1.0 + t) * e + (1.0 - t)) / (2.0 * (e + 2.0))
    p_low = ((1.0 - t) * e + (3.0 + t)) / (4.0 * (e + 2.0))
    return p_high, p_low


def pdpm_position(v: np.ndarray, length: float) -> np.ndarray:
    """Compute t = 2v/L, clipped to [-1, 1]: float rounding of the centring (c far from 0, tiny L) cannot push it out.

    Without the clip, c = 1e8 and L = 1e-6 gave t = 1.013 at one end and a negative P(low).
    """
    return np.clip(2.0 * np.asarray(v, dtype=np.float64) / length, -1.0, 1.0)


def pdpm_endpoint_probabilities(epsilon: float) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Eq. 10 at t = -1 and t = +1, as (P(high), P(low), P(centre)); they do not depend on L.

    t = -1: (1, (e^ε+1)/2, (e^ε+1)/2)/(e^ε+2);  t = +1: (e^ε, 1, 1)/(e^ε+2). Eq. 10 is linear in t, so
    P(· | t) = (1+t)/2 · P(· | +1) + (1-t)/2 · P(· | -1): every input's law is a mixture of these two.
    """
    e = math.exp(epsilon)
    left = (1.0 / (e + 2.0), (e + 1.0) / (2.0 * (e + 2.0)), (e + 1.0) / (2.0 * (e + 2.0)))
    right = (e / (e + 2.0), 1.0 / (e + 2.0), 1.0 / (e + 2.0))
    return left, right


def pdpm_thresholds(epsilon: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Return the float thresholds ``PDPM.randomize`` compares a 53-bit uniform with, per endpoint law.

    high if U < P(high), low if U < P(high) + P(low) (that sum in float64), the centre otherwise.
    """
    left, right = pdpm_endpoint_probabilities(epsilon)
    return (left[0], left[0] + left[1]), (right[0], right[0] + right[1])


def pdpm_endpoint_counts(epsilon: float) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Count (out of 2^53) the outputs (high, low, centre) that PDPM really samples at t = -1 and t = +1."""
    left, right = pdpm_thresholds(epsilon)
    return categorical_counts(left), categorical_counts(right)  # type: ignore[return-value]


def pdpm_exact_epsilon(epsilon: float) -> float:
    """Exact pure ε of PDPM as sampled: the worst log-ratio between the two endpoint laws' counts.

    Every input's law is a mixture of the two endpoint laws (``pdpm_endpoint_probabilities``; the sampler
    draws the mixture explicitly), so no pair of inputs is further apart than the endpoints. Eq. 11 gives
    ε (the high output); from the counts it is ∞ once e^ε/(e^ε+2) rounds to 1 (ε ≳ 37.4): at t = +1 the
    sampler then always outputs high, while low and the centre stay possible at t = -1.
    """
    left, right = pdpm_endpoint_counts(epsilon)
    return counts_epsilon(left, right)


def pdpm_variance_bound(epsilon: float, length: float) -> float:
    """Bound the variance of one PDPM output (PLDP Theorem 1 / eq. 14).

    Read as Var ≤ L²·(e^ε + 1)(e^ε + 3) / (e^ε − 1)².

    Decision: eq. 14 as printed has L_i (not L_i²) in the *denominator*, which makes the bound shrink as
    the safe range grows and fails as a bound (ε = 0.1, L = 2: the printed value is 391 while the
    variance of eq. 10 at v = 0 is 1057). Every output of eq. 10 scales linearly with L, so the variance
    scales with L²; with L² in the numerator the bound holds for every ε and v (tested against the exact
    variance of eq. 10), and for L = 1 both readings agree.
    """
    if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(length) and length > 0):
        raise ValueError(f"PDPM needs epsilon > 0 and L > 0, got epsilon={epsilon!r}, L={length!r}")
    inv, one_minus_inv = math.exp(-epsilon), -math.expm1(-epsilon)  # divided through by e^(2ε)
    try:
        bound = length**2 * (1.0 + inv) * (1.0 + 3.0 * inv) / one_minus_inv**2
    except (OverflowError, ZeroDivisionError):
        bound = math.inf
    if not math.isfinite(bound):
        raise ValueError(f"epsilon={epsilon!r} is too small for PDPM with L={length!r}: its variance bound "
                         "L^2 (e^eps + 1)(e^eps + 3)/(e^eps - 1)^2 overflows")
    return bound
