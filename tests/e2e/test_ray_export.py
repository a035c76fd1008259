"""Issue 32: the export's clients as Ray tasks, the same files as a seeded local export.

The slow test starts a Ray head of its own (``tests/ray_head.py``: ``ray start --head``, 2 CPUs so two
worker processes run clients, its own temp dir and free ports, the node address 127.0.0.1), exports 4
mnist5k clients through it, SIGKILLs a worker in the middle of a client, reruns, compares every dataset
and attribute of every client file with a local seeded export (the creation time left out), and stops
every process of that head. Worker releases are slowed through a ``sitecustomize`` module on the head's
PYTHONPATH (its workers import it), so that the kill lands while a client is being exported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
from click.testing import CliRunner
from ray_head import RayHead, head_processes, start_head, stop_head
from repository import ROOT
from slow_release import SLOW_SITE

from ldpfl.api.export_job import export
from ldpfl.cli import cli
from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_writer import ClientFileExists
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.manifest import FileRecord, read_manifest
from ldpfl.contract.run_dir import validate_run
from ldpfl.stage1_features.export import config as export_config
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.ray_executor import TASK_NAME, RayTaskLost, client_result, commit_files
from ldpfl.stage1_features.export.ray_task import ClientFiles, sweep_stale
from ldpfl.stage1_features.export.worker import ClientOutcome

SEED = 7
EXPORT = ["export", "--extractor", "none", "--clients", "4", "--seed", str(SEED), "--quiet"]
CREATION = ("created_utc",)  # differs between any two runs, local or not



def h5_contents(path: Path) -> dict[str, object]:
    """Every group's and dataset's attributes and every dataset's dtype, shape and bytes, by HDF5 path."""
    found: dict[str, object] = {}
    with h5py.File(path, "r") as f:
        def attrs(obj: h5py.HLObject) -> dict[str, object]:
            return {k: (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray | np.generic) else v
                    for k, v in obj.attrs.items() if k not in CREATION}  # bytes: NaN equals NaN

        found["/"] = attrs(f)

        def visit(name: str, obj: h5py.HLObject) -> None:
            if isinstance(obj, h5py.Dataset):
                found[name] = (attrs(obj), str(obj.dtype), obj.shape, obj[()].tobytes())
            else:
                found[name] = attrs(obj)

        f.visititems(visit)
    return found


def assert_same_files(run: Path, local: Path) -> None:
    names = sorted(p.name for p in local.glob("client_*.h5"))
    assert names == sorted(p.name for p in run.glob("client_*.h5")) and len(names) == 4
    for name in names:
        ours, theirs = h5_contents(run / name), h5_contents(local / name)
        assert ours.keys() == theirs.keys(), name
        for key in theirs:
            assert ours[key] == theirs[key], (name, key)


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head with 2 CPUs on 127.0.0.1 and ports of its own; yields (head, node tmp, env)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    node_tmp = tmp_path / "node-tmp"  # the workers' tempfile.gettempdir()
    node_tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "LDPFL_TEST_SLOW_RELEASE": "1.5",
           "TMPDIR": str(node_tmp), "OMP_NUM_THREADS": "1"}
    head = start_head(2, env)
    try:
        yield head, node_tmp, env
    finally:
        assert stop_head(head) == []  # no Ray process left behind


def running_task(head: RayHead) -> psutil.Process | None:
    """A worker process of this head that is exporting a client (Ray titles it ``ray::<task name>``)."""
    for process in head_processes(head):
        try:
            title = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if title.startswith("ray::") and (TASK_NAME in title or "export_client_files" in title):
            return process
    return None


def ldpfl(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "from ldpfl.cli import main; main()", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ray_export_survives_a_killed_worker_and_writes_the_local_files(tmp_path, ray_head) -> None:
    head, node_tmp, head_env = ray_head
    address = head.address
    local = tmp_path / "local"
    assert CliRunner().invoke(cli, [*EXPORT, "--out", str(local)]).exit_code == 0
    run = tmp_path / "ray"
    env = {k: v for k, v in head_env.items() if k not in ("LDPFL_TEST_SLOW_RELEASE", "TMPDIR")}
    driver = ldpfl([*EXPORT, "--ray-address", address, "--out", str(run)], env)
    killed = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and killed is None:  # a client finished, another in the middle
            done = list(run.glob("client_*.h5")) if run.is_dir() else []
            task = running_task(head) if done else None
            if task is not None:
                task.send_signal(signal.SIGKILL)
                killed = task.pid
            assert driver.poll() is None or killed, driver.communicate()
            time.sleep(0.05)
        assert killed is not None, "no client task was seen running after the first client finished"
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert err.strip().splitlines() == lines and len(lines) == 1, err  # one line, no Ray noise
    assert "was lost" in lines[0] and "rerun" in lines[0], err
    assert not list(run.glob(".*.tmp*"))  # no half-written file, not even under a temporary name
    manifest, checked = validate_run(run)
    before = {p.name: sha256_file(p) for p in run.glob("client_*.h5")}
    assert 1 <= len(before) < 4 and {r.path for r in manifest.files} == set(before)

    rerun = ldpfl([*EXPORT, "--json", "--ray-address", address, "--out", str(run)], env)
    out, err = rerun.communicate(timeout=180)
    assert rerun.returncode == 0 and err.strip() == "", err
    status = {c["index"]: c["status"] for c in json.loads(out)["clients"]}
    assert sorted(status) == [0, 1, 2, 3]
    assert {f"client_{i:03d}.h5" for i, s in status.items() if s == "reused"} == set(before)  # not randomized again
    assert {p.name: sha256_file(p) for p in run.glob("client_*.h5") if p.name in before} == before
    assert len(validate_run(run)[1]) == 4 and len(read_manifest(run).files) == 4
    assert_same_files(run, local)
    assert not [p for p in node_tmp.glob("ldpfl-ray-*") if p.name.startswith(f"ldpfl-ray-{killed}-")]  # swept


@pytest.mark.slow
def test_ray_address_local_through_the_api_leaves_no_process(tmp_path) -> None:
    local = tmp_path / "local"
    export(dataset="mnist5k", extractor="none", clients=4, seed=SEED, out=local)
    code = textwrap.dedent(f"""
        import json, psutil
        import ldpfl
        result = ldpfl.export(dataset="mnist5k", extractor="none", clients=4, seed={SEED},
                              out={str(tmp_path / 'ray')!r}, ray_address="local")
        left = [c.pid for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
        print(json.dumps({{"new": result.new, "left": left}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"new": 4, "left": []}  # the Ray it started is stopped with the run
    assert_same_files(tmp_path / "ray", local)


def test_ray_settings_are_checked_before_anything_runs(monkeypatch) -> None:
    with pytest.raises(ParameterError, match="give one of them"):
        ExportConfig(ray_address="local", clients_parallel=2)
    with pytest.raises(ParameterError, match="give `ray_address` as well|give ray_address as well"):
        ExportConfig(ray_cpus_per_client=2)
    with pytest.raises(ParameterError, match="must be auto, local"):
        ExportConfig(ray_address=" ")
    with pytest.raises(ValueError, match="ray_cpus_per_client must be an integer >= 1"):
        ExportConfig(ray_address="auto", ray_cpus_per_client=0)
    with pytest.raises(ParameterError, match=">= 0"):
        ExportConfig(ray_address="auto", ray_gpus_per_client=float("nan"))
    settings = ExportConfig(ray_address="10.0.0.1:6379", ray_cpus_per_client=2).public_dict()
    assert not {"ray_address", "ray_cpus_per_client", "ray_gpus_per_client"} & set(settings)  # not in the manifest
    real = export_config.importlib.util.find_spec
    monkeypatch.setattr(export_config.importlib.util, "find_spec", lambda name: None if name == "ray" else real(name))
    with pytest.raises(ParameterError, match="pip install 'ray>=2.10'"):
        ExportConfig(ray_address="auto")


def test_cli_refuses_ray_with_local_processes_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(cli, [*EXPORT, "--ray-address", "local", "--clients-parallel", "2",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "--ray-address" in lines[0], result.output
    assert "--clients-parallel" in lines[0] and not (tmp_path / "run").exists()


def test_help_does_not_import_ray() -> None:
    code = ("import sys\nfrom ldpfl.cli import cli\n"
            "try:\n    cli.main(['export', '--help'], prog_name='ldpfl')\nexcept SystemExit:\n    pass\n"
            "print('ray' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--ray-address" in done.stdout and done.stderr.strip().splitlines()[-1] == "False"


def test_returned_files_are_written_atomically_and_never_replace(tmp_path) -> None:
    data = b"not really hdf5"
    (tmp_path / "source.h5").write_bytes(data)
    record = FileRecord(0, "client_000.h5", sha256_file(tmp_path / "source.h5"), len(data), {"train": 1, "test": 0})
    outcome = ClientOutcome(0, record, None, None, 0.1, None)
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ExportError, match="another sha256"):
        commit_files(run, ClientFiles(outcome, {"client_000.h5": b"tampered"}))
    assert list(run.iterdir()) == []  # nothing kept, no temporary left
    with pytest.raises(ExportError, match="returned no client_000.h5"):
        commit_files(run, ClientFiles(outcome, {}))
    assert commit_files(run, ClientFiles(outcome, {"client_000.h5": data})) is outcome
    assert (run / "client_000.h5").read_bytes() == data
    with pytest.raises(ClientFileExists):
        commit_files(run, ClientFiles(outcome, {"client_000.h5": data}))
    assert sorted(p.name for p in run.iterdir()) == ["client_000.h5"]


def test_a_killed_task_s_temporary_directory_is_swept(tmp_path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / f"ldpfl-ray-{gone.pid}-abc").mkdir()
    (tmp_path / f"ldpfl-ray-{os.getpid()}-abc").mkdir()  # this process: alive, kept
    assert sweep_stale(tmp_path) == [f"ldpfl-ray-{gone.pid}-abc"]
    assert [p.name for p in tmp_path.iterdir()] == [f"ldpfl-ray-{os.getpid()}-abc"]


def test_a_task_s_own_error_is_raised_as_raised_there_and_a_dead_worker_is_one_line() -> None:
    exceptions = pytest.importorskip("ray.exceptions")

    class FakeRay:
        """``ray.get`` of a task that failed with ``error``."""

        def __init__(self, error: Exception) -> None:
            self.exceptions, self.error = exceptions, error

        def get(self, ref: object) -> None:
            raise self.error

    cause = ExportError("`data` is not on this node")
    with pytest.raises(ExportError, match="data is not on this node"):
        client_result(FakeRay(exceptions.RayTaskError("export_client_files", "Traceback ...", cause)), None, 1)
    with pytest.raises(RayTaskLost, match="client 3's Ray task was lost \\(WorkerCrashedError\\).*rerun") as lost:
        client_result(FakeRay(exceptions.WorkerCrashedError()), None, 3)
    assert isinstance(lost.value, OSError)  # the CLI: one line, exit 1
