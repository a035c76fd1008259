"""One per-record guarantee over everything a client file releases (issue 22 items 1 and 4).

Unit tests compose parts against dp-accounting computed independently here; end-to-end tests export files in
several release modes and check that every dataset and attribute is in the inventory, that values of the clear
records stay out of shared files, and that ``inspect --json`` and the manifest carry the guarantee.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import dp_accounting
import h5py
import pytest
from click.testing import CliRunner
from dp_accounting import pld

from ldpfl import mechanisms
from ldpfl.cli import cli
from ldpfl.contract import inventory
from ldpfl.contract import release_guarantee as rg
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.extractor_training import ExtractorTraining
from ldpfl.contract.label_release import CLEAR_LABELS, KRR_LABELS, LabelRelease
from ldpfl.contract.layout import client_file_name, local_file_name
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.release_history import ReleaseEntry
from ldpfl.mechanisms import privacy_events as ev

SGD_RECORD = {"training": "dp-sgd", "noise_multiplier": 1.1, "sampling_probability": 0.02, "steps": 800, "delta": 1e-5,
              "records": 6300}
SGD = ExtractorTraining.from_json(SGD_RECORD)
NONE = ExtractorTraining.from_json({"training": "none"})


def krr_labels(epsilon: float, k: int) -> LabelRelease:
    """Labels released by k-RR at exactly ``epsilon`` over ``k`` classes."""
    p = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    return LabelRelease(KRR_LABELS, epsilon, epsilon, k, p, (1 - p) / (k - 1))


def independent_pld(events: list, delta: float) -> float:
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(delta)


def test_dp_sgd_with_private_labels_and_scores_equals_dp_accounting() -> None:
    k, label_eps, scores_eps = 10, 1.0, 2.0
    parts = [rg.features_part("hybrid", "scores", scores_eps),
             rg.labels_part(krr_labels(label_eps, k)),
             rg.extractor_part(SGD, trained=True, records=7000, features_epsilon=scores_eps)]
    guarantee = rg.guarantee_of(parts, scope="test")
    sgd = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)), 800)
    krr = dp_accounting.RandomizedResponseDpEvent(k / (math.exp(label_eps) + k - 1), k)
    binary = dp_accounting.RandomizedResponseDpEvent(2 / (math.exp(scores_eps) + 1), 2)
    expected = independent_pld([sgd, krr, binary], 1e-5)
    assert guarantee.method == rg.METHOD_PLD and guarantee.delta == 1e-5 and guarantee.private
    assert guarantee.epsilon == pytest.approx(expected, rel=1e-9)
    assert guarantee.epsilon < sum(p.epsilon for p in parts)  # tighter than basic composition
    assert parts[2].epsilon == pytest.approx(independent_pld([sgd], 1e-5), rel=1e-9)


def test_a_class_released_by_krr_composes_as_krr_tighter_than_binary_rr() -> None:
    k, eps = 10, 1.0
    as_krr = rg.features_part("krr", "label", eps, categories=k)
    assert as_krr.event == ev.RandomizedResponseEvent(eps, k)
    assert as_krr.to_dict()["event"] == {"krr": eps, "num_classes": k}
    labels = rg.labels_part(krr_labels(eps, k))
    extractor = rg.extractor_part(SGD, trained=True, records=7000, features_epsilon=eps)
    tight = rg.guarantee_of([as_krr, labels, extractor], scope="s")
    loose = rg.guarantee_of([rg.features_part("krr", "label", eps), labels, extractor], scope="s")
    sgd = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)), 800)
    krr = dp_accounting.RandomizedResponseDpEvent(k / (math.exp(eps) + k - 1), k)
    assert tight.epsilon == pytest.approx(independent_pld([sgd, krr, krr], 1e-5), rel=1e-9)
    assert tight.epsilon < loose.epsilon


def test_each_part_event_is_a_typed_record_with_one_json_form() -> None:
    parts = [rg.features_part("uer", "flatten", 3.0), rg.features_part("uer", "flatten", None),
             rg.features_part("krr", "label", 1.0, categories=4), rg.features_part("gaussian", "flatten", 2.0, 1e-5),
             rg.labels_part(krr_labels(0.5, 10)), rg.extractor_part(SGD, trained=True, records=7000,
                                                                    features_epsilon=1.0, dp_sgd=lambda e, d: 1.25)]
    events = [p.event for p in parts]
    assert events[:3] == [ev.PureEvent(3.0), ev.PureEvent(math.inf), ev.RandomizedResponseEvent(1.0, 4)]
    assert events[3] is None and events[4] == ev.RandomizedResponseEvent(0.5, 10)
    assert events[5] == mechanisms.accounting.DpSgdEvent(1.1, 0.02, 800)
    assert [p.to_dict()["event"] for p in parts] == [
        {"pure_epsilon": 3.0}, {"pure_epsilon": "inf"}, {"krr": 1.0, "num_classes": 4}, {},
        {"krr": 0.5, "num_classes": 10}, {"noise_multiplier": 1.1, "sampling_probability": 0.02, "steps": 800}]
    for part in parts:
        assert rg.GuaranteePart.from_dict(json.loads(json.dumps(part.to_dict()))) == part
    for bad in ({"krr": 1.0}, {"pure_epsilon": "x"}, {"steps": 3}, [1]):
        with pytest.raises(ValueError, match="event"):
            rg.event_from_json(bad)


def test_a_client_file_reads_its_privacy_attributes_into_records_once() -> None:
    from ldpfl.contract.schema import ClientMetadata, FormatError

    spec = mechanisms.MechanismSpec.from_dict({"name": "krr", "parameters": {"epsilon": 1.0, "categories": 10}})
    report = spec.report()
    guarantee = rg.guarantee_of([rg.features_part("krr", "label", 1.0, categories=10),
                                 rg.labels_part(krr_labels(1.0, 10))], scope="s")
    meta = ClientMetadata(
        dataset="d", num_classes=10, client_index=0, client_count=1, partition={}, extractor="none", input_shape=(10,),
        integer_bits=0, fraction_bits=0, features=10, feature_format="float32", mechanism="krr",
        mechanism_parameters={"epsilon": 1.0, "categories": 10}, privacy_report=report, randomness="seeded",
        label_histograms={"train": [0] * 10, "test": [0] * 10}, release="label", label_release=krr_labels(1.0, 10),
        release_guarantee=guarantee)
    attrs = meta.to_attrs()
    assert attrs["privacy_report"] == json.dumps(report.to_dict(), sort_keys=True)
    assert attrs["label_release"] == json.dumps(krr_labels(1.0, 10).to_json(), sort_keys=True)
    read = ClientMetadata.from_attrs(attrs)
    assert read.privacy_report == report and read.label_release == krr_labels(1.0, 10)
    assert read.release_guarantee == guarantee and rg.stored_or_computed(read, records=3) is read.release_guarantee
    with pytest.raises(FormatError, match="attribute 'label_release' is malformed"):
        ClientMetadata.from_attrs(attrs | {"label_release": json.dumps({"mechanism": "krr"})})
    with pytest.raises(FormatError, match="attribute 'release_guarantee' is not a JSON object"):
        ClientMetadata.from_attrs(attrs | {"release_guarantee": "[]"})


def test_pure_parts_add_and_an_open_part_makes_it_infinite() -> None:
    krr = krr_labels(1.5, 10)
    pure = rg.guarantee_of([rg.features_part("krr", "label", 2.0), rg.labels_part(krr)], scope="s")
    assert (pure.epsilon, pure.delta, pure.method) == (3.5, 0.0, rg.METHOD_BASIC)
    clear = rg.guarantee_of([rg.features_part("uer", "flatten", 39245.4), rg.labels_part(CLEAR_LABELS)], scope="s")
    assert clear.epsilon == math.inf and not clear.private
    assert clear.headline() == "release guarantee: epsilon = inf per record (not private: labels)"
    assert rg.ReleaseGuarantee.from_dict(json.loads(json.dumps(pure.to_dict()))) == pure


def test_a_non_private_extractor_is_bounded_by_group_privacy_only() -> None:
    n, features_eps, label_eps = 100, 3.0, 1.0
    parts = [rg.features_part("uer", "flatten", features_eps),
             rg.labels_part(krr_labels(label_eps, 10)),
             rg.extractor_part(None, trained=True, records=n, features_epsilon=features_eps)]
    assert rg.guarantee_of(parts, scope="s").epsilon == pytest.approx(n * features_eps + label_eps)
    assert rg.extractor_part(None, trained=False, records=n, features_epsilon=features_eps) is None
    assert rg.extractor_part(NONE, trained=True, records=n, features_epsilon=1.0) is None


def test_re_releases_add_their_values_and_labels_and_widen_the_group_bound() -> None:
    class Meta:
        privacy_report = SimpleNamespace(exact_epsilon_per_record=2.0, exact_delta=0.0)
        mechanism, release, extractor = "hybrid", "scores", "mnist-cnn"
        label_release = krr_labels(1.0, 10)
        release_guarantee = None

        def training(self) -> ExtractorTraining:
            return ExtractorTraining.from_json({"training": "non-private", "records": 10})

    earlier = [ReleaseEntry("r", "client_000.h5", None, "krr", "flatten", 3.0, label_release=krr_labels(0.5, 10))]
    parts = rg.file_parts(Meta(), records=10, history=earlier)
    by_kind = {p.kind: p.epsilon for p in parts}
    assert by_kind["re-release"] == 3.5 and by_kind["extractor"] == pytest.approx(9 * (2.0 + 3.0))
    assert rg.guarantee_of(parts, scope="s").epsilon == pytest.approx(2.0 + 1.0 + 45.0 + 3.5)


# ----------------------------------------------------------------------------------------------------
# Files as exported


def export(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["export", "--dataset", "digits", "--extractor", "none", "--clients", "2",
                                      "--seed", "3", "--quiet", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("args", [
    ("--mechanism", "uer", "--epsilon", "0.5"),
    ("--mechanism", "rr", "--epsilon", "4", "--keep-clean-test"),
    ("--mechanism", "uer", "--epsilon", "2", "--store-input-density"),
    ("--mechanism", "none",),
])
def test_every_value_of_a_shared_file_is_in_the_inventory(tmp_path: Path, args: tuple[str, ...]) -> None:
    run = export(tmp_path, "run", *args)
    for index in range(2):
        with h5py.File(run / client_file_name(index), "r") as handle:
            assert inventory.unclassified(handle) == []
            assert math.isnan(handle.attrs["local_accuracy"])  # a statistic of clear records: never shared
            stored = json.loads(handle.attrs["release_guarantee"])
        data = read_client_file(run / client_file_name(index))
        recomputed = rg.file_guarantee(data.metadata, records=sum(len(v) for v in data.labels.values()),
                                       diagnostic="--store-input-density" in args)
        assert rg.ReleaseGuarantee.from_dict(stored) == recomputed
        assert stored["epsilon"] == "inf"  # the labels are in clear
        assert {p["kind"] for p in stored["parts"]} >= {"features", "labels"}
        assert "extractor" not in {p["kind"] for p in stored["parts"]}  # raw inputs: no trained extractor
    if "--keep-clean-test" in args:
        assert read_client_file(run / local_file_name(0)).metadata.local_only


def test_an_unknown_attribute_is_reported_by_the_inventory_and_inspect(tmp_path: Path) -> None:
    run = export(tmp_path, "run", "--mechanism", "uer", "--epsilon", "1")
    with h5py.File(run / client_file_name(0), "r+") as handle:
        handle.attrs["mean_age"] = 41.5
        handle["train"].attrs["note"] = "x"
        assert inventory.unclassified(handle) == ["attribute 'mean_age'", "attribute 'note' of 'train'"]
    result = CliRunner().invoke(cli, ["inspect", str(run / client_file_name(0)), "--json"])
    flags = json.loads(result.stdout)["files"][0]["flags"]
    assert any("'mean_age' is not in the inventory" in flag for flag in flags)


def test_inspect_json_and_the_manifest_carry_the_guarantee(tmp_path: Path) -> None:
    run = export(tmp_path, "run", "--mechanism", "uer", "--epsilon", "0.5")
    result = CliRunner().invoke(cli, ["inspect", str(run), "--json"])
    report = json.loads(result.stdout)
    for file in report["files"]:
        assert file["release_guarantee"]["epsilon"] == "inf" and not file["release_guarantee"]["private"]
    manifest = read_manifest(run)
    assert set(manifest.info["release_guarantee"]) == {"client_000", "client_001"}
    text = CliRunner().invoke(cli, ["inspect", str(run / client_file_name(0))]).stdout.splitlines()
    assert text[1].startswith("release guarantee: epsilon = inf per record")  # text leads with it
    uer = mechanisms.create_mechanism("uer", epsilon=0.5, alpha=10, features=64).report()
    assert report["files"][0]["release_guarantee"]["parts"][0]["epsilon"] == pytest.approx(
        uer.exact_epsilon_per_record, rel=1e-9)


@pytest.mark.slow
def test_cnn_releases_and_a_re_release_are_all_covered(tmp_path: Path) -> None:
    tiny = ["--dataset", "mnist5k", "--limit", "120", "--clients", "2", "--epochs", "1", "--batch-size", "32",
            "--no-augment", "--quiet", "--seed", "7"]
    first, second = tmp_path / "scores", tmp_path / "label"
    for args in ([*tiny, "--release", "scores", "--mechanism", "hybrid", "--epsilon", "4", "--save-models",
                  "--out", str(first)],
                 ["--from-models", str(first), "--release", "label", "--mechanism", "krr", "--epsilon", "2",
                  "--quiet", "--out", str(second)]):
        result = CliRunner().invoke(cli, ["export", *args])
        assert result.exit_code == 0, result.output
    for run, kinds in ((first, {"features", "labels", "extractor"}),
                       (second, {"features", "labels", "extractor", "re-release"})):
        with h5py.File(run / client_file_name(0), "r") as handle:
            assert inventory.unclassified(handle) == []
            parts = json.loads(handle.attrs["release_guarantee"])["parts"]
        assert {p["kind"] for p in parts} == kinds
        extractor = next(p for p in parts if p["kind"] == "extractor")
        assert extractor["mechanism"] == "non-private training" and extractor["epsilon"] != "inf"
    relabel = {p["kind"]: p for p in parts}
    assert relabel["re-release"]["epsilon"] == "inf"  # the first release's labels were in clear
    assert relabel["features"]["epsilon"] == pytest.approx(2.0, rel=1e-6)


def test_private_labels_and_raw_features_give_a_finite_sum(tmp_path: Path) -> None:
    run = export(tmp_path, "run", "--mechanism", "rr", "--epsilon", "0.1", "--label-epsilon", "1.5")
    report = json.loads(CliRunner().invoke(cli, ["inspect", str(run), "--json"]).stdout)
    guarantee = report["files"][0]["release_guarantee"]
    parts = {p["kind"]: p for p in guarantee["parts"]}
    assert set(parts) == {"features", "labels"} and guarantee["private"] and guarantee["delta"] == 0.0
    assert parts["labels"]["mechanism"] == "krr" and parts["labels"]["epsilon"] == pytest.approx(1.5, rel=1e-6)
    assert guarantee["epsilon"] == pytest.approx(parts["features"]["epsilon"] + parts["labels"]["epsilon"])
    assert read_manifest(run).info["release_guarantee"]["client_000"]["epsilon"] == guarantee["epsilon"]


# The DP extractor with private labels (one DP-SGD export, shared): tests/e2e/test_dp_extractor.py.
