"""Private labels (issue 22 item 2): ``ldpfl export --label-epsilon`` and stage 2's loss corrections.

Statistical checks use fixed seeds and tolerances of Z_TOL binomial/normal standard errors.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from cli_checks import one_error_line, run
from test_plan import make_plan

from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.label_release import (
    CLEAR_LABELS,
    LabelReleaseError,
    check_label_release,
    composed_epsilon,
    krr_label_release,
    label_mechanism,
    transition_matrix,
)
from ldpfl.contract.layout import PARTITION_FILE
from ldpfl.contract.plan import SharedPlan
from ldpfl.mechanisms.base import ParameterError
from ldpfl.mechanisms.krr import KRR
from ldpfl.stage1_features.datasets import load_dataset
from ldpfl.stage1_features.export import run_export
from ldpfl.stage1_features.export_config import ExportConfig

Z_TOL = 4.5
K = 10
QUICK = {"dataset": "mnist5k", "extractor": "none", "mechanism": "pdpm", "clients": 2,
         "mechanism_params": {"epsilon": 2.0, "safe_range_length": 2.0}}


def export(out, **changes):
    return run_export(ExportConfig(**{**QUICK, **changes}), out, progress=False)


def files_of(out):
    return [read_client_file(out / f"client_00{i}.h5") for i in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same seeded export with clear labels and with k-RR labels at ε = 1 (1,600 records, raw pixels)."""
    base = tmp_path_factory.mktemp("labels")
    export(base / "clear", limit=1600, seed=11)
    export(base / "krr", limit=1600, seed=11, label_epsilon=1.0, keep_clean_test=True)
    return base / "clear", base / "krr"


def true_labels(out, client):
    y = load_dataset("mnist5k").y
    with np.load(out / PARTITION_FILE) as partition:
        return {s: y[partition[f"client_{client:03d}_{s}"]] for s in ("train", "test")}


# ----------------------------------------------------------------------------------------------------
# Stage 1: what the file holds


def test_labels_agree_with_the_truth_at_the_krr_keep_rate(runs):
    _, out = runs
    keep = math.exp(1.0) / (math.exp(1.0) + K - 1)  # k-RR: e^ε / (e^ε + k - 1)
    same = total = 0
    for client, data in enumerate(files_of(out)):
        truth = true_labels(out, client)
        for split in ("train", "test"):
            same += int(np.sum(data.labels[split] == truth[split]))
            total += truth[split].size
    se = math.sqrt(keep * (1 - keep) / total)
    assert total == 1600 and abs(same / total - keep) < Z_TOL * se, (same / total, keep, se)


def test_label_release_attribute_is_the_krr_report(runs):
    _, out = runs
    krr = KRR(epsilon=1.0, categories=K)
    for data in files_of(out):
        release = data.metadata.label_release
        assert release == {"mechanism": "krr", "epsilon": krr.report().exact_epsilon_per_record,
                           "nominal_epsilon": 1.0, "num_classes": K, "p_keep": krr.p_keep,
                           "p_other_each": krr.p_other}
        assert math.isclose(release["epsilon"], math.log(release["p_keep"] / release["p_other_each"]))
        assert any("their epsilons add" in note for note in data.metadata.privacy_report["notes"])


def test_histograms_count_the_released_labels_only(runs):
    _, out = runs
    for client, data in enumerate(files_of(out)):
        truth = true_labels(out, client)
        for split in ("train", "test"):
            assert data.metadata.label_histograms[split] == np.bincount(data.labels[split], minlength=K).tolist()
        # 720 labels at a keep rate of 0.23: the histogram of the truth is another one
        assert data.metadata.label_histograms["train"] != np.bincount(truth["train"], minlength=K).tolist()


def test_the_local_only_file_keeps_the_true_test_labels(runs):
    _, out = runs
    truth = true_labels(out, 0)["test"]
    local = read_client_file(out / "client_000.local.h5")
    assert local.metadata.local_only and local.metadata.label_release == CLEAR_LABELS
    assert np.array_equal(local.labels["test"], truth)
    assert local.metadata.label_histograms["test"] == np.bincount(truth, minlength=K).tolist()


def test_clear_labels_are_the_truth_and_the_features_do_not_depend_on_the_label_stream(runs):
    clear, noisy = runs
    for client, (a, b) in enumerate(zip(files_of(clear), files_of(noisy), strict=True)):
        assert a.metadata.label_release == CLEAR_LABELS
        truth = true_labels(clear, client)
        for split in ("train", "test"):
            assert np.array_equal(a.labels[split], truth[split])
            assert np.array_equal(a.features[split], b.features[split])  # labels draw from their own child


def test_seeded_exports_without_the_flag_are_identical(tmp_path):
    """Two seeded exports with clear labels hold the same bytes in every dataset and every attribute but the time."""
    a, b = (files_of(export(tmp_path / name, limit=200, seed=5).run_dir) for name in ("a", "b"))
    for x, y in zip(a, b, strict=True):
        for split in ("train", "test"):
            assert x.features[split].tobytes() == y.features[split].tobytes()
            assert x.labels[split].tobytes() == y.labels[split].tobytes()
        assert dataclasses.replace(x.metadata, created_utc="") == dataclasses.replace(y.metadata, created_utc="")


def test_different_seeds_draw_different_labels(tmp_path):
    a = export(tmp_path / "a", limit=400, seed=1, label_epsilon=1.0)
    b = export(tmp_path / "b", limit=400, seed=2, label_epsilon=1.0)
    assert a.clients[0].sha256 != b.clients[0].sha256


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "501"])
def test_bad_label_epsilon_is_one_line_exit_2_and_writes_nothing(tmp_path, value):
    out = tmp_path / "run"
    line = one_error_line(run("export", "--extractor", "none", "--limit", "100", "--quiet", "--out", out,
                              "--label-epsilon", value))
    assert "--label-epsilon" in line
    assert not out.exists() or not any(p.name.startswith("client_") for p in out.iterdir())


def test_export_config_names_label_epsilon():
    for bad in (0, -1.0, math.nan, math.inf, 501.0, "2", True):
        with pytest.raises(ParameterError, match="label_epsilon"):
            ExportConfig(label_epsilon=bad)
    assert ExportConfig(label_epsilon=2).label_epsilon == 2.0


# ----------------------------------------------------------------------------------------------------
# The attribute, the plan, composition


def test_transition_matrix_is_the_sampled_krr():
    krr = label_mechanism(2.0, 4)
    matrix = transition_matrix(krr_label_release(krr))
    assert matrix.shape == (4, 4) and np.allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(np.diag(matrix) == krr.p_keep) and matrix[0, 1] == krr.p_other
    assert transition_matrix(None) is None and transition_matrix(CLEAR_LABELS) is None
    bad = krr_label_release(krr) | {"epsilon": 3.0}
    with pytest.raises(LabelReleaseError, match="epsilon"):
        check_label_release(bad)
    with pytest.raises(LabelReleaseError, match="p_keep"):
        check_label_release(krr_label_release(krr) | {"p_keep": 0.9})


def test_composition_adds_the_two_epsilons():
    labels = krr_label_release(label_mechanism(1.0, K))
    total = composed_epsilon(2.0, labels)
    assert total["epsilon"] == pytest.approx(2.0 + labels["epsilon"])
    assert [p["covers"] for p in total["parts"]] == ["features", "labels"]
    assert composed_epsilon(2.0, CLEAR_LABELS)["epsilon"] == math.inf


def test_plan_carries_label_epsilon_and_keeps_old_fingerprints(tmp_path):
    clear = make_plan()
    assert "label_epsilon" not in clear.to_dict()
    private = make_plan(label_epsilon=2)
    assert private.to_dict()["label_epsilon"] == 2.0 and private.fingerprint != clear.fingerprint
    assert SharedPlan.from_dict(json.loads(json.dumps(private.to_dict()))) == private
    assert private.contradictions({"label_epsilon": 3.0}) and not private.contradictions({"label_epsilon": 2.0})
    assert clear.contradictions({"label_epsilon": 2.0})
    with pytest.raises(ValueError, match="label_epsilon"):
        make_plan(label_epsilon=-1.0)
