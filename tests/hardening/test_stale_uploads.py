"""Issue 42, item 2: a stale, replayed or copied upload is refused with the silo named, also after a resume.

The faulty silo (client 2 of 3) is played by wrapping the in-process transport, as ``test_faulty_silo`` does: what
the loop receives from it is what a Flower silo could send. An honest silo never repeats itself (its training stream
moves on every round), so the honest runs of the other hardening tests must, and do, refuse nobody.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from federate_files import write_run

from hardening.test_faulty_silo import BAD, CONFIG, federate_with
from ldpfl.stage2_federate.in_process import InProcessTransport
from ldpfl.stage2_federate.rounds import ClientResult
from ldpfl.stage2_federate.upload_hashes import UploadHistory, upload_digest


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("silos"), clients=3, rows=48, features=8)


def replaying(choose) -> type[InProcessTransport]:
    """A transport whose silo BAD sends ``choose(round, this round's results, the uploads of earlier rounds)``."""
    earlier: dict[tuple[int, int], np.ndarray] = {}

    class Replaying(InProcessTransport):
        def train(self, round_number, selected, broadcast, *, evaluate_without):
            training = super().train(round_number, selected, broadcast, evaluate_without=evaluate_without)
            honest = {r.client: r.upload for r in training.results}
            earlier.update({(round_number, c): u.copy() for c, u in honest.items()})
            sent = choose(round_number, honest, earlier)
            results = tuple(dataclasses.replace(r, upload=sent) if r.client == BAD and sent is not None else r
                            for r in training.results)
            return dataclasses.replace(training, results=results)

    Replaying.earlier = earlier  # type: ignore[attr-defined]
    return Replaying


def reasons(record: dict) -> dict[int, str]:
    return {r["client"]: r["reason"] for r in record["rejected"]}


def test_a_stale_upload_is_refused_from_the_second_round_on(three, tmp_path, monkeypatch) -> None:
    stale = replaying(lambda n, honest, earlier: earlier[(1, BAD)])
    result, warnings = federate_with(monkeypatch, three, tmp_path / "stale", stale, rounds=3)
    first, *later = result.history
    assert first["rejected"] == [] and first["aggregated"] == [0, 1, 2]
    for record in later:
        assert reasons(record) == {BAD: "its upload repeats its own upload of round 1 (a stale upload)"}
        assert record["aggregated"] == [0, 1] and not record["kept_previous_model"]
    assert any("client 2: rejected, its upload repeats its own upload of round 1" in w for w in warnings)


def test_a_replayed_and_a_copied_upload_are_refused(three, tmp_path, monkeypatch) -> None:
    replayed = replaying(lambda n, honest, earlier: earlier[(1, 0)] if n > 1 else None)
    result, _ = federate_with(monkeypatch, three, tmp_path / "replay", replayed, rounds=2)
    assert reasons(result.history[1]) == {BAD: "its upload repeats client 0's upload of round 1 (a replayed upload)"}
    copied = replaying(lambda n, honest, earlier: honest[1])
    result, _ = federate_with(monkeypatch, three, tmp_path / "copy", copied, rounds=2)
    for record in result.history:  # neither can be told from the other: both are left out
        assert reasons(record) == {
            1: "its upload is identical to client 2's in this round (a copied upload; neither can be told from the "
               "other)",
            2: "its upload is identical to client 1's in this round (a copied upload; neither can be told from the "
               "other)"}
        assert record["aggregated"] == [0]


def test_a_resumed_run_still_refuses_an_upload_of_the_rounds_before_it(three, tmp_path, monkeypatch) -> None:
    import torch

    from ldpfl.stage2_federate import federation
    from ldpfl.stage2_federate.config import FederationConfig

    recorder = replaying(lambda n, honest, earlier: None)  # honest: it only keeps each round's uploads
    out = tmp_path / "resumed"
    monkeypatch.setattr(federation, "InProcessTransport", recorder)
    federation.run_federation(three, FederationConfig(**{**CONFIG, "rounds": 2}), out_dir=out, progress=False,
                              keep_checkpoint=True, on_warning=None)
    saved = torch.load(out / "checkpoint.pt", weights_only=True)["uploads"]
    assert len(saved) == 6 and sorted(v[1] for v in saved.values()) == [1, 1, 1, 2, 2, 2]
    assert saved[upload_digest(recorder.earlier[(1, BAD)])] == [BAD, 1]
    stale = replaying(lambda n, honest, earlier: recorder.earlier[(1, BAD)])  # round 1's upload, from round 3 on
    monkeypatch.setattr(federation, "InProcessTransport", stale)
    result = federation.run_federation(three, FederationConfig(**{**CONFIG, "rounds": 3}), out_dir=out,
                                       progress=False, resume=True, on_warning=None)
    assert [r["round"] for r in result.history] == [1, 2, 3] and result.history[1]["rejected"] == []
    assert reasons(result.history[2]) == {BAD: "its upload repeats its own upload of round 1 (a stale upload)"}
    assert json.loads((out / "metrics.json").read_text())["rounds"][2]["aggregated"] == [0, 1]


def test_the_history_reads_back_its_state_and_refuses_nothing_new() -> None:
    history = UploadHistory()
    a, b = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 1
    kept, rejected = history.check(1, [ClientResult(0, a, 1.0, 0.5), ClientResult(1, b, 1.0, 0.5),
                                       ClientResult(2, None, 1.0, 0.5)])
    assert [r.client for r in kept] == [0, 1, 2] and rejected == ()
    assert upload_digest(a) != upload_digest(a.astype(np.float64))  # the dtype is part of the bytes compared
    again = UploadHistory.from_state(json.loads(json.dumps(history.state())))
    assert again == history and UploadHistory.from_state(None) == UploadHistory()
    kept, rejected = again.check(2, [ClientResult(0, b, 1.0, 0.5), ClientResult(1, a + 2, 1.0, 0.5)])
    assert [r.client for r in kept] == [1]
    assert rejected == ((0, "its upload repeats client 1's upload of round 1 (a replayed upload)"),)
