"""Issue 42 items 3-4: a silo's claims the coordinator can check are checked, the others bounded; one silo never
stops a run. Client 2 of 3 is the faulty silo.

* A label histogram (DP-FedAW's weights) that the silo's labels (local engine) or the manifest's label counts
  (Flower) do not bear out is refused: the silo is left out and named, and the run goes on while enough remain.
* A histogram the coordinator cannot check is capped at the median similarity, and the cap is named.
* A silo whose own test accuracy stands far above the others' is flagged with the pooled figure without it.
* A duplicated client index leaves out every claimant the manifest's digests cannot tell apart.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import pytest
import torch
from cli_checks import one_error_line, run
from federate_files import write_run

from hardening.test_faulty_silo import BAD, CONFIG, faulty, federate_with
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.manifest import read_manifest, write_manifest
from ldpfl.stage2_federate import label_claims, outputs
from ldpfl.stage2_federate import pooled_figure as pf
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.left_out import TooFewSilosError
from ldpfl.stage2_federate.plan import plan_federation
from ldpfl.stage2_federate.round_record import ClientEvaluation, ClientScore, SplitSums


def uniform(rows: int) -> tuple[int, ...]:
    """A histogram of ``rows`` as even as can be: what a near-constant silo claims to raise its weight."""
    return (*[rows // 4] * 3, rows - 3 * (rows // 4))


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> Path:
    """Three silos; silo 2 holds one class only (its honest DP-FedAW weight is the lowest)."""
    return write_run(tmp_path_factory.mktemp("skewed"), clients=3, rows=96, features=8, class_skew={BAD: 0})


def forge_histogram(run_dir: Path, target: Path, histogram: list[int]) -> Path:
    """Copy ``run_dir`` with silo 2's recorded training histogram replaced, as its manifest entry lists it too."""
    shutil.copytree(run_dir, target)
    path = target / f"client_00{BAD}.h5"
    with h5py.File(path, "r+") as handle:
        stated = json.loads(handle.attrs["label_histograms"])
        handle.attrs["label_histograms"] = json.dumps({**stated, "train": histogram})
    manifest = read_manifest(target)
    files = [dataclasses.replace(r, sha256=sha256_file(path), bytes=path.stat().st_size,
                                 label_histograms={**r.label_histograms, "train": histogram})
             if r.client_index == BAD else r for r in manifest.files]
    write_manifest(target, files, manifest.info)
    return target


@pytest.fixture(scope="module")
def forged(skewed, tmp_path_factory) -> Path:
    with h5py.File(skewed / f"client_00{BAD}.h5") as handle:
        rows = int(json.loads(handle.attrs["label_histograms"])["train"][0])
    # adds up to its rows: only its labels say no
    return forge_histogram(skewed, tmp_path_factory.mktemp("forged") / "run", list(uniform(rows)))


# --------------------------------------------------------------------------------------------------
# Checked: the local engine counts the labels it holds.


def test_the_local_engine_leaves_out_a_silo_whose_labels_do_not_bear_out_its_histogram(forged, tmp_path,
                                                                                        monkeypatch) -> None:
    result, warnings = federate_with(monkeypatch, forged, tmp_path / "o", faulty(), aggregation="fedaw", rounds=1)
    assert [r["aggregated"] for r in result.history] == [[0, 1]]
    left = result.config["run"]["left_out"]
    assert [(x["client"], x["file"]) for x in left] == [(BAD, "client_002.h5")]
    reason = left[0]["reason"]
    assert reason.startswith("client 2: client_002.h5 claims the training label histogram [")
    assert ", its labels count [" in reason and reason.endswith("the silo's claim is refused (it sets its DP-FedAW "
                                                                 "weight)")
    assert warnings[0] == f"left out before round 1: {reason}" and result.warnings[0] == warnings[0]
    metrics = json.loads(result.paths["metrics_json"].read_text())
    assert metrics["config"]["run"]["left_out"] == left and metrics["config"]["run"]["clients"] == 2
    assert "label_claims" not in metrics["config"]  # every histogram was checked: nothing to cap


def test_the_honest_files_leave_nobody_out(skewed) -> None:
    plan = plan_federation(skewed, FederationConfig(**{**CONFIG, "aggregation": "fedaw"}))
    assert [c.index for c in plan.data.clients] == [0, 1, 2] and "left_out" not in plan.record["run"]
    weights = plan.strategy.weights([0, 1, 2])
    assert weights[BAD] < 0.6 * min(weights[0], weights[1])  # one class: cos = 1/2 against the uniform


def test_the_run_ends_in_one_line_when_too_few_silos_remain(forged, tmp_path) -> None:
    with pytest.raises(TooFewSilosError, match=r"2 of 3 silos remain, fewer than the 3 the run needs"):
        plan_federation(forged, FederationConfig(**CONFIG), min_clients=3)
    line = one_error_line(run("federate", forged, "--rounds", "1", "--hidden", "8", "--quiet",
                              "--min-clients-per-round", "3", "--out", tmp_path / "x"))
    assert line.startswith("Error: client 2: client_002.h5 claims the training label histogram"), line
    assert line.endswith("with the refused left out 2 of 3 silos remain, fewer than the 3 the run needs (two, or "
                         "--min-clients-per-round, --clients-per-round)")
    shown = run("federate", forged, "--rounds", "1", "--hidden", "8", "--out", tmp_path / "y")
    assert shown.exit_code == 0, shown.output
    assert "Warning: left out before round 1: client 2: client_002.h5 claims" in shown.stderr
    assert "\nleft out before round 1: client 2: client_002.h5 claims" in shown.stdout  # the summary names it


# --------------------------------------------------------------------------------------------------
# Flower: the manifest's label counts where it lists them; a cap where it does not.


def _summaries(run_dir: Path):
    from ldpfl.stage2_federate.flower_engine import client_side as cs
    from ldpfl.stage2_federate.flower_engine.deployment import coordinator_run

    summaries = [cs.summarize(cs.open_client(run_dir / f"client_00{i}.h5", torch.device("cpu"))) for i in range(3)]
    return summaries, list(coordinator_run(run_dir).files)


def test_a_claim_the_manifests_label_counts_refuse_leaves_the_silo_out(skewed) -> None:
    from ldpfl.stage2_federate.flower_engine.protocol import ManifestEntry
    from ldpfl.stage2_federate.flower_engine.server_side import screen

    summaries, counted = _summaries(skewed)
    # the manifest lists each file's label counts (the exporter's record_for reads the file's attribute)
    assert [e.train_labels for e in counted] == [tuple(s.label_histogram) for s in summaries]
    assert ManifestEntry.from_json(counted[BAD].to_json()) == counted[BAD]
    claimed = uniform(summaries[BAD].train_rows)
    liar = dataclasses.replace(summaries[BAD], label_histogram=claimed)
    kept, _, left = screen([(10 + i, s) for i, s in enumerate([*summaries[:BAD], liar])], counted, needed=2)
    assert [s.index for s in kept] == [0, 1] and [x.index for x in left] == [BAD]
    assert left[0].reason == (f"client 2: client_002.h5 claims the training label histogram {list(claimed)}, the "
                              f"run's manifest lists {list(summaries[BAD].label_histogram)}: the silo's claim is "
                              "refused (it sets its DP-FedAW weight)")
    kept, _, left = screen([(10 + i, s) for i, s in enumerate(summaries)], counted, needed=2)
    assert len(kept) == 3 and left == []


def test_an_unchecked_histogram_is_capped_near_the_median_similarity_and_the_cap_named(skewed) -> None:
    from ldpfl.stage2_federate.flower_engine.server_side import plan_from_summaries

    summaries, checked = _summaries(skewed)
    entries = [dataclasses.replace(e, train_labels=None) for e in checked]  # a manifest written before the counts
    config = FederationConfig(**{**CONFIG, "aggregation": "fedaw"})
    rows = summaries[0].train_rows
    # honest silos 0 and 1 of one dominant class (g 0.756); silo 2 holds one class (g 0.5) but claims uniform (g 1)
    dominant = [dataclasses.replace(s, label_histogram=(rows - 3 * (rows // 8), *[rows // 8] * 3))
                for s in summaries[:BAD]]
    liar = dataclasses.replace(summaries[BAD], label_histogram=uniform(summaries[BAD].train_rows))
    honest = plan_from_summaries(config, [*dominant, summaries[BAD]], entries=entries)
    g = honest.strategy.similarities
    assert g[0] == g[1] == pytest.approx(0.756, abs=1e-3) and g[BAD] == pytest.approx(0.5)
    assert honest.record["label_claims"]["capped"] == []  # within 1.1 x the median: the honest run is unchanged
    forged = plan_from_summaries(config, [*dominant, liar], entries=entries)
    assert forged.strategy.similarities[BAD] == pytest.approx(1.1 * g[0])  # its claimed 1.0, cut
    weights = forged.strategy.weights([0, 1, 2])
    assert weights[BAD] / weights.sum() == pytest.approx(1.1 / (1.1 + 2))  # 0.355; 0.39 as claimed, 0.25 honest
    claims = forged.record["label_claims"]
    assert claims["unchecked"] == [0, 1, 2] and claims["cap"] == pytest.approx(1.1 * g[0], abs=1e-6)
    assert claims["cap_rule"] == "1.1 times the median similarity g of the run's silos"
    assert [(c["client"], c["claimed_similarity"]) for c in claims["capped"]] == [(BAD, pytest.approx(0.975, abs=1e-3))]
    line = outputs.label_claim_lines(forged.record)[0]
    assert line.startswith("label histograms: 3 unchecked (the manifest lists no label counts); their DP-FedAW "
                           "similarity is capped at 0.832, 1.1 times the median similarity g of the run's silos: ")
    assert line.endswith("capped silo 2 (claimed 0.975)")
    assert "label_claims" not in plan_from_summaries(config, summaries, entries=checked).record
    assert "label_claims" not in plan_from_summaries(FederationConfig(**CONFIG), summaries).record  # not fedaw


def test_the_cap_lowers_only_unchecked_silos_above_the_median() -> None:
    capped, cap = label_claims.cap_unchecked({0: 0.5, 1: 0.6, 2: 1.0, 3: 0.9}, unchecked={0, 2})
    assert cap.cap == pytest.approx(0.825) and capped == {0: 0.5, 1: 0.6, 2: pytest.approx(0.825), 3: 0.9}
    assert [(c.client, c.claimed) for c in cap.capped] == [(2, 1.0)] and cap.unchecked == (0, 2)


# --------------------------------------------------------------------------------------------------
# A silo far above the others is flagged, with the pooled figure without it.


def _scores(*entries: tuple[float, int]) -> list[ClientScore]:
    return [ClientScore(c, 0.5, accuracy, rows) for c, (accuracy, rows) in enumerate(entries)]


def test_a_silo_whose_duplicated_rows_lift_the_pooled_figure_is_flagged() -> None:
    # issue 42: a silo repeating its records ten times and flipping their labels scores 100 % on its own rows
    flags = pf.pooled_figure_flags(_scores((0.013, 160), (0.013, 160), (1.0, 1600)))
    assert [f.client for f in flags] == [2]
    assert flags[0].others_accuracy == pytest.approx(0.013) and flags[0].pooled == pytest.approx(0.8355, abs=1e-4)
    assert pf.pooled_figure_flags(_scores((0.78, 160), (0.78, 160), (1.0, 1600)))[0].client == 2  # not flipped
    # no flag for ten honest silos of equal shares, one 19 pp above: it lifts the figure by 1.7 pp
    assert pf.pooled_figure_flags(_scores(*[(0.70, 200)] * 9, (0.89, 200))) == []
    assert pf.pooled_figure_flags(_scores((0.80, 30), (0.40, 30), (0.85, 30))) == []  # small splits: within 3 SE
    assert pf.pooled_figure_flags(_scores((0.70, 100), (0.75, 100), (1.0, 0))) == []  # no test row: no figure
    assert pf.pooled_figure_flags(_scores((0.9, 100),)) == []  # one silo: nobody to compare with


def test_a_run_names_the_silo_far_above_the_others_in_metrics_json_and_the_summary(
        three, tmp_path, monkeypatch) -> None:
    perfect = faulty(spoil_sums=lambda e: ClientEvaluation(e.client, SplitSums(0.0, e.test.rows, e.test.rows)))
    result, _ = federate_with(monkeypatch, three, tmp_path / "m", perfect, rounds=1)
    last = result.history[-1]["per_client"]
    others = (last[0]["test_accuracy"] + last[1]["test_accuracy"]) / 2
    flags = json.loads(result.paths["metrics_json"].read_text())["pooled_figure_flags"]
    assert [f["client"] for f in flags] == [BAD] and flags[0]["pooled_without_it"] == pytest.approx(others, abs=1e-6)
    assert result.to_dict()["pooled_figure_flags"] == flags
    shown = run("federate", three, "--out", tmp_path / "cli", "--rounds", "1", "--hidden", "16", "--local-epochs", "1",
                "--batch-size", "16", "--threads", "1", "--device", "cpu", "--seed", "5")  # CONFIG, one round
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.stdout.splitlines() if x.startswith("pooled figure: "))
    assert line.startswith("pooled figure: silo 2 scores 1.0000 on its own 24 test rows, the other silos ")
    assert f"without it the final test accuracy is {others:.4f}" in line


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("silos"), clients=3, rows=48, features=8)


def test_an_honest_run_flags_no_silo(three, tmp_path) -> None:
    result = run_federation(three, FederationConfig(**{**CONFIG, "rounds": 1}), out_dir=tmp_path / "o",
                            progress=False)
    assert "pooled_figure_flags" not in json.loads(result.paths["metrics_json"].read_text())
    assert "pooled_figure_flags" not in result.to_dict() and outputs.pooled_figure_lines(result.history) == []


# --------------------------------------------------------------------------------------------------
# A duplicated index: both claimants serve the manifest's file, so the digests cannot tell them apart.


def test_two_claimants_serving_the_listed_file_are_both_left_out(three) -> None:
    from ldpfl.stage2_federate.flower_engine.server_side import screen

    summaries, entries = _summaries(three)
    kept, node_of, left = screen([(10, summaries[0]), (11, summaries[1]), (12, summaries[0]),
                                  (13, summaries[2])], entries, needed=2)
    assert [s.index for s in kept] == [1, 2] and node_of == {1: 11, 2: 13}
    assert [(x.index, x.file) for x in left] == [(0, "client_000.h5"), (0, "client_000.h5")]
    assert all(x.reason.endswith("the run's manifest cannot tell the honest one: every claimant is left out")
               for x in left)
