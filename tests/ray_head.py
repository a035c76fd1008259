"""A Ray head of a test's (or a benchmark's) own on this machine, and stopping every process it started.

``start_head`` runs ``ray start --head`` with a temp dir of its own, free ports and the node address
127.0.0.1 (Ray resolves a loopback node address to this machine's address, and its GCS listens on every
interface); ``stop_head`` ends that head's processes only, found by the temp dir on their command lines
and their children, never with ``ray stop``, which would end every Ray of this user on the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class RayHead:
    """A started head: the address drivers connect to and the temp dir that names its processes."""

    address: str
    temp_dir: str


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alive(pid: int) -> bool:
    """Return whether ``pid`` runs (a zombie has exited: PID 1 here need not reap it)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def start_head(cpus: int, env: Mapping[str, str] | None = None, timeout: float = 180) -> RayHead:
    """Start a Ray head with ``cpus`` CPUs (so at most that many one-CPU tasks, each in a worker process)."""
    temp_dir = tempfile.mkdtemp(prefix="ldpflray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    environment = {**(env if env is not None else os.environ), "RAY_USAGE_STATS_ENABLED": "0"}
    environment.pop("RAY_ADDRESS", None)
    started = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--num-cpus={cpus}", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp_dir}", f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}"],
        env=environment, capture_output=True, text=True, timeout=timeout)
    head = RayHead(f"127.0.0.1:{port}", temp_dir)
    if started.returncode != 0:
        stop_head(head)
        raise RuntimeError(f"ray start failed: {started.stderr[-2000:]}")
    return head


def head_processes(head: RayHead) -> list[psutil.Process]:
    """The head's live processes: those whose command line names its temp dir, and everything they started."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(head.temp_dir in part for part in process.info["cmdline"] or ()):
                found[process.pid] = process
                found.update((child.pid, child) for child in process.children(recursive=True))
        except psutil.Error:
            continue
    return [p for p in found.values() if alive(p.pid)]


def stop_head(head: RayHead) -> list[int]:
    """End the head's processes (SIGTERM, then SIGKILL after 3 s); return the pids still alive (none, normally)."""
    processes = head_processes(head)
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, survivors = psutil.wait_procs(processes, timeout=3)
    for process in survivors:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(survivors, timeout=10)
    return [p.pid for p in head_processes(head)]
