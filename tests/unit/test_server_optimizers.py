"""Server optimizers (stage2_federate.server_optimizers): FedAvgM against Hsu et al.'s Algorithm 1, its state
through a restore and a version-2 checkpoint, and the configuration's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ldpfl.common.errors import ParameterError
from ldpfl.stage2_federate.checkpoint import server_state
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.server_optimizers import (
    FedAvgM,
    create_server_optimizer,
    server_optimizer_class,
    server_optimizer_names,
)


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


@pytest.mark.parametrize(("make", "steps"), [(lambda: FedAvgM(0.9), 4)])
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


def test_every_registered_optimizer_keeps_the_shape_and_starts_without_state():
    assert "fedavgm" in server_optimizer_names()
    for name in server_optimizer_names():
        optimizer = server_optimizer_class(name)()
        assert optimizer.state() == {}
        out = optimizer.step(np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32))
        assert out.shape == (3,) and out.dtype == np.float32


def test_options_the_optimizer_does_not_take_are_refused():
    assert "server_optimizer" not in FederationConfig().to_dict()  # a default run's config.json as before
    assert isinstance(create_server_optimizer(FederationConfig(server_momentum=0.9)), FedAvgM)
    with pytest.raises(ParameterError, match="server optimizer 'fedavgm' takes no lr"):
        FederationConfig(server_params={"lr": 0.1})
    with pytest.raises(ParameterError, match="must map names to numbers, got tuple"):
        FederationConfig(server_params=("lr=1",))
