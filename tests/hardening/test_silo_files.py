"""Issue 42 items 3-4, the files' side: the manifest lists each file's label counts, and a silo whose file does not
verify is left out of a local run and named. Client 2 of 3 is the faulty silo.

* The manifest's entry of a client file carries the file's ``label_histograms`` (the counts the file already
  releases): a Flower coordinator checks a SuperNode's claimed histogram against them; an older manifest without
  them still reads (its claims are then capped, ``label_claims``). ``gather`` lists them, recounted by ``--dedupe``.
* On the local engine a file whose sha256, structure, rows, label counts or index fail validation leaves its silo
  out (named) while enough remain; ``gather`` and ``inspect`` stay strict.
* ``inspect`` of a federation shows the silos left out, the label-claim cap and the pooled-figure flags.
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

from hardening.test_duplicate_records import repeat_records, silos_of
from hardening.test_faulty_silo import BAD, CONFIG, faulty, federate_with
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.gather import gather_runs
from ldpfl.contract.layout import MANIFEST_NAME, client_file_name
from ldpfl.contract.manifest import FileRecord, read_manifest, record_for, write_manifest
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import FormatError, label_histogram
from ldpfl.stage1_features.export.manifest import with_file_histograms
from ldpfl.stage2_federate import label_claims
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.left_out import TooFewSilosError
from ldpfl.stage2_federate.plan import plan_federation
from ldpfl.stage2_federate.round_record import ClientEvaluation, SplitSums


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("files") / "run", clients=3, rows=48, features=8)


def stated(path: Path) -> dict[str, list[int]]:
    """The label counts a client file's attribute states."""
    with h5py.File(path) as handle:
        return json.loads(handle.attrs["label_histograms"])


def edit_manifest(run_dir: Path, edit) -> Path:
    """Rewrite ``run_dir``'s manifest.json as ``edit`` (called on each file entry) changes it."""
    path = run_dir / MANIFEST_NAME
    raw = json.loads(path.read_text())
    for entry in raw["files"]:
        edit(entry)
    path.write_text(json.dumps(raw))
    return run_dir


def older(run_dir: Path, target: Path) -> Path:
    """A copy of ``run_dir`` whose manifest was written before the label counts were listed."""
    shutil.copytree(run_dir, target)
    return edit_manifest(target, lambda entry: entry.pop("label_histograms"))


# --------------------------------------------------------------------------------------------------
# The manifest lists each file's label counts.


def test_the_manifest_lists_each_files_label_counts_as_its_attribute_states(three) -> None:
    raw = json.loads((three / MANIFEST_NAME).read_text())["files"]
    for entry, record in zip(raw, read_manifest(three).files, strict=True):
        counts = stated(three / record.path)
        assert entry["label_histograms"] == counts and record.label_histograms == counts
        assert {s: sum(h) for s, h in counts.items()} == record.rows  # one count per released label
    record = read_manifest(three).files[BAD]
    assert record_for(three / record.path, BAD, record.sha256, record.rows) == record


def test_an_older_manifest_without_label_counts_reads_validates_and_checks_nothing(three, tmp_path) -> None:
    from ldpfl.stage2_federate.flower_engine.protocol import ManifestEntry

    run_dir = older(three, tmp_path / "old")
    manifest, checked = validate_run(run_dir)
    assert len(checked) == 3 and all(r.label_histograms is None for r in manifest.files)
    assert all(ManifestEntry.of(r).train_labels is None for r in manifest.files)
    write_manifest(run_dir, manifest.files, {})  # rewritten, it still lists none (no null key)
    assert all("label_histograms" not in e for e in json.loads((run_dir / MANIFEST_NAME).read_text())["files"])
    kept = with_file_histograms(run_dir, manifest.files[BAD])  # an export resumed over it lists them again
    assert kept.label_histograms == stated(run_dir / client_file_name(BAD))
    assert kept.sha256 == manifest.files[BAD].sha256


def test_label_counts_the_file_does_not_state_are_refused(three, tmp_path) -> None:
    def shift(entry):
        if entry["client_index"] == 1:
            train = entry["label_histograms"]["train"]
            train[0], train[1] = train[0] + 1, train[1] - 1  # adds up to its rows: only the file says no

    run_dir = edit_manifest(shutil.copytree(three, tmp_path / "shifted"), shift)
    with pytest.raises(FormatError, match=r"client_001\.h5: label histograms \{.*\} differ from the manifest's"):
        validate_run(run_dir)
    for bad in ({"train": [-1, 2, 0, 0]}, {"train": [1.5]}, {"valid": [1]}, [1, 2]):
        edit_manifest(run_dir, lambda entry, bad=bad: entry.__setitem__("label_histograms", bad))
        with pytest.raises(FormatError, match="malformed file entry .*'label_histograms'"):
            read_manifest(run_dir)


def test_the_flower_check_refuses_a_claim_the_exported_manifest_does_not_list(three, tmp_path) -> None:
    from ldpfl.stage2_federate.flower_engine import client_side as cs
    from ldpfl.stage2_federate.flower_engine.deployment import coordinator_run
    from ldpfl.stage2_federate.flower_engine.server_side import manifest_refusal

    summaries = [cs.summarize(cs.open_client(three / client_file_name(i), torch.device("cpu"))) for i in range(3)]
    listed = {e.index: e for e in coordinator_run(three).files}
    assert [listed[i].train_labels for i in range(3)] == [tuple(s.label_histogram) for s in summaries]
    assert [manifest_refusal(s, listed) for s in summaries] == [None] * 3
    honest = summaries[BAD].label_histogram
    claimed = (sum(honest), *[0] * (len(honest) - 1))
    liar = dataclasses.replace(summaries[BAD], label_histogram=claimed)
    assert manifest_refusal(liar, listed) == (
        f"client 2: client_002.h5 claims the training label histogram {list(claimed)}, the run's manifest lists "
        f"{list(honest)}: the silo's claim is refused (it sets its DP-FedAW weight)")
    unlisted = {e.index: e for e in coordinator_run(older(three, tmp_path / "old")).files}
    assert manifest_refusal(liar, unlisted) is None  # nothing to check it against: capped instead (label_claims)


def test_gather_lists_every_files_label_counts_and_dedupe_recounts_them(tmp_path) -> None:
    run_dir = write_run(tmp_path / "all", clients=3, rows=40)
    repeat_records(run_dir, BAD)
    silos = silos_of(run_dir, tmp_path / "silos")
    edit_manifest(silos[1], lambda entry: entry.pop("label_histograms"))  # silo 1 exported before the counts
    sent = read_manifest(silos[BAD]).files[0].label_histograms
    gather_runs(silos, tmp_path / "run", dedupe=True)
    manifest, _ = validate_run(tmp_path / "run")
    for record in manifest.files:
        assert record.label_histograms == stated(tmp_path / "run" / record.path)
    kept = read_client_file(tmp_path / "run" / client_file_name(BAD))
    assert manifest.files[BAD].label_histograms["train"] == label_histogram(kept.labels["train"], 4) != sent["train"]


# --------------------------------------------------------------------------------------------------
# The local engine leaves out a silo whose file does not verify.


def _resign(run_dir: Path, index: int) -> None:
    """List client ``index``'s file as it now is (sha256 and size), as a silo re-exporting it would."""
    path = run_dir / client_file_name(index)
    manifest = read_manifest(run_dir)
    files = [dataclasses.replace(r, sha256=sha256_file(path), bytes=path.stat().st_size) if r.client_index == index
             else r for r in manifest.files]
    write_manifest(run_dir, files, manifest.info)


def _flip_byte(run_dir: Path) -> None:
    path = run_dir / client_file_name(BAD)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(run_dir: Path) -> None:
    path = run_dir / client_file_name(BAD)
    path.write_bytes(path.read_bytes()[:1000])
    _resign(run_dir, BAD)


def _index(run_dir: Path) -> None:
    with h5py.File(run_dir / client_file_name(BAD), "r+") as handle:
        handle.attrs["client_index"] = 1  # claims another silo's index
    _resign(run_dir, BAD)


def _rows(run_dir: Path) -> None:
    edit_manifest(run_dir, lambda e: e["rows"].__setitem__("test", e["rows"]["test"] + 1) if e["client_index"] == BAD
                  else None)


FAULTS = {
    "sha256": (_flip_byte, "does not match the manifest's"),
    "missing": (lambda d: (d / client_file_name(BAD)).unlink(), "listed in the manifest but missing"),
    "truncated": (_truncate, "not a readable HDF5 file"),
    "index": (_index, "attribute 'client_index' is 1 but the manifest lists this file as client 2"),
    "rows": (_rows, "differ from the manifest's"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_silo_whose_file_fails_validation_is_left_out_and_named(three, tmp_path, fault) -> None:
    spoil, fragment = FAULTS[fault]
    run_dir = shutil.copytree(three, tmp_path / "run")
    spoil(run_dir)
    with pytest.raises(ValueError, match=r"client_002\.h5|client indices \[1\] appear"):  # gather's stays strict
        validate_run(run_dir)
    plan = plan_federation(run_dir, FederationConfig(**CONFIG))
    assert [c.index for c in plan.data.clients] == [0, 1] and plan.record["run"]["clients"] == 2
    (left,) = plan.record["run"]["left_out"]
    assert (left["client"], left["file"]) == (BAD, "client_002.h5")
    assert left["reason"].startswith(f"client 2: {run_dir / 'client_002.h5'}: ") and fragment in left["reason"]
    assert left["reason"].endswith(": the silo's file is refused")
    with pytest.raises(TooFewSilosError, match=r"2 of 3 silos remain, fewer than the 3 the run needs"):
        plan_federation(run_dir, FederationConfig(**CONFIG), min_clients=3)


def test_a_local_run_goes_on_without_the_silo_and_gather_and_inspect_stay_strict(three, tmp_path) -> None:
    run_dir = shutil.copytree(three, tmp_path / "run")
    _flip_byte(run_dir)
    fast = ("--rounds", "1", "--hidden", "8", "--threads", "1", "--seed", "5")
    shown = run("federate", run_dir, *fast, "--out", tmp_path / "o")
    assert shown.exit_code == 0, shown.output
    assert "Warning: left out before round 1: client 2: " in shown.stderr and "sha256" in shown.stderr
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert [x["client"] for x in metrics["config"]["run"]["left_out"]] == [BAD]
    assert [r["aggregated"] for r in metrics["rounds"]] == [[0, 1]]
    line = one_error_line(run("federate", run_dir, *fast, "--min-clients-per-round", "3", "--out", tmp_path / "x"))
    assert line.startswith(f"Error: client 2: {run_dir / 'client_002.h5'}: sha256 ") and line.endswith(
        "with the refused left out 2 of 3 silos remain, fewer than the 3 the run needs (two, or "
        "--min-clients-per-round, --clients-per-round)")
    assert not (tmp_path / "x" / "metrics.json").exists()
    line = one_error_line(run("gather", run_dir, "--out", tmp_path / "g"))
    assert "client_002.h5" in line and "sha256" in line and not (tmp_path / "g").exists()
    inspected = run("inspect", run_dir)
    assert inspected.exit_code == 1 and "BAD" in inspected.output


# --------------------------------------------------------------------------------------------------
# inspect of a federation shows what the coordinator found about its silos.


def test_inspect_shows_the_left_out_silo_the_label_claim_cap_and_the_pooled_figure_flag(three, tmp_path,
                                                                                      monkeypatch) -> None:
    run_dir = shutil.copytree(three, tmp_path / "run")
    records = read_manifest(run_dir).files
    write_manifest(run_dir, [*records, FileRecord(3, "client_003.h5", records[0].sha256, records[0].bytes,
                                                  dict(records[0].rows))], read_manifest(run_dir).info)
    shutil.copyfile(run_dir / "client_000.h5", run_dir / "client_003.h5")  # index 0's file listed as client 3
    perfect = faulty(spoil_sums=lambda e: ClientEvaluation(e.client, SplitSums(0.0, e.test.rows, e.test.rows)))
    result, _ = federate_with(monkeypatch, run_dir, run_dir / "federation", perfect, rounds=1)
    assert result.to_dict()["pooled_figure_flags"]
    # the local engine counts every silo's labels; a Flower coordinator without label counts caps them, as here
    metrics_path = run_dir / "federation" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    _, cap = label_claims.cap_unchecked({0: 0.756, 1: 0.756, 2: 0.975}, {0, 1, 2})
    metrics["config"]["label_claims"] = cap.to_dict()
    metrics_path.write_text(json.dumps(metrics))
    shown = run("inspect", run_dir)
    lines = shown.output.splitlines()
    left = next(x for x in lines if "left out before round 1" in x)
    assert left.startswith("  ! federation  silo 3 (client_003.h5) left out before round 1: client 3: ")
    assert "attribute 'client_index' is 0 but the manifest lists this file as client 3" in left
    cap = next(x for x in lines if "label histograms:" in x)
    assert cap == ("  ! federation  label histograms: 3 unchecked (the manifest listed no label counts); DP-FedAW "
                   "similarity capped at 0.832, 1.1 times the median similarity g of the run's silos: capped silo 2 "
                   "(claimed 0.975)")
    flag = next(x for x in lines if "pooled figure:" in x)
    assert flag.startswith("  ! federation  pooled figure: silo 2 scores 1.0000 on its own 24 test rows")
    fed = json.loads(run("inspect", run_dir, "--json").output)["federation"]
    assert fed["label_claims"] == metrics["config"]["label_claims"]
    assert fed["pooled_figure_flags"] == metrics["pooled_figure_flags"]
    assert fed["left_out"] == metrics["config"]["run"]["left_out"]


def test_inspect_leaves_out_a_malformed_section_and_shows_none_for_a_clean_run(three, tmp_path) -> None:
    from ldpfl.inspection.silo_findings import SiloFindings, read_silo_findings

    assert read_silo_findings({"rounds": []}) == SiloFindings()
    assert SiloFindings().lines() == [] and SiloFindings().to_dict() == {
        "left_out": [], "label_claims": None, "pooled_figure_flags": []}
    forged = {"config": {"label_claims": {"unchecked": [0], "cap": "high", "cap_rule": "x", "capped": []},
                         "run": {"left_out": [{"client": "2", "file": "f", "reason": "r"}]}},
              "pooled_figure_flags": [{"client": 1}]}
    assert read_silo_findings(forged) == SiloFindings()
    long = {"config": {"run": {"left_out": [{"client": 2, "file": "f.h5", "reason": "a\nb" + "x" * 1000}]}}}
    (silo,) = read_silo_findings(long).left_out
    assert silo.reason.startswith("a b") and len(silo.reason) == 400
