"""Issue 42 item 4 on the Flower simulation: a silo whose file does not verify gets no node, and is named as the local
engine names it. Client 2 of 3 is the faulty silo (``test_silo_files.FAULTS``: sha256, missing, truncated, index,
rows).

No test here starts Flower: the launcher's preparation (``launch.screen_silos``, the run configuration it writes)
and the ServerApp's screening of its nodes (``server_side.screen_nodes``, the plan it records) are played without
it, each node's summary being what its ClientApp would send. The slow simulation test that runs through Flower is
``test_faulty_silo.test_flower_simulation_leaves_out_a_silo_whose_claim_is_refused``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import one_error_line, run
from federate_files import write_run

from hardening.test_faulty_silo import BAD, CONFIG
from hardening.test_silo_files import FAULTS, _flip_byte
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.flower_engine import client_side as cs
from ldpfl.stage2_federate.flower_engine import launch
from ldpfl.stage2_federate.flower_engine import server_side as ss
from ldpfl.stage2_federate.flower_engine.protocol import AppRunConfig, run_config
from ldpfl.stage2_federate.left_out import LeftOut, TooFewSilosError
from ldpfl.stage2_federate.plan import plan_federation


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("flower-files") / "run", clients=3, rows=48, features=8)


def spoiled(three: Path, tmp_path: Path, fault: str) -> Path:
    run_dir = shutil.copytree(three, tmp_path / "run")
    FAULTS[fault][0](run_dir)
    return run_dir


def settings_of(silos: launch.SimulationSilos, config: FederationConfig, **values) -> AppRunConfig:
    """The run configuration as the ServerApp and the ClientApps read it (written as ``run_flower`` writes it)."""
    return AppRunConfig.read(run_config(config, **silos.run_values(), **values))


def described(settings: AppRunConfig) -> list[tuple[int, ClientDescription]]:
    """(node, summary) of each simulated node: node ``k`` serves the configuration's file ``k``."""
    return [(10 + k, cs.summarize(cs.open_client(Path(f), torch.device("cpu"))))
            for k, f in enumerate(settings.client_files)]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_simulation_starts_a_node_only_for_each_file_that_verifies(three, tmp_path, fault) -> None:
    run_dir = spoiled(three, tmp_path, fault)
    silos = launch.screen_silos(run_dir)
    assert [r.client_index for r in silos.records] == [0, 1]
    assert [e.index for e in silos.entries] == [0, 1, 2]  # the manifest, as a deployment's coordinator sends it
    (left,) = silos.left_out
    assert (left.index, left.file) == (BAD, "client_002.h5")
    assert left.reason.startswith(f"client 2: {run_dir / 'client_002.h5'}: ") and FAULTS[fault][1] in left.reason
    # the run configuration: one node per verified file, in client-index order, and the left-out silo
    settings = settings_of(silos, FederationConfig(**CONFIG))
    assert settings.client_files == tuple(str(run_dir / f"client_00{i}.h5") for i in (0, 1))
    assert settings.client_sha256 == tuple(r.sha256 for r in silos.records) and settings.num_clients == 2
    assert settings.left_out == silos.left_out and [e.index for e in settings.manifest] == [0, 1, 2]


def test_a_clean_simulation_starts_every_node_and_leaves_out_nobody(three) -> None:
    silos = launch.screen_silos(three)
    assert [r.client_index for r in silos.records] == [0, 1, 2] and silos.left_out == ()
    settings = settings_of(silos, FederationConfig(**CONFIG))
    assert settings.num_clients == 3 and settings.left_out == ()
    plan = ss.plan_from_summaries(settings.federation, ss.screen_nodes(described(settings), settings)[0])
    assert "left_out" not in plan.record["run"]


@pytest.mark.parametrize("fault", ["sha256", "index"])
def test_the_server_records_a_refused_file_as_the_local_engine_does(three, tmp_path, fault) -> None:
    run_dir = spoiled(three, tmp_path, fault)
    config = FederationConfig(**CONFIG)
    settings = settings_of(launch.screen_silos(run_dir), config)
    kept, node_of, left = ss.screen_nodes(described(settings), settings)
    assert [s.index for s in kept] == [0, 1] and node_of == {0: 10, 1: 11}
    plan = ss.plan_from_summaries(config, kept, left_out=left, entries=list(settings.manifest))
    local = plan_federation(run_dir, config)
    assert plan.record["run"]["left_out"] == local.record["run"]["left_out"]
    assert [x["client"] for x in plan.record["run"]["left_out"]] == [BAD]
    assert plan.record["run"]["clients"] == local.record["run"]["clients"] == 2


def test_the_server_names_the_launchers_left_out_beside_its_own_and_counts_every_listed_silo(three, tmp_path) -> None:
    import dataclasses

    run_dir = shutil.copytree(three, tmp_path / "run")
    (run_dir / "client_000.h5").unlink()  # the launcher leaves client 0 out
    config = FederationConfig(**CONFIG)
    silos = launch.screen_silos(run_dir)
    assert [x.index for x in silos.left_out] == [0]
    settings = settings_of(silos, config)
    nodes = described(settings)
    forged = dataclasses.replace(nodes[1][1], train_rows=10**6, label_histogram=(10**6 - 36, 12, 12, 12))
    nodes[1] = (nodes[1][0], forged)  # client 2 then claims rows the manifest does not list
    # two of three listed silos are gone: the run's two cannot hold (before, the server counted only its two nodes)
    with pytest.raises(TooFewSilosError) as refused:
        ss.screen_nodes(nodes, settings)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"client 0: {run_dir / 'client_000.h5'}: listed in the manifest but missing")
    assert "; client 2: its SuperNode claims 1000000 training rows in client_002.h5, the run's manifest lists 48" \
           in line
    assert line.endswith("with the refused left out 1 of 3 silos remain, fewer than the 2 the run needs (two, or "
                         "--min-clients-per-round, --clients-per-round)")
    # where one silo is enough, both are named, the launcher's and the server's, in client-index order
    kept, _, left = ss.screen(nodes, list(settings.manifest), needed=1, refused=silos.left_out)
    assert [s.index for s in kept] == [1] and [x.index for x in left] == [0, 2]
    # --min-clients-per-round counts every listed silo, the launcher's left out too
    honest = described(settings)
    assert [s.index for s in ss.screen_nodes(honest, settings)[0]] == [1, 2]
    with pytest.raises(TooFewSilosError, match=r"2 of 3 silos remain, fewer than the 3 the run needs"):
        ss.screen_nodes(honest, settings_of(silos, config, min_clients=3))
    # one node and one silo the launcher left out: a federation of one, not a run of one listed silo
    with pytest.raises(TooFewSilosError, match=r"1 of 2 silos remain, fewer than the 2 the run needs"):
        ss.screen_nodes(honest[:1], settings)


def test_the_run_configuration_refuses_a_malformed_left_out_silo() -> None:
    from ldpfl.stage2_federate.flower_engine.protocol import MessageError, left_out_from_json, left_out_to_json

    left = (LeftOut(2, "client_002.h5", "client 2: refused"),)
    assert left_out_from_json(left_out_to_json(left)) == left and left_out_from_json("") == ()
    for text, fragment in [('[{"client": "2", "file": "f", "reason": "r"}]', "0.client: Input should be a valid"),
                           ('[{"client": 2, "file": "f"}]', "0.reason: missing"),
                           ('[{"client": -1, "file": "f", "reason": "r"}]', "greater than or equal to 0")]:
        with pytest.raises(MessageError, match=fragment):
            left_out_from_json(text)


@pytest.mark.parametrize("args", [("--min-clients-per-round", "3"), ("--clients-per-round", "3")])
def test_too_few_files_end_a_simulation_in_one_line_before_flower_starts(three, tmp_path, monkeypatch, args) -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")

    def never(*_args, **_kwargs):
        raise AssertionError("Flower was started")

    monkeypatch.setattr(launch, "start_superlink", never)
    run_dir = shutil.copytree(three, tmp_path / "run")
    _flip_byte(run_dir)
    line = one_error_line(run("federate", run_dir, "--engine", "flower", "--rounds", "1", "--hidden", "8",
                              *args, "--out", tmp_path / "x"))
    assert line.startswith(f"Error: client 2: {run_dir / 'client_002.h5'}: sha256 ")  # as the local engine's
    assert line.endswith("with the refused left out 2 of 3 silos remain, fewer than the 3 the run needs (two, or "
                         "--min-clients-per-round, --clients-per-round)")
    assert not (tmp_path / "x" / "metrics.json").exists()
