"""A Flower ClientApp in which every silo of a 3-silo, 2-round deployment misbehaves once, for issue 31.

The SuperLink test names it as the app's ``clientapp`` component (``faulty_deployment_clientapp:app``, with
``tests/`` on the ``PYTHONPATH`` of the SuperNodes). Otherwise each silo is ldpfl's own ClientApp. A round's
evaluation travels with the next round's training message (the last one in the closing ``evaluate``), so the
evaluation of round r's model is forged in the message of group r + 1.

* silo :data:`SHAPE_NAN`: round 1 uploads three values short (a wrong shape), round 2 uploads NaN;
* silo :data:`FORGED`: round 1 reports training metrics of 3.3e8, and its evaluation of round 2's model claims
  more correct predictions than rows (above 100 %);
* silo :data:`ROW_CLAIM`: its evaluation of round 1's model claims 10⁶ rows, every one correct; and when the
  file ``claim-rows`` exists in the directory :data:`FAULTS_VARIABLE` names, its description claims 10⁶
  training rows (the coordinator's manifest says otherwise).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp

from ldpfl.stage2_federate.flower_engine import client_app as honest
from ldpfl.stage2_federate.flower_engine import client_entry  # noqa: F401 - the runtime settings, as Flower loads them
from ldpfl.stage2_federate.flower_engine.protocol import EVALUATION, INFO, METRICS, NODE_CLIENT_INDEX, UPLOAD

ROW_CLAIM, FORGED, SHAPE_NAN = 0, 1, 2
CLAIMED_ROWS = 10**6
FAULTS_VARIABLE = "LDPFL_TEST_FAULTS"

app = ClientApp()


def silo(context: Context) -> int:
    """The silo's index, from its SuperNode's node configuration."""
    return int(context.node_config[NODE_CLIENT_INDEX])


def forged_evaluation(reply: Message, group: int, index: int) -> None:
    """Forge the evaluation sums in ``reply`` (of message group ``group``) as silo ``index`` does."""
    if EVALUATION not in reply.content.metric_records:
        return
    sums = dict(reply.content.metric_records[EVALUATION])
    if index == ROW_CLAIM and group == 2:  # round 1's model: a million rows, all correct
        sums.update(test_rows=CLAIMED_ROWS, test_correct=CLAIMED_ROWS)
    elif index == FORGED and group == 3:  # round 2's model: more correct than rows
        sums.update(test_correct=int(sums["test_rows"]) + 7)
    else:
        return
    reply.content[EVALUATION] = MetricRecord(sums)


@app.query("describe")
def describe(msg: Message, context: Context) -> Message:
    """Describe the file as ldpfl's ClientApp does; silo ROW_CLAIM inflates its training rows when told to."""
    reply = honest.describe(msg, context)
    faults = os.environ.get(FAULTS_VARIABLE)
    if silo(context) == ROW_CLAIM and faults and (Path(faults) / "claim-rows").exists():
        summary = json.loads(str(reply.content.config_records[INFO]["json"]))
        histogram = summary["label_histogram"]
        histogram[0] += CLAIMED_ROWS - summary["train_rows"]  # the claims add up: only the manifest says no
        summary.update(train_rows=CLAIMED_ROWS, label_histogram=histogram)
        reply.content[INFO] = ConfigRecord({"json": json.dumps(summary)})
    return reply


@app.query("finish")
def finish(msg: Message, context: Context) -> Message:
    """End the run as ldpfl's ClientApp does."""
    return honest.finish(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate as ldpfl's ClientApp does, then forge the sums as the silo does."""
    reply = honest.evaluate(msg, context)
    if not reply.has_error():
        forged_evaluation(reply, int(msg.metadata.group_id), silo(context))
    return reply


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train as ldpfl's ClientApp does, then spoil the upload, the metrics or the evaluation as the silo does."""
    reply = honest.train(msg, context)
    if reply.has_error():
        return reply
    group, index = int(msg.metadata.group_id), silo(context)
    forged_evaluation(reply, group, index)
    if index == SHAPE_NAN and UPLOAD in reply.content.array_records:
        upload = reply.content.array_records[UPLOAD].to_numpy_ndarrays()[0]
        reply.content[UPLOAD] = ArrayRecord([upload[:-3] if group == 1 else np.full_like(upload, np.nan)])
    if index == FORGED and group == 1:
        reply.content[METRICS] = MetricRecord({"loss": 0.01, "accuracy": 3.3e8})
    return reply


