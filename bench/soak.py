"""Soak test (issue 13): kill a parallel export and a federation at random points, rerun, check nothing broke.

Not part of the test suite (it takes minutes). Two phases, ``--kills`` SIGKILLs each:

* **export**: ``ldpfl export --extractor none --clients-parallel 2`` (no ``--seed``: the OS CSPRNG, so
  a client randomized a second time would get different bytes) is started, SIGKILLed after a random
  delay (uniform in 0.3 to 1.2 times an uninterrupted run's duration), and started again (it
  resumes); a run that finished before its kill starts a fresh directory.
* **federate**: ``ldpfl federate --seed`` over one export is killed the same way and continued with
  ``--resume`` (or started afresh when no checkpoint was written yet).

After every kill it checks that no process of the killed command is left (every process carries a tag
in its environment; a zombie counts as gone); after every completed run, that the run directory
verifies (``ldpfl.contract.run_dir.validate_run``), that no temporary file is left, that every client file
finished before any kill is unchanged (sha256: no record randomized twice), and for the federation
that the final model equals an uninterrupted run's (bit for bit). It prints the figures and exits 1 if
any check failed.

Usage::

    .venv/bin/python bench/soak.py [--kills 20] [--clients 4] [--limit 2000] [--rounds 6] [--seed 1] [--dir DIR]
    .venv/bin/python bench/soak.py --kills 2 --clients 3 --limit 300 --rounds 3     # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil

from ldpfl.contract.digest import sha256_file
from ldpfl.contract.run_dir import validate_run

REPO = Path(__file__).resolve().parents[1]
LDPFL = [sys.executable, "-c", "from ldpfl.cli import main; main()"]
ORPHAN_GRACE_SECONDS = 10.0


def tagged_processes(tag: str) -> list[int]:
    """Return the live (not zombie) processes whose environment carries ``LDPFL_SOAK_TAG=tag`` (psutil)."""
    found = []
    for process in psutil.process_iter():
        try:
            if (process.pid != os.getpid() and process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
                    and process.environ().get("LDPFL_SOAK_TAG") == tag):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def temporaries(directory: Path) -> list[str]:
    """Return the temporary files under ``directory`` (``ldpfl.contract.atomic`` names)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(".*") if ".tmp" in p.name)


def client_digests(run: Path) -> dict[str, str]:
    """Return name → sha256 of the complete client files in ``run``."""
    return {p.name: sha256_file(p) for p in sorted(run.glob("client_*.h5")) if not p.name.endswith(".local.h5")}


class Soak:
    """One phase's loop of start, random kill, checks; the figures it gathers."""

    def __init__(self, name: str, rng: random.Random, max_delay: float) -> None:
        self.name, self.rng, self.max_delay = name, rng, max_delay
        self.figures: Counter[str] = Counter()
        self.failures: list[str] = []

    def fail(self, message: str) -> None:
        self.failures.append(f"{self.name}: {message}")
        print(f"  FAIL {message}", flush=True)

    def start(self, args: list[str], tag: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LDPFL_SOAK_TAG": tag}
        return subprocess.Popen([*LDPFL, *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)

    def run_until_killed(self, args: list[str]) -> tuple[bool, float, str]:
        """Start ``args``, SIGKILL it after a random delay unless it ends first; return (killed, delay, stderr)."""
        tag = uuid.uuid4().hex
        process = self.start(args, tag)
        delay = self.rng.uniform(0.3 * self.max_delay, 1.2 * self.max_delay)
        try:
            process.wait(timeout=delay)
            killed = False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            killed = True
        stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
        deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = tagged_processes(tag)
        if left:
            self.figures["orphans"] += len(left)
            self.fail(f"orphan processes {left} after the kill")
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        if not killed and process.returncode != 0:
            self.fail(f"exit {process.returncode}: {stderr.strip().splitlines()[-1:]}")
        return killed, delay, stderr

    def run_to_end(self, args: list[str]) -> None:
        process = self.start(args, uuid.uuid4().hex)
        _, stderr = process.communicate()
        if process.returncode != 0:
            self.fail(f"rerun exit {process.returncode}: {stderr.decode(errors='replace').strip()[-300:]}")


def soak_export(base: Path, args: argparse.Namespace, rng: random.Random, max_delay: float) -> Soak:
    soak = Soak("export", rng, max_delay)
    command = ["export", "--extractor", "none", "--clients", str(args.clients), "--limit", str(args.limit),
               "--clients-parallel", "2", "--quiet"]
    cycle, run = 0, base / "export-0"
    finished: dict[str, str] = {}  # files complete at some kill, with their sha256
    kills = 0
    while kills < args.kills:
        killed, delay, _ = soak.run_until_killed([*command, "--out", str(run)])
        if killed:
            kills += 1
            soak.figures["kills"] += 1
            for name, digest in client_digests(run).items() if run.is_dir() else ():
                if finished.setdefault(name, digest) != digest:
                    soak.figures["re_randomized"] += 1
                    soak.fail(f"{run.name}/{name} changed after it was finished (randomized twice)")
            print(f"  export kill {kills:>3} at {delay:5.2f} s: {len(client_digests(run))} of {args.clients} "
                  f"client files present", flush=True)
            continue
        soak.figures["completed_runs"] += 1
        check_export(soak, run, finished)
        cycle += 1
        run, finished = base / f"export-{cycle}", {}
    soak.run_to_end([*command, "--out", str(run)])  # finish the last one
    soak.figures["completed_runs"] += 1
    check_export(soak, run, finished)
    return soak


def check_export(soak: Soak, run: Path, finished: dict[str, str]) -> None:
    try:
        validate_run(run)
        soak.figures["verified_runs"] += 1
    except ValueError as error:
        soak.fail(f"{run.name} does not verify: {error}")
    left = temporaries(run)
    if left:
        soak.figures["temporaries"] += len(left)
        soak.fail(f"{run.name}: temporary files left: {left}")
    now = client_digests(run)
    for name, digest in finished.items():
        if now.get(name) != digest:
            soak.figures["re_randomized"] += 1
            soak.fail(f"{run.name}/{name} changed after it was finished (randomized twice)")
    soak.figures["files_checked"] += len(finished)


def soak_federate(base: Path, args: argparse.Namespace, rng: random.Random, max_delay: float) -> Soak:
    soak = Soak("federate", rng, max_delay)
    run = base / "federate-run"
    soak.run_to_end(["export", "--extractor", "none", "--clients", str(args.clients), "--limit", str(args.limit),
                     "--quiet", "--out", str(run)])
    common = ["federate", str(run), "--rounds", str(args.rounds), "--hidden", "64", "--local-epochs", "1",
              "--threads", "1", "--seed", str(args.seed), "--quiet"]
    reference = base / "federate-reference"
    soak.run_to_end([*common, "--out", str(reference)])
    kills, cycle = 0, 0
    out = base / f"federate-{cycle}"
    while kills < args.kills:
        resume = ["--resume"] if (out / "checkpoint.pt").is_file() else ["--overwrite"]
        killed, delay, _ = soak.run_until_killed([*common, "--out", str(out), *resume])
        if killed:
            kills += 1
            soak.figures["kills"] += 1
            soak.figures["resumes" if resume == ["--resume"] else "fresh_starts"] += 1
            print(f"  federate kill {kills:>3} at {delay:5.2f} s ({resume[0]})", flush=True)
            continue
        soak.figures["completed_runs"] += 1
        check_federation(soak, out, reference)
        cycle += 1
        out = base / f"federate-{cycle}"
    resume = ["--resume"] if (out / "checkpoint.pt").is_file() else ["--overwrite"]
    soak.run_to_end([*common, "--out", str(out), *resume])
    soak.figures["completed_runs"] += 1
    check_federation(soak, out, reference)
    return soak


def check_federation(soak: Soak, out: Path, reference: Path) -> None:
    left = temporaries(out)
    if left:
        soak.figures["temporaries"] += len(left)
        soak.fail(f"{out.name}: temporary files left: {left}")
    try:
        rounds = [r["round"] for r in json.loads((out / "metrics.json").read_text())["rounds"]]
        same = (out / "model.pt").read_bytes() == (reference / "model.pt").read_bytes()
    except (OSError, ValueError, KeyError) as error:
        soak.fail(f"{out.name}: unreadable outputs ({error})")
        return
    if rounds != list(range(1, len(rounds) + 1)):
        soak.fail(f"{out.name}: rounds {rounds}")
    if (out / "checkpoint.pt").exists():
        soak.fail(f"{out.name}: checkpoint.pt (seed-equivalent) left after the run completed")
    if not same:
        import torch

        from ldpfl.stage2_federate.model_file import read_model

        a = read_model(out / "model.pt").state_dict
        b = read_model(reference / "model.pt").state_dict
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    soak.figures["identical_to_uninterrupted" if same else "differs_from_uninterrupted"] += 1
    if not same:
        soak.fail(f"{out.name}: final model differs from the uninterrupted run's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs per phase.")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--limit", type=int, default=2000, help="Records of mnist5k exported.")
    parser.add_argument("--rounds", type=int, default=6, help="Federation rounds.")
    parser.add_argument("--seed", type=int, default=1, help="Seed of the soak's kill times and the federation.")
    parser.add_argument("--dir", type=Path, default=None, help="Working directory (default: a temp dir, removed).")
    parser.add_argument("--phases", default="export,federate")
    args = parser.parse_args()
    if os.name != "posix":
        raise SystemExit("the soak test kills its processes with POSIX signals (POSIX only)")
    base = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="ldpfl-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    soaks = []
    started = time.perf_counter()
    try:
        for phase in args.phases.split(","):
            probe = base / f"probe-{phase}"  # one uninterrupted run sets the range of kill times
            t0 = time.perf_counter()
            probe_args = (["export", "--extractor", "none", "--clients", str(args.clients), "--limit",
                           str(args.limit), "--clients-parallel", "2", "--quiet", "--out", str(probe)]
                          if phase == "export" else None)
            if phase == "federate":
                Soak("probe", rng, 1).run_to_end(["export", "--extractor", "none", "--clients", str(args.clients),
                                                  "--limit", str(args.limit), "--quiet", "--out", str(probe)])
                t0 = time.perf_counter()
                probe_args = ["federate", str(probe), "--rounds", str(args.rounds), "--hidden", "64",
                              "--local-epochs", "1", "--threads", "1", "--seed", str(args.seed), "--quiet"]
            Soak("probe", rng, 1).run_to_end(probe_args)
            duration = time.perf_counter() - t0
            print(f"{phase}: an uninterrupted run takes {duration:.1f} s; killing at random in "
                  f"[{0.3 * duration:.1f}, {1.2 * duration:.1f}] s, {args.kills} times", flush=True)
            soak = (soak_export if phase == "export" else soak_federate)(base, args, rng, duration)
            soaks.append(soak)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\nsoak finished in {time.perf_counter() - started:.0f} s")
    failures = []
    for soak in soaks:
        print(f"{soak.name}: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.figures.items())) +
              f"; failures {len(soak.failures)}")
        failures += soak.failures
    for failure in failures:
        print(f"FAIL {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
