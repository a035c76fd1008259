"""The Flower engine (issue 14): same selections and accuracies as the local engine, real silos, no leftovers.

The protocol, the server's plan, the clients' streams and resume files, and the process teardown are
tested without Flower. The runs through Flower's simulation need ``flwr[simulation]`` (``pip install -e
'.[flower]'``) and are skipped without it. A SuperLink with two SuperNodes on 127.0.0.1:
tests/e2e/test_flower_deployment.py (apart so that the two slowest Flower runs go to different workers).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from federate_files import write_run
from flower_engine_checks import CONFIG, assert_same_rounds, local_history
from flower_helpers import leftovers

from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.data import load_run
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.flower_engine import FlowerMissingError, require_flower
from ldpfl.stage2_federate.flower_engine import client_side as cs
from ldpfl.stage2_federate.flower_engine.processes import Daemon, alive, stop_all
from ldpfl.stage2_federate.flower_engine.protocol import (
    RUN_CONFIG_DEFAULTS,
    AppRunConfig,
    ClientSetup,
    EvaluateInstruction,
    MessageError,
    TrainInstruction,
    TrainReply,
    app_pyproject,
    description_from_json,
    description_to_json,
    read_app_config,
    read_config,
    run_config,
)
from ldpfl.stage2_federate.flower_engine.server_side import plan_from_summaries
from ldpfl.stage2_federate.plan import plan_federation
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import DpSgdClient

# --------------------------------------------------------------------------------------------------
# Without Flower.


def test_run_config_round_trips_the_configuration_and_its_seed() -> None:
    config = FederationConfig(**CONFIG)
    values = run_config(config, num_clients=3, out_dir="/x", resume=True)
    parsed = tomllib.loads(tomli_w.dumps(values))  # as launch.submit_run writes it
    assert parsed == values and parsed["num-clients"] == 3 and parsed["resume"] is True
    again = read_config(parsed)
    assert again == config and again.seed == 1
    assert read_config(run_config(FederationConfig(rounds=2))).seed is None
    with pytest.raises(KeyError, match="unknown run configuration key 'nope'"):
        run_config(config, nope=1)


def test_the_apps_read_the_run_config_once_into_typed_fields() -> None:
    config = FederationConfig(**CONFIG)
    files = ["/runs/r/client_000.h5", "/runs/r/client_001.h5"]
    values = tomllib.loads(tomli_w.dumps(run_config(config, client_files=json.dumps(files), num_clients=2,
                                                    round_timeout=30, min_clients=1, keep_checkpoint=True)))
    settings = AppRunConfig.read(values)
    assert settings.federation == config and settings.client_files == tuple(files)
    assert (settings.num_clients, settings.round_timeout, settings.min_clients) == (2, 30.0, 1)
    assert settings.keep_checkpoint is True and settings.resume is False and settings.manifest == ()
    assert settings.run_dir == "/runs/r" and settings.plan_fingerprint is None  # the files' folder by default
    assert read_app_config(dict(values)) is read_app_config(dict(values))  # parsed once per configuration
    bare = AppRunConfig.read({"client-sha256": '["ab"]'})  # a node's file checks need only the file fields
    assert bare.client_sha256 == ("ab",)
    with pytest.raises(ValueError, match="no 'ldpfl-config'"):
        _ = bare.federation


def test_the_app_declares_every_run_config_key_and_ldpfl_components() -> None:
    project = tomllib.loads(app_pyproject("1.2.3"))
    app = project["tool"]["flwr"]["app"]
    assert set(app["config"]) == set(RUN_CONFIG_DEFAULTS)  # Flower refuses an override of an undeclared key
    assert app["components"] == {"serverapp": "ldpfl.stage2_federate.flower_engine.server_app:app",
                                 "clientapp": "ldpfl.stage2_federate.flower_engine.client_entry:app"}
    assert project["project"]["version"] == "1.2.3" and app["publisher"]


def test_missing_flower_is_a_one_line_error_with_the_install_command(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a))
    with pytest.raises(FlowerMissingError) as caught:
        require_flower()
    message = str(caught.value)
    assert "\n" not in message and "pip install -e '.[flower]'" in message and "flwr[simulation]==1.41.0" in message


def test_cli_engine_flower_without_flower_is_one_error_line(monkeypatch, tmp_path) -> None:
    import importlib.util

    from click.testing import CliRunner

    from ldpfl.cli import cli

    run_dir = write_run(tmp_path / "run", clients=2, rows=16, features=8)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a))
    result = CliRunner().invoke(cli, ["federate", str(run_dir), "--engine", "flower", "--rounds", "1"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "pip install -e '.[flower]'" in lines[0]
    assert not (run_dir / "federation").exists()
    local_only = CliRunner().invoke(cli, ["federate", str(run_dir), "--cpus-per-client", "2"])
    assert local_only.exit_code == 2 and "apply to --engine flower only" in local_only.stderr


def write_clean_tests(run_dir: Path, seed: int = 11) -> None:
    """Write each client's local-only clean file (``export --keep-clean-test``'s): test records near the randomized
    ones, and the training records (mechanism ``none``: the client file's rows) a silo personalizes on."""
    import dataclasses

    from ldpfl.contract.client_reader import read_client_file
    from ldpfl.contract.client_writer import write_client_file
    from ldpfl.contract.layout import local_file_name

    rng = np.random.default_rng(seed)
    for path in sorted(run_dir.glob("client_???.h5")):
        data = read_client_file(path)
        meta = data.metadata
        rows = len(data.labels["test"])
        features = data.features["test"].copy()
        flip = rng.random(features.shape) < 0.2  # records near, not equal to, the randomized ones
        features[flip] = rng.integers(0, 256, size=int(flip.sum()), dtype=features.dtype)
        labels = data.labels["test"].copy()
        train = data.labels["train"]
        splits = {"train": (data.features["train"], train), "test": (features, labels)}
        clean = dataclasses.replace(meta, local_only=True, label_histograms={
            "train": np.bincount(train, minlength=meta.num_classes).tolist(),
            "test": np.bincount(labels, minlength=meta.num_classes).tolist()})
        assert rows == len(labels)
        write_client_file(run_dir / local_file_name(meta.client_index), clean, splits)


@pytest.fixture(scope="module")
def three_clients(tmp_path_factory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("flower") / "run", clients=3, rows=64, features=8)
    write_clean_tests(run_dir)  # for --eval-clean; local-only files are not part of the run
    return run_dir


def test_a_flower_client_evaluates_its_own_clean_file_like_the_local_engine(three_clients) -> None:
    from ldpfl.stage2_federate.data import load_clean_tests
    from ldpfl.stage2_federate.model import evaluate

    config = FederationConfig(**{**CONFIG, "eval_clean": True})
    local = plan_federation(three_clients, config)
    vector = torch.nn.utils.parameters_to_vector(local.model.parameters()).detach().numpy()
    plan = plan_from_summaries(config, [cs.summarize(c) for c in local.data.clients])
    sums = []
    for client in local.data.clients:  # each client: only its own files
        opened = cs.open_client(client.path, torch.device("cpu"))
        setup = plan.setups[client.index]
        sums.append(cs.Trainer.build(config, setup).evaluate(config, setup, opened, vector, 1)["clean"])
    from ldpfl.stage2_federate.flower_engine.server_side import union_evaluation

    loss, accuracy = evaluate(local.model, load_clean_tests(local.data), config.eval_batch_size)
    assert union_evaluation(sums) == pytest.approx((loss, accuracy), rel=1e-6)
    assert [rows for _, _, rows in sums] == [len(c.test) for c in local.data.clients]


def test_server_plan_from_summaries_equals_the_local_plan(three_clients) -> None:
    config = FederationConfig(**CONFIG)
    local = plan_federation(three_clients, config)
    summaries = [cs.summarize(c) for c in load_run(three_clients).clients]
    assert [description_from_json(description_to_json(s)) for s in summaries] == summaries
    plan = plan_from_summaries(config, list(reversed(summaries)))
    assert plan.clients == local.clients  # one description of each client, from the silo or from the file
    assert np.array_equal(plan.vector, torch.nn.utils.parameters_to_vector(local.model.parameters()).detach().numpy())
    assert plan.strategy.describe() == local.strategy.describe()
    assert plan.strategy.weights([0, 1, 2]).tolist() == local.strategy.weights([0, 1, 2]).tolist()
    assert [p.noise_scale for p in plan.privacy] == [p.noise_scale for p in local.privacy]
    assert [p.file for p in plan.privacy] == ["client_000.h5", "client_001.h5", "client_002.h5"]
    assert plan.privacy == local.privacy  # the same records, whether read from the files or from the summaries
    assert plan.record["resolved"]["client_epsilons"] == [2.0, 4.0, 8.0]
    assert [plan.setups[i].position for i in range(3)] == [0, 1, 2]
    # Each client rebuilds its own mechanism from its setup: the same σ_i as the server's plan.
    for client in load_run(three_clients).clients:
        setup = ClientSetup.from_json(plan.setups[client.index].to_json())
        mine = cs.client_perturbation(config, setup, client)
        assert mine.noise_scale == local.perturbations[client.index].noise_scale
        assert mine.epsilon == setup.epsilon
    with pytest.raises(ValueError, match="two clients hold client index 1"):
        plan_from_summaries(config, [summaries[0], summaries[1], summaries[1]])


def test_each_build_resolves_the_perturbation_target_once(three_clients, monkeypatch) -> None:
    from ldpfl.stage2_federate import plan as planning

    calls, resolve = [], planning.resolve_target
    monkeypatch.setattr(planning, "resolve_target", lambda *args: calls.append(args) or resolve(*args))
    config = FederationConfig(**CONFIG)
    plan_federation(three_clients, config)
    assert len(calls) == 1  # the local engine's build
    plan_from_summaries(config, [cs.summarize(c) for c in load_run(three_clients).clients])
    assert len(calls) == 2  # and the Flower server's


def test_messages_round_trip_and_a_malformed_one_names_its_field(three_clients) -> None:
    """Every INFO record reads back equal; what does not fit its fields is a MessageError naming the field."""
    config = FederationConfig(**CONFIG)
    summaries = [cs.summarize(c) for c in load_run(three_clients).clients]
    setup = plan_from_summaries(config, summaries).setups[1]
    train = TrainInstruction(round=2, setup=setup, resume_round=1, trained_before=True)
    for record in (train, EvaluateInstruction(setup), TrainReply(client=1, note=None),
                   TrainReply(client=0, note="upload not finite; excluded")):
        assert type(record).from_json(record.to_json()) == record
    # a setup inside an instruction keeps its training: DP-SGD read back as DP-SGD, never as plain training
    dp = dataclasses.replace(setup, training=DpSgdClient(1, 1.1, 0.5, 0.25, 2, 1e-5, accounting.ADD_REMOVE, 48))
    for record in (dataclasses.replace(train, setup=dp), EvaluateInstruction(dp)):
        assert type(record).from_json(record.to_json()).setup.training == dp.training
    text = description_to_json(summaries[0])
    missing = object()

    def refusal(schema, **changes) -> str:
        values = {**json.loads(text if schema is ClientDescription else train.to_json()), **changes}
        read = description_from_json if schema is ClientDescription else schema.from_json
        with pytest.raises(MessageError) as caught:
            read(json.dumps({k: v for k, v in values.items() if v is not missing}))
        assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
        return str(caught.value)

    assert refusal(ClientDescription, train_rows="64") == (
        "invalid ClientDescription message: train_rows: Input should be a valid integer, got '64'")  # no coercion
    assert refusal(ClientDescription, label_histogram=[3, -1]).startswith(
        "invalid ClientDescription message: label_histogram.1: Input should be greater than or equal to 0")
    assert refusal(ClientDescription, sha256=missing) == "invalid ClientDescription message: sha256: missing"
    assert refusal(ClientDescription, rows=3) == "invalid ClientDescription message: rows: not a field of this message"
    assert refusal(TrainInstruction, setup={**json.loads(setup.to_json()), "lr": "fast"}) == (
        "invalid TrainInstruction message: setup.lr: Input should be a valid number, got 'fast'")
    assert "setup.epsilon: Input should be a finite number" in refusal(
        TrainInstruction, setup={**json.loads(setup.to_json()), "epsilon": float("inf")})
    assert refusal(TrainInstruction, trained_before=1).endswith(
        "trained_before: Input should be a valid boolean, got 1")
    with pytest.raises(MessageError, match="invalid TrainReply message: the message: Invalid JSON"):
        TrainReply.from_json("{'client': 1}")


def test_client_streams_are_the_local_engines_and_survive_a_round_trip(three_clients) -> None:
    config = FederationConfig(**CONFIG)
    local = plan_federation(three_clients, config)
    setup = plan_from_summaries(config, [cs.summarize(c) for c in load_run(three_clients).clients]).setups[2]
    perturb, train, mode = cs.fresh_streams(config, setup, torch.device("cpu"))
    assert mode == "seeded"
    assert perturb.random() == local.streams.perturb[2].random()
    assert torch.equal(torch.rand(3, generator=train), torch.rand(3, generator=local.streams.train[2]))
    state = cs.pack_streams(perturb, train)
    p2, t2, _ = cs.fresh_streams(config, setup, torch.device("cpu"))
    cs.unpack_streams(json.loads(json.dumps(state)), p2, t2)
    assert p2.random() == perturb.random() and torch.equal(torch.rand(2, generator=t2), torch.rand(2, generator=train))


def test_resume_store_keeps_the_last_three_rounds_and_picks_the_latest_not_after(tmp_path) -> None:
    store = cs.ResumeStore(tmp_path, 3)
    assert store.load(5) is None
    for r in (1, 4, 6, 7):
        store.save(r, {"perturb": f"p{r}", "train": f"t{r}"})
    assert [e["round"] for e in json.loads(store.path.read_text())["entries"]] == [4, 6, 7]
    assert store.load(5) == {"perturb": "p4", "train": "t4"}  # 6 and 7 were saved after the checkpoint of 5
    assert store.load(9)["perturb"] == "p7" and store.load(3) is None
    store.save(5, {"perturb": "again", "train": "t"})  # a resumed run overwrites what came after
    assert [e["round"] for e in json.loads(store.path.read_text())["entries"]] == [4, 5]
    store.remove()
    assert not store.path.exists()


def test_stop_kills_descendants_in_other_sessions(tmp_path, marked) -> None:
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
            "time.sleep(300)\n")
    daemon = Daemon("tree", [sys.executable, "-c", code], env=dict(os.environ), log=tmp_path / "log", cwd=tmp_path)
    deadline = time.monotonic() + 20
    # the grandchild calls setsid between fork and exec: a snapshot may see its pid before its own session
    while (len(daemon.pids) < 2 or len(daemon.groups) < 2) and time.monotonic() < deadline:
        daemon.snapshot()
        time.sleep(0.05)
    assert len(daemon.pids) == 2 and len(daemon.groups) == 2  # the grandchild lives in its own session
    assert leftovers(marked, settle=0) == sorted(daemon.pids)  # the leftover detector sees both
    assert stop_all([daemon]) == []
    assert alive(daemon.pids) == [] and leftovers(marked) == []


# --------------------------------------------------------------------------------------------------
# Through Flower.


@pytest.fixture(scope="module")
def flower() -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")


@pytest.mark.slow
def test_simulation_equals_the_local_engine_and_resumes(flower, three_clients, tmp_path, marked) -> None:
    """`ldpfl federate RUN --engine flower --seed 1` = `--engine local --seed 1`, also across --resume.

    With ``--eval-clean``: each silo evaluates the global model on its own clean file; the server's
    ``clean_test_accuracy`` equals the local engine's.
    """
    from click.testing import CliRunner

    from ldpfl.cli import cli

    local = local_history(three_clients, tmp_path / "local", eval_clean=True)
    assert all("clean_test_accuracy" in r for r in local)
    out = tmp_path / "flower"
    args = ["federate", str(three_clients), "--engine", "flower", "--clients-per-round", "2", "--hidden", "16",
            "--device", "cpu", "--drop-per-round", "1", "--seed", "1", "--perturbation", "gaussian",
            "--client-epsilons", "2,4,8", "--aggregation", "weighted", "--eval-clean", "--out", str(out), "--json"]
    first = CliRunner().invoke(cli, [*args, "--rounds", "2", "--keep-checkpoint"])
    assert first.exit_code == 0, first.output
    assert_same_rounds(json.loads((out / "metrics.json").read_text())["rounds"], local[:2])
    assert (out / ".flower-clients").is_dir()  # each client's own resume state, kept with the checkpoint
    resumed = CliRunner().invoke(cli, [*args, "--rounds", "3", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["resumed_from_round"] == 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert_same_rounds(metrics["rounds"], local)
    outputs = {p.name for p in out.iterdir()}
    assert {"metrics.csv", "metrics.json", "accuracy.png", "model.pt", "config.json"} <= outputs
    assert "checkpoint.pt" not in outputs and ".flower-clients" not in outputs  # seed-equivalent: deleted
    assert metrics["config"]["engine"] == "flower" and '"seed"' not in json.dumps(metrics)
    assert metrics["privacy_ledger"]["clients"]
    assert leftovers(marked) == []


@pytest.mark.slow
def test_dp_sgd_on_the_simulation_equals_the_local_engine(flower, three_clients, tmp_path, marked) -> None:
    """`--dp-sgd` with server momentum: the same rounds, accuracies and per-silo ledger on both engines.

    With `--eval-every 2` over 3 rounds: round 1 is not evaluated (round 2's messages carry no evaluation),
    round 2's model is evaluated with round 3's messages, and the last by the closing exchange.
    """
    from click.testing import CliRunner

    from ldpfl.cli import cli

    dp = dict(perturbation="none", client_epsilons=None, aggregation="fedavg", dp_sgd=True, noise_multiplier=1.2,
              local_steps=2, server_momentum=0.9, lr=1.0, drop_per_round=0, eval_every=2)
    local_out = tmp_path / "local"
    local = local_history(three_clients, local_out, rounds=3, **dp)
    assert [r["round"] for r in local if not math.isnan(r["test_accuracy"])] == [2, 3]
    out = tmp_path / "flower"
    result = CliRunner().invoke(cli, [
        "federate", str(three_clients), "--engine", "flower", "--clients-per-round", "2", "--hidden", "16",
        "--device", "cpu", "--seed", "1", "--rounds", "3", "--eval-every", "2", "--dp-sgd", "--noise-multiplier",
        "1.2", "--local-steps", "2", "--server-momentum", "0.9", "--lr", "1", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert_same_rounds(metrics["rounds"], local)
    assert [r.get("model_evaluated", True) for r in metrics["rounds"]] == [False, True, True]
    assert "per_client" not in metrics["rounds"][0] and len(metrics["rounds"][1]["per_client"]) == 3
    local_metrics = json.loads((local_out / "metrics.json").read_text())
    assert metrics["privacy_ledger"]["clients"] == local_metrics["privacy_ledger"]["clients"]
    assert metrics["release_guarantee"]["clients"] == local_metrics["release_guarantee"]["clients"]
    assert leftovers(marked) == []
    personalized_on_both_engines_alike(three_clients, local_out, out, tmp_path)


def personalized_on_both_engines_alike(run_dir: Path, local_out: Path, flower_out: Path, tmp_path: Path) -> None:
    """Issue 41: both engines' global models personalize identically at one seed (clear and DP fine-tuning).

    The two global models agree to float32 rounding (the engines sum the same replies in another order); each
    personalization from them gives the same own held-out figures, the same accountant and the same weights to
    rounding.
    """
    import ldpfl
    from ldpfl.stage2_federate.model_file import read_model

    local, flower = read_model(local_out / "model.pt").state_dict, read_model(flower_out / "model.pt").state_dict
    for name in local:
        torch.testing.assert_close(local[name], flower[name], rtol=0.0, atol=1e-6)
    for method in ("clear", "dp"):
        made = [ldpfl.personalize(run_dir, client_index=0, method=method, model=out / "model.pt", epochs=2, steps=3,
                                  seed=4, out=tmp_path / f"{out.name}-{method}") for out in (local_out, flower_out)]
        assert made[0].summary["own_heldout"] == made[1].summary["own_heldout"], method
        assert made[0].summary.get("accountant") == made[1].summary.get("accountant")
        assert made[0].epsilon == made[1].epsilon and (method == "clear") == made[0].local_only
        first, second = read_model(made[0].model).state_dict, read_model(made[1].model).state_dict
        for name in first:
            torch.testing.assert_close(first[name], second[name], rtol=0.0, atol=1e-5)


def test_each_engine_refuses_the_others_checkpoint(three_clients, tmp_path) -> None:
    from ldpfl.common.errors import ParameterError
    from ldpfl.stage2_federate.checkpoint import check_inputs, load_checkpoint

    def load_server_checkpoint(path, config, inputs):  # as the ServerApp resumes (server_app._run)
        payload = load_checkpoint(path, config, engine="flower")
        check_inputs(path, payload, inputs)
        return payload

    config = FederationConfig(**{**CONFIG, "rounds": 1})
    result = run_federation(three_clients, config, out_dir=tmp_path / "local", progress=False, keep_checkpoint=True,
                            on_warning=None)
    path = result.paths["checkpoint"]
    inputs = load_checkpoint(path, config)["inputs"]
    with pytest.raises(ParameterError) as caught:
        load_server_checkpoint(path, config, inputs)
    message = str(caught.value)
    assert "\n" not in message and "with the flower engine: the local engine wrote it" in message
    assert caught.value.render(lambda n: "--" + n).endswith("resume it with --engine local")
    payload = torch.load(path, weights_only=True)
    payload["engine"] = "flower"
    torch.save(payload, path)
    assert load_server_checkpoint(path, config, inputs)["round"] == 1
    with pytest.raises(ParameterError, match=r"with the local engine: the flower engine wrote it .*`?engine`? flower"):
        run_federation(three_clients, config, out_dir=tmp_path / "local", progress=False, resume=True)
