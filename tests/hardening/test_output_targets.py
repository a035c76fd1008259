"""Issue 24 item 2: no command writes onto its own input or onto a released artifact.

Each case reproduces a reported overwrite (``inspect --plot RUN/client_000.h5``, ``predict --out
RUN/manifest.json``) or a sibling of it, and checks one ``Error:`` line, exit 2, and a run directory that
is byte for byte what it was.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_checks import ok, one_error_line, run

from ldpfl.contract.write_targets import WriteTargetError, check_write_target, protected_artifact


def snapshot(root: Path) -> dict[str, bytes]:
    """Return the bytes of every file under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A silo's export of a 40-record .npz (extractor none) with its plan, and a fake federation."""
    root = tmp_path_factory.mktemp("targets")
    rng = np.random.default_rng(7)
    data = root / "silo.npz"
    np.savez(data, x=rng.integers(0, 256, size=(40, 8, 8)).astype(np.uint8), y=np.arange(40) % 2)
    out = root / "run"
    ok(run("plan", "--data", data, "--extractor", "none", "--out", root / "plan.json"))
    ok(run("export", "--plan", root / "plan.json", "--data", data, "--client-index", 0, "--clients", 2, "--seed", 3,
           "--quiet", "--out", out))  # client_000.h5, manifest.json, partition.npz, plan.json
    federation = out / "federation"
    federation.mkdir()
    (federation / "model.pt").write_bytes(b"a federated model")
    (federation / "metrics.json").write_text('{"rounds": []}')
    return out


@pytest.mark.parametrize("name", ["client_000.h5", "client_001.h5", "manifest.json", "plan.json", "partition.npz",
                                  "federation/model.pt", "federation/metrics.json", "federation/accuracy.png"])
def test_inspect_plot_never_replaces_a_run_artifact(run_dir, name):
    before = snapshot(run_dir)
    line = one_error_line(run("inspect", run_dir, "--plot", run_dir / name))
    assert line.startswith(f"Error: --plot {run_dir / name} is ") and "choose another path" in line
    assert snapshot(run_dir) == before


def test_inspect_plot_never_replaces_the_inspected_file_through_a_link(run_dir, tmp_path):
    link = tmp_path / "plot.png"
    link.symlink_to(run_dir / "client_000.h5")
    before = snapshot(run_dir)
    line = one_error_line(run("inspect", run_dir / "client_000.h5", "--plot", link))
    assert "--plot" in line and "is an input of this command" in line
    assert snapshot(run_dir) == before


def test_a_plot_beside_the_run_is_still_written(run_dir, tmp_path):
    plot = tmp_path / "density.png"
    ok(run("inspect", run_dir, "--plot", plot))
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("name", ["manifest.json", "plan.json", "federation/metrics.json"])
def test_predict_out_never_replaces_a_run_artifact(run_dir, name):
    before = snapshot(run_dir)
    line = one_error_line(run("predict", run_dir, "--client-index", 0, "--out", run_dir / name))
    assert line.startswith(f"Error: --out {run_dir / name} is ")
    assert snapshot(run_dir) == before


def test_predict_out_never_replaces_its_own_data(run_dir, tmp_path):
    data = tmp_path / "records.csv"
    data.write_text("p0,label\n1,0\n")
    line = one_error_line(run("predict", run_dir, "--client-index", 0, "--data", data, "--out", data))
    assert "is an input of this command" in line
    assert data.read_text() == "p0,label\n1,0\n"


def test_plan_out_never_replaces_a_run_manifest_even_with_overwrite(run_dir):
    before = snapshot(run_dir)
    line = one_error_line(run("plan", "--data", run_dir.parent / "silo.npz", "--extractor", "none", "--overwrite",
                              "--out", run_dir / "manifest.json"))
    assert "the manifest of run directory" in line
    assert snapshot(run_dir) == before


def test_library_check(run_dir, tmp_path):
    assert protected_artifact(run_dir / "client_000.h5").startswith("a client file")
    assert protected_artifact(run_dir / "new.csv") is None
    assert protected_artifact(tmp_path / "manifest.json") is None  # no run here
    with pytest.raises(WriteTargetError) as caught:
        check_write_target(run_dir / "manifest.json", "out")
    assert caught.value.parameters == ("out",)
    check_write_target(tmp_path / "fresh.csv", "out", [run_dir, None])
