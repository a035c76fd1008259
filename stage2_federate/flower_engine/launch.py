"""Run a federation on Flower: a simulation on this machine, or a submission to a deployed SuperLink.

:func:`run_flower` (``ldpfl federate RUN_DIR --engine flower``) starts a private SuperLink in simulation
mode (its own ``FLWR_HOME``, port, Ray temporary directory, in its own session), submits the ldpfl app
with ``flwr run --stream``, follows the ServerApp's status file (``flwr run`` exits 0 even when the
ServerApp failed, and never returns when a ClientApp hangs), and stops every process it started, also
when the run fails or is interrupted. It screens the run as the local engine does: a silo whose file does not
verify gets no node and is named in ``run.left_out`` (:func:`screen_silos`). ``deployment.run_on_superlink``
submits the same app to a SuperLink that already runs (real silos: one SuperNode per client file;
:func:`start_superlink` and :func:`start_supernode` start Flower's commands on this machine, for tests and
benchmarks).

Flower's ``flwr run`` with its default ``local`` connection would start a detached SuperLink that
outlives the command; ldpfl never uses that connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import tomli_w

from ldpfl.common.errors import LdpflError, ParameterError
from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.contract.layout import FEDERATION_DIR
from ldpfl.contract.manifest import FileRecord
from ldpfl.contract.run_dir import screen_run
from ldpfl.contract.version import package_version
from ldpfl.stage2_federate.client_privacy import ClientPrivacy
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.console import print_warning
from ldpfl.stage2_federate.left_out import LeftOut, enough_remain, needed_silos
from ldpfl.stage2_federate.outdir import check_out_dir, clear_outputs, locked, remove_temporaries
from ldpfl.stage2_federate.result import FederationResult

from . import require_flower
from .processes import Daemon, stop_all
from .protocol import ManifestEntry, app_pyproject, left_out_to_json, run_config

CONNECTION = "ldpfl"
# Flower's SuperExec asks its SuperNode (or SuperLink) for a ClientApp (ServerApp) task to launch every
# FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds (default 1 s, allowed 0.01-60): a wait in every message. 0.25 s
# cut that wait without slowing the ClientApp's start; 0.05 s polls cost the 2-core machine more than they
# saved (bench/RESULTS.md, "Flower deployment: where a round's time goes").
SUPEREXEC_POLL_VARIABLE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPEREXEC_POLL = "0.25"
CLIENT_STATE_DIR = ".flower-clients"  # simulation: each client's resume state, under the output directory


class FlowerRunError(LdpflError, RuntimeError):
    """The Flower run failed; the message is one line (the ServerApp's reason, or what went wrong)."""


@dataclass(frozen=True)
class FlowerOptions:
    """How the Flower engine runs: CPUs per simulated client and the time limits (seconds)."""

    cpus_per_client: int = 1
    startup_timeout: float = 300.0  # SuperLink start, Ray start, every node describing its file
    round_timeout: float = 600.0  # one exchange (training or evaluation) of a round
    timings_file: str | None = None  # benchmarks: each message's timeline, as JSON lines (transport.Timeline)
    min_clients: int | None = None  # failure policy: the fewest selected clients that must train in a round


    def __post_init__(self) -> None:
        """Validate the options."""
        if not isinstance(self.cpus_per_client, int) or self.cpus_per_client < 1:
            raise ParameterError(f"`cpus_per_client` must be an integer >= 1 (Flower takes whole CPUs), got "
                                 f"{self.cpus_per_client!r}")
        for name in ("startup_timeout", "round_timeout"):
            if not float(getattr(self, name)) > 0:
                raise ParameterError(f"`{name}` must be > 0 seconds, got {getattr(self, name)!r}")
        if self.min_clients is not None and (not isinstance(self.min_clients, int) or self.min_clients < 1):
            raise ParameterError(f"`min_clients` must be an integer >= 1, got {self.min_clients!r}")


def _bin(name: str) -> str:
    found = Path(sys.executable).parent / name
    return str(found) if found.exists() else (shutil.which(name) or name)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_app(directory: str | Path) -> Path:
    """Write the ldpfl Flower app (a ``pyproject.toml`` naming ldpfl's ServerApp and ClientApp) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(app_pyproject(package_version().split("+")[0] or "0.0.0"),
                                              encoding="utf-8")
    return directory


def flower_env(home: Path, *, address: str | None = None, insecure: bool = True,
               root_certificates: str | None = None, ray_tmp: Path | None = None) -> dict[str, str]:
    """Return the environment of Flower's commands: a private ``FLWR_HOME``, its connection ``ldpfl`` = ``address``."""
    home.mkdir(parents=True, exist_ok=True)
    if address is not None:
        connection: dict[str, Any] = {"address": address}
        connection.update({"root-certificates": root_certificates} if root_certificates else {"insecure": insecure})
        (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: connection}}),
                                          encoding="utf-8")
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    return env


def _healthy(port: int, tls: bool = False) -> bool:
    import httpx

    try:  # a liveness probe of our own child: its certificate is not what is checked here
        return httpx.get(f"{'https' if tls else 'http'}://127.0.0.1:{port}/health", timeout=0.5,
                         verify=False).is_success
    except httpx.HTTPError:
        return False


def start_superlink(work: Path, *, port: int | None = None, simulation: bool = False, insecure: bool = True,
                    extra: Sequence[str] = (), timeout: float = 60.0) -> tuple[Daemon, int]:
    """Start ``flower-superlink`` on 127.0.0.1 (its Fleet, Control and Runtime APIs share one HTTP port).

    Returns the daemon and its port once its ``/health`` answers. ``extra`` adds arguments, e.g. the TLS
    files (``--ssl-ca-certfile``, ``--ssl-certfile``, ``--ssl-keyfile``) and ``--enable-supernode-auth``.
    """
    port = port or free_port()
    env = {SUPEREXEC_POLL_VARIABLE: SUPEREXEC_POLL, **flower_env(work / "superlink-home", ray_tmp=_ray_tmp(work))}
    if simulation:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hide_tensorflow(work)), env.get("PYTHONPATH")]))
    argv = [_bin("flower-superlink"), *(["--insecure"] if insecure else []), *(["--simulation"] if simulation else []),
            "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation", *extra]
    daemon = Daemon("superlink", argv, env=env, log=work / "superlink.log", cwd=work)
    deadline = time.monotonic() + timeout
    while not _healthy(port, tls=not insecure):
        if not daemon.running or time.monotonic() > deadline:
            tail = daemon.tail(5)
            daemon.stop()
            raise FlowerRunError(f"flower-superlink did not start on 127.0.0.1:{port} within {timeout:.0f} s"
                                 + (f": {' '.join(tail.split())[-300:]}" if tail else ""))
        time.sleep(0.1)
    return daemon, port


def start_supernode(work: Path, superlink: str, client_file: str | Path, *, index: int | None = None,
                    state_dir: str | Path | None = None, insecure: bool = True, extra: Sequence[str] = ()) -> Daemon:
    """Start one ``flower-supernode`` (one silo) that serves exactly ``client_file``.

    Its ClientApp reads only that file; ``index`` makes it check the file's client index; ``state_dir``
    is where it keeps its resume state. ``extra``: e.g. ``--root-certificates ca.crt`` and
    ``--auth-supernode-private-key key`` for production.
    """
    name = f"supernode-{Path(client_file).stem}"
    node_config = {"client-file": str(Path(client_file).resolve())}
    if index is not None:
        node_config["client-index"] = str(int(index))
    if state_dir is not None:
        node_config["state-dir"] = str(Path(state_dir).resolve())
    node_arg = " ".join(f"{k}={json.dumps(v) if k != 'client-index' else v}" for k, v in node_config.items())
    env = {SUPEREXEC_POLL_VARIABLE: SUPEREXEC_POLL, **flower_env(work / f"{name}-home")}
    argv = [_bin("flower-supernode"), *(["--insecure"] if insecure else []), "--superlink", superlink,
            "--port", str(free_port()), "--node-config", node_arg, *extra]
    return Daemon(name, argv, env=env, log=work / f"{name}.log", cwd=work)


def hide_tensorflow(work: Path) -> Path:
    """Return a directory whose ``tensorflow`` package refuses to import (for ``PYTHONPATH``).

    Flower's Ray backend imports TensorFlow when it is installed (``flwr.simulation.ray_transport.utils``
    catches only ``ModuleNotFoundError``), in the simulation process and in every Ray actor: 5-20 s each
    on a loaded machine, for nothing (stage 2 is torch only). Stage 1 installs TensorFlow in the same
    environment, so the simulation's processes get this directory first on their path.
    """
    package = work / "hide-tensorflow" / "tensorflow"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        'raise ModuleNotFoundError("TensorFlow is hidden from the ldpfl Flower simulation", name="tensorflow")\n')
    return package.parent


def _ray_tmp(work: Path) -> Path:
    path = work / "ray"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _prepared_out_dir(target: Path, *, resume: bool, overwrite: bool) -> Iterator[None]:
    """Hold ``target``'s lock for the whole run, start afresh with ``overwrite`` and drop stale temporaries."""
    with locked(target), _interruptible():
        if overwrite and not resume:
            clear_outputs(target)
            shutil.rmtree(target / CLIENT_STATE_DIR, ignore_errors=True)
        remove_temporaries(target)
        yield


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while running, so that every started process gets stopped."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _read_status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def follow(status_path: Path, *, rounds: int, options: FlowerOptions, progress: bool,
           ended: Callable[[], str | None], settle: Callable[[], None] = lambda: None,
           on_warning: Callable[[str], None] | None = print_warning,
           on_round: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, Any]:
    """Wait for the ServerApp's final status; raise :class:`FlowerRunError` on an error, a stall or a lost run.

    Shows the rounds as they complete, passes each round's warning line to ``on_warning`` once, and the
    last completed round (``round``, ``test_accuracy``) to ``on_round`` whenever the ServerApp reports a new one.
    ``ended()`` is asked at every poll: ``None`` while the run may still report, else the one-line reason
    why it ended without a result; ``settle()`` lets the run end by itself after its final status.
    """
    from tqdm.auto import tqdm

    stall = max(options.startup_timeout, 2 * options.round_timeout) + 60.0
    last_change, seen, shown, warned = time.monotonic(), "", 0, 0
    bar = tqdm(total=rounds, desc="federate (flower)", unit="round", file=sys.stderr, disable=not progress,
               dynamic_ncols=True, leave=True)
    try:
        while True:
            status = _read_status(status_path)
            if json.dumps(status, sort_keys=True) != seen:
                seen, last_change = json.dumps(status, sort_keys=True), time.monotonic()
            for warning in list(status.get("warnings", ()))[warned:]:
                warned += 1
                if on_warning is not None:
                    on_warning(str(warning))
            if status.get("round") and int(status["round"]) > shown:
                bar.update(int(status["round"]) - shown)
                shown = int(status["round"])
                if status.get("test_accuracy") is not None:
                    bar.set_postfix(test_acc=f"{status['test_accuracy']:.4f}")
                if on_round is not None:
                    on_round({"round": shown, "test_accuracy": status.get("test_accuracy")})
            if status.get("state") in ("done", "error"):
                settle()
                if status["state"] == "error":
                    raise FlowerRunError(str(status.get("error", "the ServerApp failed")))
                return status
            reason = ended()
            if reason is not None:
                if _read_status(status_path).get("state") in ("done", "error"):
                    continue
                raise FlowerRunError(reason)
            if time.monotonic() - last_change > stall:
                raise FlowerRunError(f"the Flower run made no progress for {stall:.0f} s (state "
                                     f"{status.get('state', 'not started')!r}); stopped")
            time.sleep(0.25)
    finally:
        bar.close()


def _simulation_watch(submit: Daemon, daemons: Sequence[Daemon]) -> tuple[Callable[[], str | None],
                                                                           Callable[[], None]]:
    """Return :func:`follow`'s ``ended`` and ``settle`` for ``flwr run`` (``submit``) and the daemons beside it."""
    def ended() -> str | None:
        for daemon in daemons:
            daemon.snapshot()
        if submit.running:
            return None
        time.sleep(1.0)
        return (f"flwr run ended (exit code {submit.proc.returncode}) without a result: "
                + " ".join(submit.tail(3).split())[-300:])

    def settle() -> None:
        end = time.monotonic() + 10.0  # let Flower end the run itself; it may not (a hung client)
        while submit.running and time.monotonic() < end:
            time.sleep(0.2)

    return ended, settle


def submit_run(work: Path, env: Mapping[str, str], values: Mapping[str, Any], *,
               federation: Mapping[str, int] | None = None) -> Daemon:
    """Write the app and its run configuration under ``work`` and start ``flwr run APP ldpfl --stream``."""
    app = write_app(work / "app")
    config_file = work / "run-config.toml"
    config_file.write_text(tomli_w.dumps(dict(values)), encoding="utf-8")
    argv = [_bin("flwr"), "run", str(app), CONNECTION, "--stream", "--run-config", str(config_file)]
    if federation:
        argv += ["--federation-config", " ".join(f"{k}={v}" for k, v in federation.items())]
    return Daemon("flwr-run", argv, env=env, log=work / "flwr-run.log", cwd=work)


@dataclass(frozen=True)
class SimulationSilos:
    """The silos of a simulation: a node for each listed file that verifies, and the silos left out before any starts.

    ``records``: the manifest's entries of the files that verify, in client-index order (node ``k`` serves file
    ``k``); ``entries``: every file the manifest lists (the ServerApp checks each node's claims against them);
    ``left_out``: each silo whose file does not verify, named as the local engine names it (``LeftOut.refused_file``).
    """

    run_dir: Path
    records: tuple[FileRecord, ...]
    entries: tuple[ManifestEntry, ...]
    left_out: tuple[LeftOut, ...]

    def run_values(self) -> dict[str, Any]:
        """Return the run configuration's keys that name the silos (``protocol.run_config``'s keyword arguments)."""
        return {"client_files": json.dumps([str(self.run_dir / r.path) for r in self.records]),
                "client_sha256": json.dumps([r.sha256 for r in self.records]), "num_clients": len(self.records),
                "manifest_files": ManifestEntry.list_to_json(self.entries),
                "left_out": left_out_to_json(self.left_out)}


def screen_silos(run_dir: str | Path, *, min_clients: int | None = None,
                 clients_per_round: int | None = None) -> SimulationSilos:
    """Screen ``run_dir`` as the local engine does, before a simulation starts a node (issue 42 item 4).

    ``contract.run_dir.screen_run``: a listed file that is missing or fails its sha256, structure, rows, label
    counts, index or feature values leaves its silo out, named; the ServerApp records it in ``run.left_out``
    beside the silos whose claims it refuses (``server_side.screen``). What is wrong with the run itself raises.

    Raises
    ------
    TooFewSilosError
        Fewer files verify than the run needs (``left_out.needed_silos``: two, or ``min_clients`` or
        ``clients_per_round``); one line naming every left-out silo, before Flower starts.
    FormatError, ValueError
        As ``screen_run``: no valid manifest, unlisted client files, files that do not form one run.
    """
    run_dir = Path(run_dir)
    screened = screen_run(run_dir)
    left = tuple(LeftOut.refused_file(r.record.client_index, r.record.path, r.error) for r in screened.refused)
    listed = len(screened.manifest.files)
    enough_remain(len(screened.checked), listed, left,
                  needed_silos(listed, min_clients=min_clients, clients_per_round=clients_per_round))
    records = tuple(sorted((record for record, _ in screened.checked), key=lambda r: r.client_index))
    entries = tuple(ManifestEntry.of(r) for r in sorted(screened.manifest.files, key=lambda r: r.client_index))
    return SimulationSilos(run_dir, records, entries, left)


def _result(out_dir: Path, status: Mapping[str, Any], keep_checkpoint: bool) -> FederationResult:
    from ldpfl.stage2_federate.run_outputs import output_paths

    paths = output_paths(out_dir)
    if not keep_checkpoint:
        del paths["checkpoint"]
    metrics = json.loads(paths["metrics_json"].read_text())
    history = metrics["rounds"]
    final = history[-1]["test_accuracy"] if history else None
    ledger = metrics.get("privacy_ledger")
    return FederationResult(history, final, paths, metrics["config"],
                            tuple(ClientPrivacy.from_dict(p) for p in metrics["privacy"]),
                            resumed_from_round=status.get("resumed_from_round"),
                            warnings=tuple(status.get("warnings", ())),
                            privacy_ledger=None if ledger is None else LedgerSection.from_dict(ledger))


def run_flower(run_dir: str | Path, config: FederationConfig, *, out_dir: str | Path | None = None,
               resume: bool = False, progress: bool = True, overwrite: bool = False, keep_checkpoint: bool = False,
               options: FlowerOptions = FlowerOptions(),
               on_warning: Callable[[str], None] | None = print_warning,
               on_round: Callable[[Mapping[str, Any]], None] | None = None) -> Any:
    """Run (or resume) the federation of ``run_dir`` in Flower's simulation engine; same outputs as the local one.

    Parameters are those of ``federation.run_federation`` plus ``options`` (CPUs per client, time limits);
    ``on_round`` gets the last completed round and its test accuracy whenever the ServerApp reports a new one.
    Each simulated client opens only its own file; client selection and dropouts come from the run's
    seeded server Generator, so a seeded run equals the local engine's (same selections; accuracies to
    float tolerance). A silo whose file does not verify gets no node: it is left out and named
    (:func:`screen_silos`), as on the local engine.

    Returns
    -------
    FederationResult
        As ``run_federation``'s.

    Raises
    ------
    FlowerMissingError
        Flower is not installed (the message says how to install it).
    FlowerRunError
        The run failed (a client's error, a timeout, too few silos left once the ServerApp refused a claim);
        one line.
    TooFewSilosError
        Too few files verify (:func:`screen_silos`); one line, before Flower starts.
    """
    require_flower(simulation=True)
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist or is not a directory")
    silos = screen_silos(run_dir, min_clients=options.min_clients, clients_per_round=config.clients_per_round)
    target = (run_dir / FEDERATION_DIR if out_dir is None else Path(out_dir)).resolve()
    check_out_dir(target, resume=resume, overwrite=overwrite)
    with _prepared_out_dir(target, resume=resume, overwrite=overwrite):
        work = Path(tempfile.mkdtemp(prefix="ldpfl-flwr-"))
        daemons: list[Daemon] = []
        try:
            link, port = start_superlink(work, simulation=True, timeout=min(options.startup_timeout, 120.0))
            daemons.append(link)
            env = flower_env(work / "cli-home", address=f"127.0.0.1:{port}", ray_tmp=_ray_tmp(work))
            status_path = work / "status.json"
            values = run_config(config, **silos.run_values(), out_dir=str(target), status_file=str(status_path),
                                startup_timeout=options.startup_timeout, round_timeout=options.round_timeout,
                                resume=resume, keep_checkpoint=keep_checkpoint,
                                client_state_dir=str(target / CLIENT_STATE_DIR),
                                timings_file=options.timings_file or "", min_clients=options.min_clients or 0)
            federation = {"num-supernodes": len(silos.records), "client-resources-num-cpus": options.cpus_per_client}
            submit = submit_run(work, env, values, federation=federation)
            daemons.append(submit)
            ended, settle = _simulation_watch(submit, daemons)
            status = follow(status_path, rounds=config.rounds, options=options, progress=progress, ended=ended,
                            settle=settle, on_warning=on_warning, on_round=on_round)
        finally:
            stop_all(daemons)
            shutil.rmtree(work, ignore_errors=True)
        if not keep_checkpoint:
            shutil.rmtree(target / CLIENT_STATE_DIR, ignore_errors=True)
    return _result(target, status, keep_checkpoint)
