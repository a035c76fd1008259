"""A new real mechanism reaches federation through the registry alone: its module declares the wiring.

The toy mechanism below is registered inside the test and unregistered after it; nothing in stage 2
knows its name. It clips each coordinate to [-b, b] and adds Laplace noise of scale 2b/ε (the Laplace
mechanism, pure ε-LDP per coordinate), perturbs the update, and maps the federation option ``clip`` to
its own parameter ``bound``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms.base import UPDATE, FederationWiring, param, require_generator
from ldpfl.mechanisms.real import RealMechanism, pure_report
from ldpfl.mechanisms.registry import register, unregister
from ldpfl.mechanisms.report import PrivacyReport
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.model import build_model
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.perturbation import perturbation_names
from ldpfl.stage2_federate.streams import Streams

FAST = dict(hidden=(16,), local_epochs=1, batch_size=16, lr=0.01, threads=1, seed=5, rounds=1)
EPSILONS = (100.0, 200.0, 300.0, 400.0)


@dataclass(frozen=True)
class ToyLaplace(RealMechanism):
    """Clip to [-b, b], add Laplace(0, 2b/ε) per coordinate."""

    NAME: ClassVar[str] = "toy-laplace"
    SOURCE: ClassVar[str] = "test only: the Laplace mechanism"
    SUMMARY: ClassVar[str] = "clip to [-b, b], Laplace noise of scale 2b/epsilon"
    FEDERATION: ClassVar[FederationWiring | None] = FederationWiring(
        UPDATE, "toy Laplace perturbation of the update", options={"clip": "bound"})

    bound: float = param(1.0, "b, element-wise clipping bound")

    def noise_scale(self) -> float:
        return math.sqrt(2.0) * 2.0 * self.bound / self.epsilon  # standard deviation of Laplace(2b/ε)

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        x = np.asarray(x)
        noise = require_generator(rng).laplace(0.0, 2.0 * self.bound / self.epsilon, size=x.shape)
        return (np.clip(x, -self.bound, self.bound) + noise).astype(x.dtype)

    def report(self) -> PrivacyReport:
        return pure_report(self, self.epsilon)


@pytest.fixture
def toy():
    register(ToyLaplace)
    try:
        yield ToyLaplace
    finally:
        unregister(ToyLaplace.NAME)


def _initial(seed: int) -> torch.Tensor:
    streams = Streams.create(mech.make_randomness(seed), 4)
    model = build_model(48, (16,), 4, generator=streams.init)
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _final(path) -> torch.Tensor:
    return torch.cat([v.flatten() for v in read_model(path).state_dict.values()])


def test_a_registered_toy_mechanism_federates_with_its_declared_wiring(toy, packed_run, tmp_path) -> None:
    assert "toy-laplace" in perturbation_names() and "toy-laplace" not in mech.mechanism_names("bits")
    bound = 1e-6
    config = FederationConfig(**FAST, perturbation="toy-laplace", aggregation="weighted", client_epsilons=EPSILONS,
                              clip=bound)
    result = run_federation(packed_run, config, out_dir=tmp_path / "out", progress=False)
    privacy = json.loads(result.paths["metrics_json"].read_text())["privacy"]
    assert [p["mechanism"] for p in privacy] == ["toy-laplace"] * 4
    assert [p["parameters"]["bound"] for p in privacy] == [bound] * 4  # the option reached `bound`
    assert [p["nominal_epsilon"] for p in privacy] == list(EPSILONS)  # ε_i per client
    assert all(p["parameters"]["dim"] == result.config["resolved"]["parameters"] for p in privacy)
    assert {p["target"] for p in privacy} == {"update"}
    sigmas = [p["noise_scale"] for p in privacy]
    assert sigmas == pytest.approx([math.sqrt(2) * 2 * bound / e for e in EPSILONS])
    rho = 1.0 / np.array(sigmas)
    assert result.history[0]["weights"] == pytest.approx((rho / rho.sum()).tolist())  # Wu eq. 11
    assert result.config["resolved"]["server_update"] == "W <- W + aggregate"
    # Every upload is the clipped update plus noise far below b: W moves by at most about b.
    moved = (_final(result.paths["model"]) - _initial(FAST["seed"])).abs().max().item()
    assert 0 < moved <= 2 * bound


def test_the_same_run_without_the_toy_moves_the_model(packed_run, tmp_path) -> None:
    """The control for the test above: plain federation moves the weights by far more than 2e-6."""
    result = run_federation(packed_run, FederationConfig(**FAST), out_dir=tmp_path / "out", progress=False)
    assert (_final(result.paths["model"]) - _initial(FAST["seed"])).abs().max().item() > 1e-3


def test_the_toy_refuses_options_it_does_not_declare_and_leaves_no_trace(toy, packed_run, tmp_path) -> None:
    config = FederationConfig(**FAST, perturbation="toy-laplace", sensitivity=2.0)
    with pytest.raises(ParameterError, match="perturbation 'toy-laplace' takes no sensitivity; it takes clip$"):
        run_federation(packed_run, config, out_dir=tmp_path / "out", progress=False)
    with pytest.raises(ParameterError, match="client_ranges and client_centres .* apply to perturbation pdpm only"):
        FederationConfig(**FAST, perturbation="toy-laplace", client_ranges=(1.0, 1.0, 1.0, 1.0))


def test_unregistered_toy_is_gone() -> None:
    assert "toy-laplace" not in perturbation_names()
    with pytest.raises(ValueError, match="perturbation must be one of none, "):
        FederationConfig(perturbation="toy-laplace")
