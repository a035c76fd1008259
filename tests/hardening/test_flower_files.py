"""Issue 24 item 6: a Flower client fails when its file is replaced during the run.

The reported case: after round 1 another same-plan export replaced ``client_001.h5``; the run finished
with exit 0, other accuracies, and ``model.pt`` still recorded the old sha256. Here the ClientApp's
check (``file_watch.check_unchanged`` through ``client_app.check_file``) is driven with a real Flower
``Context``, as the ClientApp's handlers call it before every open.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

import ldpfl.stage2_federate.flower_engine.file_watch as file_watch  # noqa: E402
from ldpfl.contract.digest import sha256_file  # noqa: E402
from ldpfl.stage2_federate.flower_engine.client_app import FILE_KEY, check_file  # noqa: E402
from ldpfl.stage2_federate.flower_engine.file_watch import FileChanged, check_unchanged  # noqa: E402


def simulated_context(path, digest: str) -> Context:
    """A simulated node's context: partition 0 of a one-file run whose manifest gives ``digest``."""
    run_config = {"client-files": json.dumps([str(path)]), "client-sha256": json.dumps([digest])}
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config=run_config)


def replace_same_size(path, content: bytes) -> None:
    """Replace ``path`` by a file of the same size (another export of the same plan), with a later mtime."""
    info = path.stat()
    path.write_bytes(content)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def test_a_file_replaced_between_rounds_fails_the_client(tmp_path):
    path = tmp_path / "client_001.h5"
    path.write_bytes(b"round one records")
    context = simulated_context(path, sha256_file(path))
    check_file(context, path)  # describe: the first contact
    check_file(context, path)  # round 1
    replace_same_size(path, b"other export rows")
    with pytest.raises(FileChanged, match="client_001.h5 changed since the run started"):
        check_file(context, path)  # round 2


def test_a_file_replaced_before_the_first_contact_fails_against_the_manifest(tmp_path):
    path = tmp_path / "client_000.h5"
    path.write_bytes(b"exported records")
    context = simulated_context(path, sha256_file(path))
    replace_same_size(path, b"replaced records")
    with pytest.raises(FileChanged, match="sha256"):
        check_file(context, path)


def test_the_hash_is_computed_only_when_size_or_mtime_change(tmp_path, monkeypatch):
    path = tmp_path / "client_000.h5"
    path.write_bytes(b"records")
    calls = []
    real = file_watch.sha256_file
    monkeypatch.setattr(file_watch, "sha256_file", lambda p: calls.append(p) or real(p))
    context = simulated_context(path, real(path))
    for _ in range(5):
        check_file(context, path)
    assert len(calls) == 1
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # touched, same content
    check_file(context, path)
    check_file(context, path)
    assert len(calls) == 2
    assert dict(context.state.config_records[FILE_KEY])["sha256"] == real(path)


def test_a_deployed_node_records_its_file_at_the_first_contact(tmp_path):
    path = tmp_path / "client_003.h5"
    path.write_bytes(b"silo records")
    first = check_unchanged(path, None)
    assert first["sha256"] == sha256_file(path)
    assert check_unchanged(path, first) == first
    replace_same_size(path, b"SILO RECORDS")
    with pytest.raises(FileChanged):
        check_unchanged(path, first)
