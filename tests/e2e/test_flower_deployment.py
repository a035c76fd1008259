"""The Flower engine on a SuperLink with two SuperNodes on 127.0.0.1 (issue 14): equal to the local engine, failures.

Apart from tests/e2e/test_flower_engine.py (the simulation) so that the two slowest Flower runs go to different
workers. Needs ``flwr[simulation]`` (``pip install -e '.[flower]'``); skipped without it (the ``flower`` fixture).
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from federate_files import write_run
from flower_engine_checks import CONFIG, assert_same_rounds, local_history
from flower_helpers import leftovers

from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.flower_engine.processes import stop_all


@pytest.mark.slow
def test_two_supernodes_equal_the_local_engine_a_failing_client_ends_the_run_and_a_dead_supernode_is_lost(
        flower, tmp_path, marked) -> None:
    """One SuperLink, two SuperNodes, three runs: a deployment and its failure cases, at the price of one start-up.

    Run 1: silo 1's file does not exist, so its ClientApp fails to open it and the run ends at once
    with that client's reason. The file then appears. Run 2 (each silo serving its own file only) equals the
    local engine round for round, and the silos delete their resume state. Run 3 goes on while silo 1 is
    killed once round 1 is written. Round 1's record is written when round 2's replies (which carry round 1's
    evaluation) are in, so silo 1 has trained round 2; round 2's evaluation, which travels with round 3's
    message, leaves its split out, and round 3 logs client 1 as lost and aggregates client 0 alone.
    """
    import shutil
    import threading

    from ldpfl.stage2_federate.flower_engine.deployment import run_on_superlink
    from ldpfl.stage2_federate.flower_engine.launch import (
        FlowerOptions,
        FlowerRunError,
        start_superlink,
        start_supernode,
    )

    run_dir = write_run(tmp_path / "run", clients=2, rows=64, features=8)
    changes = dict(rounds=2, clients_per_round=None, drop_per_round=0, client_epsilons=(4.0, 8.0))
    local = local_history(run_dir, tmp_path / "local", **changes)
    late = tmp_path / "silo1" / "client_001.h5"  # silo 1's file, not there yet
    states = [tmp_path / "silo0-state", tmp_path / "silo1-state"]
    config = FederationConfig(rounds=2, hidden=(8,), device="cpu", seed=1)
    out = tmp_path / "flower"
    daemons = []
    try:
        link, port = start_superlink(tmp_path / "work")
        daemons.append(link)
        for index, path in enumerate((run_dir / "client_000.h5", late)):
            daemons.append(start_supernode(tmp_path / "work", f"127.0.0.1:{port}", path, index=index,
                                           state_dir=states[index]))
        started = time.monotonic()
        with pytest.raises(FlowerRunError, match=r"could not open its client file: FileNotFoundError.*client_001\.h5"):
            run_on_superlink(run_dir, config, superlink=f"127.0.0.1:{port}", insecure=True, out_dir=tmp_path / "failed",
                             progress=False, options=FlowerOptions(startup_timeout=240, round_timeout=60))
        assert time.monotonic() - started < 240  # an error, not a wait for the time limit
        late.parent.mkdir()
        shutil.copy(run_dir / "client_001.h5", late)

        same = run_on_superlink(run_dir, FederationConfig(**{**CONFIG, **changes}), superlink=f"127.0.0.1:{port}",
                                insecure=True, out_dir=tmp_path / "same", progress=False,
                                options=FlowerOptions(startup_timeout=240, round_timeout=180))
        assert_same_rounds(same.history, local)
        assert not any(states[0].iterdir()) and not any(states[1].iterdir())  # resume state deleted

        def kill_after_round_one() -> None:  # silo 1 dies once round 1 is written
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    if json.loads((out / "metrics.json").read_text())["rounds"]:
                        daemons[2].stop(grace=0)
                        return
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.2)

        killer = threading.Thread(target=kill_after_round_one, daemon=True)
        killer.start()
        result = run_on_superlink(run_dir, dataclasses.replace(config, rounds=3), superlink=f"127.0.0.1:{port}",
                                  insecure=True, out_dir=out,
                                  progress=False, on_warning=None,
                                  # round 1 must finish with both silos alive even on a loaded 2-core machine
                                  # (each message starts a ClientApp process: 15-40 s under load)
                                  options=FlowerOptions(startup_timeout=240, round_timeout=75))
        killer.join(5)
    finally:
        left = stop_all(daemons)
    assert left == []
    first, second, third = result.history
    assert first["lost"] == [] and first["aggregated"] == [0, 1]
    assert second["lost"] == [] and second["aggregated"] == [0, 1]
    assert any(note.startswith("client 1: no evaluation reply") for note in second["notes"]), second["notes"]
    assert third["lost"] == [1] and third["aggregated"] == [0]
    assert any(note.startswith("client 1:") and "lost" in note for note in third["notes"])
    assert "client 1: lost in training, not asked to evaluate; its test split is left out" in third["notes"]
    assert any(w.startswith("round 3:") for w in result.warnings)
    assert leftovers(marked) == []
