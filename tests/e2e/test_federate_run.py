"""Stage-2 federation runs end to end on small synthetic client files."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from federate_files import write_run

import ldpfl.stage2_federate.model as round_steps  # plain local training: silo_training.plain calls it
from ldpfl import mechanisms as mech
from ldpfl.mechanisms.randomness import generator_name_of, secure_generator_name
from ldpfl.stage2_federate.federation import FederationConfig, Streams, run_federation
from ldpfl.stage2_federate.model import build_model
from ldpfl.stage2_federate.model_file import read_model

FAST = dict(hidden=(16,), local_epochs=2, batch_size=16, lr=0.01, threads=1)


@pytest.fixture(scope="module")
def float_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("float"), clients=4, rows=64, features=8, feature_format=mech.FLOAT32)


def run(run_dir, out, keep_checkpoint=True, **overrides):
    config = FederationConfig(**{**FAST, "seed": 11, "rounds": 2, **overrides})
    return run_federation(run_dir, config, out_dir=out, progress=False, keep_checkpoint=keep_checkpoint)


def state(path):
    return read_model(path).state_dict


def assert_same_state(a, b) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def strip_timing(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


def initial_state(run_dir, seed, hidden=(16,)):
    """The model the server initializes (LDPFL Algorithm 1 line 13), rebuilt from the same stream."""
    streams = Streams.create(mech.make_randomness(seed), 4)
    return build_model(48, hidden, 4, generator=streams.init).state_dict()


# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["packed_run", "float_run"])
def test_federation_learns_and_writes_every_output(fixture, request, tmp_path) -> None:
    run_dir = request.getfixturevalue(fixture)
    result = run(run_dir, tmp_path / "out", keep_checkpoint=False, rounds=4, local_epochs=3)
    accuracies = [r["test_accuracy"] for r in result.history]
    assert accuracies[-1] > 0.6, accuracies  # four classes: chance is 0.25
    assert result.final_accuracy == accuracies[-1]
    for name in ("metrics.csv", "metrics.json", "accuracy.png", "model.pt", "config.json"):
        assert (tmp_path / "out" / name).is_file(), name
    assert not (tmp_path / "out" / "checkpoint.pt").exists()  # seed-equivalent, removed once complete
    assert (tmp_path / "out" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(metrics) >= {"config", "privacy", "rounds"}
    assert [r["round"] for r in metrics["rounds"]] == [1, 2, 3, 4]
    assert [r["test_accuracy"] for r in metrics["rounds"]] == pytest.approx(accuracies)
    for key in ("train_loss", "train_accuracy", "test_loss", "selected", "dropped", "excluded", "weights",
                "client_epsilons"):
        assert key in metrics["rounds"][0]
    assert len(metrics["privacy"]) == 4 and metrics["privacy"][2]["file"] == "client_002.h5"
    rows = list(csv.DictReader((tmp_path / "out" / "metrics.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[-1]["test_accuracy"]) == pytest.approx(accuracies[-1], rel=1e-5)
    final = state(tmp_path / "out" / "model.pt")
    assert final["net.0.weight"].shape == (16, 48 if fixture == "packed_run" else 8)


def test_no_seed_in_any_output(packed_run, tmp_path) -> None:
    run(packed_run, tmp_path / "out", seed=123456789)
    for name in ("config.json", "metrics.json"):
        text = (tmp_path / "out" / name).read_text()
        assert "seed" not in json.loads(text).keys() and '"seed"' not in text
        assert "123456789" not in text
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["randomness"] == "seeded" and config["rounds"] == 2
    checkpoint = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)
    assert "seed" not in checkpoint["config"]


def test_same_seed_same_model_different_seed_different_model(packed_run, tmp_path) -> None:
    a = run(packed_run, tmp_path / "a", clients_per_round=3, drop_per_round=1)
    b = run(packed_run, tmp_path / "b", clients_per_round=3, drop_per_round=1)
    c = run(packed_run, tmp_path / "c", clients_per_round=3, drop_per_round=1, seed=12)
    assert_same_state(state(a.paths["model"]), state(b.paths["model"]))
    assert strip_timing(a.history) == strip_timing(b.history)
    assert not torch.equal(state(a.paths["model"])["net.0.weight"], state(c.paths["model"])["net.0.weight"])


RESUME_CASE = dict(clients_per_round=3, drop_per_round=1, aggregation="probability", perturbation="gaussian",
                   client_epsilons=(50.0, 100.0, 200.0, 400.0), clip=1.0)


def test_resume_equals_an_uninterrupted_run(packed_run, tmp_path) -> None:
    whole = run(packed_run, tmp_path / "whole", keep_checkpoint=False, rounds=4, **RESUME_CASE)
    first = run(packed_run, tmp_path / "split", rounds=2, **RESUME_CASE)
    assert len(first.history) == 2
    config = FederationConfig(**{**FAST, "rounds": 4, **RESUME_CASE})  # no seed: every stream comes back
    assert not (tmp_path / "whole" / "checkpoint.pt").exists()  # seed-equivalent: deleted by default
    resumed = run_federation(packed_run, config, out_dir=tmp_path / "split", resume=True, progress=False)
    assert resumed.resumed_from_round == 2
    assert_same_state(state(whole.paths["model"]), state(resumed.paths["model"]))
    assert strip_timing(whole.history) == strip_timing(resumed.history)
    assert json.loads((tmp_path / "split" / "config.json").read_text())["randomness"] == "seeded"


def test_resume_after_an_interruption(packed_run, tmp_path, monkeypatch) -> None:
    whole = run(packed_run, tmp_path / "whole", rounds=3, **RESUME_CASE)
    calls = {"n": 0}
    original = round_steps.train_local

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # second client of round 2
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(round_steps, "train_local", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(packed_run, tmp_path / "cut", rounds=3, **RESUME_CASE)
    monkeypatch.setattr(round_steps, "train_local", original)
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["round"] == 1
    resumed = run_federation(packed_run, FederationConfig(**{**FAST, "rounds": 3, **RESUME_CASE}),
                             out_dir=tmp_path / "cut", resume=True, progress=False)
    assert_same_state(state(whole.paths["model"]), state(resumed.paths["model"]))


def test_resume_refuses_a_different_configuration(packed_run, tmp_path) -> None:
    run(packed_run, tmp_path / "out", rounds=1)
    with pytest.raises(ValueError, match=r"configuration differs \(lr: checkpoint 0.01, now 0.02\)"):
        run_federation(packed_run, FederationConfig(**{**FAST, "lr": 0.02, "rounds": 2}), out_dir=tmp_path / "out",
                       resume=True, progress=False)
    with pytest.raises(ValueError, match="already holds a federation run"):
        run(packed_run, tmp_path / "out", rounds=1)
    with pytest.raises(ValueError, match="does not exist"):
        run_federation(packed_run, FederationConfig(**FAST), out_dir=tmp_path / "none", resume=True, progress=False)


def test_a_checkpoint_from_before_eval_every_resumes_and_keeps_its_schedule(packed_run, tmp_path) -> None:
    """A checkpoint whose configuration has no ``eval_every`` evaluated every round: it resumes as K = 1 only."""
    run(packed_run, tmp_path / "out", rounds=1)
    path = tmp_path / "out" / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    del payload["config"]["eval_every"]  # as written before the option existed
    torch.save(payload, path)
    with pytest.raises(ValueError, match=r"configuration differs \(eval_every: checkpoint 1, now 2\)"):
        run_federation(packed_run, FederationConfig(**{**FAST, "rounds": 2, "eval_every": 2}),
                       out_dir=tmp_path / "out", resume=True, progress=False)
    resumed = run_federation(packed_run, FederationConfig(**{**FAST, "rounds": 2}), out_dir=tmp_path / "out",
                             resume=True, progress=False)
    assert resumed.resumed_from_round == 1 and all(math.isfinite(r["test_accuracy"]) for r in resumed.history)


def test_non_finite_update_is_excluded_and_logged(packed_run, tmp_path, monkeypatch) -> None:
    calls = {"n": 0}
    original = round_steps.train_local

    def poisoned(model, split, **kwargs):
        stats = original(model, split, **kwargs)
        calls["n"] += 1
        if calls["n"] % 4 == 2:  # client 1 in every round (all four train, in index order)
            with torch.no_grad():
                model.net[0].weight[0, 0] = math.nan
        return stats

    monkeypatch.setattr(round_steps, "train_local", poisoned)
    result = run(packed_run, tmp_path / "out", rounds=2)
    for record in result.history:
        assert record["excluded"] == [1]
        assert record["aggregated"] == [0, 2, 3]
        assert any("client 1: excluded" in note for note in record["notes"])
        assert math.isfinite(record["test_accuracy"])
    final = state(result.paths["model"])
    assert all(torch.isfinite(v).all() for v in final.values())


def test_every_client_dropped_keeps_the_previous_model(packed_run, tmp_path) -> None:
    result = run(packed_run, tmp_path / "out", rounds=2, clients_per_round=2, drop_per_round=2)
    for record in result.history:
        assert record["kept_previous_model"] is True
        assert record["aggregated"] == [] and sorted(record["dropped"]) == record["selected"]
    assert_same_state(initial_state(packed_run, 11), state(result.paths["model"]))
    assert result.history[0]["test_accuracy"] == result.history[1]["test_accuracy"]


def test_dropouts_are_drawn_from_the_selected(packed_run, tmp_path) -> None:
    result = run(packed_run, tmp_path / "out", rounds=3, clients_per_round=3, drop_per_round=1)
    for record in result.history:
        assert len(record["selected"]) == 3 and len(record["dropped"]) == 1
        assert set(record["dropped"]) <= set(record["selected"])
        assert record["aggregated"] == sorted(set(record["selected"]) - set(record["dropped"]))
    with pytest.raises(ValueError, match=r"drop per round \(3\) exceeds the 2 clients"):
        run(packed_run, tmp_path / "bad", clients_per_round=2, drop_per_round=3)


EPSILONS = (1.0, 2.0, 5.0, 10.0)


@pytest.mark.parametrize("perturbation", ["gaussian-wu", "gaussian", "ldpsign", "pdpm", "fedaw-gaussian"])
def test_each_perturbation_is_wired_per_client_with_its_own_budget(perturbation, packed_run, tmp_path) -> None:
    extra = {"client_ranges": (0.2, 0.4, 1.0, 2.0)} if perturbation == "pdpm" else {}
    result = run(packed_run, tmp_path / "out", rounds=1, perturbation=perturbation, aggregation="weighted",
                 client_epsilons=EPSILONS, **extra)
    privacy = json.loads(result.paths["metrics_json"].read_text())["privacy"]
    assert [p["nominal_epsilon"] for p in privacy] == list(EPSILONS)
    assert [p["client"] for p in privacy] == [0, 1, 2, 3]
    assert all(p["mechanism"] == perturbation and p["randomness"] == "seeded" for p in privacy)
    dim = result.config["resolved"]["parameters"]
    assert dim == 48 * 16 + 16 + 16 * 4 + 4
    assert all(p["parameters"]["dim"] == dim for p in privacy)
    sigmas = [p["noise_scale"] for p in privacy]
    if perturbation == "pdpm":
        assert [p["parameters"]["safe_range_length"] for p in privacy] == [0.2, 0.4, 1.0, 2.0]
    else:
        assert sigmas == sorted(sigmas, reverse=True) and sigmas[0] > sigmas[-1]  # larger ε, smaller σ
    record = result.history[0]
    assert record["client_epsilons"] == list(EPSILONS)
    rho = 1.0 / np.array(sigmas)
    assert record["weights"] == pytest.approx((rho / rho.sum()).tolist())  # Wu eq. 11
    assert privacy[0]["target"] == ("update" if perturbation in ("ldpsign", "fedaw-gaussian") else "parameters")


def test_ldpsign_update_mode_steps_by_server_lr(packed_run, tmp_path) -> None:
    result = run(packed_run, tmp_path / "out", rounds=1, perturbation="ldpsign", epsilon=10.0, server_lr=0.125)
    before = torch.nn.utils.parameters_to_vector(initial_state(packed_run, 11).values())
    after = torch.nn.utils.parameters_to_vector(state(result.paths["model"]).values())
    steps = ((after - before) / 0.125).round()
    assert set(steps.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.allclose(after, before + 0.125 * steps, atol=1e-6)


def test_ldpsign_literal_mode_sets_the_model_to_signs(packed_run, tmp_path) -> None:
    result = run(packed_run, tmp_path / "out", rounds=1, perturbation="ldpsign", sign_mode="literal")
    values = torch.cat([v.flatten() for v in state(result.paths["model"]).values()])
    assert set(values.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert result.config["resolved"]["server_update"] == "W <- sign(aggregate)"


def test_fedaw_weights_follow_the_label_histograms(tmp_path) -> None:
    run_dir = write_run(tmp_path / "skewed", clients=4, rows=64, class_skew={3: 0})
    result = run(run_dir, tmp_path / "out", rounds=1, aggregation="fedaw")
    weights = result.history[0]["weights"]
    assert weights[3] < min(weights[:3])  # client 3 holds one class only: cos = 1/2 with uniform over 4


@pytest.mark.parametrize("aggregation", ["fedavg", "weighted", "probability", "fraction", "fedaw"])
@pytest.mark.parametrize("perturbation", ["none", "gaussian-wu", "gaussian", "ldpsign", "pdpm", "fedaw-gaussian"])
def test_every_aggregation_with_every_perturbation(aggregation, perturbation, packed_run, tmp_path) -> None:
    extra = {"fraction": 0.5} if aggregation == "fraction" else {}
    if perturbation != "none":
        extra["client_epsilons"] = EPSILONS
    if aggregation in ("weighted", "probability") and perturbation == "none":
        with pytest.raises(ValueError, match="needs a noise scale"):
            run(packed_run, tmp_path / "out", rounds=1, aggregation=aggregation, perturbation=perturbation, **extra)
        return
    result = run(packed_run, tmp_path / "out", rounds=1, aggregation=aggregation, perturbation=perturbation,
                 hidden=(4,), **extra)
    record = result.history[0]
    assert record["aggregated"] and not record["kept_previous_model"]
    assert len(record["selected"]) == (2 if aggregation == "fraction" else 4)
    assert sum(record["weights"]) == pytest.approx(1.0)
    assert all(torch.isfinite(v).all() for v in state(result.paths["model"]).values())


def test_unseeded_streams_are_secure_and_survive_a_checkpoint(tmp_path) -> None:
    """Issue 23: without a seed every numpy stream is the secure generator; its state is checkpointable."""
    streams = Streams.create(mech.make_randomness(), 3)
    assert streams.generator_name == secure_generator_name()
    assert {generator_name_of(g) for g in streams.perturb} == {secure_generator_name()}
    streams.server.random(3)
    streams.perturb[1].normal(size=5)
    torch.save({"rng": streams.state()}, tmp_path / "checkpoint.pt")
    expected = streams.server.random(4), streams.perturb[1].random(4), streams.perturb[2].random(4)
    resumed = Streams.create(mech.make_randomness(), 3)
    resumed.restore(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["rng"])
    for a, b in zip(expected, (resumed.server.random(4), resumed.perturb[1].random(4),
                               resumed.perturb[2].random(4)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_unseeded_run_labels_its_reports_with_the_generator(packed_run, tmp_path) -> None:
    result = run(packed_run, tmp_path / "out", rounds=1, seed=None)
    metrics = json.loads(result.paths["metrics_json"].read_text())
    assert metrics["config"]["randomness"] == "csprng"
    assert metrics["config"]["generator"] == secure_generator_name()
    assert {p["generator"] for p in metrics["privacy"]} == {secure_generator_name()}
    assert all("cryptographically secure" in p["randomness_description"] for p in metrics["privacy"])
