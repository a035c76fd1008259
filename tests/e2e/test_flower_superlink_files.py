"""A silo's client file replaced during a SuperLink deployment, under each failure policy (slow: three runs).

Apart from tests/e2e/test_flower_superlink.py so that the two longest deployments run on different workers.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from cli_checks import run
from federate_files import write_run
from flower_helpers import DEPLOYMENT_FLAGS, Descendants, coordinator_copy, leftovers, one_line, superlink_with_silos


def replace_after_round_one(metrics: Path, target: Path, replacement: Path) -> threading.Thread:
    """Replace ``target`` by ``replacement`` (another export of the same name) once round 1 is in ``metrics``."""
    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if json.loads(metrics.read_text())["rounds"]:
                    shutil.copy(replacement, target)
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_client_file_replaced_during_the_run_follows_the_failure_policy(flower, tmp_path, marked) -> None:
    """One SuperLink, two SuperNodes, three runs of 3 rounds; each time silo 1's file is replaced once round 1 is
    written (when round 2's replies are in), so that its round-3 training finds the file changed.

    With ``--min-clients-per-round 1`` the run goes on without client 1, whose failure is logged with its
    index and reason; with 2 the run stops at that round, naming the client and the reason; without a
    policy the client's failure ends the run.
    """
    run_dir = write_run(tmp_path / "silos", clients=2, rows=32)
    other = write_run(tmp_path / "other", clients=2, rows=32, seed=99)
    original = tmp_path / "client_001.original.h5"
    shutil.copy(run_dir / "client_001.h5", original)
    coordinator = coordinator_copy(run_dir, tmp_path / "coordinator")
    watch = Descendants()
    results = {}
    with superlink_with_silos(tmp_path / "work", [run_dir / "client_000.h5", run_dir / "client_001.h5"]) as (port, _):
        for name, policy in (("one", ["--min-clients-per-round", "1"]), ("two", ["--min-clients-per-round", "2"]),
                             ("none", [])):
            shutil.copy(original, run_dir / "client_001.h5")  # the silo restored its file
            out = tmp_path / name
            thread = replace_after_round_one(out / "metrics.json", run_dir / "client_001.h5", other / "client_001.h5")
            results[name] = run("federate", coordinator, "--engine", "flower", "--superlink", f"127.0.0.1:{port}",
                                "--insecure", "--quiet", "--out", out, *DEPLOYMENT_FLAGS, *policy)
            thread.join(5)
    watch.stop()
    assert results["one"].exit_code == 0, results["one"].output
    rounds = json.loads((tmp_path / "one" / "metrics.json").read_text())["rounds"]
    failed = [r for r in rounds if r["lost"]]
    assert failed and all(r["lost"] == [1] and r["aggregated"] == [0] for r in failed)
    assert any(re.match(r"client 1: failed training in round \d: FileChanged: client_001\.h5 changed since the run "
                        r"started", note) for note in failed[0]["notes"]), failed[0]["notes"]
    assert rounds[-1]["round"] == 3 and (tmp_path / "one" / "model.pt").is_file()
    line = one_line(results["two"], 1)
    assert re.match(r"Error: the Flower run failed: round \d: 1 of the 2 selected clients trained, fewer than the "
                    r"failure policy's 2 \(min-clients-per-round\): client 1: failed training in round \d: "
                    r"FileChanged: client_001\.h5 changed since the run started", line), line
    line = one_line(results["none"], 1)
    assert re.match(r"Error: the Flower run failed: client 1 failed training in round \d: FileChanged: "
                    r"client_001\.h5 changed since the run started", line), line
    assert watch.running() == [] and leftovers(marked) == []
