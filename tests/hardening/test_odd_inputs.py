"""Issue 24 item 5: wrong or noisy results from odd inputs.

Labels 0, 1e19, 2e19 (two of them merged into one class before), a data file whose name is not UTF-8
(a half-written ``--out`` before), a killed ``gather``'s temporary directory (left forever before), a
checkpoint edited and saved again (``KeyError: 'config'`` before) and a third-party warning (a
multi-line leak before).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from cli_checks import ok, one_error_line, run
from click.testing import CliRunner

from ldpfl.cli import cli
from ldpfl.stage1_features.own_data.errors import DataError
from ldpfl.stage1_features.own_data.load import load_own_data


@pytest.mark.parametrize("labels", [[0.0, 1e19, 2e19], [0.0, -(2.0**60), 2.0**60]])
def test_float_labels_beyond_2_53_are_refused_never_merged(tmp_path, labels):
    path = tmp_path / "labels.npz"
    np.savez(path, x=np.zeros((6, 4), dtype=np.float32), y=np.array(labels * 2))
    with pytest.raises(DataError, match="beyond 2\\^53"):
        load_own_data(path)
    line = one_error_line(run("plan", "--data", path, "--out", tmp_path / "plan.json"))
    assert "labels.npz" in line and not (tmp_path / "plan.json").exists()


def test_uint64_labels_beyond_int64_are_refused(tmp_path):
    path = tmp_path / "labels.npz"
    np.savez(path, x=np.zeros((4, 4), dtype=np.float32), y=np.array([0, 2**63, 0, 2**63], dtype=np.uint64))
    with pytest.raises(DataError, match="exceeds the int64 range"):
        load_own_data(path)


def test_exact_float_labels_still_read(tmp_path):
    path = tmp_path / "labels.npz"
    np.savez(path, x=np.zeros((4, 4), dtype=np.float32), y=np.array([0.0, 2.0**53, 0.0, 2.0**53]))
    data = load_own_data(path)
    assert data.class_names == ("0", str(2**53)) and list(data.y) == [0, 1, 0, 1]


def test_a_data_file_name_that_is_not_utf8_creates_nothing(tmp_path):
    data = Path(os.fsdecode(bytes(tmp_path) + b"/silo_\xff.npz"))
    np.savez(data, x=np.zeros((6, 4), dtype=np.float32), y=np.arange(6) % 2)
    out = tmp_path / "out"
    done = subprocess.run([Path(sys.executable).parent / "ldpfl", "export", "--data", os.fsencode(data),
                           "--extractor", "none", "--clients", "1", "--quiet", "--out", out],
                          capture_output=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"})
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: --name "), lines
    assert "not valid Unicode" in lines[0]
    assert not out.exists()


def test_a_killed_gathers_temporary_is_removed(tmp_path):
    rng = np.random.default_rng(9)
    data = tmp_path / "silo.npz"
    np.savez(data, x=rng.integers(0, 256, size=(20, 4, 4)).astype(np.uint8), y=np.arange(20) % 2)
    source = tmp_path / "export"
    ok(run("export", "--data", data, "--extractor", "none", "--clients", 1, "--quiet", "--out", source))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".gathered.{dead.pid}.tmp"
    stale.mkdir()
    (stale / "client_000.h5").write_bytes(b"half a copy")
    live = tmp_path / f".gathered.{os.getppid()}.tmp"  # a process that is alive: a gather under way
    live.mkdir()
    other = tmp_path / f".other.{dead.pid}.tmp"  # another target's: not ours to remove
    other.mkdir()
    ok(run("gather", source, "--out", tmp_path / "gathered"))
    assert not stale.exists() and live.is_dir() and other.is_dir()
    assert (tmp_path / "gathered" / "client_000.h5").is_file()


def checkpoint_payload() -> dict:
    from ldpfl.stage2_federate.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION

    return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "round": 1,
            "model": {"net.0.weight": torch.zeros(2, 3)}, "rng": {}, "history": [], "config": {},
            "randomness": "csprng", "inputs": {}, "engine": "local"}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("config", None, "key 'config' is missing"),
    ("round", "1", "key 'round' is a str, expected int"),
    ("model", [1], "key 'model' is a list, expected Mapping"),
    ("history", {}, "key 'history' is a dict, expected list"),
])
def test_a_tampered_checkpoint_gets_a_named_refusal(tmp_path, key, value, message):
    from ldpfl.stage2_federate.checkpoint import load_checkpoint
    from ldpfl.stage2_federate.federation import FederationConfig

    payload = checkpoint_payload()
    if value is None:
        del payload[key]
    else:
        payload[key] = value
    path = tmp_path / "checkpoint.pt"
    torch.save(payload, path)
    with pytest.raises(ValueError, match=f"damaged checkpoint: {message}"):
        load_checkpoint(path, FederationConfig(rounds=2))


def test_a_stride_zero_checkpoint_is_refused_before_torch_loads_it(tmp_path):
    from ldpfl.stage2_federate.checkpoint import load_checkpoint
    from ldpfl.stage2_federate.federation import FederationConfig

    payload = checkpoint_payload() | {"model": {"net.0.weight": torch.zeros(1).expand(10**6, 10**4)}}
    path = tmp_path / "checkpoint.pt"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="cannot resume: .*over a storage of 1 values"):
        load_checkpoint(path, FederationConfig(rounds=2))


def test_third_party_warnings_become_one_line(monkeypatch):
    @click.command("warn-twice")
    def warn_twice() -> None:
        warnings.warn("Palette images with Transparency expressed in bytes\nshould be converted", UserWarning,
                      stacklevel=1)
        click.echo("done")

    monkeypatch.setitem(cli.commands, "warn-twice", warn_twice)
    result = CliRunner().invoke(cli, ["warn-twice"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert lines == ["Warning: Palette images with Transparency expressed in bytes should be converted "
                     "(UserWarning)", "done"], lines


def test_a_full_disk_names_the_path_whatever_the_library_raised(tmp_path, monkeypatch):
    import errno

    import ldpfl.contract.atomic as atomic

    target = tmp_path / "model.pt"
    target.write_bytes(b"the previous model")

    def torch_like_write(handle) -> None:
        handle.write(b"part of a model")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(atomic, "free_bytes", lambda directory: 0)
    with pytest.raises(OSError) as caught:
        atomic.atomic_write(target, torch_like_write)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert "No space left on device" in str(caught.value)
    assert target.read_bytes() == b"the previous model" and os.listdir(tmp_path) == ["model.pt"]
    monkeypatch.setattr(atomic, "free_bytes", lambda directory: 1 << 30)  # space left: the error is the library's
    with pytest.raises(RuntimeError, match="enforce fail"):
        atomic.atomic_write(target, torch_like_write)


def test_a_full_disk_is_one_error_line_with_the_path(tmp_path, monkeypatch):
    import errno

    import ldpfl.contract.atomic as atomic

    data = tmp_path / "silo.npz"
    np.savez(data, x=np.arange(24, dtype=np.float32).reshape(6, 4), y=np.arange(6) % 2)

    def full(path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "fsync_file", full)
    result = run("plan", "--data", data, "--extractor", "none", "--out", tmp_path / "plan.json")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [f"Error: No space left on device: {tmp_path / 'plan.json'}"], lines
    assert not (tmp_path / "plan.json").exists()


def test_ctrl_c_on_a_parallel_export_prints_one_line(tmp_path):
    import signal
    import time

    import psutil

    data = tmp_path / "big.npz"
    rng = np.random.default_rng(1)
    np.savez(data, x=rng.integers(0, 256, size=(20000, 8, 8)).astype(np.uint8), y=np.arange(20000) % 2)
    command = [Path(sys.executable).parent / "ldpfl", "export", "--data", data, "--extractor", "none", "--clients",
               "400", "--clients-parallel", "2", "--quiet", "--out", tmp_path / "out"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env=os.environ | {"OMP_NUM_THREADS": "1"})
    workers: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while len(workers) < 2 and time.monotonic() < deadline and process.poll() is None:
        workers = [c for c in psutil.Process(process.pid).children(recursive=True)
                   if "spawn_main" in " ".join(c.cmdline())]
        time.sleep(0.05)
    time.sleep(0.5)  # the workers are exporting clients
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C on the terminal does: the whole group
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the export finished before the signal")
    lines = [line for line in stderr.decode().splitlines() if line.strip()]
    assert process.returncode == 130 and lines == ["Error: aborted"], stderr.decode()[-2000:]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []  # the parent stopped its workers


def test_a_full_disk_while_writing_a_client_file_names_it(tmp_path, monkeypatch):
    import errno

    from federate_files import write_run

    import ldpfl.contract.atomic as atomic
    import ldpfl.contract.client_writer as client_writer
    from ldpfl.contract.client_reader import open_client_file, read_client_file

    run_dir = write_run(tmp_path / "run", clients=1, rows=16)
    source = Path(run_dir) / "client_000.h5"
    with open_client_file(source) as (_handle, metadata, _rows):
        pass
    data = read_client_file(source)
    splits = {split: (data.features[split], data.labels[split]) for split in ("train", "test")}

    def failing_rows(self, split, start, features, labels) -> None:
        raise RuntimeError("Can't write data (file write failed)")  # what h5py says on a full disk

    monkeypatch.setattr(client_writer.ClientFileWriter, "write_rows", failing_rows)
    monkeypatch.setattr(atomic, "free_bytes", lambda directory: 0)
    target = tmp_path / "client_009.h5"
    with pytest.raises(OSError) as caught:
        client_writer.write_client_file(target, metadata, splits)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert not target.exists() and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
