"""Issue 13, the command line: a last-resort handler (one ``Error:`` line, exit 1; a traceback only with
LDPFL_DEBUG=1; usage errors keep exit 2), and the specific cases that used to trace back or write nonsense.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_checks import stderr_error_line as one_line
from click.testing import CliRunner
from repository import ROOT

from ldpfl.cli import cli
from ldpfl.contract.client_reader import read_client_file

REPO = ROOT


@pytest.mark.parametrize("exception, expected", [
    (RuntimeError("boom\nsecond line"), "Error: RuntimeError: boom second line (an unexpected error; set "
                                        "LDPFL_DEBUG=1 for the traceback)"),
    (MemoryError(), "Error: out of memory; set LDPFL_DEBUG=1 for the traceback"),
    (RecursionError("deep"), "Error: input nested too deeply to process (RecursionError)"),
    (KeyError("k"), "Error: KeyError: 'k' (an unexpected error"),
])
def test_any_exception_becomes_one_line_with_exit_1(monkeypatch, exception, expected) -> None:
    import ldpfl.commands.mechanisms as mechanisms_cli

    def explode(*args, **kwargs):
        raise exception

    monkeypatch.setattr(mechanisms_cli, "mechanism_listing", explode)
    monkeypatch.delenv("LDPFL_DEBUG", raising=False)
    line = one_line(CliRunner().invoke(cli, ["mechanisms"]), 1)
    assert line.startswith(expected), line


def test_traceback_only_with_ldpfl_debug() -> None:
    code = ("import sys, ldpfl.commands.mechanisms as m\n"
            "def explode(*a, **k):\n    raise RuntimeError('boom')\n"
            "m.mechanism_listing = explode\n"
            "from ldpfl.cli import main\nsys.argv = ['ldpfl', 'mechanisms']\nmain()\n")
    for debug, traced in (("", False), ("0", False), ("1", True)):
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LDPFL_DEBUG": debug})
        assert done.returncode == 1, done.stderr
        assert ("Traceback" in done.stderr) is traced, done.stderr
        if not traced:
            assert done.stderr.strip() == "Error: RuntimeError: boom (an unexpected error; set LDPFL_DEBUG=1 for " \
                                          "the traceback)"


def test_usage_errors_keep_exit_2() -> None:
    line = one_line(CliRunner().invoke(cli, ["mechanisms", "show", "uer", "--features", "1e12"]), 2)
    assert "'1e12' is not a valid integer" in line
    line = one_line(CliRunner().invoke(cli, ["mechanisms", "show", "uer", "--features", str(10**12)]), 2)
    assert "must be an integer <= 10000000" in line
    assert one_line(CliRunner().invoke(cli, ["federate", "--no-such-option"]), 2).startswith("Error: No such option")


@pytest.mark.parametrize("command", [["export", "--extractor", "none"], ["federate", "."]])
def test_empty_out_is_refused(command, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_line(CliRunner().invoke(cli, [*command, "--out", ""]), 2)
    assert "--out" in line and "is empty" in line
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_export_refuses_noise_that_overflows_float32(tmp_path) -> None:
    out = tmp_path / "run"
    args = ["export", "--extractor", "none", "--clients", "2", "--limit", "40", "--mechanism", "gaussian",
            "--quiet", "--seed", "1", "--out", str(out)]
    line = one_line(CliRunner().invoke(cli, [*args, "--epsilon", "1e-300"]), 2)
    assert "noise scale 3.88e+301" in line and "overflow" in line and "--epsilon" in line, line
    assert not out.exists() or not any(out.glob("client_*.h5"))
    result = CliRunner().invoke(cli, [*args, "--epsilon", "1e-35"])  # huge but finite: written, all finite
    assert result.exit_code == 0, result.output
    import numpy as np

    data = read_client_file(out / "client_000.h5")
    assert all(np.isfinite(data.features[s]).all() for s in ("train", "test"))
