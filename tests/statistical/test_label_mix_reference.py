"""The label-mix-aware outlier reference (stage2_federate/label_mix_reference.py, issue 42's non-IID false alarm).

Uploads are drawn from its model (eq. 1): u_i = β + Σ_c π_ic·Δ_c + e_i with Dirichlet(0.1) label mixes, class
departures of very different sizes, and DP-SGD noise s_i ∝ 1/√n_i. Under the model an honest r_i is √(χ²_d / d):
its standard deviation is 1/√(2d) = 0.005 at d = 20,000, and the bound 1 + 7.5·√2/(2√d) = 1.0375 is 7.5 of those
above 1 (a one-sided normal tail of 3e-14 per silo and round).
"""

from __future__ import annotations

import numpy as np
import pytest

from ldpfl.stage2_federate import outliers
from ldpfl.stage2_federate.label_mix_reference import mix_prediction

SILOS, CLASSES, DIM = 10, 10, 20_000
BOUND = outliers.noise_bound(2.0, DIM)


def federation(rng: np.random.Generator, concentration: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Label counts, noise scales and class departures of one federation (fixed across its rounds)."""
    mixes = rng.dirichlet(np.full(CLASSES, concentration), size=SILOS)
    counts = np.floor(mixes * rng.integers(1_000, 20_000, size=(SILOS, 1))) + 1
    scales = 1.0 / np.sqrt(counts.sum(axis=1) / 1_000)
    departures = rng.standard_normal((CLASSES, DIM)) * rng.uniform(0.1, 1.5, size=(CLASSES, 1))
    return counts, scales, departures


def named(uploads: np.ndarray, scales: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, set[int]]:
    """Each silo's label-mix distance (as ``outliers`` names by it) and the silos past the bound."""
    units = mix_prediction(list(uploads), scales, counts).units
    return units, {int(i) for i in np.flatnonzero(units > BOUND)}


def honest_round(rng, counts, scales, departures, shared) -> np.ndarray:
    mix = counts / counts.sum(axis=1, keepdims=True)
    return shared + mix @ departures + rng.standard_normal((SILOS, DIM)) * scales[:, None]


def test_honest_silos_of_skewed_mixes_are_not_named_where_the_others_median_names_them() -> None:
    rng = np.random.default_rng(20261128)
    counts, scales, departures = federation(rng, 0.1)
    shared = rng.standard_normal(DIM)
    units, by_median = [], 0
    for _ in range(12):
        uploads = honest_round(rng, counts, scales, departures, shared)
        ratios, who = named(uploads, scales, counts)
        assert who == set(), ratios
        units.append(mix_prediction(list(uploads), scales, counts).units)
        by_median += int(outliers.noise_distances(list(uploads), list(scales)).named.any())
    assert by_median == 12  # the reason for this reference: the median assumes one shared mean
    # each class is granted the largest class variance the others show: r_i is √(χ²_d/d) (sd 0.005) where that is
    # the true variance and below 1 where it is more, never above
    assert float(np.max(units)) < BOUND and float(np.mean(units)) < 1.0


def reported(uploads: np.ndarray, scales: np.ndarray, counts: np.ndarray) -> outliers.OutlierReport:
    """The round's report as a strategy writes it in a DP-SGD run: noise scales and label histograms given."""
    clients = list(range(SILOS))
    return outliers.report(clients, list(uploads), None, outliers.FLAGGED, noise_scales=dict(enumerate(scales)),
                           label_mixes={c: counts[c].astype(int).tolist() for c in clients})


def test_a_silo_of_honest_looking_histogram_and_near_constant_labels_is_the_one_named() -> None:
    rng = np.random.default_rng(42)
    counts, scales, departures = federation(rng, 1e4)  # IID: every mix near uniform
    shared = rng.standard_normal(DIM)
    for _ in range(8):
        uploads = honest_round(rng, counts, scales, departures, shared)
        uploads[9] = shared + departures[0] + rng.standard_normal(DIM) * scales[9]  # trains on class 0 alone
        report = reported(uploads, scales, counts)
        assert report.named == (9,), report
        entry = report.silos[9]
        assert entry.mix_distance is not None and entry.mix_distance > outliers.noise_bound(2.0, DIM)
        assert outliers.SiloDiscount.from_dict(entry.to_dict()).mix_distance == round(entry.mix_distance, 6)


def test_a_mix_the_other_silos_do_not_vary_along_is_judged_as_a_near_constant_one_would_be() -> None:
    """Nine near-uniform silos and one of a single class: its variance is fitted without it, where the others show
    no heterogeneity, so an honest single-class silo cannot be told from a near-constant poisoner (both named)."""
    rng = np.random.default_rng(7)
    counts, scales, departures = federation(rng, 1e4)
    counts[9] = 0
    counts[9, 3] = 5_000
    uploads = honest_round(rng, counts, scales, departures, rng.standard_normal(DIM))
    _, who = named(uploads, scales, counts)
    assert who == {9}
    assert reported(uploads, scales, counts).named == (9,)


@pytest.mark.parametrize(("uploads", "scales", "mixes", "fragment"), [
    ([np.zeros(4)] * 2, [1.0, 1.0], [[1, 0], [0, 1]], "at least 3 silos, got 2"),
    ([np.zeros(4)] * 3, [1.0, 0.0, 1.0], [[1, 0]] * 3, "scales must be 3 finite numbers > 0"),
    ([np.zeros(4)] * 3, [1.0] * 3, [[1, 0], [0, 0], [1, 1]], "mixes must be 3 label histograms"),
    ([np.zeros(4)] * 3, [1.0] * 3, [[1, 0]] * 2, "mixes must be 3 label histograms"),
])
def test_bad_input_names_the_parameter(uploads, scales, mixes, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        mix_prediction(uploads, scales, mixes)
