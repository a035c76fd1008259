"""What the Flower engine's ServerApp and ClientApps say to each other, and how a run is configured.

Imports neither flwr nor torch: the launcher, the CLI and the tests use it without Flower installed.

Message types (``flwr.app.Message.metadata.message_type``):

* :data:`DESCRIBE` (``query.describe``), once per node at start: the node answers with the
  ``ClientDescription`` of its file (:func:`description_to_json`: what the server's plan and strategies need;
  never a record);
* :data:`TRAIN` (``train``): the global vector and a :class:`TrainInstruction` (the client's
  :class:`ClientSetup`, the round); the answer is the client's perturbed upload (perturbed on the client)
  with its training loss and accuracy and a :class:`TrainReply`, and, when the instruction says
  ``evaluate``, first the evaluation of the received global vector (as :data:`EVALUATE`'s);
* :data:`EVALUATE` (``evaluate``): the global vector and an :class:`EvaluateInstruction`; the answer is the
  summed test loss, the number of correct predictions and the number of rows of the client's test split
  (and clean file, ``eval_clean``);
* :data:`FINISH` (``query.finish``), once per node at the end: the client deletes its resume state
  unless the run keeps its checkpoint.

The JSON under :data:`INFO` is read with :func:`decode`: pydantic validates it against the record's
fields (exact types, no missing or unknown field, counts ≥ 0, budgets finite and > 0), so a malformed
message from across the network is a :class:`MessageError` that names the field, never a half-built record.

The run configuration (``context.run_config``) holds the keys of :data:`RUN_CONFIG_DEFAULTS`; a value
reaches the apps through a TOML file given to ``flwr run --run-config FILE.toml`` (written with ``tomli_w``,
the writer Flower itself uses; every key must also be declared in the app's ``pyproject.toml``,
:func:`app_pyproject`, or Flower refuses the override).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, TypeVar

import tomli_w
from pydantic import TypeAdapter, ValidationError

from ldpfl.common.errors import LdpflError
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.left_out import LeftOut
from ldpfl.stage2_federate.message_fields import (
    STRICT,
    AtLeastOne,
    Count,
    Finite,
    FinitePositive,
    WireLabelNoise,
    WireTraining,
)
from ldpfl.stage2_federate.silo_training import PLAIN

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
    "left-out": "",  # simulation: JSON list of the silos the launcher left out, no node started for them (a file
    # that does not verify; LeftOut.to_dict each), named in run.left_out with those the ServerApp refuses
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


@dataclass(frozen=True)
class AppRunConfig:
    """A run configuration as both apps read it: once, into typed fields (keys of :data:`RUN_CONFIG_DEFAULTS`).

    ``federation`` (the :class:`FederationConfig` with its seed) is parsed when first asked for: a node's file
    checks need only the file fields.
    """

    config_json: str
    seed_text: str
    client_files: tuple[str, ...]
    client_sha256: tuple[str, ...]
    out_dir: str
    status_file: str
    num_clients: int
    startup_timeout: float
    round_timeout: float
    resume: bool
    keep_checkpoint: bool
    client_state_dir: str
    run_dir: str
    manifest: tuple[ManifestEntry, ...]
    plan_fingerprint: str | None
    submission: str
    timings_file: str
    min_clients: int
    left_out: tuple[LeftOut, ...] = ()

    @classmethod
    def read(cls, run_config: Mapping[str, Any]) -> AppRunConfig:
        """Parse ``run_config`` (missing keys take :data:`RUN_CONFIG_DEFAULTS`' values)."""
        values = {**RUN_CONFIG_DEFAULTS, **run_config}
        files = tuple(str(f) for f in json.loads(str(values["client-files"]) or "[]"))
        return cls(
            config_json=str(values["ldpfl-config"]), seed_text=str(values["ldpfl-seed"]), client_files=files,
            client_sha256=tuple(str(d) for d in json.loads(str(values["client-sha256"]) or "[]")),
            out_dir=str(values["out-dir"]), status_file=str(values["status-file"]),
            num_clients=int(values["num-clients"]), startup_timeout=float(values["startup-timeout"]),
            round_timeout=float(values["round-timeout"]), resume=bool(values["resume"]),
            keep_checkpoint=bool(values["keep-checkpoint"]), client_state_dir=str(values["client-state-dir"]),
            run_dir=str(values["run-dir"]) or (str(PurePath(files[0]).parent) if files else ""),
            manifest=tuple(ManifestEntry.list_from_json(str(values["manifest-files"]))),
            plan_fingerprint=str(values["plan-fingerprint"]) or None, submission=str(values["submission"]),
            timings_file=str(values["timings-file"]), min_clients=int(values["min-clients"]),
            left_out=left_out_from_json(str(values["left-out"])),
        )

    @functools.cached_property
    def federation(self) -> FederationConfig:
        """The run's :class:`FederationConfig`, with its seed (:func:`read_config`)."""
        return read_config({"ldpfl-config": self.config_json, "ldpfl-seed": self.seed_text})


def left_out_to_json(left: Sequence[LeftOut]) -> str:
    """Return ``left`` as the run configuration's ``left-out`` (``LeftOut.to_dict`` of each silo)."""
    return json.dumps([x.to_dict() for x in left])


def left_out_from_json(text: str) -> tuple[LeftOut, ...]:
    """Read what :func:`left_out_to_json` wrote (``()`` for an empty text), each silo validated (``MessageError``)."""
    forms = decode(tuple[LeftOutForm, ...], text or "[]")
    return tuple(LeftOut(form.client, form.file, form.reason) for form in forms)


def read_app_config(run_config: Mapping[str, Any]) -> AppRunConfig:
    """Return :meth:`AppRunConfig.read` of ``run_config``, parsed once per process and run configuration."""
    return _read_app_config(json.dumps(dict(run_config), sort_keys=True))


@functools.lru_cache(maxsize=4)
def _read_app_config(text: str) -> AppRunConfig:
    return AppRunConfig.read(json.loads(text))


# --------------------------------------------------------------------------------------------------
# The JSON records of the messages, validated on the way in.

Record = TypeVar("Record")


class MessageError(LdpflError, ValueError):
    """A message whose JSON does not fit its record; the text names the record and the field."""


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(schema: type) -> TypeAdapter[Any]:
    if schema not in _ADAPTERS:
        _ADAPTERS[schema] = TypeAdapter(schema)
    return _ADAPTERS[schema]


def _problem(error: Mapping[str, Any]) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "the message"
    if error["type"] == "missing":
        return f"{field}: missing"
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return f"{field}: not a field of this message"
    value = error.get("input")
    got = f", got {value!r}" if isinstance(value, str | int | float | bool) or value is None else ""
    return f"{field}: {error['msg']}{got[:80]}"


def decode(schema: type[Record], text: str) -> Record:
    """Read JSON ``text`` as a ``schema`` record, validated against its fields (module docstring).

    Raises
    ------
    MessageError
        The text is not JSON, or a field is missing, unknown, of the wrong type or out of range (the first
        three problems are named).
    """
    try:
        return _adapter(schema).validate_json(text)
    except ValidationError as error:
        problems = "; ".join(_problem(e) for e in error.errors()[:3])
        name = getattr(schema, "__name__", None) or str(schema)
        raise MessageError(f"invalid {name} message: {problems}") from None


class JsonRecord:
    """``to_json`` / ``from_json`` of a frozen dataclass record (``from_json`` validates, :func:`decode`)."""

    __pydantic_config__ = STRICT

    def to_json(self) -> str:
        """Return the record as JSON text (floats as Python's ``json`` writes them: NaN and ∞ kept)."""
        return json.dumps(self.json_form())

    def json_form(self) -> dict[str, Any]:
        """Return the record's fields as JSON values (a record with typed fields writes their JSON forms).

        A field that is itself a record is written by its own ``json_form`` (``ClientSetup`` inside an
        instruction writes its training's ``wire_form``, not the dataclass's fields).
        """
        form: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, JsonRecord):
                form[field.name] = value.json_form()
        return form

    @classmethod
    def from_json(cls: type[Record], text: str) -> Record:
        """Read a record written by :meth:`to_json`; ``MessageError`` names a field that does not fit."""
        return decode(cls, text)


def description_to_json(description: ClientDescription) -> str:
    """Return a silo's answer to :data:`DESCRIBE`: ``description`` as JSON text (its ``json_form``)."""
    return json.dumps(description.json_form())


def description_from_json(text: str) -> ClientDescription:
    """Read a silo's answer to :data:`DESCRIBE` (:func:`description_to_json`), each field validated (:func:`decode`).

    Raises
    ------
    MessageError
        A field is missing, unknown, of the wrong type or out of range.
    """
    return decode(ClientDescription, text)


@dataclass(frozen=True)
class ManifestEntry(JsonRecord):
    """One client file as the coordinator's ``manifest.json`` lists it: what its SuperNode must serve."""

    index: Count
    file: str
    sha256: str
    train_rows: Count | None = None  # the manifest's rows of the file (None: not checked)
    test_rows: Count | None = None
    train_labels: tuple[Count, ...] | None = None  # the manifest's training label counts (None: not listed)

    @classmethod
    def of(cls, record: Any) -> ManifestEntry:
        """Return the entry of a manifest's ``FileRecord`` (``contract.manifest``), with its rows when listed.

        A record that lists per-split label counts (``label_histograms``, as the files' attribute) gives the
        training split's as ``train_labels``, against which a SuperNode's claimed histogram is checked.
        """
        rows = dict(getattr(record, "rows", {}) or {})
        train, test = rows.get("train"), rows.get("test")
        labels = (dict(getattr(record, "label_histograms", None) or {})).get("train")
        return cls(int(record.client_index), str(record.path), str(record.sha256),
                   None if train is None else int(train), None if test is None else int(test),
                   None if labels is None else tuple(int(c) for c in labels))

    @staticmethod
    def list_to_json(entries: Sequence[ManifestEntry]) -> str:
        """Return ``entries`` as JSON text (the run configuration's ``manifest-files``)."""
        return json.dumps([dataclasses.asdict(e) for e in entries])

    @classmethod
    def list_from_json(cls, text: str) -> list[ManifestEntry]:
        """Read what :meth:`list_to_json` wrote (``[]`` for an empty text), each entry validated."""
        return list(decode(tuple[cls, ...], text or "[]"))  # type: ignore[valid-type]


@dataclass(frozen=True)
class LeftOutForm(JsonRecord):
    """A silo left out before round 1 as the run configuration's ``left-out`` lists it (``LeftOut.to_dict``)."""

    client: Count
    file: str
    reason: str


@dataclass(frozen=True)
class ClientSetup(JsonRecord):
    """What the server tells a client with each training message: its place in the run and its budget.

    ``position`` is the client's rank in client-index order (its random streams are the root's child
    ``position``, as in the local engine's ``Streams``); ``epsilon``, ``range_length`` and ``centre`` are
    its resolved ε_i, L_i and c_i (None when the perturbation takes none); ``dim`` the model's size;
    ``label_noise`` the run's ``LabelNoise`` (T and the loss correction; None: plain cross-entropy);
    ``training`` how the client trains (``silo_training``: e.g. its σ, C, q and steps), resolved by the server.
    On the wire each is its JSON form (the dataclass's fields; ``training`` its ``wire_form``).
    """

    position: Count
    clients: AtLeastOne
    dim: AtLeastOne
    input_width: AtLeastOne
    num_classes: AtLeastOne
    optimizer: str
    lr: FinitePositive
    epsilon: FinitePositive | None
    range_length: FinitePositive | None
    centre: Finite | None
    label_noise: WireLabelNoise | None = None
    training: WireTraining = PLAIN

    def json_form(self) -> dict[str, Any]:
        """Return the fields as JSON values, ``training`` as its ``wire_form`` (keyed by its kind)."""
        return {**dataclasses.asdict(self), "training": self.training.wire_form()}


@dataclass(frozen=True)
class TrainInstruction(JsonRecord):
    """The server's training message: the round, the client's setup, and what a resumed run needs.

    ``resume_round`` is the round the run resumed from (0: a fresh run); ``trained_before`` whether this
    client trained in an earlier round, when it must find its generator states in its resume store;
    ``evaluate`` whether it first evaluates the received vector (the previous round's model: one message
    per client and round).
    """

    round: AtLeastOne
    setup: ClientSetup
    resume_round: Count
    trained_before: bool
    evaluate: bool = False


@dataclass(frozen=True)
class EvaluateInstruction(JsonRecord):
    """The server's evaluation message: the client's setup (the model's shape)."""

    setup: ClientSetup


@dataclass(frozen=True)
class TrainReply(JsonRecord):
    """A client's answer to training besides its metrics and upload: who it is, and why an upload was excluded."""

    client: Count
    note: str | None
