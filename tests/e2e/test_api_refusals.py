"""Every refusal of the command line, fed to the Python API too: both refuse, with the same message (issue 33).

Each case runs ``ldpfl COMMAND ARGS`` (one ``Error:`` line, exit 2) and the API call that says the same; the API's
``ParameterError`` is spelled with the command's flags (``ldpfl.cli.cli_message``, as the CLI spells it) and the
two messages must be equal. The checks live once, in the API or its configs; the commands map flags to them.
:data:`FLAG_ONLY` lists the refusals a command makes itself, and ``test_the_commands_refuse_only_flag_syntax``
checks that no other refusal is left in the command modules.

Left out, because the API has no such input: the text syntax of flags that the API takes typed (``--param
KEY=VALUE`` and ``--hidden 512,256``: a mapping and a tuple there), click's own types and ranges (``--clients 0``
is refused by click before any code runs; the config refuses 0 with its own message), ``--dataset`` beside
``--data`` (the API's ``dataset`` *is* the name of its own data) and ``--name`` without ``--data`` (the API has no
``name``), and a ``--from-models`` source whose settings conflict (it needs a run exported with saved models:
``tests/e2e/test_from_models.py``). ``--name`` sets the API's ``dataset``: its refusals are compared with the
API's spelled that way.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from click.testing import CliRunner
from repository import ROOT

import ldpfl.api.export_job as export_job
import ldpfl.api.federate_job as federate_job
import ldpfl.api.gather_job as gather_job
import ldpfl.api.inspect_job as inspect_job
import ldpfl.api.mechanism_reports as mechanism_reports
import ldpfl.api.plan_job as plan_job
import ldpfl.api.predict_job as predict_job
from ldpfl.cli import cli, cli_message, option_flag
from ldpfl.common.errors import ParameterError


def cli_refusal(*args: str) -> str:
    """Run ``ldpfl ARGS``; return its one error message (exit 2, one ``Error:`` line)."""
    result = CliRunner().invoke(cli, list(args))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0].removeprefix("Error: ")


def api_refusal(command: str, call: Callable[[], Any], spelled: dict[str, str] | None = None) -> str:
    """Run ``call``; return its refusal spelled with ``ldpfl COMMAND``'s flags (one line, as the CLI prints it).

    ``spelled`` maps an API parameter to the flag that sets it where the names differ (``dataset``: ``--name``).
    """
    with pytest.raises(ValueError) as raised:
        call()
    words = command.split()
    found = cli.get_command(click.Context(cli), words[0])
    for word in words[1:]:
        found = found.commands[word]
    error = raised.value
    if spelled and isinstance(error, ParameterError):
        message = error.render(lambda name: spelled.get(name) or option_flag(found, name))
    else:
        message = cli_message(error, found)
    return " ".join(message.split())


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
    (["--eval-every", "0"], {"eval_every": 0}),
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


@pytest.fixture()
def sample(tmp_path: Path) -> Path:
    """A silo's own data: six records of three values, two classes."""
    path = tmp_path / "silo.npz"
    np.savez(path, x=np.random.default_rng(0).random((6, 3)), y=[0, 1] * 3)
    return path


def test_a_name_that_is_a_path_is_refused(files: dict[str, Path], sample: Path) -> None:
    run = files["dir"] / "run"
    cli_line = cli_refusal("export", "--data", str(sample), "--name", "a/b", "--extractor", "none", "--out", str(run))
    api_line = api_refusal("export", lambda: export_job.export(out=run, data=str(sample), dataset="a/b",
                                                               extractor="none"), {"dataset": "--name"})
    assert api_line == cli_line and cli_line.startswith("--name 'a/b' ")
    cli_line = cli_refusal("plan", "--data", str(sample), "--name", "a/b", "--out", str(files["dir"] / "p.json"))
    api_line = api_refusal("plan", lambda: plan_job.plan(sample, dataset="a/b", out=files["dir"] / "p.json"),
                           {"dataset": "--name"})
    assert api_line == cli_line
    assert not run.exists()


def test_settings_that_contradict_the_plan_are_refused(files: dict[str, Path], sample: Path) -> None:
    plan = plan_job.plan(sample, out=files["dir"] / "shared.json", extractor="none").path
    run = files["dir"] / "run"
    cli_line = cli_refusal("export", "--plan", str(plan), "--data", str(sample), "--client-index", "0", "--clients",
                           "2", "--extractor", "none", "--epsilon", "2", "--quiet", "--out", str(run))
    api_line = api_refusal("export", lambda: export_job.export(
        out=run, plan=plan, data=str(sample), client_index=0, clients=2, extractor="none",
        mechanism_params={"epsilon": 2.0}))
    assert api_line == cli_line and "--epsilon" in cli_line and "contradicts the plan" in cli_line
    assert not run.exists()


@pytest.mark.parametrize(("flags", "parameters"), [
    (["rr", "--alpha", "1"], ("rr", {"alpha": 1.0})),
    (["pdpm", "--features", "3", "-n", "4"], ("pdpm", {"features": 3, "fraction_bits": 4})),
])
def test_mechanism_options_it_does_not_take_are_refused(flags: list[str], parameters: tuple) -> None:
    cli_line = cli_refusal("mechanisms", "show", *flags)
    name, given = parameters
    assert api_refusal("mechanisms show", lambda: mechanism_reports.mechanism_report(name, **given)) == cli_line
    assert "does not apply to mechanism" in cli_line


@pytest.mark.parametrize(("flags", "parameters"), [
    (["rr", "--epsilon", "-1"], ("rr", {"epsilon": -1.0})),
    (["pdpm", "--epsilon", "1000"], ("pdpm", {"epsilon": 1000.0})),
])
def test_mechanism_values_it_refuses_are_refused(flags: list[str], parameters: tuple) -> None:
    cli_line = cli_refusal("mechanisms", "show", *flags)
    name, given = parameters
    api_line = api_refusal("mechanisms show", lambda: mechanism_reports.mechanism_report(name, **given))
    assert cli_line == f"Invalid value: {api_line}"  # click's BadParameter, around the API's message


def test_predict_and_gather_refusals(files: dict[str, Path]) -> None:
    cli_line = cli_refusal("predict")
    assert api_refusal("predict", lambda: predict_job.predict(None)) == cli_line
    cli_line = cli_refusal("gather", str(files["dir"]), "--out", str(files["dir"] / "new"))
    assert api_refusal("gather", lambda: gather_job.gather([files["dir"]], out=files["dir"] / "new")) == cli_line


FLAG_ONLY: list[tuple[list[str], str]] = [
    (["export", "--data", "{data}", "--dataset", "mnist5k"], "Invalid value for --dataset: --dataset and --data "
                                                             "exclude each other"),
    (["export", "--name", "silo"], "--name applies to the user's own --data; a benchmark dataset has its own reader"),
    (["export", "--param", "epsilon=2"], "Invalid value for --param: use --epsilon for epsilon"),
    (["plan", "--data", "{data}", "--param", "ratio"], "Invalid value for --param: expected KEY=VALUE, got 'ratio'"),
    (["federate", "{dir}", "--hidden", "1,x"], "Invalid value for '--hidden': '1,x' is not a comma-separated list "
                                               "of integers or 'none'"),
    (["federate", "{dir}", "--hidden", "0,8"], "Invalid value for '--hidden': layer sizes must be >= 1, got '0,8'"),
    (["federate", "{dir}", "--server-params", "eta"], "Invalid value for '--server-params': 'eta' is not NAME=VALUE"),
]
"""The refusals a command makes itself: the syntax and the combination of its flags (the module docstring)."""


@pytest.mark.parametrize(("args", "message"), FLAG_ONLY, ids=[" ".join(c[0][:3]) for c in FLAG_ONLY])
def test_flag_only_refusals(files: dict[str, Path], sample: Path, args: list[str], message: str) -> None:
    args = [a.replace("{data}", str(sample)).replace("{dir}", str(files["dir"])) for a in args]
    out = [] if args[0] == "federate" else ["--out", str(files["dir"] / "run.out")]
    assert cli_refusal(*args, *out) == message


def test_the_commands_refuse_only_flag_syntax() -> None:
    """Every ``raise`` left in ldpfl/commands is of flag syntax (FLAG_ONLY) or maps an API error to click."""
    raises = {}
    for path in sorted((ROOT / "ldpfl" / "commands").glob("*.py")):
        tree = ast.parse(path.read_text())
        found = [ast.unparse(node.exc.func if isinstance(node.exc, ast.Call) else node.exc)
                 for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc]
        found += [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and ast.unparse(node.func) in ("check_name", "require_own_data", "check_parameters")]
        if found:
            raises[path.stem] = sorted(found)
    assert raises == {
        "export": ["check_name", "check_name", "click.BadParameter", "require_own_data"],  # --name, --dataset
        "export_options": ["click.BadParameter", "click.BadParameter"],  # --param
        "federate": ["click.BadParameter", "click.BadParameter", "click.BadParameter",  # --hidden, --server-params
                     "click.BadParameter", "click.BadParameter",
                     "click.ClickException", "click.ClickException", "click.ClickException",  # a run fails
                     "click.ClickException"],
        "inspect": ["click.UsageError"],  # --plot / --recompute / --details with a model
        "mechanisms": ["check_parameters", "click.BadParameter"],  # the API's check; its ValueError in click's words
        "plan": ["check_name"],  # --name
    }
