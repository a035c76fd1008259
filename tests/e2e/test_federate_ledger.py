"""The privacy ledger in a federation's outputs (metrics.json, the result, the CLI summary) and in
``ldpfl inspect RUN_DIR --json``; every figure is checked against dp-accounting called directly."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from federate_files import write_run

import ldpfl
from ldpfl.cli import cli
from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate import ledger as lg
from ldpfl.stage2_federate.federation import FederationConfig, run_federation

FAST = dict(hidden=(8,), local_epochs=1, batch_size=16, lr=0.01, threads=1, seed=3)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("ledger"), clients=4, rows=32, features=6)


def federate(run_dir, out, **overrides):
    config = FederationConfig(**{**FAST, "rounds": 3, **overrides})
    return run_federation(run_dir, config, out_dir=out, progress=False)


def uploads(history) -> dict[int, int]:
    counts = {c: 0 for c in range(4)}
    for r in history:
        for c in r["selected"]:
            if c not in r["dropped"] and c not in r["excluded"]:
                counts[c] += 1
    return counts


def rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    return acc.get_epsilon(delta)


def test_gaussian_federation_stores_each_clients_total(small_run, tmp_path) -> None:
    result = federate(small_run, tmp_path / "fed", perturbation="gaussian", clients_per_round=2, drop_per_round=1,
                      client_epsilons=(1.0, 2.0, 4.0, 8.0))
    metrics = json.loads(result.paths["metrics_json"].read_text())
    ledger = metrics["privacy_ledger"]
    assert ledger == json.loads(json.dumps(result.privacy_ledger.to_dict()))
    assert ledger["rounds"] == 3 and ledger["adds_privacy_loss"] and ledger["accountant"] == "rdp"
    counts = uploads(result.history)
    assert sum(counts.values()) == 3  # 2 selected, 1 dropped, each round
    for row, report in zip(ledger["clients"], metrics["privacy"], strict=True):
        assert row["client"] == report["client"] and row["rounds"] == counts[row["client"]]
        if row["rounds"] == 0:
            assert row["epsilon"] == 0.0
            continue
        # dp-accounting called directly, with the σ and record sensitivity of the client's report.
        expected = rdp_epsilon(report["sigma"] / report["sensitivity"], row["rounds"], report["exact_delta"])
        assert row["epsilon"] == pytest.approx(expected, rel=1e-12)
        assert row["delta"] == report["exact_delta"] and row["method"] == accounting.METHOD_NAMES[accounting.RDP]
        assert "discrete Gaussian" in row["notes"][0]


def test_pure_epsilon_federation_composes_by_hand(small_run, tmp_path) -> None:
    result = federate(small_run, tmp_path / "pdpm", perturbation="pdpm", client_epsilons=(0.5, 1.0, 1.5, 2.0),
                      client_ranges=(1.0, 1.0, 1.0, 1.0))
    ledger = result.privacy_ledger.to_dict()
    dim = result.config["resolved"]["parameters"]
    for row, eps in zip(ledger["clients"], (0.5, 1.0, 1.5, 2.0), strict=True):
        assert row["rounds"] == 3  # every client, every round
        assert row["epsilon"] == pytest.approx(3 * dim * eps, rel=1e-9)
        assert row["delta"] == 0.0 and row["method"] == accounting.METHOD_BASIC


def test_none_says_stage_two_adds_nothing(small_run, tmp_path) -> None:
    result = federate(small_run, tmp_path / "none", perturbation="none", rounds=2)
    ledger = result.privacy_ledger.to_dict()
    assert not ledger["adds_privacy_loss"]
    assert all(row["epsilon"] is None and row["method"] == lg.METHOD_NONE for row in ledger["clients"])
    assert any("adds no noise" in note for note in ledger["notes"])
    assert "adds no noise nor release of its own" in " ".join(result.privacy_ledger.lines())


def test_cli_summary_and_inspect_show_the_ledger(small_run, tmp_path) -> None:
    runner = CliRunner()
    out = small_run / "federation"
    result = runner.invoke(cli, ["federate", str(small_run), "--rounds", "2", "--perturbation", "fedaw-gaussian",
                                 "--hidden", "8", "--local-epochs", "1", "--threads", "1", "--seed", "5",
                                 "--overwrite", "--quiet"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(cli, ["federate", str(small_run), "--rounds", "2", "--perturbation", "fedaw-gaussian",
                                "--hidden", "8", "--local-epochs", "1", "--threads", "1", "--seed", "5",
                                "--overwrite"])
    assert shown.exit_code == 0, shown.output
    assert "privacy ledger  stage 2, each client over its uploads" in shown.output and "client 0: eps" in shown.output
    metrics = json.loads((out / "metrics.json").read_text())
    inspected = runner.invoke(cli, ["inspect", str(small_run), "--json"])
    assert inspected.exit_code == 0, inspected.output
    ledger = json.loads(inspected.stdout)["privacy_ledger"]
    stage1 = ledger["stage1"]
    assert [row["client"] for row in stage1] == [0, 1, 2, 3]
    for row in stage1:
        assert row["mechanism"] and "epsilon_per_record" in row and "delta" in row
    stage2 = ledger["stage2"]
    assert stage2["clients"] == [{k: v for k, v in row.items() if k != "notes"}
                                 for row in metrics["privacy_ledger"]["clients"]]
    assert stage2["adds_privacy_loss"] is True
    for row in stage2["clients"]:
        assert row["epsilon"] is None or row["epsilon"] == "inf" or math.isfinite(row["epsilon"])
    # the API reads the same sections back as the typed records stage 2 wrote (one reader each)
    found = ldpfl.inspect(small_run)
    assert found.privacy_ledger == LedgerSection.from_dict(metrics["privacy_ledger"])
    assert found.privacy_ledger is not None and found.privacy_ledger.to_dict() == metrics["privacy_ledger"]
    assert found.federation_guarantee is None or found.federation_guarantee.to_dict() == metrics["release_guarantee"]
    # one display of the ledger: the federation's summary and inspect's text show the same lines
    text = runner.invoke(cli, ["inspect", str(small_run)])
    assert text.exit_code == 0, text.output
    shared = "\n".join(found.privacy_ledger.lines())
    assert shared in shown.output and shared in text.output


def test_inspect_without_federation_has_stage_one_only(tmp_path) -> None:
    run_dir = write_run(tmp_path / "bare", clients=2, rows=16, features=4)
    inspected = CliRunner().invoke(cli, ["inspect", str(run_dir), "--json"])
    assert inspected.exit_code == 0, inspected.output
    ledger = json.loads(inspected.stdout)["privacy_ledger"]
    assert len(ledger["stage1"]) == 2 and ledger["stage2"] is None
    # write_run's files are written without randomization: the stage-1 ledger says so.
    assert all(row["mechanism"] == "none" and row["epsilon_per_record"] == "inf" and row["private"] is False
               for row in ledger["stage1"])
