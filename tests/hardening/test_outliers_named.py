"""Issue 42, items 1 and 3: every robust rule names the silos it discounted or clipped, and one that cannot act is
refused.

A poisoning silo (client 2) is played by wrapping the in-process transport (``test_faulty_silo.faulty``): it sends the
honest update reversed and boosted five times, a valid-looking upload (finite, of the model's shape, well within the
default norm bound of 10 x the round's median). Each rule must name it in every round, in the round's record, the
CSV, ``--json``, the CLI summary, ``inspect`` and the plot; FedAvg names it only with ``outlier_report``. Ten honest
IID silos must never be named in the run's summary, by any rule.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from cli_checks import one_error_line, run
from federate_files import write_run

from hardening.test_faulty_silo import BAD, CONFIG, faulty, federate_with
from ldpfl.stage2_federate import outliers as out
from ldpfl.stage2_federate import outputs
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.round_record import RoundRecord
from ldpfl.stage2_federate.rule_checks import smallest_trim_fraction
from ldpfl.stage2_federate.silo_training import UPLOAD_NOISE

RULES = [("median", {}), ("trimmed-mean", {"trim_fraction": 0.34}), ("norm-clipped", {}),
         ("fedavg", {"outlier_report": True})]
ACTION = {"median": "discounted", "trimmed-mean": "discounted", "norm-clipped": "clipped", "fedavg": "flagged"}
REVERSED = faulty(lambda r, g: dataclasses.replace(r, upload=(g - 5 * (r.upload - g)).astype(np.float32)))


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("silos"), clients=3, rows=48, features=8)


@pytest.fixture(scope="module")
def ten(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("ten"), clients=10, rows=48, features=8)


def test_the_discount_and_distance_on_hand_computed_uploads() -> None:
    rows = [np.array([0.0, 1.0, 2.0, 5.0]), np.array([1.0, 1.0, 3.0, 6.0]), np.array([9.0, -9.0, 9.0, -9.0])]
    # median (k = 1 of 3): silo 0 holds the middle value in coordinates 1 (a tie at 1.0) and 3, silo 1 in 0, 1, 2,
    # silo 2 in none. Expected share 1/3: discount 1 - s / (1/3), clipped at 0.
    np.testing.assert_allclose(out.kept_discounts(rows, 1), [0.0, 0.0, 1.0])
    # four silos, k = 1: the band is the two middle values (expected share 1/2); silo 0 is in it in coordinates 1
    # and 3 (share 1/2: discount 0), silo 3 never (discount 1); one in the band of one coordinate: share 1/4, 1/2
    four = [rows[0], rows[1], rows[1] + 1, rows[2]]
    np.testing.assert_allclose(out.kept_discounts(four, 1), [0.0, 0.0, 0.0, 1.0])
    half = np.array([9.0, 1.0, 9.0, -9.0])  # in the band of coordinate 1 (1.0, tied) only
    np.testing.assert_allclose(out.kept_discounts([rows[0], rows[1], half, rows[1] + 1], 1)[2], 0.5)
    np.testing.assert_allclose(out.kept_discounts(rows, 0), [0.0, 0.0, 0.0])  # nothing dropped: nobody discounted
    # distances from the coordinate median m = (1, 1, 3, 5): silo 0 sqrt(1+0+1+0), silo 1 sqrt(0+0+0+1), silo 2 far
    d = [np.sqrt(2.0), 1.0, np.linalg.norm([8.0, -10.0, 6.0, -14.0])]
    np.testing.assert_allclose(out.median_distances(rows), np.array(d) / np.sqrt(2.0))
    report = out.report([4, 5, 6], rows, None, out.FLAGGED)
    assert report.named == (6,) and all(s.discount == 0.0 for s in report.silos)
    assert out.OutlierReport.from_dict(json.loads(json.dumps(report.to_dict()))).to_dict() == report.to_dict()
    # named in more than half of the rounds it was aggregated in: 2 of 3 yes, 1 of 2 no
    one, none = out.report([4, 5, 6], rows, [0.0, 0.6, 0.9], out.DISCOUNTED), out.report([4, 5, 6], rows,
                                                                                          [0.0, 0.0, 0.0], "discounted")
    named = out.persistent_outliers([one, none, one, None])
    assert [(p.client, p.named_rounds, p.rounds) for p in named] == [(5, 2, 3), (6, 2, 3)]
    assert out.persistent_outliers([one, none]) == []
    assert "silo 6: discounted in 2 of the 3 rounds" in named[1].line(noise=UPLOAD_NOISE)


@pytest.mark.parametrize(("rule", "extra"), RULES)
def test_each_rule_names_a_poisoning_silo_in_every_round(three, tmp_path, monkeypatch, rule, extra) -> None:
    result, _ = federate_with(monkeypatch, three, tmp_path / rule, REVERSED, aggregation=rule, **extra)
    assert len(result.history) == CONFIG["rounds"]
    for record in result.history:
        report = record["outliers"]
        assert report["action"] == ACTION[rule] and report["named"] == [BAD] and record["rejected"] == []
        silos = {s["client"]: s for s in report["silos"]}
        assert silos[BAD]["distance"] > out.OUTLIER_BOUND > max(silos[c]["distance"] for c in (0, 1))
        if rule != "fedavg":
            assert silos[BAD]["discount"] >= out.DISCOUNT_BOUND > max(silos[c]["discount"] for c in (0, 1))
    summary = result.to_dict()["named_outliers"]
    assert [(p["client"], p["action"], p["named_rounds"], p["rounds"]) for p in summary] == \
        [(BAD, ACTION[rule], CONFIG["rounds"], CONFIG["rounds"])]
    metrics = json.loads(result.paths["metrics_json"].read_text())
    assert metrics["named_outliers"] == summary
    csv_rows = result.paths["metrics_csv"].read_text().splitlines()
    assert csv_rows[0].endswith(",outliers,rejected") and all(row.endswith(f",{BAD},") for row in csv_rows[1:])
    records = [RoundRecord.from_dict(r) for r in result.history]
    assert [r.to_dict() for r in records] == result.history  # the checkpoint's history reads the report back
    lines = {line.get_label(): line for line in outputs.history_figure(records).axes[0].get_lines()}
    assert list(lines[f"round in which a silo is {ACTION[rule]}"].get_xdata()) == [1, 2]


def test_fedavg_names_nobody_without_the_report(three, tmp_path, monkeypatch) -> None:
    result, _ = federate_with(monkeypatch, three, tmp_path / "plain", REVERSED)
    assert all("outliers" not in r for r in result.history) and "named_outliers" not in result.to_dict()
    assert "named_outliers" not in json.loads(result.paths["metrics_json"].read_text())


@pytest.mark.parametrize(("rule", "extra"), RULES)
def test_no_false_alarm_with_ten_honest_iid_silos(ten, tmp_path, rule, extra) -> None:
    config = FederationConfig(**{**CONFIG, "rounds": 4}, aggregation=rule, **extra)
    result = run_federation(ten, config, out_dir=tmp_path / rule, progress=False, on_warning=None)
    assert result.to_dict()["named_outliers"] == []
    for record in result.history:  # honest IID silos: every figure far from the bounds
        assert record["outliers"]["named"] == []
        assert max(s["distance"] for s in record["outliers"]["silos"]) < out.OUTLIER_BOUND / 2
    assert "no silo" in outputs.outlier_lines(result.history)[0]


def test_the_cli_summary_json_and_inspect_name_the_silo(three, tmp_path, monkeypatch) -> None:
    import shutil

    from ldpfl.stage2_federate import federation

    run_dir = tmp_path / "run"
    shutil.copytree(three, run_dir)
    monkeypatch.setattr(federation, "InProcessTransport", REVERSED)
    result = run("federate", run_dir, "--rounds", "2", "--hidden", "16", "--batch-size", "16", "--seed", "5",
                 "--aggregation", "median")
    assert result.exit_code == 0, result.output
    assert f"outliers: silo {BAD}: discounted in 2 of the 2 rounds it was aggregated in" in result.stdout
    assert result.stdout.splitlines()[0].endswith("aggregated  named")
    assert result.stdout.splitlines()[1].endswith(f"  {BAD}")
    inspected = run("inspect", run_dir)
    assert f"silo {BAD}: discounted by the aggregation rule in 2 of the 2 rounds" in inspected.stdout
    as_json = json.loads(run("inspect", run_dir, "--json").stdout)
    assert as_json["federation"]["named_outliers"] == [{"client": BAD, "action": "discounted", "named_rounds": 2,
                                                        "rounds": 2}]


# --------------------------------------------------------------------------------------------------
# Item 3: a rule that cannot act at the run's size is refused in one line.


def test_a_trimmed_mean_that_trims_nobody_is_refused_naming_the_smallest_beta(three, tmp_path) -> None:
    assert [smallest_trim_fraction(n) for n in (3, 4, 5, 10)] == [0.334, 0.25, 0.2, 0.1]
    line = one_error_line(run("federate", three, "--out", tmp_path / "a", "--rounds", "1",
                              "--aggregation", "trimmed-mean"))
    assert line == ("Error: --trim-fraction 0.2 trims no silo with 3 clients per round (floor(0.2 x 3) = 0: the "
                    "plain mean); the smallest that trims one is 0.334"), line
    assert not (tmp_path / "a").exists()
    for args, fragment in ((["--aggregation", "median", "--clients-per-round", "2"], "needs at least 3"),
                           (["--aggregation", "norm-clipped", "--clients-per-round", "1"], "clips nothing"),
                           (["--aggregation", "median", "--outlier-report"], "--outlier-report")):
        line = one_error_line(run("federate", three, "--out", tmp_path / "b", "--rounds", "1", *args))
        assert fragment in line and "--" in line, line
    assert not (tmp_path / "b").exists()
    ok = run("federate", three, "--out", tmp_path / "c", "--rounds", "1", "--hidden", "8", "--quiet",
             "--aggregation", "trimmed-mean", "--trim-fraction", "0.334")
    assert ok.exit_code == 0, ok.output
