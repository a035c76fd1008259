"""``ldpfl export --keras-backend``: the CNNs train and release on TensorFlow, torch or jax, with the same files.

Keras picks its backend once per process, so each export on another backend runs in a fresh
interpreter. The model a torch or jax export saves is read back by a TensorFlow ``--from-models``
release, and both must give the same clean features up to the fixed-point rounding of a few values.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from repository import ROOT

from ldpfl.cli import cli
from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import read_manifest
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.models import cnn, keras_backend

# One batch of each client's 54 training records: a step of one shape. On jax the augmentation layers keep Keras
# from compiling the training step (it runs op by op, and XLA compiles each op anew for each batch shape).
TINY = ["--dataset", "mnist5k", "--limit", "120", "--clients", "2", "--epochs", "1", "--batch-size", "64",
        "--mechanism", "none", "--save-models", "--seed", "3", "--quiet", "--json"]


def export_in_fresh_process(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    done = subprocess.run([sys.executable, "-c", "from ldpfl.cli import main; main()", "export", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def clean_bits(run: Path, client: int) -> np.ndarray:
    return np.unpackbits(read_client_file(run / client_file_name(client)).features["train"], axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_an_export_on_another_backend_gives_the_features_tensorflow_gives_for_its_model(backend: str,
                                                                                       tmp_path: Path) -> None:
    pytest.importorskip(backend, reason=f"the {backend} backend needs {backend} installed (the test extra has it)")
    run = tmp_path / backend
    summary = export_in_fresh_process(*TINY, "--keras-backend", backend, "--out", str(run))
    assert read_manifest(run).info["config"]["keras_backend"] == backend
    accuracies = [c["local_accuracy"] for c in summary["clients"]]
    assert all(0.0 <= a <= 1.0 for a in accuracies), accuracies
    # The same saved models, released again by TensorFlow (this process's backend), in a fresh process.
    again = tmp_path / "tensorflow"
    export_in_fresh_process("--from-models", str(run), "--mechanism", "none", "--quiet", "--json", "--seed", "3",
                            "--out", str(again))
    assert read_manifest(again).info["config"]["keras_backend"] == "tensorflow"
    for client in range(2):
        ours, theirs = clean_bits(run, client), clean_bits(again, client)
        assert ours.shape == theirs.shape and ours.shape[0] > 0
        # Float rounding between backends can move a value across a fixed-point step (1/32): a few bits.
        assert np.mean(ours != theirs) < 2e-3, f"client {client}: {np.mean(ours != theirs):.4%} of bits differ"


def test_an_unknown_backend_is_refused_by_config_and_cli(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="keras_backend"):
        ExportConfig(keras_backend="theano")
    result = CliRunner().invoke(cli, ["export", "--keras-backend", "theano", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--keras-backend" in result.output
    assert not (tmp_path / "x").exists()


def test_a_backend_cannot_change_once_keras_is_imported() -> None:
    keras = cnn.import_keras()
    other = next(b for b in keras_backend.KERAS_BACKENDS if b != keras.backend.backend())
    with pytest.raises(ParameterError, match="after Keras was imported"):
        keras_backend.select_keras_backend(other)
    assert keras_backend.select_keras_backend(keras.backend.backend()) == keras.backend.backend()
    with pytest.raises(ParameterError, match="keras_backend"):
        keras_backend.select_keras_backend("theano")


def test_device_cuda_where_no_gpu_is_seen_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    if keras_backend.cuda_visible("tensorflow"):
        pytest.skip("this machine has a GPU that TensorFlow sees")
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["export", *TINY, "--device", "cuda", "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --device cuda: the tensorflow backend sees no CUDA device")
    assert not out.exists()
    with pytest.raises(ParameterError, match="device must be one of auto, cpu, cuda"):
        ExportConfig(device="gpu")


@pytest.mark.slow
def test_the_device_is_not_recorded_and_changes_no_byte_on_the_cpu(tmp_path: Path) -> None:
    auto, cpu = tmp_path / "auto", tmp_path / "cpu"
    export_in_fresh_process(*TINY, "--out", str(auto))
    export_in_fresh_process(*TINY, "--device", "cpu", "--out", str(cpu))
    assert "device" not in read_manifest(cpu).info["config"]
    for client in range(2):  # every dataset and attribute but the time
        x, y = (read_client_file(run / client_file_name(client)) for run in (auto, cpu))
        for split in ("train", "test"):
            assert x.features[split].tobytes() == y.features[split].tobytes()
            assert x.labels[split].tobytes() == y.labels[split].tobytes()
        assert dataclasses.replace(x.metadata, created_utc="") == dataclasses.replace(y.metadata, created_utc="")
