"""One client's export as a Ray task: the same ``export_client``, its files sent back as bytes (issue 32).

A task runs on whichever node Ray picks. It exports the client exactly as a local worker does
(``worker.export_client``: the client's own child stream, so the same bytes for the same seed), but into a
private temporary directory of that node, then returns every finished file's bytes with the client's
outcome. The driver alone writes them into the run directory, atomically (``ray_executor``): a task never
touches the run directory, so a task that dies (SIGKILL, a lost node) leaves nothing there, and nodes need
no shared storage for their outputs. Inputs are read at the same paths on every node (a benchmark
dataset's files, own ``data``, a ``from_models`` source run's CNNs).

A killed task cannot remove its temporary directory; the next task on that node removes the directories
of processes that are gone (:func:`sweep_stale`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ldpfl.contract.version import package_version
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.worker import ClientOutcome, ClientTask, export_client, init_worker
from ldpfl.stage1_features.models.keras_backend import pin_threads, select_device, select_keras_backend

TMP_PREFIX = "ldpfl-ray-"
_TMP_RE = re.compile(rf"^{re.escape(TMP_PREFIX)}(\d+)-")


@dataclass(frozen=True)
class NodeSetup:
    """How a node's worker runs a client: the driver's package version, threads and Keras settings."""

    package_version: str
    threads: int
    uses_keras: bool
    keras_backend: str | None
    device: str
    pinned: bool = False  # a seeded run: the CNN must train with ``threads`` threads, not this worker's own (issue 40)


@dataclass(frozen=True)
class ClientFiles:
    """A finished client: its outcome and each file it wrote (name → bytes), the client file among them."""

    outcome: ClientOutcome
    files: dict[str, bytes]


def sweep_stale(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the temporary directories of this node's killed tasks (their process is gone); return their names."""
    removed = []
    base = Path(root if root is not None else tempfile.gettempdir())
    for path in base.glob(f"{TMP_PREFIX}*"):
        match = _TMP_RE.match(path.name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to sweep
        return True
    return True


def export_client_files(task: ClientTask, setup: NodeSetup) -> ClientFiles:
    """Export ``task``'s client on this node into a temporary directory; return the outcome and the files' bytes.

    Raises
    ------
    ExportError
        This node's ldpfl is another version than the driver's (the files would differ).
    """
    here = package_version()
    if here != setup.package_version:
        raise ExportError(f"a Ray node runs ldpfl {here}, the driver {setup.package_version}: install the same "
                          "version on every node (the files record it)")
    if setup.uses_keras and setup.keras_backend is not None:  # before Keras is imported in this worker
        select_keras_backend(setup.keras_backend)
        select_device(setup.keras_backend, setup.device)
    init_worker(setup.threads, setup.uses_keras)
    if setup.pinned and not pin_threads(setup.threads):
        raise ExportError(f"a seeded export trains each CNN with {setup.threads} thread(s), and this Ray worker's "
                          f"{setup.keras_backend} already runs with others (an earlier export of this driver): "
                          "run the seeded export from a new process")
    sweep_stale()
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    try:
        outcome = export_client(dataclasses.replace(task, run_dir=str(work), progress=False))
        files = {path.name: path.read_bytes() for path in sorted(work.iterdir())
                 if path.is_file() and not path.name.startswith(".")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ClientFiles(outcome, files)
