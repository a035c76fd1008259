"""Issue 24 item 3: a declared size is checked before anything is allocated.

Each case reproduces a reported input (a few-KB ``model.pt`` of stride-0 tensors declaring a 320 →
3,000,000 → 3 net, ``--client-epsilons @/dev/zero``, a sparse 4 GiB ``manifest.json``, a FIFO as a
plan) and checks one ``Error:`` line, the exit code, and, where the input is small, the memory it took
(``ru_maxrss`` in a subprocess).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_checks import ok, one_error_line, run
from memory_checks import peak_growth

from ldpfl.contract.schema import FormatError

MiB = 1 << 20


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A one-client export of a 40-record .npz (extractor none)."""
    root = tmp_path_factory.mktemp("sizes")
    rng = np.random.default_rng(11)
    data = root / "silo.npz"
    np.savez(data, x=rng.integers(0, 256, size=(40, 8, 8)).astype(np.uint8), y=np.arange(40) % 2)
    ok(run("export", "--data", data, "--extractor", "none", "--clients", 1, "--seed", 5, "--quiet", "--out",
           root / "run"))
    return root / "run"


def stride_zero_model(path: Path) -> None:
    """Write the reported model.pt: 320 → 3,000,000 → 3 over one-value storages (a few KB)."""
    import torch

    from ldpfl.stage2_federate.model_file import MODEL_FORMAT, MODEL_VERSION

    one = torch.zeros(1)
    state = {"net.0.weight": one.expand(3_000_000, 320), "net.0.bias": one.expand(3_000_000),
             "net.3.weight": one.expand(3, 3_000_000), "net.3.bias": torch.zeros(3)}
    torch.save({"format": MODEL_FORMAT, "version": MODEL_VERSION, "state_dict": state, "trained_on": {}}, path)


def test_a_stride_zero_model_is_refused_before_it_allocates(tmp_path):
    model = tmp_path / "model.pt"
    stride_zero_model(model)
    assert model.stat().st_size < 16 * 1024
    out, growth = peak_growth(f"""
        from ldpfl.prediction import load_global_model
        # --- measure
        load_global_model({str(model)!r})
    """)
    assert out.startswith("FormatError") and "declares shape [3000000, 320]" in out, out
    assert growth < 64, growth  # the net would take 3.6 GiB


def test_predict_refuses_the_stride_zero_model_in_one_line(run_dir, tmp_path):
    model = tmp_path / "model.pt"
    stride_zero_model(model)
    line = one_error_line(run("predict", "--released", run_dir / "client_000.h5", "--model", model))
    assert "model.pt" in line and "over a storage of 1 values" in line


def test_a_real_model_archive_passes(tmp_path):
    import torch

    from ldpfl.contract.torch_archive import check_archive

    path = tmp_path / "model.pt"
    weights = torch.ones(4, 6)
    torch.save({"state_dict": {"net.0.weight": torch.nn.Parameter(weights), "net.0.bias": torch.zeros(8)[2:6]},
                "note": [1, "x", {"k": 2.5}]}, path)
    sizes = check_archive(path)
    assert (sizes.tensors, sizes.values) == (2, 28)


def test_a_deflated_member_that_expands_is_refused(tmp_path):
    import zipfile

    from ldpfl.contract.torch_archive import check_archive

    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("bomb/data/0", b"\x00" * (64 * MiB))
    assert path.stat().st_size < MiB
    with pytest.raises(FormatError, match="zip bomb"):
        check_archive(path)


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_client_epsilons_from_a_device_or_a_fifo_fail_fast(run_dir, tmp_path, source):
    if source == "fifo":
        source = tmp_path / "eps.csv"
        os.mkfifo(source)  # nobody writes: a plain read would block forever
    line = one_error_line(run("federate", run_dir, "--client-epsilons", f"@{source}", "--out", tmp_path / "fed"))
    assert "--client-epsilons" in line and "not a regular file" in line
    assert not (tmp_path / "fed").exists()


def test_client_epsilons_from_a_huge_file_fail_fast(run_dir, tmp_path):
    big = tmp_path / "eps.csv"
    with open(big, "wb") as handle:
        handle.truncate(4 << 30)  # sparse: 4 GiB declared, nothing stored
    line = one_error_line(run("federate", run_dir, "--client-epsilons", f"@{big}", "--out", tmp_path / "fed"))
    assert "larger than the 1048576-byte cap" in line


def test_a_sparse_4_gib_manifest_is_refused_by_inspect_and_gather(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    with open(copy / "manifest.json", "r+b") as handle:
        handle.truncate(4 << 30)
    result = run("inspect", copy)
    assert result.exit_code != 0 and "larger than the 1048576-byte cap" in result.output
    line = one_error_line(run("gather", copy, "--out", tmp_path / "gathered"))
    assert "manifest.json" in line and "larger than the 1048576-byte cap" in line
    assert not (tmp_path / "gathered").exists()


def test_a_fifo_as_plan_or_manifest_does_not_hang(run_dir, tmp_path):
    plan = tmp_path / "plan.json"
    os.mkfifo(plan)
    line = one_error_line(run("export", "--plan", plan, "--data", run_dir.parent / "silo.npz", "--client-index", 0,
                              "--clients", 2, "--out", tmp_path / "out"))
    assert "FIFO" in line and not (tmp_path / "out").exists()
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "manifest.json").unlink()
    os.mkfifo(copy / "manifest.json")
    line = one_error_line(run("gather", copy, "--out", tmp_path / "gathered"))
    assert "manifest" in line


def test_manifest_cap_is_the_plan_cap(run_dir, tmp_path):
    from ldpfl.contract.manifest import MAX_MANIFEST_BYTES
    from ldpfl.contract.plan import MAX_PLAN_BYTES

    assert MAX_MANIFEST_BYTES == MAX_PLAN_BYTES == MiB
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(json.dumps(manifest)) < MAX_MANIFEST_BYTES  # a real manifest is far below it


def test_a_fifo_as_client_file_or_model_does_not_hang(run_dir, tmp_path):
    fifo = tmp_path / "client_000.h5"
    os.mkfifo(fifo)
    result = run("inspect", fifo)
    assert result.exit_code != 0 and "is a FIFO (named pipe), not a regular file" in result.output
    model = tmp_path / "model.pt"
    os.mkfifo(model)
    line = one_error_line(run("predict", "--released", run_dir / "client_000.h5", "--model", model))
    assert "FIFO" in line or "no federated model" in line
