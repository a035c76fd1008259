"""``ldpfl federate``: help, JSON output, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_checks import assert_usage_error, command
from federate_files import write_run

FAST = ["--hidden", "8", "--local-epochs", "1", "--batch-size", "16", "--threads", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("cli"), clients=4, rows=32, features=8)


invoke = command("federate")


def test_help_lists_options_and_presets() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for text in ("--client-epsilons", "--aggregation", "fedaw", "--perturbation", "fedaw-gaussian",
                 "--drop-per-round", "--resume", "wu-fmnist-LH", "pldp-eps2", "pldp-tau3", "omega"):
        assert text in result.output, text


def test_json_run_and_summary(run_dir, tmp_path) -> None:
    result = invoke(str(run_dir), *FAST, "--rounds", "2", "--out", str(tmp_path / "a"), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["rounds_completed"] == 2 and len(payload["test_accuracy"]) == 2
    assert payload["final_test_accuracy"] == payload["test_accuracy"][-1]
    assert "seed" not in payload["config"]
    assert (tmp_path / "a" / "metrics.json").is_file()
    text = invoke(str(run_dir), *FAST, "--rounds", "2", "--out", str(tmp_path / "b"))
    assert text.exit_code == 0
    assert "round  test_acc" in text.stdout and "final test accuracy" in text.stdout


def test_default_out_dir_and_resume(tmp_path) -> None:
    run_dir = write_run(tmp_path / "run", clients=2, rows=16)
    assert invoke(str(run_dir), *FAST, "--rounds", "1", "--quiet", "--keep-checkpoint").exit_code == 0
    assert (run_dir / "federation" / "checkpoint.pt").is_file()
    assert_usage_error(invoke(str(run_dir), *FAST, "--rounds", "1", "--quiet"), "already holds a federation run")
    resumed = invoke(str(run_dir), *FAST, "--rounds", "2", "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    payload = json.loads(resumed.stdout)
    assert payload["resumed_from_round"] == 1 and "checkpoint" not in payload["outputs"]
    assert not (run_dir / "federation" / "checkpoint.pt").exists()
    assert (run_dir / "federation" / "model.pt").is_file()


def test_missing_run_directory(tmp_path) -> None:
    assert_usage_error(invoke(str(tmp_path / "nope")), "does not exist")


def test_directory_without_manifest(tmp_path) -> None:
    assert_usage_error(invoke(str(tmp_path)), "no manifest")


def test_mismatched_files(tmp_path) -> None:
    run_dir = write_run(tmp_path, clients=3, rows=16, features=8, features_of={1: 9})
    assert_usage_error(invoke(str(run_dir), *FAST), "'features' differs", "client_000.h5", "client_001.h5")


def test_budget_list_of_the_wrong_length(run_dir, tmp_path) -> None:
    result = invoke(str(run_dir), *FAST, "--perturbation", "gaussian", "--client-epsilons", "1,2,3",
                    "--out", str(tmp_path))
    assert_usage_error(result, "client epsilons list has 3 values but the run has 4 clients")


def test_budget_file_and_preset_of_the_wrong_length(run_dir, tmp_path) -> None:
    (tmp_path / "eps.csv").write_text("epsilon\n1\n2\n")
    result = invoke(str(run_dir), *FAST, "--perturbation", "gaussian", "--client-epsilons", f"@{tmp_path}/eps.csv",
                    "--out", str(tmp_path / "o"))
    assert_usage_error(result, "has 2 values but the run has 4 clients")
    result = invoke(str(run_dir), *FAST, "--perturbation", "ldpsign", "--budget-preset", "wu-fmnist-LH",
                    "--out", str(tmp_path / "o"))
    assert_usage_error(result, "'wu-fmnist-LH' is defined for 10 clients", "this run has 4")


@pytest.mark.parametrize(("args", "fragments"), [
    (["--aggregation", "weighted"], ["needs a noise scale", "perturbation 'none'"]),
    (["--client-epsilons", "1,x"], ["'x' is not a number"]),
    (["--hidden", "12,a"], ["not a comma-separated list"]),
    (["--perturbation", "pdpm", "--clip", "1"], ["perturbation 'pdpm' takes no --clip"]),
    (["--aggregation", "fraction"], ["needs --fraction"]),
    (["--drop-per-round", "5"], ["drop per round (5) exceeds the 4 clients"]),
    (["--delta", "2"], ["open interval (0, 1)"]),
    (["--budget-preset", "pldp-eps1", "--client-epsilons", "1,1,1,1", "--perturbation", "gaussian"],
     ["both set epsilon values"]),
    (["--perturbation", "gaussian", "--budget-preset", "pldp-eps1", "--device", "cuda"], ["cuda"]),
])
def test_bad_options_are_one_line_errors(run_dir, tmp_path, args, fragments) -> None:
    result = invoke(str(run_dir), *FAST, *args, "--out", str(tmp_path))
    if "--device" in args and result.exit_code == 0:
        pytest.skip("this machine has CUDA")
    assert_usage_error(result, *fragments)


def test_cli_module_does_not_import_torch() -> None:
    code = "import sys, ldpfl.commands.federate, ldpfl.stage2_federate.strategies; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runtime_defaults_apply_before_torch_and_keep_user_values() -> None:
    code = ("import json, stage2_federate.runtime as r; first = r.apply_runtime_defaults(); import torch; "
            "print(json.dumps([first, r.apply_runtime_defaults()]))")
    env = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "OMP_WAIT_POLICY")}
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    first, after_torch = json.loads(out.stdout)
    assert first == {"THP_MEM_ALLOC_ENABLE": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    assert after_torch == {}
