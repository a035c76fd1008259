"""Server optimizers (stage2_federate.server_optimizers): FedAdam against Reddi et al.'s Algorithm 2 on hand-computed
numbers, FedAvgM against Hsu et al.'s Algorithm 1, their state through a restore, and the parameters' checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ldpfl.common.errors import ParameterError
from ldpfl.stage2_federate.checkpoint import server_state
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.server_optimizers import (
    FedAdam,
    FedAvgM,
    create_server_optimizer,
    server_optimizer_class,
    server_optimizer_names,
)

HAND = dict(lr=0.1, beta1=0.5, beta2=0.5, tau=1.0)  # v_{-1} = τ² = 1: square roots that come out round


def test_fedadam_follows_algorithm_2_on_hand_computed_numbers():
    adam = FedAdam(**HAND)
    x0 = np.zeros(2, dtype=np.float32)
    # Δ1 = (1, 0): m1 = (0.5, 0), v1 = 0.5·(1, 1) + 0.5·(1, 0) = (1, 0.5); x1 = x0 + 0.1·m1/(√v1 + 1) = (0.025, 0)
    x1 = adam.step(x0, np.array([1.0, 0.0], dtype=np.float32))
    assert x1.dtype == np.float32
    np.testing.assert_allclose(x1, [0.025, 0.0], rtol=1e-6)
    np.testing.assert_allclose(adam.m, [0.5, 0.0])
    np.testing.assert_allclose(adam.v, [1.0, 0.5])
    # Δ2 = (−1, 1): m2 = (−0.25, 0.5), v2 = (1, 0.75); x2 = x1 + 0.1·(−0.25/2, 0.5/(√0.75 + 1))
    x2 = adam.step(x1, x1 + np.array([-1.0, 1.0], dtype=np.float32))
    np.testing.assert_allclose(adam.m, [-0.25, 0.5], rtol=1e-6)
    np.testing.assert_allclose(adam.v, [1.0, 0.75], rtol=1e-6)
    np.testing.assert_allclose(x2, [0.0125, 0.05 / (np.sqrt(0.75) + 1.0)], rtol=1e-5)


def test_a_kept_round_leaves_fedadams_moments_alone():
    adam = FedAdam(**HAND)
    x1 = adam.step(np.zeros(2, dtype=np.float32), np.ones(2, dtype=np.float32))
    before = adam.state()
    assert adam.step(x1, x1, kept=True) is x1
    for name, array in adam.state().items():
        np.testing.assert_array_equal(array, before[name])


def test_fedavgm_is_hsu_et_als_momentum_and_beta_zero_is_fedavg():
    momentum = FedAvgM(0.5)
    w = np.zeros(2, dtype=np.float32)
    w = momentum.step(w, np.array([1.0, 2.0], dtype=np.float32))  # v = (1, 2), W = (1, 2)
    w = momentum.step(w, w + np.array([1.0, 0.0], dtype=np.float32))  # v = 0.5·(1, 2) + (1, 0) = (1.5, 1)
    np.testing.assert_allclose(w, [2.5, 3.0])
    assert momentum.state().keys() == {"velocity"}
    plain = FedAvgM(0.0)
    target = np.array([3.0, 4.0], dtype=np.float32)
    assert plain.step(w, target) is target and plain.state() == {}


@pytest.mark.parametrize(("make", "steps"), [(lambda: FedAdam(**HAND), 4), (lambda: FedAvgM(0.9), 4)])
def test_a_restored_state_goes_on_as_an_uninterrupted_run(make, steps):
    rng = np.random.default_rng(3)
    targets = [rng.normal(size=5).astype(np.float32) for _ in range(steps)]
    whole, w = make(), np.zeros(5, dtype=np.float32)
    for target in targets:
        w = whole.step(w, target)
    first, v = make(), np.zeros(5, dtype=np.float32)
    for target in targets[:2]:
        v = first.step(v, target)
    saved = {name: torch.from_numpy(array) for name, array in first.state().items()}  # as the checkpoint holds it
    resumed = make()
    resumed.restore(server_state(None, {"version": 3, "server_state": saved}))
    for target in targets[2:]:
        v = resumed.step(v, target)
    np.testing.assert_array_equal(v, w)


def test_a_version_2_checkpoints_velocity_is_read_as_fedavgms_state():
    velocity = torch.tensor([0.5, -1.0])
    state = server_state(None, {"version": 2, "velocity": velocity})
    momentum = FedAvgM(0.5)
    momentum.restore(state)
    np.testing.assert_array_equal(momentum.velocity, velocity.numpy())


def test_a_state_of_another_optimizer_is_refused():
    with pytest.raises(ValueError, match="keeps m, v, not velocity"):
        FedAdam().restore({"velocity": np.zeros(2)})
    with pytest.raises(ValueError, match="both moments"):
        FedAdam().restore({"m": np.zeros(2)})


def test_parameters_are_checked_quoting_the_value_and_the_range():
    assert FedAdam().params == {"lr": 1e-2, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    with pytest.raises(ParameterError, match=r"beta1 must lie in \[0, 1\), got 1.0"):
        FedAdam(beta1=1.0)
    with pytest.raises(ParameterError, match="takes no momentum"):
        FedAdam(momentum=0.5)
    with pytest.raises(ParameterError, match=r"tau must lie in \(0, inf\), got 0"):
        FederationConfig(server_optimizer="fedadam", server_params={"tau": 0})


def test_the_configuration_reads_names_and_values_and_writes_them_only_when_set():
    config = FederationConfig(server_optimizer="fedadam", server_params={"lr": 0.5, "beta2": 0.9})
    assert list(config.server_params.items()) == [("beta2", 0.9), ("lr", 0.5)]
    assert config.to_dict()["server_params"] == {"beta2": 0.9, "lr": 0.5}
    assert create_server_optimizer(config).params["lr"] == 0.5
    assert "server_optimizer" not in FederationConfig().to_dict()  # a default run's config.json as before
    assert isinstance(create_server_optimizer(FederationConfig(server_momentum=0.9)), FedAvgM)
    with pytest.raises(ParameterError, match="server_momentum is the beta of server optimizer 'fedavgm'"):
        FederationConfig(server_optimizer="fedadam", server_momentum=0.9)
    with pytest.raises(ParameterError, match="must map names to numbers, got tuple"):
        FederationConfig(server_optimizer="fedadam", server_params=("lr=1",))
    with pytest.raises(ParameterError, match="server optimizer 'fedavgm' takes no lr"):
        FederationConfig(server_params={"lr": 0.1})


def test_every_registered_optimizer_keeps_the_shape_and_starts_without_state():
    assert {"fedavgm", "fedadam"} <= set(server_optimizer_names())
    for name in server_optimizer_names():
        optimizer = server_optimizer_class(name)()
        assert optimizer.state() == {}
        out = optimizer.step(np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32))
        assert out.shape == (3,) and out.dtype == np.float32


def test_the_command_maps_its_flags_to_the_configurations_fields(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ldpfl.commands import federate as command

    seen = {}
    monkeypatch.setattr(command, "federate", lambda run_dir, **kwargs: seen.update(kwargs) or None)
    monkeypatch.setattr(command, "federate_text", lambda result: "")
    runner = CliRunner()
    ok = runner.invoke(command.federate_command, [str(tmp_path), "--server-optimizer", "fedadam", "--server-params",
                                                 "lr=0.5", "--server-params", "tau=1e-4"])
    assert ok.exit_code == 0, ok.output
    assert seen["server_optimizer"] == "fedadam" and seen["server_params"] == {"lr": 0.5, "tau": 1e-4}
    bad = runner.invoke(command.federate_command, [str(tmp_path), "--server-params", "lr"])
    assert bad.exit_code == 2 and "'lr' is not NAME=VALUE" in bad.output
    assert "fedadam" in runner.invoke(command.federate_command, ["--help"]).output
