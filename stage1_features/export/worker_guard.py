"""Export workers that die with their parent, and a rerun that waits for a dead export's workers.

A parallel export (``--clients-parallel K``) runs clients in spawned worker processes while the parent
alone holds the run directory's lock (``run_dir.locked``) and writes the manifest. If the parent
is killed, its workers must not go on writing client files unsupervised next to a rerun:

* each worker asks the kernel for SIGKILL when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``
  through ctypes), and a watchdog thread polls ``os.getppid()`` as a fallback (other systems, or a
  parent that died before the request was made);
* each worker holds a *read* lock on ``.export.workers.lock`` for its whole life; a rerun, once it
  holds the run lock, takes that lock for *writing*, which waits until every worker of the dead export
  has exited (:func:`wait_for_stale_workers`), and then releases it again for its own workers. The lock
  is ``filelock.ReadWriteLock`` (SQLite's file locking: on every platform, dropped by the kernel when
  a process dies);
* before renaming a finished client file into place, a worker checks that its parent is still the one
  that started it (:func:`require_parent`), and the rename itself cannot replace a file that appeared
  meanwhile (``ldpfl.contract.atomic.link_durably``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

from filelock import ReadWriteLock, Timeout

WORKERS_LOCK = ".export.workers.lock"
WATCHDOG_SECONDS = 0.5
STALE_WAIT_SECONDS = 120.0
PR_SET_PDEATHSIG = 1

_parent_pid: int | None = None
_worker_lock: ReadWriteLock | None = None


def _request_death_signal() -> bool:
    """Ask the Linux kernel to SIGKILL this process when its parent dies; return whether it agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup: the parent's rerun removes temporaries
        time.sleep(WATCHDOG_SECONDS)


def die_with_parent(parent_pid: int, run_dir: str | os.PathLike[str] | None = None) -> None:
    """Bind this worker's life to ``parent_pid`` (death signal, watchdog) and take the workers' read lock.

    Call it first thing in the worker initializer. The worker ignores SIGINT: a Ctrl-C on the terminal
    reaches every process of the group, and the parent alone reports it (one line) and kills the workers.
    """
    global _parent_pid, _worker_lock
    _parent_pid = int(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the workers
    _request_death_signal()
    if os.getppid() != _parent_pid:  # the parent died before the request: nothing would signal us
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(_parent_pid,), name="ldpfl-parent-watchdog", daemon=True).start()
    if run_dir is not None:
        _worker_lock = hold_workers_lock(run_dir)


def hold_workers_lock(run_dir: str | os.PathLike[str]) -> ReadWriteLock:
    """Take a read lock on ``run_dir``'s workers lock and return it (held while the returned lock is kept)."""
    lock = ReadWriteLock(Path(run_dir) / WORKERS_LOCK, is_singleton=False)
    lock.acquire_read()
    return lock


def parent_alive() -> bool:
    """Return whether the process that started this worker is still its parent (True outside a worker)."""
    return _parent_pid is None or os.getppid() == _parent_pid


def require_parent(what: str) -> None:
    """Raise ``RuntimeError`` when this worker's parent has died (call before committing ``what``)."""
    if not parent_alive():
        raise RuntimeError(f"the export that started this worker has died; {what} is not committed")


def wait_for_stale_workers(run_dir: str | os.PathLike[str], timeout: float = STALE_WAIT_SECONDS) -> None:
    """Wait until no worker of an earlier export of ``run_dir`` is alive (call holding the run lock).

    Raises
    ------
    TimeoutError
        Workers still hold their lock after ``timeout`` seconds (they should have died with their parent).
    """
    lock = ReadWriteLock(Path(run_dir) / WORKERS_LOCK, is_singleton=False)
    try:
        with lock.write_lock(timeout=timeout):
            pass  # released at once: this export's own workers take it for reading
    except Timeout:
        raise TimeoutError(f"worker processes of an earlier ldpfl export still hold {Path(run_dir) / WORKERS_LOCK} "
                           f"after {timeout:.0f} s; wait for them to exit (or end them) and rerun") from None
    finally:
        lock.close()
