"""A Flower ClientApp whose silo 2 is faulty, for the hardening tests (issue 31); every other silo is ldpfl's own.

The tests name it as the app's ``clientapp`` component (``faulty_clientapp:app``, with ``tests/`` on the
``PYTHONPATH`` of Flower's processes). Silo :data:`BAD` trains as ldpfl's ClientApp does, then replaces its
upload: round 1 sends it three values short (a wrong shape), every later round all NaN.

With :data:`DESCRIBE_FAULT` set in the environment, silo :data:`BAD` lies in its description instead (issue 42):
``rows`` claims :data:`CLAIMED_ROWS` training rows (a histogram that adds up: only the manifest says no),
``index`` claims client index :data:`IMPOSTOR_OF` while serving its own file (the manifest's digest says no).
With :data:`HISTOGRAM_FORGER` set to a client index, that silo (whatever its node) claims a training label histogram
as even as its rows allow (:func:`even`), the claim that raises a DP-FedAW weight; only the manifest's label counts
say no.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from ldpfl.stage2_federate.flower_engine import client_app as honest
from ldpfl.stage2_federate.flower_engine import client_entry  # noqa: F401 - the runtime settings, as Flower loads them
from ldpfl.stage2_federate.flower_engine.protocol import INFO, PARTITION_ID, UPLOAD

BAD = 2
DESCRIBE_FAULT = "LDPFL_TEST_DESCRIBE_FAULT"
CLAIMED_ROWS = 10**6
IMPOSTOR_OF = 0
HISTOGRAM_FORGER = "LDPFL_TEST_HISTOGRAM_FORGER"

app = ClientApp()


def even(rows: int, classes: int) -> list[int]:
    """A histogram of ``rows`` over ``classes`` as even as can be (the remainder in the last class)."""
    return [*[rows // classes] * (classes - 1), rows - (classes - 1) * (rows // classes)]


@app.query("describe")
def describe(msg: Message, context: Context) -> Message:
    """Describe the file as ldpfl's ClientApp does; silos BAD and :data:`HISTOGRAM_FORGER` lie as set."""
    reply = honest.describe(msg, context)
    fault = os.environ.get(DESCRIBE_FAULT)
    forger = os.environ.get(HISTOGRAM_FORGER)
    summary = json.loads(str(reply.content.config_records[INFO]["json"]))
    if forger and summary["index"] == int(forger):
        summary["label_histogram"] = even(summary["train_rows"], len(summary["label_histogram"]))
        reply.content[INFO] = ConfigRecord({"json": json.dumps(summary)})
    if int(context.node_config[PARTITION_ID]) == BAD and fault:
        if fault == "rows":
            summary["label_histogram"][0] += CLAIMED_ROWS - summary["train_rows"]
            summary["train_rows"] = CLAIMED_ROWS
        elif fault == "index":
            summary["index"] = IMPOSTOR_OF
        reply.content[INFO] = ConfigRecord({"json": json.dumps(summary)})
    return reply


@app.query("finish")
def finish(msg: Message, context: Context) -> Message:
    """End the run as ldpfl's ClientApp does."""
    return honest.finish(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate as ldpfl's ClientApp does."""
    return honest.evaluate(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train as ldpfl's ClientApp does; silo BAD then spoils its upload (wrong shape in round 1, NaN after)."""
    reply = honest.train(msg, context)
    if int(context.node_config[PARTITION_ID]) == BAD and UPLOAD in reply.content.array_records:
        upload = reply.content.array_records[UPLOAD].to_numpy_ndarrays()[0]
        spoiled = upload[:-3] if int(msg.metadata.group_id) == 1 else np.full_like(upload, np.nan)
        reply.content[UPLOAD] = ArrayRecord([spoiled])
    return reply
