"""The federation checkpoint: model, every random stream, the history so far; resumable only as configured.

The checkpoint holds the state of every generator, from which each client's perturbation noise can be
recomputed (it holds each generator's key or seed): it is seed-equivalent, and ``run_federation`` deletes it
once a run completes unless asked to keep it.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ldpfl.common.errors import ParameterError
from ldpfl.contract.atomic import atomic_write
from ldpfl.contract.schema import FormatError
from ldpfl.contract.torch_archive import check_archive
from ldpfl.contract.version import package_version

from .config import WRITTEN_WHEN_SET, FederationConfig
from .data import FederatedData
from .perturbation import perturbation_wiring
from .round_record import RoundRecord, rows
from .streams import Streams

CHECKPOINT_FORMAT = "ldpfl-federation-checkpoint"
CHECKPOINT_VERSION = 3
"""Version 2 records the sha256 of every client file the run trains on (``inputs``); version 3 keeps the server
optimizer's state under ``server_state`` (version 2 kept server momentum's velocity alone, as ``velocity``)."""
READABLE_VERSIONS = (2, CHECKPOINT_VERSION)
"""The versions :func:`load_checkpoint` reads (:func:`server_state` reads version 2's velocity)."""
# Options that may change when a run is resumed (they do not change what the run computes, or, for
# ``rounds``, only how long it goes on).
RESUMABLE_CHANGES = frozenset({"rounds", "device", "threads", "eval_batch_size", "eval_clean"})
ADDED_FIELDS = {"eval_every": 1, "head": "mlp", "shrinkage": None, "outlier_report": False}
"""Configuration fields added since checkpoint version 2, with the value a checkpoint without them ran with."""
LOCAL_ENGINE = "local"
"""The engine of a checkpoint without an ``engine`` entry (the local engine writes none)."""
_ENGINE_HOLDS = {LOCAL_ENGINE: "every client's random streams are in the checkpoint",
                 "flower": "each client's random streams are with that client, in its own resume file"}


def client_digests(data: FederatedData) -> dict[str, str]:
    """Return file name → sha256 of every client file of the run (the manifest's, which the files matched)."""
    return {record.path: record.sha256 for record in sorted(data.manifest.files, key=lambda r: r.path)}


@dataclass(frozen=True)
class Snapshot:
    """The server's model and streams after a round: what that round's checkpoint holds.

    An engine that completes a round's record later (Flower evaluates round t's model with round t + 1's
    message) keeps the snapshot until then.
    """

    model: dict[str, torch.Tensor]
    rng: dict[str, Any]
    server: Mapping[str, np.ndarray] = field(default_factory=dict)  # the server optimizer's state (none: empty)
    uploads: Mapping[str, list[int]] | None = None  # the digests of the uploads checked so far (``upload_hashes``)

    @classmethod
    def of(cls, model: torch.nn.Module, streams: Streams, server: Mapping[str, np.ndarray] | None = None,
           uploads: Mapping[str, list[int]] | None = None) -> Snapshot:
        """Return a copy of ``model``'s parameters (CPU), of the stream states and of the server optimizer's state.

        ``server``: ``ServerOptimizer.state()`` (named arrays); ``uploads``: the server's upload digests
        (``upload_hashes.UploadHistory.state``), kept as given.
        """
        return cls({k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                   copy.deepcopy(streams.state()), {k: np.array(v, copy=True) for k, v in (server or {}).items()},
                   None if uploads is None else dict(uploads))


def save_checkpoint(path: Path, *, round_number: int, state: Snapshot, config: FederationConfig, randomness: str,
                    history: Sequence[RoundRecord], inputs: Mapping[str, str], engine: str = LOCAL_ENGINE) -> None:
    """Atomically write the state after ``round_number``: model, streams, history, configuration, inputs.

    ``inputs`` maps each client file's name to its sha256 (:func:`client_digests`). Another engine than
    the local one records itself and the ldpfl version (a local checkpoint has no ``engine`` entry: it
    predates the entry, and :func:`check_engine` reads a missing one as local). Flower's ``rng`` holds the
    server's streams only in substance; each client keeps its own streams in its own resume file.
    """
    payload: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "round": round_number}
    if engine != LOCAL_ENGINE:
        payload["engine"] = engine
    if state.server:
        payload["server_state"] = {name: torch.from_numpy(np.ascontiguousarray(array))
                                   for name, array in state.server.items()}
    payload.update(model=state.model, rng=state.rng, history=rows(history), config=config.to_dict(),
                   randomness=randomness)
    if engine != LOCAL_ENGINE:
        payload["ldpfl"] = package_version()
    payload["inputs"] = dict(inputs)
    if state.uploads is not None:  # issue 42: a resumed run still refuses a stale upload of the rounds before it
        payload["uploads"] = dict(state.uploads)
    atomic_write(path, lambda handle: torch.save(payload, handle))


def check_inputs(path: Path, payload: Mapping[str, Any], inputs: Mapping[str, str]) -> None:
    """Refuse to resume a checkpoint trained on other client files than ``inputs`` (name → sha256).

    Raises
    ------
    ValueError
        One line naming the files that differ, are new, or are gone (a ``ParameterError``).
    """
    saved = payload.get("inputs")
    if not isinstance(saved, Mapping):
        raise ValueError(f"cannot resume {path}: it does not record which client files it was trained on")
    if dict(saved) == dict(inputs):
        return
    changed = sorted(name for name in set(saved) & set(inputs) if saved[name] != inputs[name])
    gone = sorted(set(saved) - set(inputs))
    new = sorted(set(inputs) - set(saved))
    parts = ([f"{', '.join(changed)} differ (sha256)"] if changed else []) + \
        ([f"{', '.join(gone)} not in this run"] if gone else []) + \
        ([f"{', '.join(new)} not in the checkpoint's run"] if new else [])
    raise ParameterError(f"cannot resume {path}: it was trained on other client files than this run directory's "
                     f"({'; '.join(parts)}); start afresh with `overwrite` or choose another `out_dir`")


def check_silos(path: Path, payload: Mapping[str, Any], federated: Collection[int],
                left_out: Sequence[Mapping[str, Any]] = ()) -> None:
    """Refuse to resume the local engine's checkpoint with other silos than its rounds federated (one line).

    The checkpoint holds the clients' random streams by position, not by client index (``Streams.state``), so a
    resumed run must federate the silos it started with. A silo the checkpoint's rounds selected that this run
    leaves out (its file refused now: ``left_out``, ``run.left_out``'s entries) is named with the reason; another
    count of silos (a silo left out before round 1 whose file verifies now) is refused too. Without this check a
    silo left out now and another back in would swap streams silently.

    Raises
    ------
    ParameterError
        ``federated`` (the client indices of this run) are not the checkpoint's silos.
    """
    trained = sorted({int(c) for row in payload.get("history", ()) for c in row.get("selected", ())})
    gone = [c for c in trained if c not in set(federated)]
    streams = payload.get("rng", {}).get("perturb")
    held = len(streams) if isinstance(streams, Sequence) else len(federated)
    if not gone and held == len(federated):
        return
    reasons = [str(x.get("reason")) for x in left_out if x.get("client") in gone]
    why = (f"its rounds trained client {', '.join(map(str, gone))}, which this run leaves out"
           + (f" ({'; '.join(reasons)})" if reasons else "")) if gone else (
        f"it holds the random streams of {held} silos, this run federates {len(federated)} "
        f"(clients {', '.join(map(str, sorted(federated)))})")
    raise ParameterError(f"cannot resume {path}: {why}: a resumed run federates the silos it started with (the "
                         "checkpoint holds their random streams by position); restore the silo's file, or start "
                         "afresh with `overwrite` or choose another `out_dir`")


def check_engine(path: Path, payload: Mapping[str, Any], engine: str) -> None:
    """Refuse to resume with ``engine`` a checkpoint another engine wrote (one line naming both).

    The engines keep the clients' random streams in different places (the local engine in the
    checkpoint, the Flower engine with each client), so resuming across engines would restart those
    streams silently.
    """
    written = str(payload.get("engine", LOCAL_ENGINE))
    if written != engine:
        where = _ENGINE_HOLDS.get(written, "its clients' random streams are kept elsewhere")
        raise ParameterError(f"cannot resume {path} with the {engine} engine: the {written} engine wrote it "
                             f"({where}); resume it with `engine` {written}")


_KEY_TYPES: dict[str, tuple[type, ...]] = {"round": (int,), "model": (Mapping,), "rng": (Mapping,), "history": (list,),
                                           "config": (Mapping,), "randomness": (str,)}


def check_keys(path: Path, payload: Mapping[str, Any]) -> None:
    """Refuse a checkpoint that lacks a key resuming reads, or holds one of the wrong type (one line naming it).

    A checkpoint edited by hand (or by an attacker) and saved again is a valid archive; without this
    check it would fail later with a bare ``KeyError``.
    """
    for key, types in _KEY_TYPES.items():
        if key not in payload:
            raise ValueError(f"cannot resume: {path} is a damaged checkpoint: key {key!r} is missing; start "
                             "afresh with --overwrite")
        value = payload[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise ValueError(f"cannot resume: {path} is a damaged checkpoint: key {key!r} is a "
                             f"{type(value).__name__}, expected {' or '.join(t.__name__ for t in types)}")
    if payload["round"] < 0 or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                       for k, v in payload["model"].items()):
        raise ValueError(f"cannot resume: {path} is a damaged checkpoint: 'round' is negative or 'model' holds "
                         "something other than named tensors")


def load_checkpoint(path: Path, config: FederationConfig, *, engine: str = LOCAL_ENGINE) -> dict[str, Any]:
    """Read and check a checkpoint for resuming a run configured as ``config`` with ``engine``.

    Raises
    ------
    ValueError
        No readable ldpfl checkpoint at ``path``, another version, one written by another engine
        (:func:`check_engine`), a configuration that differs in anything but ``RESUMABLE_CHANGES``, a
        new number of rounds for a perturbation whose σ depends on it, or a checkpoint beyond
        ``config.rounds``.
    """
    if not path.is_file():
        raise ParameterError(f"cannot resume: {path} does not exist (start without `resume`)")
    try:
        check_archive(path, "checkpoint")  # declared sizes before torch allocates (issue 24)
    except FormatError as error:
        raise ValueError(f"cannot resume: {error}") from None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unpickling failure means an unusable checkpoint
        raise ValueError(f"cannot resume: {path} is not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"cannot resume: {path} is not an ldpfl federation checkpoint")
    if payload.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"cannot resume: {path} has checkpoint version {payload.get('version')!r}, this code "
                         f"reads {' and '.join(map(str, READABLE_VERSIONS))}")
    check_keys(path, payload)
    check_engine(path, payload, engine)
    saved = {**ADDED_FIELDS, **WRITTEN_WHEN_SET, **payload["config"]}
    now = {**WRITTEN_WHEN_SET, **config.to_dict()}
    differing = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))
    if differing:
        shown = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in differing)
        raise ValueError(f"cannot resume {path}: the configuration differs ({shown})")
    rounds_parameter = perturbation_wiring(config.perturbation).rounds
    if saved.get("rounds") != now["rounds"] and rounds_parameter is not None:
        raise ParameterError(f"cannot resume {path} with `rounds` {now['rounds']}: the sigma of perturbation "
                             f"{config.perturbation!r} depends on the number of rounds R (its parameter "
                             f"{rounds_parameter!r}), which was {saved.get('rounds')}")
    if payload["round"] > config.rounds:
        raise ParameterError(f"cannot resume: the checkpoint is at round {payload['round']}, beyond `rounds` "
                             f"{config.rounds}")
    return payload


def server_state(path: Path, payload: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Return the server optimizer's state a loaded checkpoint holds (empty: none), as named arrays.

    A version-2 checkpoint kept server momentum's velocity alone (``velocity``): it is read as FedAvgM's state.
    """
    if "velocity" in payload and payload.get("version") == 2:
        saved: Any = {"velocity": payload["velocity"]}
    else:
        saved = payload.get("server_state", {})
    if not isinstance(saved, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in saved.items()):
        raise ValueError(f"cannot resume: {path} is a damaged checkpoint: 'server_state' holds something other than "
                         "named tensors")
    return {name: tensor.numpy().copy() for name, tensor in saved.items()}
