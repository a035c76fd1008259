"""Issue 13, stage 2: a lock on the output directory, no temporary file left, resume only on the same files,
resource limits before allocation, and warnings instead of silence.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from cli_checks import command, stderr_error_line
from federate_files import write_run
from repository import ROOT

from ldpfl.stage2_federate import outdir, resources
from ldpfl.stage2_federate.federation import FederationConfig, run_federation
from ldpfl.stage2_federate.model_file import read_model

REPO = ROOT
FAST = ["--hidden", "8", "--local-epochs", "1", "--batch-size", "16", "--threads", "1", "--seed", "3"]
FAST_CONFIG = dict(hidden=(8,), local_epochs=1, batch_size=16, threads=1, seed=3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("hard"), clients=3, rows=32, features=8)


invoke = command("federate")


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


# ---------------------------------------------------------------------------------------------- case 4: lock


def test_second_federation_into_the_same_out_is_refused(run_dir, tmp_path) -> None:
    out = tmp_path / "out"
    with outdir.locked(out):  # a federation holding the directory (another lock of the same file conflicts)
        line = stderr_error_line(invoke(str(run_dir), *FAST, "--rounds", "1", "--out", str(out)))
        assert "another ldpfl federate is writing into" in line and "--out" in line, line
        assert not (out / "config.json").exists()  # the refused run wrote nothing
    result = invoke(str(run_dir), *FAST, "--rounds", "1", "--out", str(out), "-q")  # lock released: runs
    assert result.exit_code == 0, result.output


def test_lock_held_by_a_live_process_and_released_when_it_dies(run_dir, tmp_path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from stage2_federate.outdir import locked\n"
                               f"with locked({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match="another ldpfl federate is writing into"):
            run_federation(run_dir, FederationConfig(rounds=1, **FAST_CONFIG), out_dir=out, progress=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the dead holder's lock
    run_federation(run_dir, FederationConfig(rounds=1, **FAST_CONFIG), out_dir=out, progress=False)


def test_refused_run_leaves_no_directory_behind(tmp_path) -> None:
    run = write_run(tmp_path / "run", clients=2, rows=16)
    out = tmp_path / "never"
    line = stderr_error_line(invoke(str(run), *FAST, "--hidden", "100000000", "--out", str(out)))
    assert "needs at least" in line
    assert not out.exists()


# ------------------------------------------------------------------------ case 3: temporary files, SIGKILL

KILL_ON_SECOND_CHECKPOINT = textwrap.dedent("""
    import os, signal, sys
    import ldpfl.stage2_federate.checkpoint as checkpoint
    real_write, calls = checkpoint.atomic_write, []

    def dying_write(path, write):
        calls.append(path)
        if len(calls) < 2:
            return real_write(path, write)

        def half(handle):  # a few MB of the checkpoint reach the disk, then the process is killed
            handle.write(os.urandom(1 << 20))
            handle.flush()
            os.fsync(handle.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        return real_write(path, half)

    checkpoint.atomic_write = dying_write
    from ldpfl.cli import main
    sys.argv = ["ldpfl", "federate", *sys.argv[1:]]
    main()
""")


def test_sigkill_during_checkpoint_write_then_resume_leaves_no_temporary(run_dir, tmp_path) -> None:
    out, whole = tmp_path / "out", tmp_path / "whole"
    args = [str(run_dir), *FAST, "--rounds", "3", "-q"]
    killed = subprocess.run([sys.executable, "-c", KILL_ON_SECOND_CHECKPOINT, *args, "--out", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = temporaries(out)
    assert len(left) == 1 and left[0].startswith(".checkpoint.pt.") and left[0].endswith(".tmp"), left
    assert (out / "checkpoint.pt").is_file()  # round 1's, intact

    resumed = invoke(*args, "--out", str(out), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert temporaries(out) == []  # the half-written checkpoint (generator states: seed-equivalent) is gone
    assert not (out / "checkpoint.pt").exists()

    assert invoke(*args, "--out", str(whole)).exit_code == 0  # nothing lost: the same model as uninterrupted
    a, b = read_model(out / "model.pt").state_dict, read_model(whole / "model.pt").state_dict
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stale_temporaries_removed_on_start_and_completion(run_dir, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stale = [".metrics.json.4242.deadbeef.tmp", ".model.pt.4242.cafe0001.tmp", ".accuracy.png.1.ab.tmp"]
    for name in stale:
        (out / name).write_bytes(b"half")
    (out / "notes.txt").write_text("mine")  # not an output: left alone
    result = run_federation(run_dir, FederationConfig(rounds=1, **FAST_CONFIG), out_dir=out, progress=False)
    assert temporaries(out) == []
    assert (out / "notes.txt").read_text() == "mine"
    assert result.final_accuracy is not None


def test_overwrite_clears_the_previous_outputs(run_dir, tmp_path) -> None:
    out = tmp_path / "out"
    run_federation(run_dir, FederationConfig(rounds=2, **FAST_CONFIG), out_dir=out, progress=False,
                   keep_checkpoint=True)
    assert (out / "checkpoint.pt").is_file()
    run_federation(run_dir, FederationConfig(rounds=1, **FAST_CONFIG), out_dir=out, progress=False, overwrite=True)
    assert not (out / "checkpoint.pt").exists()  # the old run's checkpoint does not survive an overwrite


# ------------------------------------------------------------------- case 5: resume only on the same files


def test_resume_refuses_a_checkpoint_of_another_run_directory(run_dir, tmp_path) -> None:
    out = tmp_path / "out"
    run_federation(run_dir, FederationConfig(rounds=1, **FAST_CONFIG), out_dir=out, progress=False,
                   keep_checkpoint=True)
    other = write_run(tmp_path / "other", clients=3, rows=32, features=8, seed=99)  # same shape, other records
    line = stderr_error_line(invoke(str(other), *FAST, "--rounds", "2", "--out", str(out), "--resume"))
    assert "trained on other client files" in line and "client_000.h5" in line and "--overwrite" in line, line

    fewer = write_run(tmp_path / "fewer", clients=2, rows=32, features=8)
    line = stderr_error_line(invoke(str(fewer), *FAST, "--rounds", "2", "--out", str(out), "--resume"))
    assert "trained on other client files" in line or "client count" in line or "differ" in line, line

    copy = tmp_path / "copy"  # the same files elsewhere are the same data: resuming is fine
    shutil.copytree(run_dir, copy)
    result = invoke(str(copy), *FAST, "--rounds", "2", "--out", str(out), "--resume", "-q")
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------- case 2: resource limits before any allocation


def test_model_size_is_checked_against_memory_before_allocation() -> None:
    assert resources.parameter_count_of(48, (16,), 4) == 48 * 16 + 16 + 16 * 4 + 4
    with pytest.raises(ValueError, match=r"5,300,000,004 parameters.*needs at least .* GiB.*only 1\.0 GiB"):
        resources.check_model(48, (100_000_000,), 4, 3, available=2**30, source="test")
    assert resources.check_model(48, (16,), 4, 3, available=2**30) == 852
    available, source = resources.available_memory()  # this machine reports its memory (cgroup or the OS)
    assert available is not None and available > 2**28 and source


def test_huge_hidden_layer_is_a_quick_stderr_error_line(run_dir, tmp_path) -> None:
    started = time.perf_counter()
    line = stderr_error_line(invoke(str(run_dir), *FAST, "--hidden", "100000000", "--out", str(tmp_path / "o")))
    assert time.perf_counter() - started < 30
    assert "5,300,000,004 parameters" in line and "GiB" in line and "available" in line and "--hidden" in line


def test_ten_million_input_bits_with_the_default_hidden_layer_is_refused(tmp_path) -> None:
    # r · l = 1,666,666 · 6 = 9,999,996 input bits (the schema's limit is 10^7): 2.0e10 parameters, 82 GB
    run = write_run(tmp_path / "wide", clients=1, rows=2, features=1_666_666)
    started = time.perf_counter()
    line = stderr_error_line(invoke(str(run), "--threads", "1", "--seed", "1", "--out", str(tmp_path / "o")))
    assert time.perf_counter() - started < 60
    assert "9999996 -> 2048 -> 4" in line and "20,480,002,052 parameters" in line, line


# ---------------------------------------------------------- case 7: a round without uploads is not silent


def test_round_without_any_upload_warns(run_dir, tmp_path) -> None:
    result = invoke(str(run_dir), *FAST, "--rounds", "2", "--drop-per-round", "3", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 2 and "round 1" in warnings[0] and "no upload survived" in warnings[0], result.stderr
    assert "RuntimeWarning" not in result.stderr


def test_excluded_uploads_warn_without_numpy_warnings(run_dir, tmp_path) -> None:
    # sigma ~ 3.9e36 at epsilon 1e-35: uploads near float32's edge; the next round's training overflows
    result = invoke(str(run_dir), *FAST, "--rounds", "3", "--perturbation", "gaussian", "--epsilon", "1e-35",
                    "--out", str(tmp_path / "o"), "--json")
    assert result.exit_code == 0, result.output
    assert "RuntimeWarning" not in result.stderr and "overflow" not in result.stderr, result.stderr
    assert "Warning: round " in result.stderr and "excluded" in result.stderr


def test_noise_that_cannot_fit_float32_is_refused(run_dir, tmp_path) -> None:
    line = stderr_error_line(invoke(str(run_dir), *FAST, "--perturbation", "gaussian", "--epsilon", "1e-300",
                                 "--out", str(tmp_path / "o")))
    assert "noise scale 3.88e+301" in line and "overflow" in line and "--epsilon" in line, line


@pytest.mark.parametrize("perturbation, expected", [("pdpm", "too small for PDPM"),
                                                    ("gaussian-wu", "out of range for WU eq. 4")])
def test_tiny_epsilon_is_a_one_line_error_not_a_zero_division(run_dir, tmp_path, perturbation, expected) -> None:
    line = stderr_error_line(invoke(str(run_dir), *FAST, "--perturbation", perturbation, "--epsilon", "1e-300",
                                 "--out", str(tmp_path / "o")))
    assert expected in line and "ZeroDivisionError" not in line, line
