"""Submit a federation to a running Flower SuperLink: ``ldpfl federate RUN_DIR --engine flower --superlink HOST:PORT``.

Real silos: a SuperLink at the coordinator, one ``flower-supernode`` per silo serving that silo's client
file (``--node-config "client-file='...'"``). :func:`run_on_superlink` is the coordinator's side:

1. **What it needs locally:** RUN_DIR's ``manifest.json`` (and ``plan.json`` when the silos exported with
   one), never a client file (:func:`coordinator_run`). The ServerApp refuses a SuperNode whose file is
   not the manifest's entry of its client index (name and sha256) or was not exported with the plan.
2. **Where the outputs go:** the ServerApp runs where the SuperLink runs and writes OUT there (the local
   engine's files). The command therefore runs on the SuperLink's machine, and checks it: it writes a
   token into OUT before submitting, which the ServerApp reads back before anything else
   (``server_side.claim_out_dir``); a ServerApp that does not see it fails with that reason.
3. **Before anything is written:** the SuperLink must answer (Control API ``ListRuns``); an address that
   does not resolve or refuses, a TLS failure or a server that is no SuperLink is one line
   (:class:`~.control.SuperLinkError`), and OUT is left as it was. So is a SuperLink busy with another run.
4. **Following the run:** the ServerApp's status file in OUT gives the progress bar; the run's state on the
   SuperLink tells a run that failed, was stopped, or ended without writing its outputs.
5. **Interrupted, or killed:** on Ctrl-C or SIGTERM the command asks its ServerApp to stop (``stop`` in
   the submission record, :data:`~.protocol.SUBMISSION_FILE`), which it does before its next exchange, with
   no message in flight; a run still going after :data:`GRACEFUL_STOP` s is stopped through Flower. A
   command killed outright leaves its record (SuperLink, run id, token) in OUT; the next ``ldpfl federate``
   into OUT stops that run the same way first, waits for its ServerApp to let go of OUT, and then resumes
   (``--resume``) or starts afresh (``--overwrite``) from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.layout import FEDERATION_DIR, MANIFEST_NAME
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.plan import PLAN_FILE, read_plan
from ldpfl.contract.schema import FormatError
from ldpfl.contract.version import package_version
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.console import print_warning
from ldpfl.stage2_federate.outdir import check_out_dir, clear_outputs, locked, remove_temporaries

from . import require_flower
from .control import ControlClient, RunState, SuperLinkError, parse_superlink
from .launch import (
    FlowerOptions,
    FlowerRunError,
    _interruptible,
    _result,
    follow,
)
from .protocol import SERVERAPP_LOCK, STATUS_FILE, SUBMISSION_FILE, ManifestEntry, run_config

RELEASE_WAIT = 60.0  # seconds for a stopped run's ServerApp to let go of OUT
GRACEFUL_STOP = 120.0  # seconds for a ServerApp asked to stop to end its exchange (then Flower's StopRun)
STATE_POLL = 1.0  # seconds between two questions to the SuperLink about the run's state
FAILED_PREFIX = "ServerApp failed with exception: "  # Flower's prefix of a failed run's details


@dataclass(frozen=True)
class CoordinatorRun:
    """What the coordinator knows of a run: its manifest's files and its plan's fingerprint (if any)."""

    run_dir: Path
    files: tuple[ManifestEntry, ...]
    plan_fingerprint: str | None


def coordinator_run(run_dir: str | Path) -> CoordinatorRun:
    """Read RUN_DIR's ``manifest.json`` and, when present, ``plan.json``; never a client file.

    Raises
    ------
    FormatError
        No manifest, an unreadable one, one that lists no file or one client index twice, or a bad plan.
    """
    run_dir = Path(run_dir).resolve()
    if not (run_dir / MANIFEST_NAME).is_file():
        raise FormatError(run_dir / MANIFEST_NAME, "no manifest: a coordinator needs the run's manifest.json (and its "
                                                   "plan.json when the silos exported with one); the client files "
                                                   "stay on the silos")
    manifest = read_manifest(run_dir)
    files = tuple(ManifestEntry.of(r) for r in sorted(manifest.files, key=lambda r: r.client_index))
    if not files:
        raise FormatError(run_dir / MANIFEST_NAME, "lists no client file")
    indices = [f.index for f in files]
    if len(set(indices)) != len(indices):
        raise FormatError(run_dir / MANIFEST_NAME, f"lists client index {indices[0]} twice")
    plan = read_plan(run_dir / PLAN_FILE) if (run_dir / PLAN_FILE).is_file() else None
    return CoordinatorRun(run_dir, files, None if plan is None else plan.fingerprint)


def _read_submission(target: Path) -> dict[str, Any] | None:
    path = target / SUBMISSION_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_submission(target: Path, **values: Any) -> None:
    atomic_write_text(target / SUBMISSION_FILE, json.dumps(values))


def released(target: Path, timeout: float) -> bool:
    """Wait until no ServerApp holds ``target``'s :data:`~.protocol.SERVERAPP_LOCK`; return whether none does."""
    path = target / SERVERAPP_LOCK
    deadline = time.monotonic() + timeout
    while True:
        if not path.exists():
            return True
        probe = FileLock(path, blocking=False)
        try:
            with probe:
                return True  # released on leaving
        except Timeout:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _request_stop(target: Path) -> None:
    """Set ``stop`` in ``target``'s submission record: its ServerApp ends before its next exchange."""
    record = _read_submission(target) or {}
    _write_submission(target, **{**record, "stop": True})


def _wait_finished(control: ControlClient, run_id: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while (state := control.run(run_id)) is not None and state.active:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _end_run(control: ControlClient, run_id: int, target: Path) -> bool:
    """End run ``run_id`` and wait for its ServerApp to let go of ``target``; return whether it did.

    First the ServerApp is asked to stop between two exchanges (its submission record), with no message in
    flight; a run still active after :data:`GRACEFUL_STOP` s is stopped through Flower (``StopRun``).
    """
    _request_stop(target)
    if not _wait_finished(control, run_id, GRACEFUL_STOP):
        control.stop(run_id)
        if not _wait_finished(control, run_id, RELEASE_WAIT):
            return False
    return released(target, RELEASE_WAIT)


def _end_previous_submission(control: ControlClient, target: Path) -> None:
    """Stop the run of an earlier command into ``target`` that was killed (its submission record), if any."""
    record = _read_submission(target)
    if record is None:
        return
    run_id, address = record.get("run_id"), record.get("superlink")
    if run_id is not None:
        where = f"{target} holds the submission of run {run_id} to the SuperLink at {address} by a command that " \
                "ended without stopping it"
        if address != control.address:
            raise FlowerRunError(f"{where}; stop that run there (flwr stop {run_id}) and delete "
                                 f"{target / SUBMISSION_FILE}")
        if not _end_run(control, int(run_id), target):
            raise FlowerRunError(f"{where}; its ServerApp did not stop within {RELEASE_WAIT:.0f} s "
                                 f"(flwr stop {run_id})")
    elif not released(target, RELEASE_WAIT):
        raise FlowerRunError(f"another ldpfl ServerApp is writing into {target}")
    _forget(target)


def _forget(target: Path) -> None:
    for name in (SUBMISSION_FILE, STATUS_FILE, SERVERAPP_LOCK):
        (target / name).unlink(missing_ok=True)


def _control_watch(control: ControlClient, run_id: int, target: Path) -> tuple[Callable[[], str | None],
                                                                                Callable[[], None]]:
    """Return :func:`~.launch.follow`'s ``ended`` and ``settle`` for run ``run_id`` on the SuperLink."""
    asked = [0.0]

    def ended() -> str | None:
        if time.monotonic() - asked[0] < STATE_POLL:
            return None
        asked[0] = time.monotonic()
        state = control.run(run_id)
        return None if state is not None and state.active else _why_ended(state, run_id, target)

    def settle() -> None:
        deadline = time.monotonic() + 10.0
        while (state := control.run(run_id)) is not None and state.active and time.monotonic() < deadline:
            time.sleep(0.2)

    return ended, settle


def _why_ended(state: RunState | None, run_id: int, target: Path) -> str:
    if state is None:
        return f"the SuperLink no longer knows run {run_id} (was it restarted?)"
    if state.sub_status == "failed":
        return f"run {run_id} failed on the SuperLink: {state.details.removeprefix(FAILED_PREFIX) or 'no details'}"
    if state.sub_status == "stopped":
        return f"run {run_id} was stopped on the SuperLink (flwr stop)"
    return f"run {run_id} ended on the SuperLink without writing its outputs to {target}"


def run_on_superlink(run_dir: str | Path, config: FederationConfig, *, superlink: str,
                     out_dir: str | Path | None = None, resume: bool = False, progress: bool = True,
                     overwrite: bool = False, keep_checkpoint: bool = False, options: FlowerOptions | None = None,
                     insecure: bool = False, root_certificates: str | os.PathLike[str] | None = None,
                     on_warning: Callable[[str], None] | None = print_warning,
                     on_round: Callable[[Mapping[str, Any]], None] | None = None) -> Any:
    """Run (or resume) the federation of ``run_dir`` on the SuperNodes of the SuperLink at ``superlink``.

    Parameters are those of ``launch.run_flower`` (``on_round`` included) plus the SuperLink's ``HOST:PORT`` and
    its TLS:
    ``root_certificates`` (the CA's PEM file; default the system's CAs) or ``insecure`` (no TLS: tests on
    127.0.0.1 only). ``run_dir`` needs only its manifest (and plan); run this on the SuperLink's machine
    (the ServerApp writes ``out_dir`` there). See the module docstring.

    Returns
    -------
    FederationResult
        As ``run_federation``'s.

    Raises
    ------
    ParameterError
        A bad ``superlink`` address or ``root_certificates`` file, or an output directory that holds a run
        (neither ``resume`` nor ``overwrite``) or none to resume.
    FormatError
        No readable manifest, or a bad plan.
    FlowerRunError
        The SuperLink cannot be reached, fails TLS, is none, refuses or is busy, or the run failed; one line.
    """
    require_flower(simulation=False)
    options = FlowerOptions() if options is None else options
    address = parse_superlink(superlink)
    run = coordinator_run(run_dir)
    target = (run.run_dir / FEDERATION_DIR if out_dir is None else Path(out_dir)).resolve()
    check_out_dir(target, resume=resume, overwrite=overwrite)

    with ControlClient(address, insecure=insecure, root_certificates=root_certificates) as control:
        control.runs()  # reachable, TLS, a SuperLink: checked before OUT is touched
        with locked(target), _interruptible():
            try:
                _end_previous_submission(control, target)
                check_out_dir(target, resume=resume, overwrite=overwrite)  # the earlier run may have moved on
                busy = [state for state in control.runs() if state.active]
                if busy:
                    raise SuperLinkError(f"the SuperLink at {address} is busy with {busy[0].describe()}: wait for "
                                         f"it to finish, or stop it (flwr stop {busy[0].run_id})")
            except BaseException:
                _forget_if_ours(target)
                raise
            if overwrite and not resume:
                clear_outputs(target)
            remove_temporaries(target)
            status = _submit_and_follow(control, run, config, target, resume=resume, keep_checkpoint=keep_checkpoint,
                                        options=options, progress=progress, on_warning=on_warning, on_round=on_round)
    return _result(target, status, keep_checkpoint)


def _forget_if_ours(target: Path) -> None:
    """Leave no record behind when nothing was submitted (an earlier command's record is kept)."""
    if _read_submission(target) is None:
        (target / STATUS_FILE).unlink(missing_ok=True)


def _submit_and_follow(control: ControlClient, run: CoordinatorRun, config: FederationConfig, target: Path, *,
                       resume: bool, keep_checkpoint: bool, options: FlowerOptions, progress: bool,
                       on_warning: Callable[[str], None] | None,
                       on_round: Callable[[Mapping[str, Any]], None] | None) -> dict[str, Any]:
    """Write the submission record, start the run, follow it; stop it when this fails or is interrupted."""
    token = secrets.token_hex(16)
    status_path = target / STATUS_FILE
    status_path.unlink(missing_ok=True)
    values = run_config(config, out_dir=str(target), status_file=str(status_path), num_clients=len(run.files),
                        startup_timeout=options.startup_timeout, round_timeout=options.round_timeout, resume=resume,
                        keep_checkpoint=keep_checkpoint, run_dir=str(run.run_dir),
                        manifest_files=ManifestEntry.list_to_json(run.files),
                        plan_fingerprint=run.plan_fingerprint or "", submission=token,
                        timings_file=options.timings_file or "", min_clients=options.min_clients or 0)
    _write_submission(target, superlink=control.address, token=token, run_id=None)
    run_id: int | None = None
    ended_cleanly = False
    try:
        run_id = control.start(values, package_version().split("+")[0] or "0.0.0")
        _write_submission(target, superlink=control.address, token=token, run_id=run_id)
        ended, settle = _control_watch(control, run_id, target)
        status = follow(status_path, rounds=config.rounds, options=options, progress=progress, ended=ended,
                        settle=settle, on_warning=on_warning, on_round=on_round)
        ended_cleanly = released(target, RELEASE_WAIT)
        return status
    except BaseException:
        if run_id is None:
            ended_cleanly = True
        else:
            with contextlib.suppress(SuperLinkError):
                ended_cleanly = _end_run(control, run_id, target)
        raise
    finally:
        if ended_cleanly:  # else the record stays: the next command into OUT stops that run first
            _forget(target)


__all__ = ["CoordinatorRun", "coordinator_run", "released", "run_on_superlink"]
