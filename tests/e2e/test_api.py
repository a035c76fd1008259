"""The typed Python API (``ldpfl.export`` ... ``ldpfl.gather``): the README's examples against the CLI's ``--json``.

The code blocks of README.md's "Python API" section run as written, in order, in a fresh directory. Then the
commands that say the same thing run there too (in-process), with the same seed, and each job's result is
compared with the command's JSON and files: the same figures, and the same bytes where the bytes are seeded
(a client file records its creation time, so its datasets and other attributes are compared instead).
Both sides of each comparison go through the same function, so this checks that the README's arguments and
the command's flags mean the same run, and that a seeded run is reproducible across the two front ends.

Also: ``import ldpfl`` stays light, the keyword fields match the configs, errors name parameters, and progress
reaches the callback. The Flower engine through the API: ``test_api_flower.py`` (slow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from cli_checks import run
from repository import ROOT

import ldpfl
from ldpfl.api.fields import ExportFields, FederationFields

SECTION = "## Python API"
TIMES = ("seconds", "train_samples_per_s")  # wall-clock figures: never equal across two runs
HEAVY = ("tensorflow", "torch", "keras", "jax", "matplotlib", "flwr")


def readme_examples() -> list[str]:
    """The ```python blocks of README.md's "Python API" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run the README's examples in a fresh directory; return it and the names they defined."""
    work = tmp_path_factory.mktemp("readme")
    names: dict[str, Any] = {}
    with contextlib.chdir(work):
        for block in readme_examples():
            exec(compile(block, str(ROOT / "README.md"), "exec"), names)  # noqa: S102 - the README's own code
    return work, names


def cli_json(work: Path, *args: object) -> Any:
    """Run ``ldpfl ARGS`` in ``work`` and return its JSON output."""
    with contextlib.chdir(work):
        result = run(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def without(data: Any, keys: tuple[str, ...]) -> Any:
    """``data`` with ``keys`` removed at every depth."""
    if isinstance(data, dict):
        return {k: without(v, keys) for k, v in data.items() if k not in keys}
    if isinstance(data, list):
        return [without(v, keys) for v in data]
    return data


def file_content(path: Path) -> dict[str, Any]:
    """A client file's datasets and attributes, but its creation time."""
    content: dict[str, Any] = {}
    with h5py.File(path, "r") as handle:
        content["attrs"] = {k: str(v) for k, v in handle.attrs.items() if k != "created_utc"}
        handle.visititems(lambda name, item: content.__setitem__(name, item[()].tobytes())
                          if isinstance(item, h5py.Dataset) else None)
    return content


def assert_same_client_files(first: Path, second: Path) -> None:
    names = sorted(p.name for p in first.glob("client_*.h5"))
    assert names and names == sorted(p.name for p in second.glob("client_*.h5"))
    for name in names:
        assert file_content(first / name) == file_content(second / name), name


# ----------------------------------------------------------------------------------------------------
# The README's examples against the commands


def test_the_readme_shows_one_example_per_job() -> None:
    blocks = readme_examples()
    for job in ("export", "federate", "inspect", "predict", "plan", "gather"):
        assert any(f"ldpfl.{job}(" in block for block in blocks), job


def test_export_equals_the_cli(readme) -> None:
    work, names = readme
    export = names["export"]
    assert isinstance(export, ldpfl.ExportResult) and export.run_dir == Path("runs/api")
    cli = cli_json(work, "export", "--dataset", "mnist5k", "--clients", "2", "--extractor", "none", "--limit", "300",
                   "--seed", "1", "--out", "runs/cli", "--json", "--quiet")
    volatile = (*TIMES, "run_dir", "manifest", "sha256")  # the sha256 covers the creation time
    assert without(export.to_dict(), volatile) == without(cli, volatile)
    assert (work / "runs/api/partition.npz").read_bytes() == (work / "runs/cli/partition.npz").read_bytes()
    assert_same_client_files(work / "runs/api", work / "runs/cli")
    # each client file's guarantee, as its file states it: clear labels make it infinite (issue 22)
    assert sorted(export.release_guarantees) == [0, 1]
    assert export.release_guarantee is not None and not export.release_guarantee.private
    manifest = json.loads((work / "runs/api/manifest.json").read_text())
    assert {f"client_{i:03d}": g.to_dict() for i, g in export.release_guarantees.items()} == \
        manifest["release_guarantee"] == cli["release_guarantees"]  # --json says it too
    assert cli["release_guarantee"] == export.release_guarantee.to_dict()
    assert cli["release_guarantee"]["epsilon"] == "inf"  # labels in clear


def test_federate_equals_the_cli(readme) -> None:
    work, names = readme
    federation = names["federation"]
    assert isinstance(federation, ldpfl.FederateResult) and federation.engine == "local"
    cli = cli_json(work, "federate", "runs/api", "--rounds", "2", "--hidden", "16", "--seed", "1", "--out",
                   "cli_federation", "--json", "--quiet")
    assert without(federation.to_dict(), ("outputs",)) == without(cli, ("outputs",))
    assert federation.test_accuracy == tuple(cli["test_accuracy"]) and len(federation.rounds) == 2
    assert federation.final_accuracy == cli["final_test_accuracy"]
    outputs, other = federation.outputs, work / "cli_federation"
    for path in (outputs.metrics_csv, outputs.config, outputs.model):
        assert (work / path).read_bytes() == (other / path.name).read_bytes(), path.name
    metrics = [json.loads(p.read_text()) for p in (work / outputs.metrics_json, other / "metrics.json")]
    assert without(metrics[0], TIMES) == without(metrics[1], TIMES)
    assert outputs.checkpoint is None and not (work / outputs.directory / "checkpoint.pt").exists()
    # the run's figure is the weakest file's, as metrics.json states it
    assert federation.release_guarantee is not None
    assert metrics[0]["release_guarantee"]["epsilon"] == ("inf" if not federation.release_guarantee.private
                                                          else federation.release_guarantee.epsilon)
    assert federation.client_guarantees == names["export"].release_guarantees


def test_inspect_equals_the_cli(readme) -> None:
    work, names = readme
    report = names["report"]
    assert isinstance(report, ldpfl.InspectResult) and report.ok and report.kind == "run"
    assert report.to_dict() == cli_json(work, "inspect", "runs/api", "--json")
    assert sorted(report.release_guarantees) == ["client_000.h5", "client_001.h5"]
    assert report.release_guarantee == names["export"].release_guarantee


def test_predict_equals_the_cli(readme) -> None:
    work, names = readme
    prediction = names["prediction"]
    assert isinstance(prediction, ldpfl.PredictResult) and prediction.inputs == "clean"
    cli = cli_json(work, "predict", "runs/api", "--client-index", "0", "--json", "--quiet")
    assert prediction.to_dict() == cli
    assert prediction.predicted.tolist() == [p["predicted_class"] for p in cli["predictions"]]
    assert prediction.accuracy == cli["accuracy"]
    assert prediction.release_guarantee == names["export"].release_guarantees[0]


def test_plan_equals_the_cli(readme) -> None:
    work, names = readme
    shared = names["shared"]
    assert isinstance(shared, ldpfl.PlanResult)
    cli = cli_json(work, "plan", "--data", "silo_0.npz", "--name", "digits", "--extractor", "none", "--epsilon", "2",
                   "--out", "cli_plan.json", "--json")
    assert shared.to_dict() == cli
    assert (work / "plan.json").read_bytes() == (work / "cli_plan.json").read_bytes()
    assert shared.privacy.nominal_epsilon == 2.0


def test_gather_and_the_silos_exports_equal_the_cli(readme) -> None:
    work, names = readme
    gathered = names["run"]
    assert isinstance(gathered, ldpfl.GatherResult) and gathered.plan_fingerprint == names["shared"].fingerprint
    for i in range(2):  # each silo's export with the plan
        exported = cli_json(work, "export", "--plan", "plan.json", "--data", f"silo_{i}.npz", "--client-index", i,
                            "--clients", "2", "--seed", "1", "--out", f"cli_export_{i}", "--json", "--quiet")
        assert exported["clients"][0]["index"] == i
        assert_same_client_files(work / f"export_{i}", work / f"cli_export_{i}")
    cli = cli_json(work, "gather", "export_0", "export_1", "--out", "cli_silos", "--json")
    assert without(gathered.to_dict(), ("run_dir",)) == without(cli, ("run_dir",))
    for path in sorted((work / "runs/silos").glob("client_*.h5")) + [work / "runs/silos/plan.json"]:
        assert path.read_bytes() == (work / "cli_silos" / path.name).read_bytes(), path.name
    assert sorted(gathered.release_guarantees) == [0, 1]


def test_the_mechanisms_example_ran(readme) -> None:
    _, names = readme
    assert names["bits"].shape == (4, names["mech"].width) and names["bits"].dtype == np.uint8


# ----------------------------------------------------------------------------------------------------
# The package, the types, the errors, the progress


def test_import_ldpfl_is_light_and_every_api_name_resolves() -> None:
    code = ("import sys, json, ldpfl\n"
            f"loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
            "api = sorted(m for m in sys.modules if m.startswith('ldpfl.api'))\n"
            "print(json.dumps([loaded, api]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == [[], []]
    for name in ldpfl.__all__:
        assert getattr(ldpfl, name) is not None, name
    assert set(ldpfl.__all__) <= set(dir(ldpfl))
    with pytest.raises(AttributeError, match="no attribute 'exprot'"):
        ldpfl.exprot  # noqa: B018


def test_keyword_fields_are_the_configs_fields() -> None:
    export_fields = {f.name for f in dataclasses.fields(ldpfl.ExportConfig)} - {"plan"}  # plan: an argument
    assert set(ExportFields.__annotations__) == export_fields
    assert set(FederationFields.__annotations__) == {f.name for f in dataclasses.fields(ldpfl.FederationConfig)}


def test_errors_name_the_parameter_and_the_cli_names_the_flag(tmp_path) -> None:
    cases = [
        (lambda: ldpfl.federate(tmp_path, cpus_per_client=2), {"superlink", "cpus_per_client", "client_timeout",
                                                                "engine"}),
        (lambda: ldpfl.federate(tmp_path, min_clients_per_round=0), {"min_clients_per_round"}),
        (lambda: ldpfl.federate(tmp_path, engine="flower", insecure=True), {"root_certificates", "insecure",
                                                                             "superlink"}),
        (lambda: ldpfl.federate(tmp_path, engine="ray"), {"engine"}),
        (lambda: ldpfl.federate(tmp_path, ldpfl.FederationConfig(), rounds=3), {"config"}),
        (lambda: ldpfl.export(ldpfl.ExportConfig(), clients=3), {"config", "plan"}),
        (lambda: ldpfl.export(from_models=str(tmp_path)), {"from_models", "out"}),
        (lambda: ldpfl.predict(tmp_path, seed=1), {"seed", "randomized"}),
        (lambda: ldpfl.predict(tmp_path, out=tmp_path / "p.txt"), {"out"}),
        (lambda: ldpfl.inspect(tmp_path / "missing"), {"path"}),
    ]
    for call, parameters in cases:
        with pytest.raises(ldpfl.ParameterError) as caught:
            call()
        assert set(caught.value.parameters) == parameters, caught.value
    line = run("federate", tmp_path, "--cpus-per-client", "2").stderr.strip()
    assert line == "Error: --superlink, --cpus-per-client and --round-timeout apply to --engine flower only"


def test_a_plan_given_to_export_refuses_a_contradicting_setting(readme) -> None:
    work, _ = readme
    with contextlib.chdir(work), pytest.raises(ldpfl.ParameterError) as caught:
        ldpfl.export(data="silo_1.npz", plan="plan.json", client_index=1, clients=2, mechanism="oue",
                     out="never_written")
    assert "mechanism" in caught.value.parameters and not (work / "never_written").exists()


def test_progress_reaches_the_callback(readme, tmp_path) -> None:
    work, _ = readme
    events: list[ldpfl.Progress] = []
    ldpfl.export(dataset="mnist5k", clients=2, extractor="none", limit=100, seed=2, out=tmp_path / "run",
                 progress=events.append)
    assert [(e.job, e.unit, e.done, e.total) for e in events] == [("export", "client", k, 2) for k in range(3)]
    events.clear()
    ldpfl.federate(work / "runs/api", rounds=2, hidden=(16,), seed=1, out=tmp_path / "fed", progress=events.append)
    assert [(e.job, e.unit, e.done, e.total) for e in events] == [("federate", "round", k, 2) for k in (1, 2)]
    assert str(events[-1]).startswith("federate: 2/2 rounds (test accuracy ")
