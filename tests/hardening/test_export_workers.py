"""Issue 13, parallel export: workers die with their parent, a rerun waits for stale workers, no rename
replaces a client file, and the rerun's messages name flags.

The kill test slows the workers' release down through a ``sitecustomize`` module on PYTHONPATH (spawned
workers import it too), so that the parent is killed while both workers are in the middle of a client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from click.testing import CliRunner
from repository import ROOT
from slow_release import SLOW_SITE

from ldpfl.cli import cli
from ldpfl.contract.client_writer import ClientFileExists, ClientFileWriter
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import ClientMetadata
from ldpfl.stage1_features.export import run_dir as export_run_dir
from ldpfl.stage1_features.export import worker_guard
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.run import run_export

REPO = ROOT
ARGS = ["export", "--extractor", "none", "--clients", "4", "--limit", "400", "--seed", "5", "--quiet"]



def children(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False  # a zombie has exited (PID 1 here need not reap it)


def client_files(run: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(run.glob("client_*.h5"))}


def test_sigkilled_parallel_export_leaves_no_orphan_and_reruns_cleanly(tmp_path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
           "LDPFL_TEST_SLOW_RELEASE": "4"}
    parent = subprocess.Popen([sys.executable, "-c", "from ldpfl.cli import main; main()", *ARGS,
                               "--clients-parallel", "2", "--out", str(run)],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline:  # both workers inside a client: two temporary client files
            temporaries = list(run.glob(".client_*.h5.*.tmp")) if run.is_dir() else []
            workers = [c for c in children(parent.pid) if alive(c)]
            if len(temporaries) >= 2:
                break
            assert parent.poll() is None, parent.stderr.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the workers never started a client")
        finished_before = client_files(run)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    finally:
        if parent.poll() is None:
            parent.kill()
    assert len(workers) >= 2, workers  # the pool's worker processes (and the resource tracker)
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers), [w for w in workers if alive(w)]  # no orphan
    time.sleep(5)  # longer than the slowed release: an orphan would have committed by now
    assert client_files(run) == finished_before  # nothing written after the parent died

    result = CliRunner().invoke(cli, [*ARGS, "--clients-parallel", "2", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert not list(run.glob(".*.tmp*")) and not list(run.glob(".client_*"))  # no temporary left
    manifest, checked = validate_run(run)
    assert len(checked) == 4
    after = client_files(run)
    for name, digest in finished_before.items():  # finished files kept: never randomized twice
        assert after[name] == digest, name


def test_rerun_waits_for_a_stale_worker_then_proceeds(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # the holder keeps the lock until the test releases it (a line on its stdin): no race with a slow machine
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom ldpfl.stage1_features.export.worker_guard import hold_workers_lock\n"
                               f"lock = hold_workers_lock({str(run)!r})\nprint('held', flush=True)\n"
                               "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    release = threading.Timer(1.0, lambda: holder.communicate("go\n"))
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(worker_guard, "STALE_WAIT_SECONDS", 0.5)
        monkeypatch.setattr(worker_guard.wait_for_stale_workers, "__defaults__", (0.5,))
        with pytest.raises(ExportError, match="worker processes of an earlier ldpfl export still hold"):
            run_export(ExportConfig(dataset="mnist5k", extractor="none", limit=40, clients=1, seed=1), run,
                       progress=False)
        monkeypatch.setattr(worker_guard.wait_for_stale_workers, "__defaults__", (30.0,))
        started = time.monotonic()
        release.start()  # the holder exits a second into the wait
        run_export(ExportConfig(dataset="mnist5k", extractor="none", limit=40, clients=1, seed=1), run,
                   progress=False)  # waits for the holder to exit, then exports
        assert time.monotonic() - started < 30
    finally:
        release.cancel()
        holder.kill()
        holder.wait()
    assert len(validate_run(run)[1]) == 1


def test_a_second_export_into_a_held_run_directory_is_refused_then_runs(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    config = ExportConfig(dataset="mnist5k", extractor="none", limit=40, clients=1, seed=1)
    with export_run_dir.locked(run):  # an export holding the directory
        with pytest.raises(ExportError, match="another ldpfl export is running in"):
            run_export(config, run, progress=False)
        assert not (run / "manifest.json").exists()  # the refused export wrote nothing
    run_export(config, run, progress=False)  # released: runs
    assert len(validate_run(run)[1]) == 1


def _metadata() -> ClientMetadata:
    from ldpfl import mechanisms as mech
    spec = mech.MechanismSpec.resolve("none", {"integer_bits": 2, "fraction_bits": 3}, features=4)
    return ClientMetadata(
        dataset="mnist5k", num_classes=2, client_index=0, client_count=1, partition={}, extractor="none",
        input_shape=(4,), integer_bits=2, fraction_bits=3, features=4, feature_format=spec.feature_format,
        mechanism=spec.name, mechanism_parameters=spec.recorded_parameters(), privacy_report=spec.report().to_dict(),
        randomness="seeded", label_histograms={"train": [1, 1], "test": [0, 0]})


def test_commit_never_replaces_a_file_that_appeared_meanwhile(tmp_path) -> None:
    path = tmp_path / "client_000.h5"
    writer = ClientFileWriter(path, _metadata(), {"train": 2, "test": 0})
    writer.write_rows("train", 0, np.zeros((2, 3), dtype=np.uint8), np.array([0, 1]))
    path.write_bytes(b"written by another process")  # e.g. an orphaned worker of a killed export
    with pytest.raises(ClientFileExists) as caught:
        writer.commit()
    assert path.read_bytes() == b"written by another process"
    assert not list(tmp_path.glob(".*.tmp"))
    assert caught.value.render(lambda n: "--" + n).endswith("or start over with --overwrite")
    assert "overwrite=True" not in str(caught.value)
    with pytest.raises(ClientFileExists, match=r"client_000\.h5 exists; it is kept"):
        ClientFileWriter(path, _metadata(), {"train": 2, "test": 0})


def test_worker_guard_outside_a_worker_and_after_its_parent_died(monkeypatch) -> None:
    assert worker_guard.parent_alive()
    worker_guard.require_parent("nothing")  # not a worker: no parent to lose
    monkeypatch.setattr(worker_guard, "_parent_pid", os.getppid() + 1)  # a worker whose parent is gone
    assert not worker_guard.parent_alive()
    with pytest.raises(RuntimeError, match="client_000.h5 is not committed"):
        worker_guard.require_parent("client_000.h5")


def test_rerun_of_a_finished_export_lists_the_files_and_reuses_them(tmp_path) -> None:
    run = tmp_path / "run"
    first = CliRunner().invoke(cli, [*ARGS, "--out", str(run)])
    assert first.exit_code == 0, first.output
    before = client_files(run)
    again = CliRunner().invoke(cli, [*ARGS, "--clients-parallel", "2", "--out", str(run)])
    assert again.exit_code == 0, again.output
    assert client_files(run) == before and again.output.count("reused") == 4
    assert [r.path for r in read_manifest(run).files] == sorted(before)
