"""Every refusal of the command line, fed to the Python API too: both refuse, with the same message (issue 33).

Each case runs ``ldpfl COMMAND ARGS`` (one ``Error:`` line, exit 2) and the API call that says the same; the API's
``ParameterError`` is spelled with the command's flags (``ldpfl.cli.cli_message``, as the CLI spells it) and the
two messages must be equal. The checks live once, in the API or its configs; the commands map flags to them.

Left out, because the API has no such input: the text syntax of flags that the API takes typed (``--param
KEY=VALUE`` and ``--hidden 512,256``: a mapping and a tuple there), click's own types and ranges (``--clients 0``
is refused by click before any code runs; the config refuses 0 with its own message), ``--dataset`` beside
``--data`` (the API's ``dataset`` *is* the name of its own data) and ``--name`` without ``--data`` (the API has no
``name``), and a ``--from-models`` source whose settings conflict (it needs a run exported with saved models:
``tests/e2e/test_from_models.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import ldpfl.api.export_job as export_job
import ldpfl.api.federate_job as federate_job
import ldpfl.api.inspect_job as inspect_job
import ldpfl.api.plan_job as plan_job
from ldpfl.cli import cli, cli_message


def cli_refusal(*args: str) -> str:
    """Run ``ldpfl ARGS``; return its one error message (exit 2, one ``Error:`` line)."""
    result = CliRunner().invoke(cli, list(args))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0].removeprefix("Error: ")


def api_refusal(command: str, call: Callable[[], Any]) -> str:
    """Run ``call``; return its refusal spelled with ``ldpfl COMMAND``'s flags (one line, as the CLI prints it)."""
    with pytest.raises(ValueError) as raised:
        call()
    ctx = click.Context(cli)
    return " ".join(cli_message(raised.value, cli.get_command(ctx, command)).split())


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    """Paths the cases name: an existing directory, a file that is a plan in name only, sample data, a target."""
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "sample.npz").write_bytes(b"")
    (tmp_path / "taken.json").write_text("{}")
    return {"dir": tmp_path, "plan": tmp_path / "plan.json", "data": tmp_path / "sample.npz",
            "taken": tmp_path / "taken.json", "missing": tmp_path / "missing"}


EXPORT_CASES: list[tuple[str, Callable[[dict[str, Path]], list[str]], Callable[[dict[str, Path]], dict[str, Any]]]] = [
    ("epsilon NaN", lambda f: ["--epsilon", "nan"], lambda f: {"mechanism_params": {"epsilon": math.nan}}),
    ("alpha infinite", lambda f: ["--alpha", "inf"], lambda f: {"mechanism_params": {"alpha": math.inf}}),
    ("client index without data", lambda f: ["--client-index", "0"], lambda f: {"client_index": 0}),
    ("plan without data", lambda f: ["--plan", str(f["plan"])], lambda f: {"plan": f["plan"]}),
    ("reader option without data", lambda f: ["--label-column", "y"],
     lambda f: {"data_options": {"label_column": "y"}}),
    ("from-models without out", lambda f: ["--from-models", str(f["dir"])], lambda f: {"from_models": str(f["dir"])}),
]


@pytest.mark.parametrize(("case", "flags", "fields"), EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_export_refusals(files: dict[str, Path], case: str, flags: Callable, fields: Callable) -> None:
    del case
    args = flags(files)
    out = [] if "--from-models" in args else ["--out", str(files["dir"] / "run")]
    cli_line = cli_refusal("export", "--extractor", "none", "--quiet", *args, *out)
    keywords = fields(files)
    target = None if "from_models" in keywords else files["dir"] / "run"
    assert api_refusal("export", lambda: export_job.export(out=target, extractor="none", **keywords)) == cli_line
    assert not (files["dir"] / "run").exists()


FEDERATE_CASES: list[tuple[list[str], dict[str, Any]]] = [
    (["--delta", "2"], {"delta": "2"}),
    (["--delta", "0"], {"delta": 0}),
    (["--delta", "often"], {"delta": "often"}),
    (["--perturbation", "gaussian", "--client-epsilons", "1,x"], {"perturbation": "gaussian",
                                                                  "client_epsilons": "1,x"}),
    (["--perturbation", "gaussian", "--client-epsilons", "@{missing}.csv"],
     {"perturbation": "gaussian", "client_epsilons": "@{missing}.csv"}),
    (["--perturbation", "pdpm", "--client-epsilons", "pldp-tau1"], {"perturbation": "pdpm",
                                                                     "client_epsilons": "pldp-tau1"}),
    (["--perturbation", "pdpm", "--client-centres", "0,a"], {"perturbation": "pdpm", "client_centres": "0,a"}),
    (["--perturbation", "gaussian", "--budget-preset", "pldp-eps1", "--client-epsilons", "1,1"],
     {"perturbation": "gaussian", "budget_presets": ("pldp-eps1",), "client_epsilons": "1,1"}),
    (["--perturbation", "pdpm", "--budget-preset", "pldp-tau1", "--budget-preset", "pldp-tau2"],
     {"perturbation": "pdpm", "budget_presets": ("pldp-tau1", "pldp-tau2")}),
    (["--dp-sgd", "--target-epsilon", "1", "--delta", "1/n"], {"dp_sgd": True, "target_epsilon": 1.0,
                                                               "delta": "1/n"}),
]


@pytest.mark.parametrize(("flags", "fields"), FEDERATE_CASES, ids=[" ".join(c[0]) for c in FEDERATE_CASES])
def test_federate_refusals(files: dict[str, Path], flags: list[str], fields: dict[str, Any]) -> None:
    missing = str(files["missing"])
    flags = [f.replace("{missing}", missing) for f in flags]
    fields = {k: v.replace("{missing}", missing) if isinstance(v, str) else v for k, v in fields.items()}
    cli_line = cli_refusal("federate", str(files["dir"]), "--quiet", *flags)
    assert api_refusal("federate", lambda: federate_job.federate(files["dir"], **fields)) == cli_line


def test_an_empty_output_directory_is_refused(files: dict[str, Path]) -> None:
    cli_line = cli_refusal("export", "--extractor", "none", "--out", "")
    assert api_refusal("export", lambda: export_job.export(out="", extractor="none")) == cli_line
    assert cli_line == "--out is empty; give a directory (use '.' for the current one)"
    cli_line = cli_refusal("federate", str(files["dir"]), "--out", " ")
    assert api_refusal("federate", lambda: federate_job.federate(files["dir"], out=" ")) == cli_line


@pytest.mark.parametrize("address", ["coordinator", "http://host:9093", "host:0"])
def test_a_bad_superlink_address_is_refused(files: dict[str, Path], address: str) -> None:
    cli_line = cli_refusal("federate", str(files["dir"]), "--engine", "flower", "--superlink", address)
    api_line = api_refusal("federate", lambda: federate_job.federate(files["dir"], engine="flower",
                                                                     superlink=address))
    assert api_line == cli_line and cli_line.startswith(f"--superlink {address!r} ")


def test_plan_refusals(files: dict[str, Path]) -> None:
    cli_line = cli_refusal("plan", "--out", str(files["dir"] / "p.json"))
    assert api_refusal("plan", lambda: plan_job.plan(None, out=files["dir"] / "p.json")) == cli_line
    cli_line = cli_refusal("plan", "--data", str(files["data"]), "--out", str(files["taken"]))
    assert api_refusal("plan", lambda: plan_job.plan(files["data"], out=files["taken"])) == cli_line
    assert "exists" in cli_line and "--overwrite" in cli_line


def test_inspect_refusals(files: dict[str, Path]) -> None:
    cli_line = cli_refusal("inspect", str(files["missing"]))
    assert api_refusal("inspect", lambda: inspect_job.inspect(files["missing"])) == cli_line
    assert cli_line == f"PATH {files['missing']} does not exist"
