"""What the Flower engine's ServerApp and ClientApps say to each other, and how a run is configured.

Imports neither flwr nor torch: the launcher, the CLI and the tests use it without Flower installed.

Message types (``flwr.app.Message.metadata.message_type``):

* :data:`DESCRIBE` (``query.describe``), once per node at start: the node answers with its client index
  and a :class:`ClientSummary` of its file (what the server's strategies need; never a record);
* :data:`TRAIN` (``train``): the global vector and the client's :class:`ClientSetup`; the answer is the
  client's perturbed upload (perturbed on the client) with its training loss and accuracy, and, when the
  message says ``evaluate``, first the evaluation of the received global vector (as :data:`EVALUATE`'s);
* :data:`EVALUATE` (``evaluate``): the global vector; the answer is the summed test loss, the number of
  correct predictions and the number of rows of the client's test split (and clean file, ``eval_clean``);
* :data:`FINISH` (``query.finish``), once per node at the end: the client deletes its resume state
  unless the run keeps its checkpoint.

The run configuration (``context.run_config``) holds the keys of :data:`RUN_CONFIG_DEFAULTS`; a value
reaches the apps through a TOML file given to ``flwr run --run-config FILE.toml`` (written with ``tomli_w``,
the writer Flower itself uses; every key must also be declared in the app's ``pyproject.toml``,
:func:`app_pyproject`, or Flower refuses the override).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tomli_w

from ..config import FederationConfig

APP_NAME = "ldpfl-flower"
PUBLISHER = "ldpfl"
SERVER_APP = "ldpfl.stage2_federate.flower_engine.server_app:app"
CLIENT_APP = "ldpfl.stage2_federate.flower_engine.client_entry:app"  # client_app's, time-stamped
FLOWER_REQUIREMENT = "flwr[simulation]==1.41.0"
INSTALL_HINT = "pip install -e '.[flower]'"

DESCRIBE = "query.describe"
FINISH = "query.finish"
TRAIN = "train"
EVALUATE = "evaluate"

# Record keys inside a message's RecordDict.
GLOBAL = "global"  # ArrayRecord: [the global vector, float32]
UPLOAD = "upload"  # ArrayRecord: [the client's perturbed upload]
INFO = "info"  # ConfigRecord: JSON text under "json"
METRICS = "metrics"  # MetricRecord: the training loss and accuracy
EVALUATION = "evaluation"  # MetricRecord: the evaluation sums of the message's global model
TIMINGS = "timings"  # ConfigRecord, only with the run config's timings-file: the ClientApp's timeline (JSON)

# Files in the output directory OUT shared by the coordinator's command and the ServerApp (deployment).
SUBMISSION_FILE = ".flower-submission.json"  # the submitting command: SuperLink, run id, token
STATUS_FILE = ".flower-status.json"  # the ServerApp's progress and end, polled by the command
SERVERAPP_LOCK = ".flower-serverapp.lock"  # held by the ServerApp that writes into OUT, while it runs

# Error codes of the ClientApp's error replies (flwr.app.Error(code, reason)); Flower's own are < 100.
CLIENT_FAILED = 900

# context.node_config keys of a deployed SuperNode (``flower-supernode --node-config``).
NODE_CLIENT_FILE = "client-file"
NODE_CLIENT_INDEX = "client-index"  # optional: checked against the file's own client index
NODE_STATE_DIR = "state-dir"  # optional: where the silo keeps its resume state
# Flower's simulation gives each virtual node this key (0 .. N-1).
PARTITION_ID = "partition-id"

RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    "ldpfl-config": "",  # FederationConfig.to_dict() as JSON (no seed)
    "ldpfl-seed": "",  # the seed as decimal text, "" = the OS CSPRNG (each node draws its own)
    "client-files": "",  # simulation: JSON list of the client files, partition id k -> file k
    "client-sha256": "",  # simulation: JSON list of their sha256 at the start (the manifest's), checked each round
    "out-dir": "",  # absolute: where the ServerApp writes the outputs
    "status-file": "",  # absolute: where the ServerApp reports progress and its end (JSON)
    "num-clients": 0,  # how many SuperNodes (clients) to wait for
    "startup-timeout": 300.0,  # seconds for every node to connect and describe itself
    "round-timeout": 600.0,  # seconds for the replies of one exchange
    "resume": False,
    "keep-checkpoint": False,
    "client-state-dir": "",  # simulation: where each client keeps its resume state
    "threads": 0,  # torch threads per client (0: torch's default)
    "run-dir": "",  # the run directory as the coordinator names it (config.json's run.run_dir)
    "manifest-files": "",  # deployment: JSON list of ManifestEntry, the coordinator's manifest.json
    "plan-fingerprint": "",  # deployment: the fingerprint of the coordinator's plan.json ("" = no plan)
    "submission": "",  # deployment: the submitting command's token in OUT (the ServerApp checks it sees OUT)
    "timings-file": "",  # benchmarks: the ServerApp appends each message's timeline here (JSON lines)
    "min-clients": 0,  # failure policy: a client's failure is logged and the round goes on while at least this
    # many selected clients trained; fewer ends the run (0: no policy, a client's own failure ends the run)
}


def app_pyproject(version: str) -> str:
    """Return the ``pyproject.toml`` of the Flower app: metadata, components and every run-config key.

    The app directory holds only this file: the components are modules of the installed ldpfl package.
    """
    return tomli_w.dumps({
        "project": {"name": APP_NAME, "version": version,
                    "description": "ldpfl stage 2 (federated learning over LDP feature files) on Flower",
                    "license": "Apache-2.0", "dependencies": []},
        "tool": {"flwr": {"app": {"publisher": PUBLISHER,
                                  "components": {"serverapp": SERVER_APP, "clientapp": CLIENT_APP},
                                  "config": dict(RUN_CONFIG_DEFAULTS)}}},
    })


def run_config(config: FederationConfig, **values: Any) -> dict[str, Any]:
    """Return the run configuration of ``config`` plus ``values`` (keys with ``_`` for ``-``)."""
    out = dict(RUN_CONFIG_DEFAULTS)
    out["ldpfl-config"] = json.dumps(config.to_dict())
    out["ldpfl-seed"] = "" if config.seed is None else str(int(config.seed))
    for key, value in values.items():
        name = key.replace("_", "-")
        if name not in RUN_CONFIG_DEFAULTS:
            raise KeyError(f"unknown run configuration key {name!r}")
        out[name] = type(RUN_CONFIG_DEFAULTS[name])(value)
    return out


def read_config(run_config: Mapping[str, Any]) -> FederationConfig:
    """Rebuild the :class:`FederationConfig` (with its seed) from a run configuration."""
    text = str(run_config.get("ldpfl-config", ""))
    if not text:
        raise ValueError("the Flower run configuration has no 'ldpfl-config' (submit the run through ldpfl)")
    values = json.loads(text)
    seed = str(run_config.get("ldpfl-seed", ""))
    return FederationConfig(**values, seed=int(seed) if seed else None)


def _json_record(obj: Any) -> str:
    return json.dumps(dataclasses.asdict(obj))


@dataclass(frozen=True)
class ClientSummary:
    """What a client tells the server about its file once: sizes, labels and the file's feature metadata.

    This is what the aggregation strategies and the records need (rows for sample weights, the label
    histogram for DP-FedAW and the probability strategy) and what the local engine reads from the files.
    """

    index: int
    file: str  # the file's name (not its path on the silo)
    train_rows: int
    test_rows: int
    label_histogram: tuple[int, ...]
    dataset: str
    num_classes: int
    feature_format: str
    feature_width: int
    feature_mechanism: str
    feature_privacy: dict[str, Any]
    sha256: str  # of the file: the checkpoint records it, and resume refuses other files
    release_guarantee: dict[str, Any] | None = None  # the file's (issue 22); None from an older client
    label_release: dict[str, Any] | None = None  # the file's label_release (issue 22: T of k-RR labels)
    plan_fingerprint: str | None = None  # the shared plan the file was exported with (issue 16), if any

    def to_json(self) -> str:
        """Return the summary as JSON text."""
        return _json_record(self)

    @classmethod
    def from_json(cls, text: str) -> ClientSummary:
        """Read a summary written by :meth:`to_json`."""
        data = json.loads(text)
        data["label_histogram"] = tuple(int(v) for v in data["label_histogram"])
        return cls(**data)


@dataclass(frozen=True)
class ManifestEntry:
    """One client file as the coordinator's ``manifest.json`` lists it: what its SuperNode must serve."""

    index: int
    file: str
    sha256: str

    @staticmethod
    def list_to_json(entries: Sequence[ManifestEntry]) -> str:
        """Return ``entries`` as JSON text (the run configuration's ``manifest-files``)."""
        return json.dumps([dataclasses.asdict(e) for e in entries])

    @classmethod
    def list_from_json(cls, text: str) -> list[ManifestEntry]:
        """Read what :meth:`list_to_json` wrote (``[]`` for an empty text)."""
        return [cls(int(e["index"]), str(e["file"]), str(e["sha256"])) for e in json.loads(text or "[]")]


@dataclass(frozen=True)
class ClientSetup:
    """What the server tells a client with each training message: its place in the run and its budget.

    ``position`` is the client's rank in client-index order (its random streams are the root's child
    ``position``, as in the local engine's ``Streams``); ``epsilon``, ``range_length`` and ``centre`` are
    its resolved ε_i, L_i and c_i (None when the perturbation takes none); ``dim`` the model's size;
    ``label_noise`` the run's ``LabelNoise.to_dict()`` (T and the loss correction; None: plain cross-entropy).
    """

    position: int
    clients: int
    dim: int
    input_width: int
    num_classes: int
    optimizer: str
    lr: float
    epsilon: float | None
    range_length: float | None
    centre: float | None
    label_noise: dict[str, Any] | None = None

    def to_json(self) -> str:
        """Return the setup as JSON text."""
        return _json_record(self)

    @classmethod
    def from_json(cls, text: str) -> ClientSetup:
        """Read a setup written by :meth:`to_json`."""
        return cls(**json.loads(text))
