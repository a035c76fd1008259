"""Flower's daemons as child processes that are all gone when the run ends, whether it completes or fails.

``flower-superlink`` starts ``flower-superexec`` with ``setsid`` (a new session), which starts the
ServerApp's process (``flwr-simulation`` or ``flwr-serverapp``) and, in a simulation, Ray (its GCS,
raylet, dashboard, workers and actors). Killing the SuperLink's process group therefore leaves most of
them running. A :class:`Daemon` records its whole tree of descendants (``psutil``'s process tree, and
each one's process group) every time :meth:`Daemon.snapshot` is called, which the launcher does while
it waits; :meth:`Daemon.stop` asks the root to stop (SIGTERM), then SIGKILLs every recorded process and
process group that is still there. Only processes this module started, and their descendants, are
signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil


def descendants(root: int) -> tuple[set[int], set[int]]:
    """Return the pids and process groups of ``root`` and all its descendants now."""
    try:
        family = [root, *(child.pid for child in psutil.Process(root).children(recursive=True))]
    except psutil.NoSuchProcess:
        return set(), set()
    pids, groups = set(), set()
    for pid in family:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:  # ended since the tree was read
            continue
        pids.add(pid)
    return pids, groups


def alive(pids: Iterable[int]) -> list[int]:
    """Return those of ``pids`` that still run (zombies, which only await their parent, do not count)."""
    live = []
    for pid in set(pids):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                live.append(pid)
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:  # another user's process: it exists
            live.append(pid)
    return sorted(live)


def process_started() -> float | None:
    """Return when this process started, as a Unix time (Linux ``/proc``, 10 ms resolution); ``None`` elsewhere.

    (psutil's ``create_time`` adds the boot time, which Linux gives in whole seconds: too coarse for timelines.)
    """
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


def _signal(send: Callable[[], None]) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass


class Daemon:
    """A started command, its log file, and every process it has started so far."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path):
        self.name = name
        self.log = log
        self._log: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pids: set[int] = {self.proc.pid}
        self.groups: set[int] = {self.proc.pid}

    @property
    def running(self) -> bool:
        """Whether the root process still runs."""
        return self.proc.poll() is None

    def snapshot(self) -> None:
        """Record the current descendants (call it often while the daemon runs)."""
        if self.running:
            pids, groups = descendants(self.proc.pid)
            self.pids |= pids
            self.groups |= groups

    def tail(self, lines: int = 20) -> str:
        """Return the last ``lines`` lines of the log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the root, wait up to ``grace`` s, then SIGKILL every recorded process and group."""
        self.snapshot()
        if self.running:
            _signal(lambda: self.proc.send_signal(signal.SIGTERM))
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        own = {os.getpgid(0), os.getpid()}
        for group in sorted(self.groups - own):
            _signal(lambda g=group: os.killpg(g, signal.SIGKILL))  # type: ignore[misc]
        for pid in sorted(self.pids - own):
            _signal(lambda p=pid: os.kill(p, signal.SIGKILL))  # type: ignore[misc]
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


def stop_all(daemons: Iterable[Daemon], grace: float = 5.0, settle: float = 5.0) -> list[int]:
    """Stop ``daemons`` (last started first); return the recorded pids still running after ``settle`` s."""
    daemons = list(daemons)
    pids: set[int] = set()
    for daemon in reversed(daemons):
        daemon.stop(grace)
        pids |= daemon.pids
    deadline = time.monotonic() + settle
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
