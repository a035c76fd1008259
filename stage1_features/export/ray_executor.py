"""The export's clients as tasks on a Ray cluster (``ray_address``), beside the local processes (issue 32).

The driver (the process that runs ``run_export``) keeps everything a local export keeps: the run lock,
resuming, the manifest and the progress bar. Only the clients move: each is one Ray task
(``ray_task.export_client_files``) that declares its resources (``ray_cpus_per_client`` CPUs, and GPUs
where ``ray_gpus_per_client`` is given) and exports the client from the same child stream of the root as a
local run, so a seeded export on Ray writes the same bytes as a seeded local one. Its CNN trains with
``ray_cpus_per_client`` threads, or, in a seeded run, the one thread every executor then uses
(``keras_backend.SEEDED_THREADS``, issue 40).

**Files: the driver writes them.** A task returns each finished file's bytes; the driver writes them into
the run directory through a temporary name and a rename that never replaces a client file
(``ldpfl.contract.atomic``), the client file last, and checks its sha256 against the task's. So the run
directory need not be on storage the nodes share, and a task that dies leaves nothing in it. Tasks writing
into shared storage themselves is not offered (:data:`SHARED_STORAGE_REFUSED`).

**A lost task fails the run, as a dead local worker does.** Ray's retries are off (``max_retries=0``):
when a worker or node dies, the clients already back are written and listed, the others are cancelled,
and the export stops with one line; a rerun (same command, same seed) exports only the missing clients.

Addresses: ``auto`` connects to the cluster running here (``ray start --head``), ``local`` starts a Ray
for this run on this machine (and stops it after), anything else is a cluster's address (``host:port``
or ``ray://host:port``). A Ray already initialized in this process (a notebook) is used as it is and left
running. Ray is imported here, inside the functions: ``ldpfl --help`` never loads it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ldpfl.common.errors import LdpflError
from ldpfl.contract.atomic import atomic_path, link_durably, temporary_path
from ldpfl.contract.client_writer import ClientFileExists
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.version import package_version
from ldpfl.stage1_features.export.config import RAY_INSTALL_HINT, ExportConfig
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.plan import ExportPlan
from ldpfl.stage1_features.export.ray_task import ClientFiles, NodeSetup, export_client_files
from ldpfl.stage1_features.export.stored import MODEL_SUFFIX
from ldpfl.stage1_features.export.worker import ClientOutcome, ClientTask

AUTO = "auto"
LOCAL = "local"
TASK_NAME = "ldpfl-export-client"
"""Each task's name (``ldpfl-export-client-<i>``): what ``ray list tasks`` and the worker's process title show."""
SHARED_STORAGE_REFUSED = ("Ray tasks never write into the run directory: each returns its client's files to the "
                          "driver, which writes them (docs/cluster.md)")


class RayTaskLost(LdpflError, ConnectionError):
    """A client's Ray task died (worker killed, node lost); the finished clients are kept, a rerun does the rest.

    A ``ConnectionError`` (an ``OSError``): the work was lost on the way, not refused (the CLI exits 1).
    """


@contextlib.contextmanager
def connected(address: str) -> Iterator[Any]:
    """Yield the ``ray`` module connected to ``address`` (module docstring); disconnect (or stop ``local``) after."""
    try:
        import ray
    except ImportError:
        raise ExportError(RAY_INSTALL_HINT) from None
    if ray.is_initialized():  # the caller's own Ray (a notebook): used as it is, left running
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from a research export
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address == LOCAL:
        options.update(include_dashboard=False)
    try:
        with warnings.catch_warnings():  # Ray's notice of a future default for num_gpus=0: not the user's concern
            warnings.filterwarnings("ignore", message=".*accelerator visible devices", category=FutureWarning)
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ExportError(f"cannot connect to Ray at `ray_address` {address!r}: {first}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def run_on_ray(tasks: list[ClientTask], config: ExportConfig, plan: ExportPlan,
               finished: Callable[[ClientOutcome], None], bar: Any) -> None:
    """Export ``tasks`` as Ray tasks; write each one's files into the run directory, then call ``finished``.

    Raises
    ------
    ExportError
        Ray missing, no cluster at the address, or a task's own error (re-raised as it was raised there).
    RayTaskLost
        A worker or node died under a task: the clients written so far are listed, a rerun does the rest.
    """
    assert config.ray_address is not None  # run_export calls this with an address only
    run_dir = Path(tasks[0].run_dir)
    uses_keras = plan.uses_keras
    setup = NodeSetup(package_version(), plan.seeded_threads or config.ray_cpus_per_client, uses_keras,
                      config.keras_backend if uses_keras else None, config.device,
                      pinned=plan.seeded_threads is not None)  # a seed fixes the CNN's threads (issue 40)
    with connected(config.ray_address) as ray:
        remote = ray.remote(export_client_files)
        pending = {remote.options(num_cpus=config.ray_cpus_per_client, num_gpus=config.ray_gpus_per_client,
                                  max_retries=0, name=f"{TASK_NAME}-{task.index}").remote(task, setup): task.index
                   for task in tasks}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    index = pending.pop(ref)
                    finished(commit_files(run_dir, client_result(ray, ref, index)))
                    bar.update(1)
        except BaseException:  # a task's error, a lost task, Ctrl-C: keep what is back, stop the rest
            _keep_ready(ray, pending, run_dir, finished, bar)
            for ref in pending:
                ray.cancel(ref, force=False)
            raise


def client_result(ray: Any, ref: Any, index: int) -> ClientFiles:
    """Return a finished task's files; its own error as raised there, or ``RayTaskLost`` for a dead worker."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
    except ray.exceptions.RayError as error:
        kind = type(error).__name__
        raise RayTaskLost(f"client {index}'s Ray task was lost ({kind}); the clients finished so far are kept: "
                          "rerun the same command to export the missing ones") from None


def _keep_ready(ray: Any, pending: dict[Any, int], run_dir: Path, finished: Callable[[ClientOutcome], None],
                bar: Any) -> None:
    """Write and list the clients whose tasks are already back (a failure elsewhere loses none of them)."""
    if not pending:
        return
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
    for ref in ready:
        index = pending.pop(ref)
        with contextlib.suppress(Exception):  # the first error is the one reported
            finished(commit_files(run_dir, client_result(ray, ref, index)))
            bar.update(1)


def commit_files(run_dir: Path, result: ClientFiles) -> ClientOutcome:
    """Write a task's files into ``run_dir`` atomically, the client file last (it alone marks a client done).

    The client file never replaces one (``ClientFileExists``) and must hash to the task's sha256; the
    others (a saved CNN, the local-only clean test file) replace theirs, as a local worker's do.
    """
    outcome = result.outcome
    name = client_file_name(outcome.index)
    if outcome.record.path != name or name not in result.files:
        raise ExportError(f"client {outcome.index}'s Ray task returned no {name}; {SHARED_STORAGE_REFUSED}")
    for other, data in result.files.items():
        if other != name:
            with atomic_path(run_dir / other, suffix=MODEL_SUFFIX if other.endswith(MODEL_SUFFIX) else "") as tmp:
                tmp.write_bytes(data)
    target = run_dir / name
    tmp = temporary_path(target)
    try:
        tmp.write_bytes(result.files[name])
        if sha256_file(tmp) != outcome.record.sha256:
            raise ExportError(f"client {outcome.index}'s file came back from its Ray task with another sha256 "
                              "than the task computed; nothing was kept: rerun")
        try:
            link_durably(tmp, target)
        except FileExistsError:
            raise ClientFileExists(target, appeared=True) from None
    finally:
        tmp.unlink(missing_ok=True)
    return outcome
