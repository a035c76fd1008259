"""The README's main command: export -> federate -> inspect on MNIST-5k, at the smallest scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ldpfl.api import demo_job
from ldpfl.cli import cli
from ldpfl.commands import demo as demo_command
from ldpfl.mechanisms.gaussian_statistics import GaussianStatistics

SEED = "3"


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory) -> Path:
    """One OUT (and its OUT-stats, OUT-private) for both demos, with one seed: the main and stats runs are the same.

    Whichever test runs second reuses their verified client files, as a user's rerun does (the first test asserts
    it), instead of training the CNN and computing ScatterNet on MNIST-5k again: each test still runs every command,
    federation and inspection, and the first to run (in either order) every export.
    """
    return tmp_path_factory.mktemp("demo") / "demo"


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline(demo_out) -> None:
    out = demo_out
    result = CliRunner().invoke(cli, ["demo", "--out", str(out), "--epochs", "1", "--rounds", "1", "--seed", SEED,
                                      "--quiet", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["nominal_epsilon"] == 0.5
    assert summary["exact_epsilon_per_record"] > 30_000  # UER at alpha = 10 over r*l = 10,240 bits
    assert summary["randomness"] == "seeded" and summary["inspection_ok"] is True
    guarantee = summary["release_guarantee"]  # clear labels and a non-DP CNN: no finite figure, UER one part
    assert guarantee["epsilon"] == "inf" and guarantee["private"] is False
    assert {p["kind"]: p["mechanism"] for p in guarantee["parts"]}["features"] == "uer"
    assert len(summary["local_cnn_accuracy"]) == 2 and len(summary["global_test_accuracy_per_round"]) == 1
    for name in ("client_000.h5", "client_001.h5", "manifest.json", "inspect.png", "federation/metrics.json"):
        assert (out / name).is_file(), name
    assert not (out / "federation" / "checkpoint.pt").exists()
    # Beside it, the recommended way to ship files (issue 40): one stats:K release per silo, two free models.
    stats = summary["stats"]
    assert stats["release"] == "stats:128" and abs(stats["epsilon_add_remove"] - 3.0) < 1e-6
    replace_one = GaussianStatistics(epsilon=3.0, width=128).epsilons()["replace-one"]  # the file's figure
    assert stats["release_guarantee"]["private"] and stats["release_guarantee"]["epsilon"] == pytest.approx(replace_one)
    assert 0.5 < stats["lda_clean_test_accuracy"] <= 1 and stats["inspection_ok"] is True
    assert len(stats["fc_clean_test_accuracy_per_round"]) == 1
    for name in ("client_000.h5", "client_000.local.h5", "federation-lda/model.pt", "federation/metrics.json"):
        assert (out.parent / "demo-stats" / name).is_file(), name
    # A rerun reuses the verified client files (never randomizes the same samples twice).
    before = (out / "client_000.h5").read_bytes()
    again = CliRunner().invoke(cli, ["demo", "--out", str(out), "--epochs", "1", "--rounds", "1", "--seed", SEED,
                                     "--quiet"])
    assert again.exit_code == 0, again.output
    assert "reused, not randomized again" in again.output
    assert (out / "client_000.h5").read_bytes() == before


@pytest.mark.slow
def test_private_demo_runs_a_second_configuration_next_to_ldpfl(demo_out, monkeypatch) -> None:
    out = demo_out
    returned = []

    def recorded(*args, **kwargs) -> demo_job.DemoResult:
        returned.append(demo_job.demo(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(demo_command, "demo", recorded)
    args = ["demo", "--out", str(out), "--epochs", "1", "--rounds", "1", "--seed", SEED, "--private", "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "== configurations side by side ==" in result.stdout
    assert "private files: stats:128, LDA head" in result.stdout
    assert "private: ScatterNet features kept local, dp-sgd eps 3 per silo" in result.stdout
    private = out.parent / "demo-private"
    for name in ("client_000.h5", "manifest.json", "federation/metrics.json"):
        assert (private / name).is_file(), name
    metrics = json.loads((private / "federation" / "metrics.json").read_text())
    assert 0.0 <= metrics["rounds"][0]["test_accuracy"] <= 1.0
    assert all(row["local_only_files"] for row in metrics["release_guarantee"]["clients"])
    # --json of the same run: the command prints the summary the demo returned above (a rerun would federate and
    # inspect everything again from the reused files, as test_demo_runs_the_whole_pipeline's second command does)
    monkeypatch.setattr(demo_command, "demo", lambda *args, **kwargs: returned[0])
    as_json = CliRunner().invoke(cli, [*args, "--json"])
    assert as_json.exit_code == 0 and len(returned) == 1, as_json.output
    summary = json.loads(as_json.stdout)
    assert summary["exact_epsilon_per_record"] > 30_000
    total = summary["private"]["release_guarantee"]  # DP-SGD of the updates over the whole run; files stay local
    assert total == metrics["release_guarantee"]  # the federation's own record, as the summary reports it
    assert total["private"] and 2.9 < total["epsilon"] <= 3.0 and total["delta"] == 1e-5
    # the test records' evaluation noise spends the same figure under both relations (Gaussian, the same
    # sensitivity), calibrated exactly to the target: the add/remove figure can reach the replace-one one
    assert 0 < total["epsilon_add_remove"] <= total["epsilon"]
    assert summary["private"]["inspection_ok"] is True
