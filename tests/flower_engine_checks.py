"""What the Flower engine's tests compare: the local engine's rounds at the tests' configuration, round for round.

Shared by tests/e2e/test_flower_engine.py (the simulation) and tests/e2e/test_flower_deployment.py (a SuperLink).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation

CONFIG = dict(rounds=3, clients_per_round=2, hidden=(16,), device="cpu", drop_per_round=1, seed=1,
              perturbation="gaussian", client_epsilons=(2.0, 4.0, 8.0), aggregation="weighted")


def local_history(run_dir: Path, out: Path, **changes) -> list[dict]:
    config = FederationConfig(**{**CONFIG, **changes})
    return run_federation(run_dir, config, out_dir=out, progress=False).history


def assert_same_rounds(flower_rounds: list[dict], local_rounds: list[dict]) -> None:
    assert len(flower_rounds) == len(local_rounds)
    for f, loc in zip(flower_rounds, local_rounds, strict=True):
        for key in ("round", "selected", "dropped", "aggregated", "excluded"):
            assert f[key] == loc[key], key
        assert f["lost"] == []
        for key in ("test_accuracy", "test_loss", "train_loss", "train_accuracy", "clean_test_accuracy",
                    "clean_test_loss"):
            assert (key in f) == (key in loc), key
            if key in loc:  # a metric not reported (NaN in memory) is null in metrics.json
                if isinstance(loc[key], float) and math.isnan(loc[key]):
                    assert f[key] is None, key
                else:
                    assert f[key] == pytest.approx(loc[key], rel=1e-5, abs=1e-6), key
        assert f["weights"] == pytest.approx(loc["weights"], rel=1e-9)
