"""Issue 31: the coordinator trusts no silo. Each test plays a broken or hostile silo (client 2 of 3).

On the local engine the silo's replies are spoiled by wrapping the in-process transport (``InProcessTransport``:
what the loop receives from it is what a Flower silo could send); each bad reply must be refused with the silo
named in the round's ``rejected``, the honest silos aggregated and the run completed. One Flower simulation
plays the wrong-shape and NaN uploads through real messages. The claims a Flower silo makes about its file
are checked against the coordinator's manifest; the files themselves are refused by ``gather`` and
``federate`` when a float feature is not finite.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import federate_files
import h5py
import numpy as np
import pytest
import torch
from cli_checks import one_error_line, run, stderr_error_line
from federate_files import write_run
from repository import ROOT

from ldpfl import mechanisms as mech
from ldpfl.stage2_federate import federation, outputs
from ldpfl.stage2_federate import reply_checks as rc
from ldpfl.stage2_federate.checkpoint import client_digests
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.in_process import InProcessTransport
from ldpfl.stage2_federate.loop import TooFewClientsError, run_rounds
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.plan import plan_federation
from ldpfl.stage2_federate.round_record import ClientEvaluation, ClientScore, RoundRecord, SplitSums
from ldpfl.stage2_federate.rounds import ClientResult
from ldpfl.stage2_federate.run_outputs import RunWriter

BAD = 2
CONFIG = dict(rounds=2, hidden=(16,), local_epochs=1, batch_size=16, threads=1, device="cpu", seed=5)

Spoil = Callable[[ClientResult, np.ndarray], ClientResult]
SpoilSums = Callable[[ClientEvaluation], ClientEvaluation]


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("silos"), clients=3, rows=48, features=8)


def faulty(spoil: Spoil | None = None, spoil_sums: SpoilSums | None = None) -> type[InProcessTransport]:
    """An in-process transport whose client ``BAD`` replies as ``spoil`` / ``spoil_sums`` make it."""

    class Faulty(InProcessTransport):
        def train(self, round_number, selected, broadcast, *, evaluate_without):
            training = super().train(round_number, selected, broadcast, evaluate_without=evaluate_without)
            if spoil is None:
                return training
            results = tuple(spoil(r, broadcast.vector) if r.client == BAD else r for r in training.results)
            return dataclasses.replace(training, results=results)

        def evaluate(self, round_number, broadcast, *, without):
            replies = super().evaluate(round_number, broadcast, without=without)
            if spoil_sums is None:
                return replies
            return dataclasses.replace(replies, reports=tuple(spoil_sums(r) if r.client == BAD else r
                                                              for r in replies.reports))

    return Faulty


def federate_with(monkeypatch, run_dir: Path, out: Path, transport: type[InProcessTransport], **changes):
    monkeypatch.setattr(federation, "InProcessTransport", transport)
    warnings: list[str] = []
    result = run_federation(run_dir, FederationConfig(**{**CONFIG, **changes}), out_dir=out, progress=False,
                            on_warning=warnings.append)
    return result, warnings


def assert_contained(result, warnings: list[str], fragment: str, *, in_training: bool = True) -> None:
    """Client BAD is named in every round's ``rejected`` with ``fragment``; the honest ones carry the run."""
    assert len(result.history) == CONFIG["rounds"]
    for record in result.history:
        reasons = [r["reason"] for r in record["rejected"] if r["client"] == BAD]
        assert len(reasons) == 1 and fragment in reasons[0], record["rejected"]
        assert [r["client"] for r in record["rejected"]] == [BAD]
        if in_training:
            assert record["aggregated"] == [0, 1] and not record["kept_previous_model"]
        assert math.isfinite(record["test_accuracy"]) and 0.0 <= record["test_accuracy"] <= 1.0
        assert any(note.startswith(f"client {BAD}: rejected, ") for note in record["notes"])
    assert any(f"client {BAD}: rejected" in w for w in warnings)
    metrics = json.loads((result.paths["metrics_json"]).read_text())
    assert metrics["rounds"][-1]["rejected"][0]["client"] == BAD
    csv_rows = result.paths["metrics_csv"].read_text().splitlines()
    assert csv_rows[0].endswith(",rejected") and all(row.endswith(f",{BAD}") for row in csv_rows[1:])
    assert all(torch.isfinite(v).all() for v in read_model(result.paths["model"]).state_dict.values())


@pytest.fixture(scope="module")
def clean_history(three, tmp_path_factory) -> list[dict]:
    return run_federation(three, FederationConfig(**CONFIG), out_dir=tmp_path_factory.mktemp("clean"),
                          progress=False).history


def test_a_clean_run_rejects_nobody_and_records_each_silos_figures(clean_history) -> None:
    for record in clean_history:
        assert record["rejected"] == [] and record["aggregated"] == [0, 1, 2]
        scores = record["per_client"]
        assert [s["client"] for s in scores] == [0, 1, 2] and [s["test_rows"] for s in scores] == [24, 24, 24]
        # the union figure is the row-weighted mean of the silos' own
        assert record["test_accuracy"] == pytest.approx(sum(s["test_accuracy"] * 24 for s in scores) / 72)
        assert record["test_loss"] == pytest.approx(sum(s["test_loss"] * 24 for s in scores) / 72, rel=1e-6)


def _round(number: int, *scores: ClientScore, test_accuracy: float = 0.8) -> RoundRecord:
    """A round with only what the plot reads: its test accuracy and the silos' own figures."""
    return RoundRecord(number, math.nan, math.nan, math.nan, test_accuracy, (), (), (), (), (), (), False, (), 0.0,
                       per_client=scores)


def test_the_plot_draws_each_silos_accuracy_beside_the_pooled_one(clean_history, tmp_path) -> None:
    records = [RoundRecord.from_dict(r) for r in clean_history]
    figure = outputs.history_figure(records)
    accuracy = figure.axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in accuracy.get_lines()}
    for client in (0, 1, 2):
        assert lines[f"silo {client} (its test rows)"] == [r["per_client"][client]["test_accuracy"]
                                                           for r in clean_history]
    assert lines["test (global model, pooled)"] == [r["test_accuracy"] for r in clean_history]
    # a poisoned silo the pooled figure hides: its own line stands apart; a rejected evaluation is a gap
    rounds = [_round(n, ClientScore(0, 0.3, 0.9, 24), ClientScore(1, 0.3, 0.9, 24),
                     *([ClientScore(2, 4.0, 0.1, 24)] if n != 2 else [])) for n in (1, 2, 3)]
    poisoned = outputs.per_client_series(rounds, "accuracy")[2]
    assert poisoned[0] == poisoned[2] == 0.1 and math.isnan(poisoned[1])
    drawn = {line.get_label(): line for line in outputs.history_figure(rounds).axes[0].get_lines()}
    assert list(drawn["silo 2 (its test rows)"].get_ydata())[::2] == [0.1, 0.1]
    assert drawn["silo 2 (its test rows)"].get_linewidth() < drawn["test (global model, pooled)"].get_linewidth()
    many = [_round(1, *(ClientScore(c, 0.5, 0.5, 24) for c in range(12)))]
    labels = [line.get_label() for line in outputs.history_figure(many).axes[0].get_lines()]
    assert labels.count("each silo's test rows") == 1 and not any(label.startswith("silo ") for label in labels)
    assert outputs.plot_history(tmp_path / "a.png", rounds).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("name", "spoil", "fragment"), [
    ("nan", lambda r, g: dataclasses.replace(r, upload=np.where(np.arange(r.upload.size) == 3, np.nan, r.upload)
                                              .astype(np.float32)), "not finite"),
    ("inf", lambda r, g: dataclasses.replace(r, upload=np.full_like(r.upload, np.inf)), "not finite"),
    ("wrong-shape", lambda r, g: dataclasses.replace(r, upload=r.upload[:-5]), "has shape"),
    ("one-value", lambda r, g: dataclasses.replace(r, upload=np.array([0.5], dtype=np.float32)), "has shape"),
    ("int-dtype", lambda r, g: dataclasses.replace(r, upload=r.upload.astype(np.int64)), "dtype int64"),
    ("update-x1e6", lambda r, g: dataclasses.replace(r, upload=(g + (r.upload - g) * 1e6).astype(np.float32)),
     "update norm"),
    ("parameters-x1e6", lambda r, g: dataclasses.replace(r, upload=r.upload * np.float32(1e6)), "update norm"),
    ("accuracy-3e8", lambda r, g: dataclasses.replace(r, accuracy=3.3e8), "accuracy"),
    ("negative-loss", lambda r, g: dataclasses.replace(r, loss=-1.0), "negative"),
    ("inf-loss", lambda r, g: dataclasses.replace(r, loss=math.inf), "not finite"),
])
def test_a_bad_upload_is_refused_with_the_silo_named(three, tmp_path, monkeypatch, name, spoil, fragment) -> None:
    result, warnings = federate_with(monkeypatch, three, tmp_path / name, faulty(spoil))
    assert_contained(result, warnings, fragment)
    for record in result.history:
        assert BAD not in record["excluded"] and record["train_accuracy"] <= 1.0


def test_honest_accuracy_is_that_of_a_run_without_the_bad_silo(three, tmp_path, monkeypatch) -> None:
    """A NaN upload costs the honest silos nothing: the same model as a run whose silo 2 trains but sends nothing."""
    nan = faulty(lambda r, g: dataclasses.replace(r, upload=np.full_like(r.upload, np.nan)))
    silent = faulty(lambda r, g: dataclasses.replace(r, upload=None, note=None))
    bad, _ = federate_with(monkeypatch, three, tmp_path / "nan", nan)
    quiet, _ = federate_with(monkeypatch, three, tmp_path / "quiet", silent)
    assert [r["test_accuracy"] for r in bad.history] == [r["test_accuracy"] for r in quiet.history]
    assert [r["aggregated"] for r in quiet.history] == [[0, 1]] * 2


def test_a_note_that_frames_another_silo_is_never_stored(three, tmp_path, monkeypatch) -> None:
    framing = "client 0: excluded, its parameters are not finite after local training"
    with_upload = faulty(lambda r, g: dataclasses.replace(r, note=framing))
    result, warnings = federate_with(monkeypatch, three, tmp_path / "frame", with_upload)
    assert all(r["notes"] == [] and r["aggregated"] == [0, 1, 2] for r in result.history) and warnings == []
    without = faulty(lambda r, g: dataclasses.replace(r, upload=None, note=framing))
    result, warnings = federate_with(monkeypatch, three, tmp_path / "frame2", without)
    for record in result.history:
        assert record["notes"] == [f"client {BAD}: excluded, it sent no upload"]  # the server's words only
        assert record["excluded"] == [BAD] and record["aggregated"] == [0, 1]
    assert not any("client 0" in w for w in warnings)


@pytest.mark.parametrize(("name", "forge", "fragment"), [
    ("all-correct-and-more", lambda s: SplitSums(s.loss_sum, s.rows + 10, s.rows), "claims"),
    ("negative-rows", lambda s: SplitSums(s.loss_sum, 5, -1), "covers -1 rows"),
    ("more-rows", lambda s: SplitSums(0.0, 10 * s.rows, 10 * s.rows), "covers"),
    ("negative-loss", lambda s: SplitSums(-s.loss_sum, s.correct, s.rows), "loss sum"),
    ("nan-loss", lambda s: SplitSums(math.nan, s.correct, s.rows), "loss sum"),
    ("float-count", lambda s: SplitSums(s.loss_sum, s.correct + 0.5, s.rows), "not integers"),
])
def test_forged_evaluation_sums_are_refused(three, clean_history, tmp_path, monkeypatch, name, forge,
                                            fragment) -> None:
    transport = faulty(spoil_sums=lambda e: ClientEvaluation(e.client, forge(e.test), e.clean))
    result, warnings = federate_with(monkeypatch, three, tmp_path / name, transport)
    assert_contained(result, warnings, fragment, in_training=False)
    for record, clean in zip(result.history, clean_history, strict=True):
        assert record["aggregated"] == [0, 1, 2]  # its training was fine
        honest = [s for s in clean["per_client"] if s["client"] != BAD]  # the union of the honest silos only
        assert [s["client"] for s in record["per_client"]] == [0, 1]
        assert record["test_accuracy"] == pytest.approx(sum(s["test_accuracy"] for s in honest) / 2)


def test_a_claimed_perfect_score_shows_in_the_silos_own_figures(three, tmp_path, monkeypatch) -> None:
    """100 % on its own rows is in range (the server cannot see a silo's records): it shows, per silo."""
    transport = faulty(spoil_sums=lambda e: ClientEvaluation(e.client, SplitSums(0.0, e.test.rows, e.test.rows)))
    result, _ = federate_with(monkeypatch, three, tmp_path / "perfect", transport)
    for record in result.history:
        assert record["rejected"] == [] and record["per_client"][BAD]["test_accuracy"] == 1.0
        assert record["test_accuracy"] <= 1.0


def test_the_default_norm_bound_is_ten_times_the_lower_median_scaled_by_noise() -> None:
    limits = rc.ReplyLimits(dim=2, target="update")
    assert rc.norm_bounds({0: 1.0, 1: 3.0}, limits) == {0: 10.0, 1: 10.0}  # two silos: the smaller one sets it
    assert rc.norm_bounds({0: 1.0, 1: 2.0, 2: 1e6}, limits) == {0: 20.0, 1: 20.0, 2: 20.0}
    noisy = rc.ReplyLimits(dim=2, target="update", noise_scales={0: 1.0, 1: 1.0, 2: 4.0})
    assert rc.norm_bounds({0: 1.0, 1: 1.0, 2: 4.0}, noisy) == {0: 10.0, 1: 10.0, 2: 40.0}
    assert rc.metrics_problem(math.nan, math.nan, uploaded=True) is None  # not measured: no DP-SGD batch held a record
    assert rc.metrics_problem(math.inf, 0.5, uploaded=False) is None  # no upload: its training diverged
    assert "outside [0, 1]" in rc.metrics_problem(1.0, -0.1, uploaded=False)
    larger = rc.ReplyLimits(dim=2, target="update", train_rows={0: 10, 1: 20, 2: 100})  # more rows, more steps
    assert rc.norm_bounds({0: 1.0, 1: 1.0, 2: 50.0}, larger) == {0: 10.0, 1: 10.0, 2: 50.0}
    fixed = rc.ReplyLimits(dim=2, target="update", max_update_norm=0.4)
    assert rc.norm_bounds({0: 1.0, 1: 0.2}, fixed) == {0: 0.4, 1: 0.4}
    ups = [ClientResult(0, np.array([0.3, 0.4], np.float32), 1.0, 0.5),
           ClientResult(1, np.array([0.0, 0.1], np.float32), 1.0, 0.5)]
    checked = rc.check_training(ups, np.zeros(2, np.float32), fixed)
    assert [r.client for r in checked.results] == [1]
    assert checked.rejected == ((0, "its update norm 0.5 exceeds the bound 0.4 (--max-update-norm)"),)
    # a parameters target: the update is upload - global
    params = rc.ReplyLimits(dim=2, target="parameters", max_update_norm=0.4)
    assert [r.client for r in rc.check_training(ups, np.array([0.3, 0.3], np.float32), params).results] == [0, 1]


def test_max_update_norm_rejects_every_silo_above_it_and_keeps_the_model(three, tmp_path) -> None:
    result = run_federation(three, FederationConfig(**CONFIG, max_update_norm=1e-6), out_dir=tmp_path / "o",
                            progress=False, on_warning=None)
    for record in result.history:
        assert [r["client"] for r in record["rejected"]] == [0, 1, 2] and record["kept_previous_model"]
        assert all("--max-update-norm" in r["reason"] for r in record["rejected"])


def test_a_rejected_silo_counts_against_the_failure_policy(three, tmp_path) -> None:
    config = FederationConfig(**CONFIG)
    transport = faulty(lambda r, g: dataclasses.replace(r, upload=r.upload[:3]))
    for min_clients, fails in ((3, True), (2, False)):
        plan = plan_federation(three, config)
        writer = RunWriter(tmp_path / str(min_clients), config, plan.record, plan.privacy, client_digests(plan.data))
        writer.start()
        history: list = []
        if fails:
            with pytest.raises(TooFewClientsError, match=r"round 1: 2 of the 3 selected clients trained.*client 2: "
                                                         r"rejected, its upload has shape \(3,\)"):
                run_rounds(plan, transport(plan), writer, history, start=1, min_clients=min_clients)
        else:
            run_rounds(plan, transport(plan), writer, history, start=1, min_clients=min_clients)
            assert len(history) == 2 and all(r.rejected[0][0] == BAD for r in history)


def test_the_local_engines_failure_policy_ends_the_run_in_one_line_naming_the_rejected_silo(
        three, tmp_path, monkeypatch) -> None:
    short = faulty(lambda r, g: dataclasses.replace(r, upload=r.upload[:3]))
    monkeypatch.setattr(federation, "InProcessTransport", short)
    args = ("federate", three, "--rounds", "2", "--hidden", "8", "--quiet", "--min-clients-per-round")
    line = stderr_error_line(run(*args, "3", "--out", tmp_path / "a"), code=1)
    assert line.startswith("Error: round 1: 2 of the 3 selected clients trained, fewer than the failure policy's 3 "
                           "(min-clients-per-round): client 2: rejected, its upload has shape (3,)"), line
    result = run(*args, "2", "--out", tmp_path / "b", "--json")  # two honest silos are enough: the run goes on
    assert result.exit_code == 0, result.output
    assert [[r["client"] for r in rejected] for rejected in json.loads(result.stdout)["rejected"]] == [[BAD], [BAD]]
    monkeypatch.undo()
    line = stderr_error_line(run(*args, "1", "--max-update-norm", "1e-9", "--out", tmp_path / "c"), code=1)
    assert "round 1: 0 of the 3 selected clients trained" in line and "client 0: rejected" in line
    assert "client 2: rejected" in line and "--max-update-norm" in line


def test_the_cli_prints_per_silo_figures_and_rejections_in_json(three, tmp_path) -> None:
    result = run("federate", three, "--out", tmp_path / "j", "--rounds", "1", "--hidden", "8", "--seed", "1",
                 "--aggregation", "trimmed-mean", "--trim-fraction", "0.34", "--max-client-weight", "0.5",
                 "--max-update-norm", "1e9", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["rejected"] == [[]] and [s["client"] for s in payload["per_client"][0]] == [0, 1, 2]
    assert payload["config"]["trim_fraction"] == 0.34 and payload["config"]["max_client_weight"] == 0.5


@pytest.mark.parametrize(("args", "fragment"), [
    (["--max-update-norm", "0"], "--max-update-norm"),
    (["--max-client-weight", "1.5"], "--max-client-weight"),
    (["--max-client-weight", "0"], "--max-client-weight"),
    (["--trim-fraction", "0.5", "--aggregation", "trimmed-mean"], "--trim-fraction"),
    (["--trim-fraction", "0.1"], "trimmed-mean"),
])
def test_cli_refuses_bad_defence_options(three, tmp_path, args, fragment) -> None:
    line = one_error_line(run("federate", three, "--out", tmp_path / "x", "--rounds", "1", *args))
    assert fragment in line


# --------------------------------------------------------------------------------------------------
# A Flower silo's claims about its file, against the coordinator's manifest.


def test_a_silos_row_claims_are_checked_against_the_manifest(three) -> None:
    from ldpfl.stage2_federate.flower_engine import client_side as cs
    from ldpfl.stage2_federate.flower_engine.deployment import coordinator_run
    from ldpfl.stage2_federate.flower_engine.server_side import check_manifest, check_summaries

    entries = coordinator_run(three).files
    assert [(e.train_rows, e.test_rows) for e in entries] == [(48, 24)] * 3
    summaries = [cs.summarize(cs.open_client(three / f"client_00{i}.h5", torch.device("cpu"))) for i in range(3)]
    check_manifest(summaries, entries)
    check_summaries(summaries)
    forged = dataclasses.replace(summaries[BAD], train_rows=10**6)  # for a weight of 0.9999 under --sample-weighted
    with pytest.raises(ValueError, match=r"^client 2: its SuperNode claims 1000000 training rows in client_002\.h5, "
                                         r"the run's manifest lists 48"):
        check_manifest([*summaries[:BAD], forged], entries)
    fewer = dataclasses.replace(summaries[BAD], test_rows=1)
    with pytest.raises(ValueError, match=r"^client 2: its SuperNode claims 1 test rows .* manifest lists 24"):
        check_manifest([*summaries[:BAD], fewer], entries)
    histogram = dataclasses.replace(summaries[BAD], label_histogram=(10**6, 0, 0, 0))
    with pytest.raises(ValueError, match=r"^client 2: its summary claims 48 training rows but a label histogram of 4 "
                                         r"classes totalling 1000000"):
        check_summaries([*summaries[:BAD], histogram])


def _screen_inputs(three):
    from ldpfl.stage2_federate.flower_engine import client_side as cs
    from ldpfl.stage2_federate.flower_engine.deployment import coordinator_run

    summaries = [cs.summarize(cs.open_client(three / f"client_00{i}.h5", torch.device("cpu"))) for i in range(3)]
    return summaries, coordinator_run(three).files


def test_a_refused_claim_leaves_the_silo_out_and_the_run_goes_on_while_enough_remain(three) -> None:
    from ldpfl.stage2_federate.flower_engine.server_side import TooFewSilosError, screen

    summaries, entries = _screen_inputs(three)
    forged = dataclasses.replace(summaries[BAD], train_rows=10**6,  # a histogram that adds up: the manifest says no
                                 label_histogram=(10**6 - 36, 12, 12, 12))
    described = [(10 + i, s) for i, s in enumerate([*summaries[:BAD], forged])]
    kept, node_of, left = screen(described, entries, needed=2)
    assert [s.index for s in kept] == [0, 1] and node_of == {0: 10, 1: 11}
    assert [(x.index, x.file) for x in left] == [(BAD, "client_002.h5")]
    assert left[0].reason == ("client 2: its SuperNode claims 1000000 training rows in client_002.h5, the run's "
                              "manifest lists 48: the silo's claim is refused")
    histogram = dataclasses.replace(summaries[0], label_histogram=(1, 0, 0, 0))  # claims that do not add up
    kept, _, left = screen([(1, histogram), *described[1:]], entries, needed=1)
    assert [s.index for s in kept] == [1] and [x.index for x in left] == [0, BAD]
    assert "its summary claims 48 training rows but a label histogram" in left[0].reason
    with pytest.raises(TooFewSilosError) as refused:
        screen(described, entries, needed=3)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("client 2: its SuperNode claims 1000000 training rows in client_002.h5")
    assert line.endswith("2 of 3 silos remain, fewer than the 3 the run needs (two, or --min-clients-per-round, "
                         "--clients-per-round)")


def test_a_duplicated_index_names_the_impostor_by_its_digest_whatever_the_reply_order(three) -> None:
    from ldpfl.stage2_federate.flower_engine.server_side import screen

    summaries, entries = _screen_inputs(three)
    impostor = dataclasses.replace(summaries[BAD], index=0)  # serves its own file, claims client 0's index
    described = [(10, summaries[0]), (11, summaries[1]), (12, impostor)]
    results = [screen(order, entries) for order in (described, described[::-1], [described[2], *described[:2]])]
    for kept, node_of, left in results:
        assert [s.file for s in kept] == ["client_000.h5", "client_001.h5"] and node_of == {0: 10, 1: 11}
        assert [(x.index, x.file) for x in left] == [(0, "client_002.h5")]
        assert left[0].reason.startswith("client 0: its SuperNode serves client_002.h5 (sha256 ")
        assert "which the run's manifest lists as client_000.h5" in left[0].reason
        assert left[0].reason.endswith("the impostor is left out")
    # neither can be told apart (no manifest to check the digests against): both are left out, named in file order
    for order in (described, described[::-1]):
        kept, _, left = screen(order, needed=1)
        assert [s.index for s in kept] == [1]
        assert [x.file for x in left] == ["client_000.h5", "client_002.h5"]
        assert all("claimed by 2 SuperNodes (client_000.h5 (sha256" in x.reason and "client_002.h5" in x.reason
                   and x.reason.endswith("every claimant is left out") for x in left)


def test_a_plan_without_a_left_out_silo_records_it(three) -> None:
    from ldpfl.stage2_federate.flower_engine.server_side import LeftOut, plan_from_summaries

    summaries, _ = _screen_inputs(three)
    config = FederationConfig(rounds=1, hidden=(8,), seed=1, device="cpu")
    left = [LeftOut(1, "client_001.h5", "client 1: refused")]
    plan = plan_from_summaries(config, [summaries[0], summaries[2]], left_out=left)
    assert sorted(plan.setups) == [0, 2] and [s.index for s in plan.clients] == [0, 2]
    assert plan.record["run"]["left_out"] == [{"client": 1, "file": "client_001.h5", "reason": "client 1: refused"}]


# --------------------------------------------------------------------------------------------------
# Files: a float feature that is not finite, a min-max range that overflows.


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory) -> Path:
    original = federate_files._records
    calls = {"n": 0}

    def records(rng, rows, features, noise):
        values, labels = original(rng, rows, features, noise)
        calls["n"] += 1
        if calls["n"] == 3:  # client 1's training split
            values[4, 2] = np.inf
        return values, labels

    federate_files._records = records
    try:
        return write_run(tmp_path_factory.mktemp("nan") / "run", clients=2, rows=16,
                         feature_format=mech.FLOAT32)
    finally:
        federate_files._records = original


def test_federate_and_gather_refuse_a_float_file_that_is_not_finite(nan_run, tmp_path) -> None:
    with h5py.File(nan_run / "client_001.h5") as handle:
        assert not np.isfinite(handle["train"]["features"][()]).all()
    line = one_error_line(run("federate", nan_run, "--out", tmp_path / "f", "--rounds", "1"))
    assert "client_001.h5" in line and "not finite" in line and "row 4" in line
    line = one_error_line(run("gather", nan_run, "--out", tmp_path / "g"))
    assert "client_001.h5" in line and "not finite" in line


def test_minmax_scaling_of_an_overflowing_range_says_so(tmp_path) -> None:
    from ldpfl.stage1_features.own_data.errors import DataError
    from ldpfl.stage1_features.own_data.load import load_own_data

    x = np.array([[1.7e308, 0.0], [-1.7e308, 1.0], [0.0, 2.0]])
    np.savez(tmp_path / "wide.npz", x=x, y=np.array([0, 1, 0]))
    with pytest.raises(DataError, match=r"range \[-1.7e\+308, 1.7e\+308\] is wider than the largest float64") as caught:
        load_own_data(tmp_path / "wide.npz", scale="minmax")
    assert "NaN" not in str(caught.value)


# --------------------------------------------------------------------------------------------------
# Through Flower's simulation: silo 2 sends a wrong-shape upload in round 1 and a NaN one in round 2.


@pytest.mark.slow
def test_flower_simulation_refuses_a_wrong_shape_and_a_nan_upload(three, tmp_path, monkeypatch, marked) -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")
    import os

    from flower_helpers import leftovers

    from ldpfl.stage2_federate.flower_engine import protocol

    monkeypatch.setattr(protocol, "CLIENT_APP", "faulty_clientapp:app")  # the app's clientapp component
    tests = str(ROOT / "tests")  # where faulty_clientapp lives, for Flower's processes
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    out = tmp_path / "flower"
    result = run("federate", three, "--engine", "flower", "--rounds", "2", "--hidden", "16", "--local-epochs", "1",
                 "--batch-size", "16", "--device", "cpu", "--seed", "5", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    rounds = json.loads((out / "metrics.json").read_text())["rounds"]
    assert [r["aggregated"] for r in rounds] == [[0, 1], [0, 1]]
    assert [[x["client"] for x in r["rejected"]] for r in rounds] == [[BAD], [BAD]]
    assert "its upload has shape" in rounds[0]["rejected"][0]["reason"]
    assert "not finite" in rounds[1]["rejected"][0]["reason"]
    assert all(math.isfinite(r["test_accuracy"]) and not r["kept_previous_model"] for r in rounds)
    assert [[s["client"] for s in r["per_client"]] for r in rounds] == [[0, 1, 2]] * 2  # its evaluation is fine
    assert leftovers(marked) == []


def _faulty_describe_run(tmp_path, monkeypatch, three, fault: str, *args, forger: int | None = None):
    import os

    from faulty_clientapp import DESCRIBE_FAULT, HISTOGRAM_FORGER

    from ldpfl.stage2_federate.flower_engine import protocol

    monkeypatch.setattr(protocol, "CLIENT_APP", "faulty_clientapp:app")  # the app's clientapp component
    tests = str(ROOT / "tests")  # where faulty_clientapp lives, for Flower's processes
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(DESCRIBE_FAULT, fault)
    if forger is not None:
        monkeypatch.setenv(HISTOGRAM_FORGER, str(forger))
    return run("federate", three, "--engine", "flower", "--rounds", "1", "--hidden", "8", "--local-epochs", "1",
               "--batch-size", "16", "--device", "cpu", "--seed", "5", *args)


FORGER = 4


@pytest.fixture(scope="module")
def five_two_refused(tmp_path_factory) -> Path:
    """Five silos; client 3's file fails its sha256, so the simulation starts nodes for 0-2 and 4 (issue 42 item 4).

    Client :data:`FORGER` holds class 0 only (its honest DP-FedAW weight is the lowest): the test has it claim an
    even histogram, which the manifest's label counts refuse.
    """
    run_dir = write_run(tmp_path_factory.mktemp("five"), clients=5, rows=48, features=8, class_skew={FORGER: 0})
    path = run_dir / "client_003.h5"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "fragment"), [
    ("rows", "client 2: its SuperNode claims 1000000 training rows in client_002.h5, the run's manifest lists 48"),
    ("index", "client 0: its SuperNode serves client_002.h5 (sha256 "),
], ids=["rows", "index"])
def test_flower_simulation_leaves_out_a_silo_whose_claim_is_refused(five_two_refused, tmp_path, monkeypatch, marked,
                                                                    fault, fragment) -> None:
    """Silo 2's and silo 4's claims are refused by the ServerApp, silo 3's file by the launcher: all named.

    Silo 4 claims an even training label histogram (it holds class 0 only): the ServerApp compares it with the
    manifest's label counts, names it and leaves it out, as the local engine does against its labels.
    """
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")
    from faulty_clientapp import even
    from flower_helpers import leftovers

    from ldpfl.contract.manifest import read_manifest

    out = tmp_path / "flower"
    result = _faulty_describe_run(tmp_path, monkeypatch, five_two_refused, fault, "--out", out, forger=FORGER)
    assert result.exit_code == 0, result.output
    refused_file = f"client 3: {five_two_refused / 'client_003.h5'}: sha256 "
    counts = list(next(r for r in read_manifest(five_two_refused).files
                       if r.client_index == FORGER).label_histograms["train"])
    assert counts[0] > 0 and counts[1:] == [0] * (len(counts) - 1)  # class 0 only, as the manifest lists it
    forged = (f"client 4: client_004.h5 claims the training label histogram {even(sum(counts), len(counts))}, the "
              f"run's manifest lists {counts}: the silo's claim is refused (it sets its DP-FedAW weight)")
    for named in (fragment, refused_file, forged):
        assert f"Warning: left out before round 1: {named}" in result.output  # printed as the run starts
        assert any(line.startswith(f"left out before round 1: {named}")  # and in the summary
                   for line in result.output.splitlines())
    metrics = json.loads((out / "metrics.json").read_text())
    left = metrics["config"]["run"]["left_out"]
    assert [(x["client"], x["file"]) for x in left] == [(BAD if fault == "rows" else 0, "client_002.h5"),
                                                        (3, "client_003.h5"), (FORGER, "client_004.h5")]
    assert left[0]["reason"].startswith(fragment)
    assert left[1]["reason"].startswith(refused_file) and left[1]["reason"].endswith(": the silo's file is refused")
    assert left[2]["reason"] == forged
    assert [r["aggregated"] for r in metrics["rounds"]] == [[0, 1]]
    assert [s["client"] for s in metrics["rounds"][0]["per_client"]] == [0, 1]
    assert leftovers(marked) == []


@pytest.mark.slow
def test_flower_simulation_refuses_in_one_line_when_too_few_silos_remain(three, tmp_path, monkeypatch,
                                                                         marked) -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")
    from flower_helpers import leftovers

    result = _faulty_describe_run(tmp_path, monkeypatch, three, "rows", "--out", tmp_path / "few",
                                  "--min-clients-per-round", "3", "--quiet")
    line = one_line_of(result)
    assert line.startswith("Error: the Flower run failed: client 2: its SuperNode claims 1000000 training rows"), line
    assert line.endswith("with the refused left out 2 of 3 silos remain, fewer than the 3 the run needs (two, or "
                         "--min-clients-per-round, --clients-per-round)"), line
    assert not (tmp_path / "few" / "metrics.json").exists()
    assert leftovers(marked) == []


# --------------------------------------------------------------------------------------------------
# Through a real SuperLink deployment on 127.0.0.1 (3 SuperNodes, 2 rounds): every silo misbehaves once
# (tests/faulty_deployment_clientapp.py), then one more submission with an inflated row claim.


@pytest.mark.slow
def test_a_superlink_deployment_names_and_excludes_each_faulty_silo(three, tmp_path, monkeypatch, flower,
                                                                     marked) -> None:
    import os
    import shutil

    from faulty_deployment_clientapp import CLAIMED_ROWS, FAULTS_VARIABLE, FORGED, ROW_CLAIM, SHAPE_NAN
    from flower_helpers import Descendants, leftovers, superlink_with_silos

    from ldpfl.contract.manifest import read_manifest
    from ldpfl.stage2_federate.flower_engine import protocol

    monkeypatch.setattr(protocol, "CLIENT_APP", "faulty_deployment_clientapp:app")  # the app's clientapp component
    tests = str(ROOT / "tests")  # where the faulty app lives, for the SuperNodes' processes
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv(FAULTS_VARIABLE, str(faults))
    coordinator = tmp_path / "coordinator"  # the manifest only: each silo serves its own file
    coordinator.mkdir()
    shutil.copy(three / "manifest.json", coordinator / "manifest.json")
    test_rows = {r.client_index: r.rows["test"] for r in read_manifest(three).files}
    watch = Descendants()
    with superlink_with_silos(tmp_path / "work", [three / f"client_{i:03d}.h5" for i in range(3)]) as (port, _):
        args = ("federate", coordinator, "--engine", "flower", "--superlink", f"127.0.0.1:{port}", "--insecure",
                "--quiet", "--rounds", "2", "--hidden", "16", "--batch-size", "16", "--device", "cpu", "--seed", "5")
        result = run(*args, "--out", tmp_path / "out")
        (faults / "claim-rows").touch()
        claim = run(*args, "--out", tmp_path / "claim", "--min-clients-per-round", "3")
    watch.stop()
    assert result.exit_code == 0, result.output
    rounds = json.loads((tmp_path / "out" / "metrics.json").read_text())["rounds"]
    rejected = [{r["client"]: r["reason"] for r in record["rejected"]} for record in rounds]
    assert sorted(rejected[0]) == [ROW_CLAIM, FORGED, SHAPE_NAN] and sorted(rejected[1]) == [FORGED, SHAPE_NAN]
    assert rejected[0][SHAPE_NAN].startswith("its upload has shape")
    assert rejected[1][SHAPE_NAN].startswith("its upload holds") and "not finite" in rejected[1][SHAPE_NAN]
    assert rejected[0][FORGED] == "its training accuracy 330000000.0 lies outside [0, 1]"
    assert rejected[1][FORGED] == f"its test evaluation claims {test_rows[FORGED] + 7} correct of " \
                                  f"{test_rows[FORGED]} rows"
    assert rejected[0][ROW_CLAIM] == f"its test evaluation covers {CLAIMED_ROWS} rows, its test split holds " \
                                     f"{test_rows[ROW_CLAIM]}"
    assert [r["aggregated"] for r in rounds] == [[ROW_CLAIM], [ROW_CLAIM, FORGED]]
    assert [[s["client"] for s in r["per_client"]] for r in rounds] == [[FORGED, SHAPE_NAN], [ROW_CLAIM, SHAPE_NAN]]
    for record, named in zip(rounds, rejected, strict=True):
        assert all(any(note.startswith(f"client {c}: rejected, ") for note in record["notes"]) for c in named)
        scores = record["per_client"]  # the server's own figures: the union of the accepted, manifest-sized sums
        assert [s["test_rows"] for s in scores] == [test_rows[s["client"]] for s in scores]
        rows = sum(s["test_rows"] for s in scores)
        assert record["test_accuracy"] == pytest.approx(sum(s["test_accuracy"] * s["test_rows"] for s in scores) / rows)
        assert 0.0 <= record["test_accuracy"] <= 1.0 and 0.0 <= record["train_accuracy"] <= 1.0
        assert math.isfinite(record["test_loss"]) and not record["kept_previous_model"]
    line = one_line_of(claim)  # a refused claim leaves the silo out; with --min-clients-per-round 3 too few remain
    assert line == (f"Error: the Flower run failed: client {ROW_CLAIM}: its SuperNode claims {CLAIMED_ROWS} training "
                    f"rows in client_000.h5, the run's manifest lists 48: the silo's claim is refused; with the "
                    f"refused left out 2 of 3 silos remain, fewer than the 3 the run needs (two, or "
                    f"--min-clients-per-round, --clients-per-round)"), line
    assert not (tmp_path / "claim" / "metrics.json").exists()
    assert watch.running() == [] and leftovers(marked) == []


def one_line_of(result) -> str:
    """The one ``Error:`` line of a failed command (exit 1), without a traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]
