"""``ldpfl federate RUN --engine flower --superlink HOST:PORT`` (issue 25 item 1): real silos from the command line.

Without Flower's daemons: the address, the flags, what the coordinator reads (manifest and plan, never a
client file), the ServerApp's checks of the nodes' files and of the output directory, and the one-line
errors of an unreachable address and of a server that is no SuperLink. With them (``slow``): TLS failures
and a busy SuperLink (one SuperLink with TLS), and the deployment itself: a SuperLink and two SuperNodes on
127.0.0.1 that first refuse a node serving another run's file, then the command as a subprocess, killed after
round 1 and resumed, outputs identical to ``--engine local``, and no Flower or Ray process left behind. Item 3:
a client file replaced during the run, under each failure policy (``--min-clients-per-round``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from cli_checks import run
from federate_files import write_run
from flower_helpers import (
    DEPLOYMENT_FLAGS,
    Descendants,
    coordinator_copy,
    leftovers,
    one_line,
    superlink_with_silos,
    tls_files,
)

from ldpfl.common.errors import ParameterError
from ldpfl.contract.plan import PLAN_FILE, SharedPlan, write_plan
from ldpfl.contract.schema import FormatError
from ldpfl.mechanisms import MechanismSpec
from ldpfl.stage2_federate.flower_engine import client_side as cs
from ldpfl.stage2_federate.flower_engine.control import parse_superlink
from ldpfl.stage2_federate.flower_engine.deployment import coordinator_run
from ldpfl.stage2_federate.flower_engine.launch import free_port
from ldpfl.stage2_federate.flower_engine.protocol import SUBMISSION_FILE
from ldpfl.stage2_federate.flower_engine.server_side import (
    OutDirUnseen,
    check_manifest,
    claim_out_dir,
    stop_requested,
)

# --------------------------------------------------------------------------------------------------
# Without Flower's daemons.


@pytest.mark.parametrize("text", ["127.0.0.1:9093", "coordinator.example:443", "[::1]:9093", " silo-1.lan:1 "])
def test_an_address_is_host_and_port(text) -> None:
    assert parse_superlink(text) == text.strip()


@pytest.mark.parametrize(("text", "fragment"), [("coordinator", "needs a port"), ("http://a:1", "no scheme"),
                                                 ("a:0", "outside 1-65535"), ("a:65536", "outside 1-65535"),
                                                 (":9093", "no valid host"), ("a b:1", "no valid host"),
                                                 ("a:port", "needs a port")])
def test_a_bad_address_names_the_parameter(text, fragment) -> None:
    with pytest.raises(ParameterError, match=fragment) as caught:
        parse_superlink(text)
    assert caught.value.parameters == ("superlink",)


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--engine", "flower", "--superlink", "coordinator"], "--superlink 'coordinator' needs a port"),
    (["--superlink", "127.0.0.1:9"], "apply to --engine flower only"),
    (["--engine", "flower", "--insecure"], "apply to --superlink only"),
    (["--engine", "flower", "--superlink", "127.0.0.1:9", "--insecure", "--root-certificates", "{manifest}"],
     "exclude each other"),
    (["--engine", "flower", "--superlink", "127.0.0.1:9", "--cpus-per-client", "2"], "applies to a simulation"),
    (["--engine", "flower", "--superlink", "127.0.0.1:9", "--root-certificates", "{manifest}"],
     "--root-certificates"),
])
def test_bad_usage_is_one_error_line_with_exit_2(flower, tmp_path, flags, fragment) -> None:
    run_dir = write_run(tmp_path / "run", clients=2, rows=16)
    flags = [flag.format(manifest=run_dir / "manifest.json") for flag in flags]
    assert fragment in one_line(run("federate", run_dir, *flags), 2)
    assert not (run_dir / "federation").exists()


def test_the_coordinator_reads_the_manifest_and_plan_only(tmp_path) -> None:
    run_dir = write_run(tmp_path / "run", clients=3, rows=16)
    coordinator = coordinator_run(coordinator_copy(run_dir, tmp_path / "coordinator"))
    listed = json.loads((run_dir / "manifest.json").read_text())["files"]
    assert [(f.index, f.file, f.sha256) for f in coordinator.files] == \
        [(f["client_index"], f["path"], f["sha256"]) for f in listed]
    assert coordinator.plan_fingerprint is None
    spec = MechanismSpec.resolve("uer", {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5},
                                 features=8)
    plan = SharedPlan(dataset="mnist5k", classes=tuple("0123456789"), extractor="synthetic", input_shape=(8,),
                      features=8, mechanism=spec)
    write_plan(plan, tmp_path / "coordinator" / PLAN_FILE)
    assert coordinator_run(tmp_path / "coordinator").plan_fingerprint == plan.fingerprint
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="a coordinator needs the run's manifest.json .* client files stay on the "
                                          "silos"):
        coordinator_run(tmp_path / "empty")


def test_the_serverapp_refuses_a_node_whose_file_is_not_the_manifests(tmp_path) -> None:
    run_dir = write_run(tmp_path / "run", clients=2, rows=16)
    other = write_run(tmp_path / "other", clients=3, rows=16, seed=99)  # another run: same names, other records
    entries = coordinator_run(run_dir).files
    summaries = [cs.summarize(cs.open_client(run_dir / f"client_00{i}.h5", torch.device("cpu"))) for i in (0, 1)]
    check_manifest(summaries, entries)  # the right files
    foreign = cs.summarize(cs.open_client(other / "client_001.h5", torch.device("cpu")))
    with pytest.raises(ValueError, match=r"^client 1: its SuperNode serves client_001\.h5 \(sha256 [0-9a-f]{12}…\), "
                                         r"but the run's manifest lists client_001\.h5 .*another run's file"):
        check_manifest([summaries[0], foreign], entries)
    extra = cs.summarize(cs.open_client(other / "client_002.h5", torch.device("cpu")))
    with pytest.raises(ValueError, match=r"^client 2: .* manifest lists no client 2 \(clients \[0, 1\]\)"):
        check_manifest([*summaries, extra], entries)
    with pytest.raises(ValueError, match=r"^client 0: client_000\.h5 was not exported with the run's plan\.json"):
        check_manifest(summaries, entries, plan_fingerprint="sha256:" + "ab" * 32)


def test_the_serverapp_sees_the_commands_output_directory_and_its_stop_request(tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(OutDirUnseen, match="run ldpfl federate --superlink on the SuperLink's machine"):
        claim_out_dir(out, "token")  # another machine: no such directory
    out.mkdir()
    (out / SUBMISSION_FILE).write_text(json.dumps({"token": "another"}))
    with pytest.raises(OutDirUnseen):
        claim_out_dir(out, "token")
    (out / SUBMISSION_FILE).write_text(json.dumps({"token": "token"}))
    assert not stop_requested(out, "token") and stop_requested(out, "another")  # a newer submission took over
    held = claim_out_dir(out, "token")
    with pytest.raises(RuntimeError, match="another ldpfl ServerApp is writing into"):
        claim_out_dir(out, "token")
    held.release()
    claim_out_dir(out, "token").release()
    (out / SUBMISSION_FILE).write_text(json.dumps({"token": "token", "stop": True}))  # the command was interrupted
    assert stop_requested(out, "token")
    (out / SUBMISSION_FILE).unlink()
    assert stop_requested(out, "token")


def test_an_unreachable_superlink_is_one_line_and_writes_nothing(flower, tmp_path) -> None:
    run_dir = coordinator_copy(write_run(tmp_path / "run", clients=2, rows=16), tmp_path / "coordinator")
    line = one_line(run("federate", run_dir, "--engine", "flower", "--superlink", f"127.0.0.1:{free_port()}",
                        "--insecure"), 1)
    assert "cannot reach the SuperLink at 127.0.0.1:" in line and "connection refused" in line
    line = one_line(run("federate", run_dir, "--engine", "flower", "--superlink", "nowhere.invalid:9093"), 1)
    assert "the host name does not resolve" in line
    assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json"]


def test_a_server_that_is_no_superlink_is_one_line(flower, tmp_path) -> None:
    run_dir = coordinator_copy(write_run(tmp_path / "run", clients=2, rows=16), tmp_path / "coordinator")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        line = one_line(run("federate", run_dir, "--engine", "flower", "--superlink", f"127.0.0.1:{port}",
                            "--insecure"), 1)
        assert f"127.0.0.1:{port} answered HTTP 501" in line and "not a Flower 1.41 SuperLink" in line
        line = one_line(run("federate", run_dir, "--engine", "flower", "--superlink", f"127.0.0.1:{port}"), 1)
        assert "TLS with the SuperLink" in line and "answers without TLS" in line
    finally:
        server.shutdown()
    assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json"]


# --------------------------------------------------------------------------------------------------
# With Flower's daemons on 127.0.0.1.

def submit_other_app(port: int, ca: Path) -> int:
    """Submit a run of another Flower app (not ldpfl's) to the SuperLink; return its run id."""
    from flwr.cli.build import build_fab_from_files
    from flwr.common.serde import fab_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.supercore.fab import Fab

    from ldpfl.stage2_federate.flower_engine.control import ControlClient

    pyproject = ('[project]\nname = "other-app"\nversion = "1.0.0"\nlicense = "Apache-2.0"\ndependencies = []\n\n'
                 '[tool.flwr.app]\npublisher = "someone"\n\n[tool.flwr.app.components]\n'
                 'serverapp = "other.server:app"\nclientapp = "other.client:app"\n')
    with warnings.catch_warnings():  # pathspec, inside Flower's builder, warns of its own deprecations
        warnings.simplefilter("ignore", DeprecationWarning)
        fab, _ = build_fab_from_files({"pyproject.toml": pyproject.encode()})
    with ControlClient(f"127.0.0.1:{port}", root_certificates=ca) as control:
        reply = control._call("StartRun", StartRunRequest(
            fab=fab_to_proto(Fab(hashlib.sha256(fab).hexdigest(), fab, {}))))
        return int(reply.run_id)


@pytest.mark.slow
def test_tls_failures_and_a_busy_superlink_are_one_line(flower, tmp_path, marked) -> None:
    """A SuperLink with TLS whose ServerApps are never launched (``--isolation process``): runs stay pending."""
    run_dir = coordinator_copy(write_run(tmp_path / "run", clients=2, rows=16), tmp_path / "coordinator")
    tls = tls_files(tmp_path / "tls")
    watch = Descendants()
    extra = ["--ssl-ca-certfile", str(tls["ca"]), "--ssl-certfile", str(tls["server"]), "--ssl-keyfile",
             str(tls["server_key"]), "--isolation", "process"]
    from ldpfl.stage2_federate.flower_engine.launch import start_superlink
    from ldpfl.stage2_federate.flower_engine.processes import stop_all

    link, port = start_superlink(tmp_path / "work", insecure=False, extra=extra, timeout=180)
    try:
        address = ["--engine", "flower", "--superlink", f"127.0.0.1:{port}"]
        line = one_line(run("federate", run_dir, *address, "--insecure"), 1)
        assert f"the SuperLink at 127.0.0.1:{port} closed the connection without an answer" in line
        assert "a SuperLink with TLS needs TLS here (--root-certificates, or the system's CAs), not --insecure" in line
        for flags in ([], ["--root-certificates", tls["other_ca"]]):  # the system's CAs, another CA
            line = one_line(run("federate", run_dir, *address, *flags), 1)
            assert f"TLS with the SuperLink at 127.0.0.1:{port} failed" in line and "CERTIFICATE_VERIFY_FAILED" in line
        other = submit_other_app(port, tls["ca"])
        line = one_line(run("federate", run_dir, *address, "--root-certificates", tls["ca"]), 1)
        assert line == (f"Error: the SuperLink at 127.0.0.1:{port} is busy with run {other} (app someone/other-app, "
                        f"pending): wait for it to finish, or stop it (flwr stop {other})")
        assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json"]  # nothing written, no federation/
    finally:
        assert stop_all([link]) == []
        watch.stop()
    assert watch.running() == [] and leftovers(marked) == []


def ldpfl(*args: object) -> list[str]:
    """The ``ldpfl`` command line as a subprocess's argv."""
    return [sys.executable, "-m", "ldpfl.cli", *map(str, args)]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.slow
def test_the_cli_on_two_supernodes_refuses_another_runs_file_then_equals_the_local_engine_and_resumes(
        flower, tmp_path, marked) -> None:
    """The issue's done-when: a SuperLink and two SuperNodes on 127.0.0.1, ``ldpfl federate --superlink`` killed
    after round 1 of 3 and resumed with ``--resume``: every round and the model identical to ``--engine local``.

    The coordinator's run directory holds the manifest only; each silo serves its own file. First, on the same
    deployment, silo 1 serves another run's file (same name, other records): the run ends before round 1 with
    one line naming client 1, and leaves no ``federation/`` behind. Then the silo restores its own file.
    """
    run_dir = write_run(tmp_path / "silos", clients=2, rows=64)
    other = write_run(tmp_path / "other", clients=2, rows=64, seed=99)
    original = tmp_path / "client_001.original.h5"
    shutil.copy(run_dir / "client_001.h5", original)
    coordinator = coordinator_copy(run_dir, tmp_path / "coordinator")
    local = run("federate", run_dir, "--out", tmp_path / "local", "--quiet", *DEPLOYMENT_FLAGS)
    assert local.exit_code == 0, local.output
    out = tmp_path / "out"
    watch = Descendants()
    states = [tmp_path / "silo0-state", tmp_path / "silo1-state"]
    with superlink_with_silos(tmp_path / "work", [run_dir / "client_000.h5", run_dir / "client_001.h5"],
                              state_dirs=states) as (port, _):
        shutil.copy(other / "client_001.h5", run_dir / "client_001.h5")  # silo 1 serves another run's file
        foreign = run("federate", coordinator, "--engine", "flower", "--superlink", f"127.0.0.1:{port}",
                      "--insecure", "--quiet", *DEPLOYMENT_FLAGS)
        line = one_line(foreign, 1)
        assert line.startswith("Error: the Flower run failed: client 1: its SuperNode serves client_001.h5 (sha256 ")
        assert "another run's file" in line
        assert sorted(p.name for p in coordinator.iterdir()) == ["manifest.json"]  # no federation/ left
        shutil.copy(original, run_dir / "client_001.h5")  # the silo restored its own file
        argv = ldpfl("federate", coordinator, "--engine", "flower", "--superlink", f"127.0.0.1:{port}", "--insecure",
                     "--round-timeout", "300", "--out", out, *DEPLOYMENT_FLAGS)
        first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 600
            while first.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    if json.loads((out / "metrics.json").read_text())["rounds"]:
                        break
                time.sleep(0.2)
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
        finally:
            first.send_signal(signal.SIGKILL)  # no chance to stop its run on the SuperLink
            first.communicate()
        assert json.loads((out / SUBMISSION_FILE).read_text())["run_id"]  # what the next command stops
        resumed = subprocess.run([*argv, "--resume", "--json"], capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stderr
    watch.stop()
    result = json.loads(resumed.stdout)
    # the killed command's ServerApp went on; the resumed command asked it to stop between two exchanges
    assert 1 <= result["resumed_from_round"] < 3
    flower_metrics = json.loads((out / "metrics.json").read_text())
    local_metrics = json.loads((tmp_path / "local" / "metrics.json").read_text())
    assert len(flower_metrics["rounds"]) == 3
    for f, loc in zip(flower_metrics["rounds"], local_metrics["rounds"], strict=True):
        assert f["lost"] == []
        assert {k: v for k, v in f.items() if k not in ("seconds", "lost")} == \
            {k: v for k, v in loc.items() if k != "seconds"}  # bit for bit: selections, losses, accuracies, weights
    assert flower_metrics["privacy"] == local_metrics["privacy"]
    assert flower_metrics["privacy_ledger"] == local_metrics["privacy_ledger"]
    flower_model, local_model = tensors(out / "model.pt"), tensors(tmp_path / "local" / "model.pt")
    assert flower_model.keys() == local_model.keys()
    assert all(torch.equal(flower_model[k], local_model[k]) for k in local_model)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".federate")) == \
        ["accuracy.png", "config.json", "metrics.csv", "metrics.json", "model.pt"]  # no checkpoint, no record
    assert not any(s.exists() and any(s.iterdir()) for s in states)  # the silos deleted their resume state
    assert sorted(p.name for p in coordinator.iterdir()) == ["manifest.json"]
    assert watch.running() == [] and leftovers(marked) == []


# --------------------------------------------------------------------------------------------------
# Failures of a node (issue 25 item 3): reported with the client's index and reason, then the policy.


def test_the_failure_policy_counts_the_clients_that_trained(flower) -> None:
    from ldpfl.stage2_federate.loop import TooFewClientsError, check_policy

    check_policy(2, [0, 1, 2], 1, ["client 1: lost"], 0)  # no policy
    check_policy(2, [0, 1, 2], 2, ["client 1: lost"], 2)
    check_policy(2, [0], 1, [], 3)  # fewer selected than the policy: all of them must train
    with pytest.raises(TooFewClientsError, match=r"^round 2: 1 of the 3 selected clients trained, fewer than the "
                                                 r"failure policy's 2 \(min-clients-per-round\): client 1: x; "
                                                 r"client 2: y$"):
        check_policy(2, [0, 1, 2], 1, ["client 1: x", "client 2: y"], 2)
    with pytest.raises(TooFewClientsError, match="0 of the 1 selected"):
        check_policy(4, [1], 0, ["client 1: x"], 3)
