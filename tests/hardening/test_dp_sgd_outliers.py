"""Issue 42: under DP-SGD the rules name silos by their distance in units of their own noise (``outliers``).

Through ``run_federation`` (the loop gives the strategy each silo's DP-SGD noise,
``silo_training.upload_noise_scales``):
the round records carry each silo's noise distance and bound and the round's median, the summary and
``metrics.json`` name a poisoning silo by it, and under Adam (whose step is not linear in the noise) the report falls
back to the raw distance. The model is small (d = 314): the bound is 1 + 7.5·√κ/(2√d) ≈ 1.3, and the poisoning
silo (``test_outliers_named.REVERSED``: its update reversed and boosted 5 times, so its noise is 5 times an honest
silo's) sits at a noise distance near √((25 s² + E[M²]) / (s² + E[M²])) ≫ 1.3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from federate_files import write_run

from hardening.test_faulty_silo import BAD, CONFIG, federate_with
from hardening.test_outliers_named import REVERSED
from ldpfl.stage2_federate import outputs
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation

DP_SGD = dict(dp_sgd=True, noise_multiplier=1.0, clip=1.0, local_steps=2, delta=1e-5, optimizer="sgd")


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("silos"), clients=3, rows=48, features=8)


@pytest.fixture(scope="module")
def ten(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("ten"), clients=10, rows=48, features=8)


@pytest.mark.parametrize(("rule", "extra"), [("median", {}), ("fedavg", {"outlier_report": True})])
def test_a_poisoning_silo_is_named_by_its_noise_distance(three, tmp_path, monkeypatch, rule, extra) -> None:
    result, _ = federate_with(monkeypatch, three, tmp_path / rule, REVERSED, aggregation=rule, **DP_SGD, **extra)
    for record in result.history:
        report = record["outliers"]
        assert report["named"] == [BAD]
        assert report["noise_median"] > 0
        silo = next(s for s in report["silos"] if s["client"] == BAD)
        assert silo["noise_distance"] > silo["noise_bound"] > 1.0
        assert silo["mix_distance"] > silo["noise_bound"]  # its label mix does not explain it (κ 2: a lower bound)
    named = json.loads(result.paths["metrics_json"].read_text())["named_outliers"]
    assert [p["client"] for p in named] == [BAD] and named[0]["mean_noise_distance"] > 1.3
    assert "in units of its own DP-SGD noise" in outputs.outlier_lines(result.history)[0]


def test_ten_honest_dp_sgd_silos_are_not_named(ten, tmp_path) -> None:
    config = FederationConfig(**{**CONFIG, "rounds": 3}, aggregation="median", **DP_SGD)
    result = run_federation(ten, config, out_dir=tmp_path / "honest", progress=False, on_warning=None)
    assert result.to_dict()["named_outliers"] == []
    for record in result.history:
        assert record["outliers"]["named"] == []
        assert all(s["noise_distance"] < s["noise_bound"] for s in record["outliers"]["silos"])
        assert all(s["mix_distance"] > 0 for s in record["outliers"]["silos"])  # the label-mix figure is written


def test_under_adam_the_report_falls_back_to_the_raw_distance(three, tmp_path, monkeypatch) -> None:
    result, _ = federate_with(monkeypatch, three, tmp_path / "adam", REVERSED, aggregation="median",
                              **{**DP_SGD, "optimizer": "adam"})
    for record in result.history:
        assert "noise_median" not in record["outliers"]
        assert all("noise_distance" not in s for s in record["outliers"]["silos"])
