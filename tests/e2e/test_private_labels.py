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
from plan_files import make_plan

from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.label_release import (
    CLEAR_LABELS,
    LabelRelease,
    LabelReleaseError,
    label_mechanism,
)
from ldpfl.contract.layout import PARTITION_FILE
from ldpfl.contract.plan import SharedPlan
from ldpfl.mechanisms.krr import KRR
from ldpfl.stage1_features.datasets.loaders import load_dataset
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.run import run_export

Z_TOL = 4.5


def _matrix(value):
    """T of a label release in any of its forms (the record, its JSON, None for clear labels)."""
    return LabelRelease.from_json(value).transition_matrix()
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
        assert release == LabelRelease.krr(krr)
        assert release.to_json() == {"mechanism": "krr", "epsilon": krr.report().exact_epsilon_per_record,
                                     "nominal_epsilon": 1.0, "num_classes": K, "p_keep": krr.p_keep,
                                     "p_other_each": krr.p_other}
        assert math.isclose(release.epsilon, math.log(release.p_keep / release.p_other_each))
        assert any("their epsilons add" in note for note in data.metadata.privacy_report.notes)


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
    matrix = _matrix(LabelRelease.krr(krr).to_json())
    assert matrix.shape == (4, 4) and np.allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(np.diag(matrix) == krr.p_keep) and matrix[0, 1] == krr.p_other
    assert _matrix(None) is None and _matrix(CLEAR_LABELS) is None
    bad = LabelRelease.krr(krr).to_json() | {"epsilon": 3.0}
    with pytest.raises(LabelReleaseError, match="epsilon"):
        LabelRelease.from_json(bad)
    with pytest.raises(LabelReleaseError, match="p_keep"):
        LabelRelease.from_json(LabelRelease.krr(krr).to_json() | {"p_keep": 0.9})


def test_label_release_is_one_frozen_record_with_one_json_form():
    krr = label_mechanism(2.0, 4)
    release = LabelRelease.for_epsilon(2.0, 4)
    assert release == LabelRelease.krr(krr) and not release.clear and release.epsilon < math.inf
    attribute = {"mechanism": "krr", "epsilon": krr.report().exact_epsilon_per_record, "nominal_epsilon": 2.0,
                 "num_classes": 4, "p_keep": krr.p_keep, "p_other_each": krr.p_other}
    assert json.dumps(release.to_json(), sort_keys=True) == json.dumps(attribute, sort_keys=True)
    assert LabelRelease.from_json(json.loads(json.dumps(release.to_json()))) == release
    assert LabelRelease.from_json(None) is CLEAR_LABELS and CLEAR_LABELS.clear and CLEAR_LABELS.epsilon == math.inf
    assert LabelRelease.from_json({"mechanism": "clear"}) == CLEAR_LABELS == LabelRelease.for_epsilon(None, 4)
    assert CLEAR_LABELS.to_json() == {"mechanism": "clear"} and CLEAR_LABELS.transition_matrix() is None
    assert np.array_equal(release.transition_matrix(), _matrix(LabelRelease.krr(krr).to_json()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        release.epsilon = 1.0  # type: ignore[misc]
    for bad, key in ((LabelRelease.krr(krr).to_json() | {"epsilon": 3.0}, "epsilon"), ([1], "JSON object"),
                     ({"mechanism": "rr"}, "mechanism"), ({"mechanism": "krr"}, "epsilon")):
        with pytest.raises(LabelReleaseError, match=key):
            LabelRelease.from_json(bad)


def test_composition_adds_the_two_epsilons():
    labels = LabelRelease.krr(label_mechanism(1.0, K)).to_json()
    total = LabelRelease.from_json(labels).composed_epsilon(2.0)
    assert total["epsilon"] == pytest.approx(2.0 + labels["epsilon"])
    assert [p["covers"] for p in total["parts"]] == ["features", "labels"]
    assert LabelRelease.from_json(CLEAR_LABELS).composed_epsilon(2.0)["epsilon"] == math.inf


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


# ----------------------------------------------------------------------------------------------------
# Stage 2: the corrections of Patrini et al. 2017


def noisy_draws(krr, true_label, n, seed):
    return krr.randomize_labels(np.full(n, true_label, dtype=np.int64), rng=np.random.default_rng(seed))


def noise_of(correction, epsilon=1.0, k=K):
    from ldpfl.stage2_federate.label_noise import resolve_label_noise

    return resolve_label_noise(correction, [("f", LabelRelease.krr(label_mechanism(epsilon, k)))])


def test_backward_correction_is_unbiased_for_the_clean_loss():
    """E over the k-RR noise of (T⁻¹ ℓ(z))_ỹ = ℓ_y(z), the clean cross-entropy (Patrini Thm 1): mean within Z_TOL SE."""
    import torch

    from ldpfl.stage2_federate.label_noise import label_loss

    noise = noise_of("backward", epsilon=1.0)
    krr = label_mechanism(1.0, K)
    logits = torch.tensor(np.random.default_rng(3).normal(0.0, 2.0, size=(1, K)))
    n = 200_000
    for y in (0, 7):
        noisy = torch.from_numpy(noisy_draws(krr, y, n, seed=y))
        corrected = label_loss(logits.expand(n, K), noisy, noise, reduction="none").numpy()
        clean = float(torch.nn.functional.cross_entropy(logits, torch.tensor([y])))
        se = corrected.std(ddof=1) / math.sqrt(n)
        assert abs(corrected.mean() - clean) < Z_TOL * se, (corrected.mean(), clean, se)
    # the exact expectation, Σ_j T[y, j] ℓ←_j, is the clean loss for every y (no sampling)
    every = label_loss(logits.expand(K, K), torch.arange(K), noise, reduction="none").numpy()
    clean_all = -torch.log_softmax(logits, dim=1).numpy()[0]
    assert np.allclose(noise.matrix() @ every, clean_all, atol=1e-9)


def test_forward_correction_is_minimized_by_the_clean_posterior_but_biased():
    """At z = ln η (the clean posterior) the forward loss's gradient has mean 0 over noisy draws; elsewhere not.

    y ~ η, ỹ = k-RR(y): the per-sample gradients of CE(Tᵀ softmax(z), ỹ) average to 0 within Z_TOL SE in
    every coordinate at the clean posterior (a proper composite loss), and are many SE away at another
    posterior. Its mean is not the clean loss: forward correction is consistent, not unbiased.
    """
    import torch

    from ldpfl.stage2_federate.label_noise import label_loss

    noise = noise_of("forward", epsilon=1.0)
    krr = label_mechanism(1.0, K)
    rng = np.random.default_rng(5)
    eta = rng.dirichlet(np.ones(K))
    n = 100_000
    clean = rng.choice(K, size=n, p=eta)
    noisy = torch.from_numpy(krr.randomize_labels(clean, rng=rng))

    def gradient_z(posterior):
        z = torch.tensor(np.log(posterior)).expand(n, K).clone().requires_grad_(True)
        label_loss(z, noisy, noise, reduction="sum").backward()
        return z.grad.numpy(), label_loss(z.detach(), noisy, noise, reduction="none").numpy()

    grads, losses = gradient_z(eta)
    se = grads.std(axis=0, ddof=1) / math.sqrt(n)
    assert np.all(np.abs(grads.mean(axis=0)) < Z_TOL * se), (grads.mean(axis=0), se)
    wrong, _ = gradient_z(np.roll(eta, 1))
    wrong_se = wrong.std(axis=0, ddof=1) / math.sqrt(n)
    assert np.max(np.abs(wrong.mean(axis=0)) / wrong_se) > 3 * Z_TOL  # the test has power: 26 SE here
    clean_losses = -np.log(eta[clean])
    se_diff = (losses - clean_losses).std(ddof=1) / math.sqrt(n)
    assert abs(losses.mean() - clean_losses.mean()) > 10 * Z_TOL * se_diff  # biased for the clean loss


def test_resolution_of_the_correction_from_the_files():
    from ldpfl.stage2_federate.label_noise import resolve_label_noise

    krr = LabelRelease.krr(label_mechanism(1.0, K))
    auto = resolve_label_noise("auto", [("a", krr), ("b", LabelRelease.from_json(krr.to_json()))])
    assert auto.correction == "forward" and np.array_equal(auto.matrix(), _matrix(krr))
    assert resolve_label_noise("backward", [("a", krr)]).correction == "backward"
    assert resolve_label_noise("none", [("a", krr)]) is None
    assert resolve_label_noise("auto", [("a", CLEAR_LABELS), ("b", None)]) is None
    other = LabelRelease.krr(label_mechanism(2.0, K))
    with pytest.raises(ValueError, match="do not share one label release"):
        resolve_label_noise("auto", [("a", krr), ("b", other)])
    with pytest.raises(ValueError, match="do not share one label release"):
        resolve_label_noise("auto", [("a", krr), ("b", CLEAR_LABELS)])
    with pytest.raises(ParameterError, match="label_noise_correction"):
        resolve_label_noise("forward", [("a", CLEAR_LABELS)])


def test_the_flower_client_step_receives_and_uses_t(runs):
    """The server resolves T from the clients' summaries and sends it in each ClientSetup; the client trains with it."""
    import torch

    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.flower_engine import client_side, server_side
    from ldpfl.stage2_federate.flower_engine.protocol import ClientSetup, description_from_json, description_to_json

    _, out = runs
    clients = [client_side.open_client(out / f"client_00{i}.h5", torch.device("cpu")) for i in range(2)]
    summaries = [description_from_json(description_to_json(client_side.summarize(c))) for c in clients]
    config = FederationConfig(rounds=1, local_epochs=1, hidden=(8,), seed=4, device="cpu")
    plan = server_side.plan_from_summaries(config, summaries)
    setup = ClientSetup.from_json(plan.setups[0].to_json())
    assert setup.label_noise is not None and setup.label_noise.correction == "forward"
    assert np.array_equal(setup.label_noise.matrix(), _matrix(clients[0].metadata.label_release))
    assert plan.training.label_noise == setup.label_noise  # the same record, through its JSON on the wire
    results = {}
    for correction in ("forward", "none"):
        trainer = client_side.Trainer.build(config, setup)
        chosen = setup if correction == "forward" else dataclasses.replace(setup, label_noise=None)
        generator = torch.Generator().manual_seed(1)
        results[correction] = trainer.train(config, chosen, clients[0], plan.vector, generator=generator,
                                            rng=np.random.default_rng(1))
    assert results["forward"].loss != pytest.approx(results["none"].loss)  # the same draws, another loss


@pytest.mark.slow
def test_the_local_engine_trains_with_t_from_the_files(runs, tmp_path):
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.federation import run_federation

    _, out = runs
    finals = {}
    for correction in ("auto", "backward", "none"):
        config = FederationConfig(rounds=2, local_epochs=1, hidden=(16,), seed=2, device="cpu", threads=1,
                                  label_noise_correction=correction)
        result = run_federation(out, config, out_dir=tmp_path / correction, progress=False)
        resolved = json.loads((tmp_path / correction / "config.json").read_text())["resolved"]["label_noise"]
        if correction == "none":
            assert resolved is None
        else:
            assert resolved["correction"] == ("forward" if correction == "auto" else "backward")
            labels = read_client_file(out / "client_000.h5").metadata.label_release
            assert np.allclose(resolved["transition"], _matrix(labels), rtol=0, atol=0)
        finals[correction] = result.history[-1]["train_loss"]
    assert len({round(v, 9) for v in finals.values()}) == 3  # the three losses differ


def test_a_plan_fixes_the_label_epsilon_of_every_silo(tmp_path):
    """``ldpfl plan --label-epsilon`` writes it; a silo exporting with the plan takes it, another value is refused."""
    from cli_checks import ok
    from silo_files import write_silos

    from ldpfl.contract.plan import read_plan

    silos = write_silos(tmp_path, np.random.default_rng(2), n=20)
    plan_path = tmp_path / "plan.json"
    ok(run("plan", "--data", silos["b"], "--extractor", "none", "--mechanism", "pdpm", "--epsilon", "2",
           "--param", "safe_range_length=2", "--label-epsilon", "1.5", "--out", plan_path))
    assert read_plan(plan_path).label_epsilon == 1.5
    ok(run("export", "--plan", plan_path, "--data", silos["b"], "--client-index", 0, "--clients", 2, "--seed", 3,
           "--quiet", "--out", tmp_path / "b"))
    release = read_client_file(tmp_path / "b" / "client_000.h5").metadata.label_release
    assert release.mechanism == "krr" and release.nominal_epsilon == 1.5
    out = tmp_path / "other"
    line = one_error_line(run("export", "--plan", plan_path, "--data", silos["b"], "--client-index", 0,
                              "--clients", 2, "--label-epsilon", "3", "--quiet", "--out", out))
    assert "--label-epsilon" in line and not out.exists()
