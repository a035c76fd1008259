"""Stage 2 on a CUDA device: the same random draws as on the CPU, checkpoints that resume on either device.

Every test here needs a GPU that torch can see and is skipped without one (CI has none): they run on a
GPU machine, e.g. ``python3 -m pytest tests/e2e/test_cuda.py`` there. The federation's torch generators live
on the CPU whatever the device (``stage2_federate/streams.py``), so a CUDA run starts from the CPU run's
initial model and draws its shuffles, dropout masks and perturbation noise from the same streams: the two
differ by float rounding only. With generators on the device, the initial models would differ outright
and a checkpoint's generator states would not load on the other device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from repository import ROOT

from ldpfl import mechanisms as mech
from ldpfl.cli import cli
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.stage2_federate.data import load_client
from ldpfl.stage2_federate.federation import FederationConfig, Streams, run_federation
from ldpfl.stage2_federate.model import GeneratorDropout, build_model
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.streaming import ResidencyBudget

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device that torch can see (run on a GPU machine)")

FAST = dict(hidden=(16,), local_epochs=2, batch_size=16, lr=0.01, seed=11, rounds=2)
TOLERANCE = 1e-4  # float rounding of a few local steps; an other initial model differs by ~0.1


def run(run_dir, out, device, **overrides):
    config = FederationConfig(**{**FAST, "device": device, **overrides})
    return run_federation(run_dir, config, out_dir=out, progress=False, keep_checkpoint=True)


def parameters(model_path) -> torch.Tensor:
    return torch.cat([v.flatten() for v in read_model(model_path).state_dict.values()])


def without_timing(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


def assert_close_runs(a: list, a_model, b: list, b_model) -> None:
    """Two runs' histories and models: the same selections, drops and aggregations; losses, accuracies
    and parameters equal up to float rounding."""
    for x, y in zip(a, b, strict=True):
        for key in ("selected", "dropped", "aggregated", "excluded", "kept_previous_model"):
            assert x[key] == y[key], key
        for key in ("train_loss", "test_loss"):
            assert x[key] == pytest.approx(y[key], rel=TOLERANCE, abs=TOLERANCE), key
        assert x["test_accuracy"] == pytest.approx(y["test_accuracy"], abs=1 / 64), "two test rows at most"
    assert torch.allclose(parameters(a_model), parameters(b_model), rtol=TOLERANCE, atol=TOLERANCE)


def test_the_initial_model_is_the_cpu_one() -> None:
    """Initialized from the CPU stream and moved: bit for bit the model a CPU run starts from."""
    models = {}
    for device in ("cpu", "cuda"):
        streams = Streams.create(mech.make_randomness(3), 4)
        assert streams.init.device.type == "cpu" and {g.device.type for g in streams.train} == {"cpu"}
        models[device] = build_model(48, (16,), 4, generator=streams.init, device=device)
    assert next(models["cuda"].parameters()).is_cuda
    for (name, a), b in zip(models["cpu"].state_dict().items(), models["cuda"].state_dict().values(), strict=True):
        assert torch.equal(a, b.cpu()), name


def test_dropout_masks_are_the_cpu_ones() -> None:
    x = torch.rand(64, 2048)
    out = {}
    for device in ("cpu", "cuda"):
        layer = GeneratorDropout(0.25).train()
        layer.generator = torch.Generator().manual_seed(9)
        out[device] = layer(x.to(device)).cpu()
    assert torch.equal(out["cpu"], out["cuda"])
    assert 0.70 < float((out["cuda"] != 0).float().mean()) < 0.80


def test_streamed_and_resident_splits_give_the_same_batches_on_cuda(packed_run) -> None:
    path = packed_run / "client_000.h5"
    resident = load_client(path, torch.device("cuda"), ResidencyBudget(2**30))
    streamed = load_client(path, torch.device("cuda"), ResidencyBudget(0))
    a = list(resident.train.batches(16, generator=torch.Generator().manual_seed(4)))
    b = list(streamed.train.batches(16, generator=torch.Generator().manual_seed(4)))
    assert len(a) == len(b) == 4 and a[0][0].is_cuda and b[0][0].is_cuda
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("overrides", [
    {},
    {"perturbation": "gaussian", "epsilon": 50.0, "aggregation": "weighted"},
    {"perturbation": "ldpsign", "epsilon": 5.0, "clients_per_round": 3, "drop_per_round": 1},
], ids=["plain", "gaussian", "ldpsign"])
def test_a_cuda_run_follows_the_cpu_run_of_its_seed(packed_run, tmp_path, overrides) -> None:
    cpu = run(packed_run, tmp_path / "on-the-cpu", "cpu", **overrides)
    cuda = run(packed_run, tmp_path / "on-the-gpu", "cuda", **overrides)
    assert cuda.config["resolved"]["device"] == "cuda" and cpu.config["resolved"]["device"] == "cpu"
    assert_close_runs(cuda.history, cuda.paths["model"], cpu.history, cpu.paths["model"])


def test_a_cuda_run_is_reproducible_and_resumes_bit_for_bit(packed_run, tmp_path) -> None:
    whole = run(packed_run, tmp_path / "whole", "cuda")
    again = run(packed_run, tmp_path / "again", "cuda")
    assert without_timing(again.history) == without_timing(whole.history)
    assert torch.equal(parameters(again.paths["model"]), parameters(whole.paths["model"]))
    run(packed_run, tmp_path / "parts", "cuda", rounds=1)
    resumed = run_federation(packed_run, FederationConfig(**{**FAST, "device": "cuda"}), out_dir=tmp_path / "parts",
                             resume=True, progress=False)
    assert resumed.resumed_from_round == 1
    assert without_timing(resumed.history) == without_timing(whole.history)
    assert torch.equal(parameters(resumed.paths["model"]), parameters(whole.paths["model"]))


@pytest.mark.parametrize(("first", "then"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(packed_run, tmp_path, first, then) -> None:
    """Through the CLI: a checkpoint written on one device resumes on the other and stays on the same streams."""
    whole = run(packed_run, tmp_path / "whole", then, rounds=3)
    out = tmp_path / "parts"
    args = ["federate", str(packed_run), "--hidden", "16", "--local-epochs", "2", "--batch-size", "16", "--lr", "0.01",
            "--seed", "11", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(cli, [*args, "--rounds", "1", "--keep-checkpoint", "--device", first])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, [*args, "--rounds", "3", "--resume", "--device", then])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["resolved"]["device"] == then
    assert [r["round"] for r in metrics["rounds"]] == [1, 2, 3]
    assert_close_runs(metrics["rounds"], out / "model.pt", whole.history, whole.paths["model"])


# ----------------------------------------------------------------------------------------------------------
# Stage 1 on the GPU (issue 26): Keras on torch with CUDA torch; each export in a fresh interpreter (Keras
# takes one backend per process).

STAGE1 = ["--dataset", "mnist5k", "--limit", "400", "--clients", "2", "--epochs", "2", "--batch-size", "32",
          "--keras-backend", "torch", "--mechanism", "none", "--seed", "13", "--quiet", "--json"]


def export_process(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_TORCH_DEVICE")}
    done = subprocess.run([sys.executable, "-c", "from ldpfl.cli import main; main()", "export", *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_stage1_training_on_the_gpu_is_reproducible_for_one_stream(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    first = export_process(*STAGE1, "--device", "cuda", "--out", a)
    second = export_process(*STAGE1, "--device", "cuda", "--out", b)
    assert [c["local_accuracy"] for c in first["clients"]] == [c["local_accuracy"] for c in second["clients"]]
    for client in range(2):
        x, y = (read_client_file(run / client_file_name(client)) for run in (a, b))
        for split in ("train", "test"):
            assert x.features[split].tobytes() == y.features[split].tobytes()


def test_stage1_gpu_features_agree_with_a_cpu_release_of_the_same_model(tmp_path):
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    export_process(*STAGE1, "--device", "cuda", "--save-models", "--out", gpu)
    export_process("--from-models", gpu, "--keras-backend", "torch", "--device", "cpu", "--mechanism", "none",
                   "--seed", "13", "--quiet", "--json", "--out", cpu)
    encoding = mech.FixedPointEncoding(4, 5)
    step = 2.0 ** -5  # one fraction step: a value computed in other float rounding moves by at most one step
    for client in range(2):
        x, y = (read_client_file(run / client_file_name(client)) for run in (gpu, cpu))
        width = x.metadata.feature_width
        for split in ("train", "test"):
            a, b = (encoding.decode(mech.unpack_bits(f.features[split], width)) for f in (x, y))
            assert np.allclose(a, b, atol=step, rtol=0)
