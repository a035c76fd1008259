"""Issue 42: the DP-SGD outlier statistic (``outliers.noise_distances``) names poison, not small honest silos.

Synthetic uploads: a common mean plus each silo's own Gaussian noise of scale s_i ∝ 1/n_i, as DP-SGD puts there
(``silo_training.dp_sgd_budget.upload_noise_scale``, checked against ``dp_sgd.train_dp_sgd`` itself).
Tolerances from the math:

* the noise scale of one DP-SGD run: the per-coordinate variance of D = 20,000 coordinates of pure noise is within
  6 standard errors √(2/D) of s_i²;
* the order-statistic moments: exact for one scale (E[X²] = s², E[X⁴] = 3s⁴) and within 5 standard errors of a
  Monte Carlo estimate for mixed scales;
* r_i (pure noise) has mean 1 and standard deviation √κ_i / (2√d); over R rounds of n silos its standardized mean is
  within 5/√(R·n) of 0 (the silos of a round are correlated through the shared median: 5 standard errors of the
  round means, √n larger, are allowed), and the standard deviation of the ratio to the round's median is at most
  1.25 of it (the docstring of ``NOISE_Z`` relies on ≤ 1.4);
* false alarms: none in 200 rounds of 10 honest silos of 1,139 to 19,283 records (P < 1e-6 per round);
* a silo whose upload carries a bias of 0.3 of its noise norm √(d·v_i) (its own s_i√d for a small silo) is named in
  every round at section 11's d = 39,700: r_i ≈ √1.09 = 1.044 against a bound of 1.027-1.029 and a spread of 0.004,
  4 standard deviations.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ldpfl.stage2_federate import outliers as out
from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import FederatedMLP, get_vector, make_optimizer
from ldpfl.stage2_federate.silo_training import PLAIN, UPLOAD_NOISE, upload_noise_scales
from ldpfl.stage2_federate.silo_training.dp_sgd import train_dp_sgd
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import DpSgdClient, upload_noise_scale

DIRICHLET_ROWS = (2318, 5102, 3007, 1153, 4296, 19283, 2765, 8455, 6021, 1139)  # 17-fold, as section 11's split
DIM = 20_000


def _scales(rows: tuple[int, ...]) -> np.ndarray:
    return np.array([upload_noise_scale(lr=2.0, noise_multiplier=3.436, clip=0.1, sampling_probability=0.1365,
                                            records=n, local_steps=1) for n in rows])


def _honest(rng: np.random.Generator, scales: np.ndarray, dim: int = DIM) -> list[np.ndarray]:
    mean = rng.normal(0.0, 0.05, dim)  # the common model: the statistic is shift-invariant
    return [mean + s * rng.standard_normal(dim) for s in scales]


def test_the_noise_scale_is_lr_sigma_clip_root_steps_over_the_expected_batch() -> None:
    # section 11's IID silo: 4 · 3.436 · 0.1 / (0.1365 · 5400) = 1.8646e-3 per coordinate
    assert upload_noise_scale(lr=4.0, noise_multiplier=3.436, clip=0.1, sampling_probability=0.1365,
                                  records=5400, local_steps=1) == pytest.approx(1.37440 / 737.1, rel=1e-4)
    assert upload_noise_scale(lr=1.0, noise_multiplier=1.0, clip=1.0, sampling_probability=0.5, records=10,
                                  local_steps=4) == pytest.approx(2.0 / 5.0)
    with pytest.raises(ValueError, match=r"records must be a finite number > 0, got 0"):
        upload_noise_scale(lr=1.0, noise_multiplier=1.0, clip=1.0, sampling_probability=0.5, records=0,
                               local_steps=1)
    dp = {3: DpSgdClient(3, 2.0, 0.5, 0.25, 2, 1e-5, "add-remove", 80)}
    assert upload_noise_scales(dp, lr=0.5, plain_sgd=True) == {3: pytest.approx(0.5 * 2 * 0.5 * math.sqrt(2) / 20)}
    assert upload_noise_scales(dp, lr=0.5, plain_sgd=False) is None  # Adam's step is not linear in the noise
    assert upload_noise_scales({3: PLAIN}, lr=0.5, plain_sgd=True) is None  # plain training


def test_the_noise_scale_matches_what_train_dp_sgd_puts_in_an_upload() -> None:
    # zero features: the weights' gradients are exactly 0, so their change is the DP noise alone
    width, classes, rows, steps, lr = 2000, 10, 64, 3, 0.5
    split = ClientSplit(torch.zeros(rows, width), torch.from_numpy(np.arange(rows) % classes), width, False)
    dp = DpSgdClient(0, 1.5, 0.2, 0.25, steps, 1e-5, "add-remove", rows)
    model = FederatedMLP(width, (), classes, dropout=0.0)
    start = get_vector(model).clone()
    train_dp_sgd(model, split, dp, optimizer=make_optimizer("sgd", model.parameters(), lr),
                 generator=torch.Generator().manual_seed(1), rng=np.random.default_rng(1))
    change = (get_vector(model) - start).numpy().astype(np.float64)[: width * classes]  # the weights, not the biases
    expected = upload_noise_scales({0: dp}, lr=lr, plain_sgd=True)[0]
    assert change.var() / expected**2 == pytest.approx(1.0, abs=6 * math.sqrt(2 / change.size))


def test_the_order_statistic_moments_are_exact_for_one_scale_and_agree_with_monte_carlo() -> None:
    assert out.order_statistic_moments((2.0,), 1) == pytest.approx((4.0, 48.0), rel=1e-9)
    scales, draws = (0.5, 1.0, 2.0, 4.0), 200_000
    sample = np.sort(np.random.default_rng(7).standard_normal((draws, 4)) * np.array(scales), axis=1)
    for k in (1, 2):
        m2, m4 = out.order_statistic_moments(scales, k)
        x2, x4 = sample[:, k - 1] ** 2, sample[:, k - 1] ** 4
        assert abs(m2 - x2.mean()) < 5 * x2.std() / math.sqrt(draws)
        assert abs(m4 - x4.mean()) < 5 * x4.std() / math.sqrt(draws)
    with pytest.raises(ValueError, match=r"k must lie in \[1, 4\] for 4 scales, got 5"):
        out.order_statistic_moments(scales, 5)


def test_honest_silos_of_unequal_size_sit_at_one_and_are_never_named() -> None:
    rng, scales, rounds = np.random.default_rng(11), _scales(DIRICHLET_ROWS), 200
    units, ratios = [], []
    for _round in range(rounds):
        noise = out.noise_distances(_honest(rng, scales), scales)
        assert not noise.named.any()
        spread = (noise.bounds - 1) / out.NOISE_Z  # √κ_i / (2√d)
        units.append((noise.units - 1) / spread)
        ratios.append((noise.ratios - 1) / spread)
    units, ratios = np.array(units), np.array(ratios)
    n = len(scales)
    assert abs(units.mean()) < 5 / math.sqrt(rounds)  # the round means' standard error, at most 1/√R
    assert units.std() == pytest.approx(1.0, abs=5 / math.sqrt(2 * rounds * n) + 0.1)
    assert ratios.std(axis=0).max() <= 1.25
    # the raw distance from the median names the small silos (section 11's false alarm); this statistic does not
    assert out.median_distances(_honest(rng, scales)).max() > out.OUTLIER_BOUND


def test_a_bias_of_a_third_of_the_noise_norm_is_named_in_every_round() -> None:
    rng, scales, dim = np.random.default_rng(5), _scales(DIRICHLET_ROWS), 39_700
    norms = out.noise_distances(_honest(rng, scales, dim), scales).norms  # √(d·v_i), a function of the scales
    assert norms[3] == pytest.approx(scales[3] * math.sqrt(dim), rel=0.01)  # a small silo: its own noise norm
    assert norms[5] > 2 * scales[5] * math.sqrt(dim)  # the largest: the others' median is noisier than it
    for poisoner in (3, 5):  # the smallest silo but one, and the largest
        for _round in range(10):
            uploads = _honest(rng, scales, dim)
            direction = rng.standard_normal(dim)
            uploads[poisoner] += 0.3 * norms[poisoner] * direction / np.linalg.norm(direction)
            report = out.report(list(range(10, 20)), uploads, None, out.FLAGGED,
                                noise_scales=dict(zip(range(10, 20), scales.tolist(), strict=True)))
            assert report.named == (10 + poisoner,)


def test_the_report_names_by_noise_and_round_trips() -> None:
    rng, scales = np.random.default_rng(2), _scales(DIRICHLET_ROWS)
    uploads = _honest(rng, scales)
    uploads[0] += 0.5 * scales[0] * rng.standard_normal(DIM)  # adds 0.25 of its noise variance: r² ≈ 1.2
    clients, noise = list(range(10)), dict(enumerate(scales.tolist()))
    # a robust rule under DP-SGD: named by the noise distance, its discount still reported (0.9 names nobody here)
    report = out.report(clients, uploads, [0.9] * 10, out.DISCOUNTED, noise_scales=noise)
    assert report.named == (0,) and report.silos[1].discount == 0.9
    assert report.noise_median == pytest.approx(1.0, abs=0.02)
    again = out.OutlierReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict() and again.silos[0].noise_distance is not None
    assert "noise_bound" not in out.report(clients, uploads, None, out.FLAGGED).silos[0].to_dict()
    named = out.persistent_outliers([report, report, None])
    assert [(p.client, p.named_rounds, p.rounds) for p in named] == [(0, 2, 2)]
    assert named[0].to_dict()["mean_noise_distance"] > report.silos[0].noise_bound
    assert "in units of its own DP-SGD noise" in named[0].line(noise=UPLOAD_NOISE)  # the component names its noise
    # two silos: each is the other's reference, both at the same ratio: nobody is named
    assert out.noise_distances(uploads[:2], scales[:2]).named.tolist() == [False, False]
    with pytest.raises(ValueError, match=r"scales must be 3 finite numbers > 0"):
        out.noise_distances(uploads[:3], [1.0, 0.0, 1.0])
