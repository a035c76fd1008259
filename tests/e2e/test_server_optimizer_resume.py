"""A server optimizer's state goes through the checkpoint: a resumed run ends as an uninterrupted one (issue 43)."""

from __future__ import annotations

import torch

from ldpfl.stage2_federate.federation import FederationConfig, run_federation
from ldpfl.stage2_federate.model_file import read_model

FAST = dict(hidden=(8,), local_epochs=1, batch_size=32, lr=0.01, threads=1, seed=5)
FEDADAM = dict(server_optimizer="fedadam", server_params={"lr": 0.05, "tau": 0.01})


def federate(run_dir, out, rounds, resume=False, **overrides):
    config = FederationConfig(**{**FAST, "rounds": rounds, **overrides})
    return run_federation(run_dir, config, out_dir=out, progress=False, keep_checkpoint=True, resume=resume)


def weights(result):
    return read_model(result.paths["model"]).state_dict


def assert_same(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fedadams_moments_are_restored_from_the_checkpoint(packed_run, tmp_path):
    whole = federate(packed_run, tmp_path / "whole", 2, **FEDADAM)
    federate(packed_run, tmp_path / "split", 1, **FEDADAM)
    saved = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert saved["server_state"].keys() == {"m", "v"} and saved["config"]["server_optimizer"] == "fedadam"
    resumed = federate(packed_run, tmp_path / "split", 2, resume=True, **FEDADAM)
    assert resumed.resumed_from_round == 1
    assert_same(weights(whole), weights(resumed))


def test_a_version_2_checkpoint_with_a_velocity_resumes_server_momentum(packed_run, tmp_path):
    whole = federate(packed_run, tmp_path / "whole", 2, server_momentum=0.9)
    federate(packed_run, tmp_path / "old", 1, server_momentum=0.9)
    path = tmp_path / "old" / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    payload |= {"version": 2, "velocity": payload.pop("server_state")["velocity"]}  # as version 2 wrote it
    torch.save(payload, path)
    resumed = federate(packed_run, tmp_path / "old", 2, resume=True, server_momentum=0.9)
    assert_same(weights(whole), weights(resumed))
