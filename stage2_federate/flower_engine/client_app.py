"""The Flower ``ClientApp`` of ldpfl: one client file per node, trained and perturbed on the node.

Which file: a deployed SuperNode names it in its node configuration (``--node-config
"client-file='/data/client_003.h5'"``, optionally ``client-index=3`` as a check and ``state-dir='...'``
for resume); a simulated node takes file ``partition-id`` of the run's ``client-files`` list.

Before every open the file is checked against the one the run started with (``file_watch``: size and
mtime, the sha256 when they change); a replaced file fails that client with its reason.

Every handler turns an exception into an error reply (code :data:`~.protocol.CLIENT_FAILED`, a one-line
reason), so the server ends the run with a clear error instead of waiting or reading a Ray traceback.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.data import ClientDataset
from ldpfl.stage2_federate.plan import resolve_device

from . import client_side as cs
from .file_watch import check_unchanged
from .processes import process_started
from .protocol import (
    CLIENT_FAILED,
    EVALUATION,
    GLOBAL,
    INFO,
    METRICS,
    NODE_CLIENT_FILE,
    NODE_CLIENT_INDEX,
    NODE_STATE_DIR,
    PARTITION_ID,
    TIMINGS,
    UPLOAD,
    ClientSetup,
    EvaluateInstruction,
    TrainInstruction,
    TrainReply,
    description_to_json,
    read_app_config,
)

MODULE_READY = time.time()  # this process has loaded Flower's runtime, this module, ldpfl and torch

app = ClientApp()
_MARKS: dict[str, float] = {}  # this message's timeline (benchmarks, run config timings-file)

STREAMS_KEY = "ldpfl-streams"  # context.state: this client's generator states between rounds
FILE_KEY = "ldpfl-file"  # context.state: the client file's path, size, mtime and sha256 at the start of the run
_TRAINERS: dict[tuple[object, ...], cs.Trainer] = {}


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def guarded(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """Reply with an error message (code CLIENT_FAILED) instead of raising; add the timeline when asked."""
    def run(msg: Message, context: Context) -> Message:
        _MARKS.clear()
        _MARKS["handler_started"] = time.time()
        try:
            reply = handler(msg, context)
        except Exception as error:  # noqa: BLE001 - every failure goes back to the server as one line
            return Message(Error(CLIENT_FAILED, _one_line(error)), reply_to=msg)
        if read_app_config(context.run_config).timings_file:
            entry = sys.modules.get(f"{__package__}.client_entry")
            timeline = {"process_started": process_started(),
                        "imports_started": getattr(entry, "IMPORTS_STARTED", None), "module_ready": MODULE_READY,
                        **_MARKS, "handler_done": time.time()}
            reply.content[TIMINGS] = ConfigRecord({"json": json.dumps(timeline)})
        return reply

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def client_file(context: Context) -> Path:
    """Return this node's client file (node configuration, else the simulation's partition)."""
    node = context.node_config
    if NODE_CLIENT_FILE in node:
        return Path(str(node[NODE_CLIENT_FILE])).expanduser()
    files = read_app_config(context.run_config).client_files
    if PARTITION_ID not in node or not files:
        raise ValueError(f"this SuperNode has no client file: start it with --node-config "
                         f"\"{NODE_CLIENT_FILE}='/path/client_XXX.h5'\"")
    return Path(files[int(node[PARTITION_ID])])


def expected_sha256(context: Context) -> str | None:
    """Return the sha256 the run started with for this node's file (simulation: the manifest's), if known."""
    digests = read_app_config(context.run_config).client_sha256
    node = context.node_config
    if NODE_CLIENT_FILE in node or PARTITION_ID not in node or not digests:
        return None  # a deployed SuperNode: its first contact records the digest
    return str(digests[int(node[PARTITION_ID])])


def check_file(context: Context, path: Path) -> None:
    """Refuse a file replaced since the run started (size and mtime each message, the sha256 when they change)."""
    records = context.state.config_records
    recorded = dict(records[FILE_KEY]) if FILE_KEY in records else None
    records[FILE_KEY] = ConfigRecord(check_unchanged(path, recorded, expected_sha256(context)))


def _open(context: Context, config: FederationConfig) -> ClientDataset:
    path = client_file(context)
    check_file(context, path)
    client = cs.open_client(path, resolve_device(config.device))
    expected = context.node_config.get(NODE_CLIENT_INDEX)
    if expected is not None and int(expected) != client.index:
        raise ValueError(f"{client.path.name} holds client {client.index}, but this SuperNode was configured as "
                         f"client {expected}")
    _MARKS["file_ready"] = time.time()
    return client


def _store(context: Context, index: int) -> cs.ResumeStore | None:
    shared = read_app_config(context.run_config).client_state_dir
    directory = str(context.node_config.get(NODE_STATE_DIR, "") or shared)
    return cs.ResumeStore(directory, index) if directory else None


def _trainer(config: FederationConfig, setup: ClientSetup) -> cs.Trainer:
    key = (setup.input_width, setup.num_classes, config.hidden, config.dropout, config.device, config.threads)
    if key not in _TRAINERS:
        _TRAINERS.clear()
        _TRAINERS[key] = cs.Trainer.build(config, setup)
    return _TRAINERS[key]


def _info(content: RecordDict) -> str:
    """Return the JSON text of a message's INFO record (a record's ``from_json`` reads and validates it)."""
    return str(content.config_records[INFO]["json"])


@app.query("describe")
@guarded
def describe(msg: Message, context: Context) -> Message:
    """Open the file (and with ``eval_clean`` its clean test file) and tell the server its index and summary."""
    config = read_app_config(context.run_config).federation
    client = _open(context, config)
    if config.eval_clean:  # a missing or mismatched clean file ends the run before round 1, as in the local engine
        cs.clean_test(client, resolve_device(config.device))
    digest = str(context.state.config_records[FILE_KEY]["sha256"])  # check_file's, a moment ago
    return Message(RecordDict({INFO: ConfigRecord({"json": description_to_json(cs.summarize(client, digest))})}),
                   reply_to=msg)


@app.train()
@guarded
def train(msg: Message, context: Context) -> Message:
    """Train from the global vector, perturb with this client's mechanism and budget, reply the upload."""
    config = read_app_config(context.run_config).federation
    instruction = TrainInstruction.from_json(_info(msg.content))
    setup = instruction.setup
    client = _open(context, config)
    trainer = _trainer(config, setup)
    perturb, generator, _mode = cs.fresh_streams(config, setup, trainer.device)
    store = _store(context, client.index)
    if STREAMS_KEY in context.state.config_records:
        perturb = cs.unpack_streams({k: str(v) for k, v in context.state.config_records[STREAMS_KEY].items()},
                                    perturb, generator)
    elif instruction.resume_round > 0:
        saved = None if store is None else store.load(instruction.resume_round)
        if saved is not None:
            perturb = cs.unpack_streams(saved, perturb, generator)
        elif instruction.trained_before:
            raise ValueError(f"client {client.index} cannot resume: it trained before round "
                             f"{instruction.resume_round} but has no resume state"
                             + ("" if store is None else f" in {store.path}"))
    vector = msg.content.array_records[GLOBAL].to_numpy_ndarrays()[0]
    evaluation = (_evaluation(trainer, config, setup, client, vector, instruction.round - 1)
                  if instruction.evaluate else None)  # the last round's model
    _MARKS["evaluated"] = time.time()
    result = trainer.train(config, setup, client, vector, generator=generator, rng=perturb)
    state = cs.pack_streams(perturb, generator)
    context.state.config_records[STREAMS_KEY] = ConfigRecord(dict(state))
    if store is not None:
        store.save(instruction.round, state)
    content = RecordDict({
        METRICS: MetricRecord({"loss": float(result.loss), "accuracy": float(result.accuracy)}),
        INFO: ConfigRecord({"json": TrainReply(client=client.index, note=result.note).to_json()}),
    })
    if result.upload is not None:
        content[UPLOAD] = ArrayRecord([result.upload])
    if evaluation is not None:
        content[EVALUATION] = evaluation
    return Message(content, reply_to=msg)


@app.evaluate()
@guarded
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the global vector on this client's test split; reply the sums."""
    config = read_app_config(context.run_config).federation
    setup = EvaluateInstruction.from_json(_info(msg.content)).setup
    client = _open(context, config)
    vector = msg.content.array_records[GLOBAL].to_numpy_ndarrays()[0]
    model_round = int(msg.metadata.group_id) - 1  # the exchange after the model's round (transport._message)
    evaluation = _evaluation(_trainer(config, setup), config, setup, client, vector, model_round)
    return Message(RecordDict({EVALUATION: evaluation}), reply_to=msg)


def _evaluation(trainer: cs.Trainer, config: FederationConfig, setup: ClientSetup, client: ClientDataset,
                vector: np.ndarray, model_round: int) -> MetricRecord:
    """Evaluate ``vector`` (round ``model_round``'s model) on this client's test split(s); return the sums."""
    sums = trainer.evaluate(config, setup, client, vector, model_round)
    return MetricRecord({f"{name}_{key}": value for name, (loss_sum, correct, rows) in sums.items()
                         for key, value in (("loss_sum", float(loss_sum)), ("correct", int(correct)),
                                            ("rows", int(rows)))})


@app.query("finish")
@guarded
def finish(msg: Message, context: Context) -> Message:
    """Delete this client's resume state at the end of the run, unless the run keeps its checkpoint."""
    config = read_app_config(context.run_config).federation
    client = _open(context, config)
    store = _store(context, client.index)
    if store is not None and not read_app_config(context.run_config).keep_checkpoint:
        store.remove()
    return Message(RecordDict({INFO: ConfigRecord({"json": "{}"})}), reply_to=msg)
