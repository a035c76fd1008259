"""``ldpfl inspect`` of a file with a DP-SGD extractor part: the stored guarantee is checked against a valid bracket
without dp-accounting, a figure below the bracket is refused, and ``--recompute`` runs the exact accountant.

The file is a real export (raw digits, PDPM values, k-RR labels) whose attributes then record a DP-SGD training
and the guarantee the exact accountant gives for it: DP-SGD training needs Keras on JAX, which these checks of
the guarantee do not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from ldpfl.cli import cli
from ldpfl.contract import guarantee_check as gc
from ldpfl.contract import release_guarantee as rg
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name

SGD = {"training": "dp-sgd", "noise_multiplier": 1.1, "sampling_probability": 0.02, "steps": 800, "delta": 1e-5,
       "records": 6300}


@pytest.fixture(scope="module")
def private_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A client file whose guarantee composes PDPM values, k-RR labels and a DP-SGD extractor (exact figure)."""
    run = tmp_path_factory.mktemp("private") / "run"
    result = CliRunner().invoke(cli, ["export", "--dataset", "digits", "--extractor", "none", "--clients", "2",
                                      "--seed", "3", "--quiet", "--out", str(run), "--mechanism", "pdpm",
                                      "--epsilon", "0.1", "--label-epsilon", "1"])
    assert result.exit_code == 0, result.output
    path = run.parent / "alone" / client_file_name(0)  # away from the manifest, whose sha256 it no longer matches
    path.parent.mkdir()
    path.write_bytes((run / client_file_name(0)).read_bytes())
    with h5py.File(path, "r+") as handle:
        handle.attrs["extractor_training"] = json.dumps(SGD)
    data = read_client_file(path)
    guarantee = rg.file_guarantee(data.metadata, records=sum(len(v) for v in data.labels.values()))
    assert guarantee.method == rg.METHOD_PLD and {p.kind for p in guarantee.parts} == {"features", "labels",
                                                                                       "extractor"}
    with h5py.File(path, "r+") as handle:
        handle.attrs["release_guarantee"] = json.dumps(guarantee.to_dict())
    return path


def tampered(source: Path, target: Path, **changes: float) -> Path:
    """A copy of ``source`` whose stored guarantee states other figures (``epsilon``, ``extractor``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    with h5py.File(target, "r+") as handle:
        stored = json.loads(handle.attrs["release_guarantee"])
        if "epsilon" in changes:
            stored["epsilon"] = changes["epsilon"]
        for part in stored["parts"]:
            if part["kind"] == "extractor" and "extractor" in changes:
                part["epsilon"] = changes["extractor"]
        handle.attrs["release_guarantee"] = json.dumps(stored)
    return target


def inspect_in_fresh_process(path: Path, *flags: str) -> dict:
    """``ldpfl.inspect`` in a new interpreter: the file's JSON section and whether dp_accounting was imported."""
    code = ("import json, sys\n"
            "from ldpfl.api.inspect_job import inspect\n"
            f"found = inspect({str(path)!r}, recompute={'--recompute' in flags})\n"
            "out = found.to_dict()['files'][0]\n"
            "print(json.dumps({'file': out, 'dp_accounting': 'dp_accounting' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_true_figure_passes_the_bracket_without_importing_dp_accounting(private_file: Path) -> None:
    found = inspect_in_fresh_process(private_file)
    check, stored = found["file"]["release_guarantee_check"], found["file"]["release_guarantee"]
    assert found["file"]["status"] == "ok", found["file"]["flags"]
    assert check["how"] == gc.CHECK_BRACKET and check["lower"] <= stored["epsilon"] <= check["upper"]
    assert not found["dp_accounting"]


def test_a_figure_below_the_bracket_is_refused(private_file: Path, tmp_path: Path) -> None:
    stored = json.loads(h5py.File(private_file, "r").attrs["release_guarantee"])["epsilon"]
    path = tampered(private_file, tmp_path / "low" / client_file_name(0), epsilon=stored - 0.5)
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 1
    file = json.loads(result.stdout)["files"][0]
    assert file["status"] == "flagged"
    assert any(f"states epsilon {stored - 0.5:.6g}, below the {stored:.6g}" in flag for flag in file["flags"])
    assert file["release_guarantee_check"]["how"] == gc.CHECK_EXACT  # the bracket disagreed: settled exactly


def test_an_extractor_figure_outside_its_bracket_is_recomputed(private_file: Path, tmp_path: Path) -> None:
    stored = json.loads(h5py.File(private_file, "r").attrs["release_guarantee"])
    sgd = next(p for p in stored["parts"] if p["kind"] == "extractor")["epsilon"]
    path = tampered(private_file, tmp_path / "sgd" / client_file_name(0), extractor=sgd / 2)
    file = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).stdout)["files"][0]
    assert file["release_guarantee_check"]["how"] == gc.CHECK_EXACT
    assert file["status"] == "ok"  # the total still holds; only the fast check could not vouch for it


def test_recompute_runs_the_exact_accountant_and_keeps_the_figure(private_file: Path) -> None:
    found = inspect_in_fresh_process(private_file, "--recompute")
    check, stored = found["file"]["release_guarantee_check"], found["file"]["release_guarantee"]
    assert check["how"] == gc.CHECK_EXACT and found["dp_accounting"]
    assert check["lower"] == check["upper"] == stored["epsilon"]
    assert found["file"]["status"] == "ok"
    result = CliRunner().invoke(cli, ["inspect", str(private_file), "--recompute", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["files"][0]["release_guarantee_check"]["how"] == gc.CHECK_EXACT
