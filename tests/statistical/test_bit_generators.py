"""Every mechanism keeps its reported rates under every numpy bit generator and under the secure one.

The threshold samplers draw 64-bit words (``randomness.random_words``); ``bit_generator.random_raw`` would give
MT19937's 32-bit outputs, under which k-RR never kept the true label and UER set every odd bit. Each check
compares an empirical rate with the probability the report (or the mechanism's sampled law) states, within
K_SE binomial standard errors, with fixed seeds. A registered mechanism without a check here fails
``test_every_randomizing_mechanism_has_a_rate_check``: a new one must say which of its rates to check.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from ldp_stats import K_SE, binomial_se
from randomgen import AESCounter, ChaCha

from ldpfl import mechanisms as mech
from ldpfl.mechanisms import sufficient_statistics as stats
from ldpfl.mechanisms.randomness import random_words, secure_bit_generator

DRAWS = 100_000
BIT_GENERATORS: dict[str, Callable[[int], np.random.BitGenerator]] = {
    "PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "Philox": np.random.Philox,
    "SFC64": np.random.SFC64, "MT19937": np.random.MT19937,
    "secure (this machine)": secure_bit_generator, "AES-CTR": AESCounter,
    "ChaCha20": lambda seed: ChaCha(seed, rounds=20),
}

Rates = list[tuple[str, int, int, float]]  # (what, hits, trials, reported probability)


def bit_rates(name: str, rng: np.random.Generator) -> Rates:
    """P(1 | 0) and P(1 | 1) of every class, at even and at odd positions (MT19937 broke the odd ones)."""
    m = mech.create_mechanism(name, features=8, epsilon=8.0)
    rows = DRAWS // m.width * 8
    classes = m.position_classes()
    parity = np.arange(m.width) % 2
    out = []
    for bit in (0, 1):
        y = m.randomize(np.full((rows, m.width), bit, dtype=np.uint8), rng=rng)
        ones = y.sum(axis=0)
        for index, c in enumerate(m.effective_bit_classes()):
            p = c.p_one_given_one if bit else c.p_one_given_zero
            for side in (0, 1):
                where = (classes == index) & (parity == side)
                if where.any():
                    out.append((f"class {c.name}, input {bit}, parity {side}", int(ones[where].sum()),
                                rows * int(where.sum()), p))
    return out


def krr_rates(rng: np.random.Generator) -> Rates:
    m = mech.create_mechanism("krr", epsilon=2.0, categories=10)
    labels = m.randomize_labels(np.zeros(DRAWS, dtype=np.int64), rng=rng)
    report = m.report().probabilities
    return [("keep", int(np.count_nonzero(labels == 0)), DRAWS, report["p_keep"]),
            ("report value 9", int(np.count_nonzero(labels == 9)), DRAWS, report["p_other_each"])]


def oue_label_rates(rng: np.random.Generator) -> Rates:
    m = mech.create_mechanism("oue-label", epsilon=2.0, categories=10)
    bits = m.randomize_labels(np.zeros(DRAWS, dtype=np.int64), rng=rng)
    report = m.report().probabilities
    return [("own bit", int(bits[:, 0].sum()), DRAWS, report["p_own_bit"]),
            ("other bits", int(bits[:, 1:].sum()), DRAWS * 9, report["q_other_bit"])]


def duchi_rates(rng: np.random.Generator) -> Rates:
    """At the vertex x = (1, 1, 1): the output lies on x's side with π; at x = 0 each sign is fair."""
    m = mech.create_mechanism("duchi", epsilon=1.0, dim=3)
    y = m.randomize(np.ones((DRAWS, 3)), rng=rng)
    upper = np.count_nonzero((y > 0).sum(axis=1) >= 2)
    zero = m.randomize(np.zeros((DRAWS, 3)), rng=rng)
    return [("upper half at the vertex", int(upper), DRAWS, m.report().probabilities["p_upper_half"]),
            ("+B at x = 0", int(np.count_nonzero(zero > 0)), 3 * DRAWS, 0.5)]


def piecewise_rates(rng: np.random.Generator) -> Rates:
    """At t = 1 the output falls in PM's window {n - h, ..., n + h} with the reported probability."""
    m = mech.create_mechanism("piecewise", epsilon=1.0, dim=1, grid_bits=4)
    report = m.report().probabilities
    grid = report["grid"]
    j = np.rint(m.randomize(np.ones((DRAWS, 1)), rng=rng)[:, 0] / grid["output_step"]).astype(np.int64)
    inside = np.count_nonzero(np.abs(j - grid["n"]) <= grid["half_window_h"])
    return [("window at t = 1", int(inside), DRAWS, report["p_window"])]


def hybrid_rates(rng: np.random.Generator) -> Rates:
    """The Duchi branch (outputs ±B) is taken with 1 - α."""
    m = mech.create_mechanism("hybrid", epsilon=2.0, dim=1)
    report = m.report().probabilities
    y = m.randomize(np.ones((DRAWS, 1)), rng=rng)[:, 0]
    duchi = np.count_nonzero(np.abs(y) == report["duchi_B"] * m.scale)
    return [("Duchi branch", int(duchi), DRAWS, 1.0 - report["alpha"])]


def laplace_rates(rng: np.random.Generator) -> Rates:
    """At x = 0 on the grid g = 1 the output is 0 with P(DLap(t) = 0) = tanh(1/(2t))."""
    m = mech.create_mechanism("laplace", epsilon=4.0, dim=1, clip=1.0, grid_bits=0)
    t = m.report().probabilities["scale_grid_steps"]
    y = m.randomize(np.zeros((DRAWS, 1)), rng=rng)
    return [("output 0 at x = 0", int(np.count_nonzero(y == 0)), DRAWS, math.tanh(1.0 / (2.0 * t)))]


def gaussian_rates(name: str, rng: np.random.Generator) -> Rates:
    """At x = 0 the output lies within ±σ with 2Φ(1) - 1 (the grid is 2^20 times finer than σ)."""
    m = mech.create_mechanism(name, epsilon=1.0, dim=4)
    y = m.randomize(np.zeros((DRAWS // 4, 4)), rng=rng)
    return [("|output| <= sigma at x = 0", int(np.count_nonzero(np.abs(y) <= m.report().sigma)), y.size,
             math.erf(1.0 / math.sqrt(2.0)))]


def pdpm_rates(rng: np.random.Generator) -> Rates:
    """At the upper end of the safe range: high, low and centre with the reported sampled probabilities."""
    m = mech.create_mechanism("pdpm", epsilon=1.0, dim=1)
    report = m.report().probabilities
    y = m.randomize(np.full((DRAWS, 1), m.safe_range[1]), rng=rng)
    return [(f"{what} at the upper end", int(np.count_nonzero(y == report["outputs"][what])), DRAWS, p)
            for what, p in report["sampled_at_upper_end"].items()]


def ldpsign_rates(rng: np.random.Generator) -> Rates:
    """P(+1) at p = +c and at p = -c, as the report's sampled probabilities."""
    m = mech.create_mechanism("ldpsign", epsilon=1.0, dim=1)
    sampled = m.report().probabilities["sampled_p_plus_one"]
    return [(f"+1 at {where}", int(np.count_nonzero(m.randomize(np.full((DRAWS, 1), x), rng=rng) > 0)), DRAWS,
             sampled[where]) for where, x in (("at_plus_c", m.clip), ("at_minus_c", -m.clip))]


def statistics_rates(rng: np.random.Generator) -> Rates:
    """gaussian-stats: each part's noise beyond 1.96 of its σ (σ_M/√2 above M's diagonal) at the normal's 5 %."""
    m = mech.create_mechanism("gaussian-stats", epsilon=1.0, width=20)
    zero = stats.Statistics(np.zeros((5, 20)), np.zeros(5), np.zeros((20, 20)))
    draws = [m.release_second(m.release_first(zero, rng=rng), np.zeros((20, 20)), rng=rng).statistics
             for _ in range(DRAWS // 100)]
    scales = m.scales(20)
    upper = np.triu_indices(20, 1)
    parts = {"sums": (np.stack([d.sums for d in draws]), scales.sums),
             "moments diagonal": (np.stack([np.diag(d.moments) for d in draws]), scales.moments),
             "moments above it": (np.stack([d.moments[upper] for d in draws]), scales.moments / math.sqrt(2))}
    p = math.erfc(1.959963984540054 / math.sqrt(2))
    return [(what, int(np.sum(np.abs(values) > 1.959963984540054 * sigma)), values.size, p)
            for what, (values, sigma) in parts.items()]


RATE_CHECKS: dict[str, Callable[[np.random.Generator], Rates]] = {
    **{name: (lambda rng, name=name: bit_rates(name, rng)) for name in ("uer", "moue", "oue", "rr")},
    **{name: (lambda rng, name=name: gaussian_rates(name, rng))
       for name in ("gaussian", "gaussian-wu", "fedaw-gaussian")},
    "krr": krr_rates, "oue-label": oue_label_rates, "duchi": duchi_rates, "piecewise": piecewise_rates,
    "hybrid": hybrid_rates, "laplace": laplace_rates, "pdpm": pdpm_rates, "ldpsign": ldpsign_rates,
    "gaussian-stats": statistics_rates,
}


def test_every_randomizing_mechanism_has_a_rate_check() -> None:
    randomizing = {n for n in mech.mechanism_names() if mech.mechanism_class(n).RANDOMIZES}
    assert set(RATE_CHECKS) == randomizing


@pytest.mark.parametrize("kind", list(BIT_GENERATORS))
@pytest.mark.parametrize("name", sorted(RATE_CHECKS))
def test_reported_rates_hold_under_every_bit_generator(name: str, kind: str) -> None:
    rng = np.random.Generator(BIT_GENERATORS[kind](20240 + sorted(RATE_CHECKS).index(name)))
    for what, hits, trials, p in RATE_CHECKS[name](rng):
        assert abs(hits / trials - p) <= K_SE * binomial_se(p, trials), (what, hits / trials, p)


def test_random_words_fill_all_64_bits_under_mt19937() -> None:
    """MT19937's random_raw leaves the high half of each word zero; random_words does not."""
    words = random_words(DRAWS, np.random.Generator(np.random.MT19937(3)))
    high = np.count_nonzero(words >> np.uint64(63))
    assert abs(high / DRAWS - 0.5) <= K_SE * binomial_se(0.5, DRAWS)
    assert not np.any(np.random.MT19937(3).random_raw(1000) >> np.uint64(32))  # the 32-bit words it replaces
