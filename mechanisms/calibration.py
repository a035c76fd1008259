"""Calibration: the papers' probability and noise formulas as pure functions.

The randomizers, their privacy reports, the tests and ``ldpfl inspect`` all call these; no formula is
written twice. Paper keys: LDPFL = Chamikara et al. (004), WU = Wu, Xu, Zhu (000),
PLDP = Shen et al. (002), FEDAW = Tan et al. (003).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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
        return self.p_one_given_one

    @property
    def p_keep_zero(self) -> float:
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
    """Modified OUE, LDPFL Theorem 1 (eq. 16).

    Read from the proof's product: P(1->1) = 1/(1+α) and P(0->0) = α e^(ε/s) / (1 + α e^(ε/s)),
    so P(0->1) = 1/(1 + α e^(ε/s)).
    """
    a_e = alpha * math.exp(per_bit_sensitivity_budget(epsilon, sensitivity))
    return (BitClass("all", 1.0 / (1.0 + alpha), 1.0 / (1.0 + a_e)),)


def uer_probabilities(epsilon: float, alpha: float, sensitivity: float) -> tuple[BitClass, BitClass]:
    """Utility enhancing randomization, LDPFL Theorem 2 (eq. 17).

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
    worst = 0.0
    for a, b in ((p_one_given_one, p_one_given_zero), (1.0 - p_one_given_one, 1.0 - p_one_given_zero)):
        if a == b:
            continue
        if a == 0.0 or b == 0.0:
            return math.inf
        worst = max(worst, abs(math.log(a) - math.log(b)))
    return worst


# --------------------------------------------------------------------------------------------------
# Gaussian noise.


def gaussian_sigma_classic(epsilon: float, delta: float, sensitivity: float) -> float:
    """Classic Gaussian mechanism σ = Δ·√(2 ln(1.25/δ))/ε.

    WU eq. 7, FEDAW eq. 6 and Theorem 1 (with Δ = S_f). The classic proof covers ε < 1.
    """
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def gaussian_sigma_wu_eq4(epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    """WU eq. 4: σ = √(4 q² R / (1 - q)) · (2 ln(1/δ)/ε² + 1/ε); log is read as natural log."""
    return math.sqrt(4.0 * sample_rate**2 * rounds / (1.0 - sample_rate)) * (
        2.0 * math.log(1.0 / delta) / epsilon**2 + 1.0 / epsilon
    )


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
    high = 1.0
    while gaussian_delta_for_epsilon(high, sigma, sensitivity) > delta:
        high *= 2.0
        if high > 1e9:
            return math.inf
    return float(
        optimize.brentq(lambda e: gaussian_delta_for_epsilon(e, sigma, sensitivity) - delta, 0.0, high,
                        xtol=1e-12, rtol=1e-10)
    )


def ldpsign_epsilon_per_coordinate(clip: float, sigma: float) -> float:
    """Exact pure ε of ldpsign on inputs clipped to [-c, c] (WU eq. 6).

    P(+1 | p) = Φ(p/σ) is monotone in p, so the worst ratio is Φ(c/σ)/Φ(-c/σ), for either output.
    """
    from scipy import special

    return float(special.log_ndtr(clip / sigma) - special.log_ndtr(-clip / sigma))


# --------------------------------------------------------------------------------------------------
# PDPM, PLDP eq. 10 / Algorithm 2.


def pdpm_output_values(epsilon: float, length: float) -> tuple[float, float]:
    """The two non-zero outputs of PDPM (before adding back the centre c):
    high = L(e^ε + 3) / (2(e^ε - 1)),  low = -L(e^ε + 1) / (e^ε - 1)."""
    e = math.exp(epsilon)
    return length * (e + 3.0) / (2.0 * (e - 1.0)), -length * (e + 1.0) / (e - 1.0)


def pdpm_probabilities(v: np.ndarray, epsilon: float, length: float) -> tuple[np.ndarray, np.ndarray]:
    """P(high | v) and P(low | v) of PLDP eq. 10 for centred inputs v in [-L/2, L/2].

    P(0 | v) equals P(low | v) (third line of eq. 10). Written with t = 2v/L in [-1, 1] as
    P(high) = ((1 + t) e^ε + (1 - t)) / (2(e^ε + 2)) and P(low) = ((1 - t) e^ε + (3 + t)) / (4(e^ε + 2)),
    which equals eq. 10 term by term but sums only non-negative terms, so large ε loses no precision.
    """
    e = math.exp(epsilon)
    t = 2.0 * np.asarray(v, dtype=np.float64) / length
    p_high = ((1.0 + t) * e + (1.0 - t)) / (2.0 * (e + 2.0))
    p_low = ((1.0 - t) * e + (3.0 + t)) / (4.0 * (e + 2.0))
    return p_high, p_low


def pdpm_exact_epsilon(epsilon: float, length: float) -> float:
    """Worst log-ratio of PDPM's output probabilities over the safe range's endpoints.

    Each probability is linear in v, so the extremes are at v = ±L/2 (PLDP eq. 11).
    """
    ends = np.array([-length / 2.0, length / 2.0])
    p_high, p_low = pdpm_probabilities(ends, epsilon, length)
    ratios = [p[1] / p[0] for p in (p_high, p_low)]
    return float(max(abs(math.log(r)) for r in ratios))


def pdpm_variance_bound(epsilon: float, length: float) -> float:
    """Upper bound on the variance of one PDPM output, PLDP Theorem 1 / eq. 14, read as
    Var ≤ L²·(e^ε + 1)(e^ε + 3) / (e^ε − 1)².

    Decision: eq. 14 as printed has L_i (not L_i²) in the *denominator*, which makes the bound shrink as
    the safe range grows and fails as a bound (ε = 0.1, L = 2: the printed value is 391 while the
    variance of eq. 10 at v = 0 is 1057). Every output of eq. 10 scales linearly with L, so the variance
    scales with L²; with L² in the numerator the bound holds for every ε and v (tested against the exact
    variance of eq. 10), and for L = 1 both readings agree.
    """
    if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(length) and length > 0):
        raise ValueError(f"PDPM needs epsilon > 0 and L > 0, got epsilon={epsilon!r}, L={length!r}")
    e = math.exp(epsilon)
    return length**2 * (e + 1.0) * (e + 3.0) / (e - 1.0) ** 2
