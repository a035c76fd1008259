"""``ldpfl export`` with a seed trains the same CNN on every executor (sequential, 2 workers, a spawned worker).

Its own file (split from test_export.py) so that pytest-xdist's ``--dist loadfile`` can run it beside that file's
other tests: it starts four TensorFlow processes and is the slowest export test.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from repository import ROOT

from ldpfl.contract.client_reader import read_client_file
from ldpfl.mechanisms import FLOAT32
from ldpfl.stage1_features.export import run as export_run
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.run import run_export


def quick_config(**overrides) -> ExportConfig:
    return ExportConfig(**{"dataset": "mnist5k", "extractor": "none", "limit": 300, "clients": 2, **overrides})


@pytest.mark.slow
def test_a_seeded_cnn_export_writes_the_same_features_on_every_executor(tmp_path, monkeypatch) -> None:
    """Issue 40 item 6: a seed fixes the CNN's threads (one), so sequential and parallel runs train the same CNN.

    Clean float32 flatten features (``local_only``): the smallest difference in training shows. Sequential in a
    fresh process (the CLI: TensorFlow gets its threads in-process), in 2 workers, and sequential where this
    process cannot give TensorFlow its threads (one spawned worker instead). Two clients, so that client 1 trains
    after client 0 in one process (sequential, spawned) and in a worker of its own, as a rule (2 workers).
    """
    cnn = {"extractor": "mnist-cnn", "limit": 200, "epochs": 1, "batch_size": 32, "local_only": True,
           "mechanism": "none"}
    args = ["export", "--dataset", "mnist5k", "--clients", "2", "--extractor", "mnist-cnn", "--limit", "200",
            "--epochs", "1", "--batch-size", "32", "--local-only", "--seed", "11", "--quiet", "--out",
            str(tmp_path / "seq")]
    done = subprocess.run([sys.executable, "-m", "ldpfl.cli", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    run_export(quick_config(clients=2, clients_parallel=2, seed=11, **cnn), tmp_path / "par", progress=False)
    monkeypatch.setattr(export_run, "pin_threads", lambda threads: False)  # TensorFlow already runs here
    run_export(quick_config(clients=2, seed=11, **cnn), tmp_path / "spawned", progress=False)
    for i in range(2):
        seq = read_client_file(tmp_path / "seq" / f"client_00{i}.h5")
        assert seq.metadata.feature_format == FLOAT32 and seq.features["train"].shape == (90, 1024)
        for other in ("par", "spawned"):
            data = read_client_file(tmp_path / other / f"client_00{i}.h5")
            for split in ("train", "test"):
                np.testing.assert_array_equal(data.features[split], seq.features[split], err_msg=f"{other} {i}")
                np.testing.assert_array_equal(data.labels[split], seq.labels[split])
