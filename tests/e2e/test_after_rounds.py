"""The driver's point after the last round (``driver.AfterRounds``): once, with the whole history, before the
final outputs, which show what it leaves in the model (issue 43 item 4)."""

from __future__ import annotations

import torch

from ldpfl.stage2_federate.checkpoint import client_digests
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.driver import RunDriver
from ldpfl.stage2_federate.in_process import InProcessTransport
from ldpfl.stage2_federate.model_file import read_model, run_record
from ldpfl.stage2_federate.plan import plan_federation
from ldpfl.stage2_federate.run_outputs import RunWriter


def test_a_step_after_the_last_round_runs_once_before_the_final_outputs(packed_run, tmp_path):
    config = FederationConfig(hidden=(8,), local_epochs=1, batch_size=32, lr=0.01, threads=1, seed=5, rounds=2)
    plan = plan_federation(packed_run, config)
    inputs = client_digests(plan.data)
    out = tmp_path / "out"
    driver = RunDriver.restored(plan, RunWriter(out, config, plan.record, plan.privacy, inputs), None, inputs)
    calls = []

    def zero_the_model(seen_plan, history):
        calls.append(([r.round for r in history], (out / "model.pt").exists(), (out / "accuracy.png").exists()))
        with torch.no_grad():
            for parameter in seen_plan.model.parameters():
                parameter.zero_()

    driver.run(InProcessTransport(plan), min_clients=0, trained_on=lambda written: run_record(plan.data, config,
                                                                                               written),
               title="after rounds", keep_checkpoint=False, after_rounds=[zero_the_model])
    assert calls == [([1, 2], False, False)]
    assert all(not tensor.any() for tensor in read_model(out / "model.pt").state_dict.values())
