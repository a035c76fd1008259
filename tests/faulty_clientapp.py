"""A Flower ClientApp whose silo 2 is faulty, for the hardening tests (issue 31); every other silo is ldpfl's own.

The tests name it as the app's ``clientapp`` component (``faulty_clientapp:app``, with ``tests/`` on the
``PYTHONPATH`` of Flower's processes). Silo :data:`BAD` trains as ldpfl's ClientApp does, then replaces its
upload: round 1 sends it three values short (a wrong shape), every later round all NaN.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from ldpfl.stage2_federate.flower_engine import client_app as honest
from ldpfl.stage2_federate.flower_engine import client_entry  # noqa: F401 - the runtime settings, as Flower loads them
from ldpfl.stage2_federate.flower_engine.protocol import PARTITION_ID, UPLOAD

BAD = 2

app = ClientApp()


@app.query("describe")
def describe(msg: Message, context: Context) -> Message:
    """Describe the file as ldpfl's ClientApp does."""
    return honest.describe(msg, context)


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
