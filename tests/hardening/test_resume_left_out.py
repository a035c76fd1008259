"""Issue 42: a run resumed after a silo's file went bad is refused in one line naming that silo (local engine).

The checkpoint holds the clients' random streams by position, so a resumed run must federate the silos it started
with. Before ``checkpoint.check_silos``, a file refused between the runs ended the resume with "the checkpoint holds
random streams for 3 clients, this run has 2" (no silo named), and a silo left out in the first run whose file was
repaired while another's went bad took that silo's streams silently: round 2 was trained and checkpointed before the
privacy ledger failed on the unknown client.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from federate_files import write_run

from ldpfl.common.errors import ParameterError
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation

CONFIG = dict(rounds=1, hidden=(16,), local_epochs=1, batch_size=16, threads=1, device="cpu", seed=5)


def spoil(path: Path) -> bytes:
    """Flip a byte of ``path`` (its sha256 no longer the manifest's); return the good bytes."""
    good = path.read_bytes()
    data = bytearray(good)
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    return good


def first_round(run_dir: Path, out: Path) -> list[int]:
    result = run_federation(run_dir, FederationConfig(**CONFIG), out_dir=out, progress=False, keep_checkpoint=True,
                            on_warning=lambda _: None)
    return result.history[0]["selected"]


def resume(run_dir: Path, out: Path):
    return run_federation(run_dir, FederationConfig(**{**CONFIG, "rounds": 2}), out_dir=out, progress=False,
                          resume=True, on_warning=lambda _: None)


def test_a_silo_whose_file_went_bad_between_the_runs_is_named_and_the_resume_refused(tmp_path) -> None:
    run_dir, out = write_run(tmp_path / "run", clients=3, rows=48, features=8), tmp_path / "out"
    assert first_round(run_dir, out) == [0, 1, 2]
    spoil(run_dir / "client_002.h5")
    with pytest.raises(ParameterError) as refused:
        resume(run_dir, out)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"cannot resume {out / 'checkpoint.pt'}: its rounds trained client 2, which this run "
                           f"leaves out (client 2: {run_dir / 'client_002.h5'}: sha256 "), line
    assert line.endswith(": the silo's file is refused): a resumed run federates the silos it started with (the "
                         "checkpoint holds their random streams by position); restore the silo's file, or start "
                         "afresh with overwrite or choose another out_dir")
    assert torch.load(out / "checkpoint.pt", weights_only=False)["round"] == 1  # nothing was trained


def test_a_left_out_silo_back_while_another_goes_bad_is_refused_before_any_round(tmp_path) -> None:
    run_dir, out = write_run(tmp_path / "run", clients=4, rows=48, features=8), tmp_path / "out"
    good = spoil(run_dir / "client_001.h5")
    assert first_round(run_dir, out) == [0, 2, 3]  # silo 1 left out before round 1
    (run_dir / "client_001.h5").write_bytes(good)  # repaired: three silos again, but not the same three
    spoil(run_dir / "client_002.h5")
    with pytest.raises(ParameterError, match=r": its rounds trained client 2, which this run leaves out \(client 2: "):
        resume(run_dir, out)
    assert torch.load(out / "checkpoint.pt", weights_only=False)["round"] == 1
    assert [r["round"] for r in json.loads((out / "metrics.json").read_text())["rounds"]] == [1]
    # silo 2 repaired too: four silos against the checkpoint's three
    spoil(run_dir / "client_002.h5")  # the same byte flipped back
    with pytest.raises(ParameterError, match=r": it holds the random streams of 3 silos, this run federates 4 "
                                             r"\(clients 0, 1, 2, 3\): a resumed run federates the silos it started"):
        resume(run_dir, out)
