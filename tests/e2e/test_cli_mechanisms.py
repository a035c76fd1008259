"""``ldpfl mechanisms`` and ``ldpfl mechanisms show``: listing, reports, one-line errors, light imports."""

from __future__ import annotations

import json

import pytest
from cli_checks import run
from heavy_imports import heavy_modules_after

from ldpfl import mechanisms as mech

PAPER_MECHANISMS = {
    "uer",
    "moue",
    "oue",
    "rr",
    "gaussian-wu",
    "gaussian",
    "ldpsign",
    "pdpm",
    "fedaw-gaussian",
}




def test_listing_as_json() -> None:
    result = run("mechanisms", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    names = [row["name"] for row in rows]
    assert PAPER_MECHANISMS <= set(names)
    assert names == mech.mechanism_names()
    uer = next(row for row in rows if row["name"] == "uer")
    assert uer["domain"] == "bits"
    options = {p["option"]: p for p in uer["parameters"]}
    assert {
        "--epsilon",
        "--alpha",
        "--integer-bits",
        "--fraction-bits",
        "--features",
        "--sensitivity-rule",
    } <= set(options)
    assert options["--integer-bits"]["flags"] == ["-m"]
    assert options["--alpha"]["default"] == 10.0


def test_listing_as_text() -> None:
    result = run("mechanisms")
    assert result.exit_code == 0, result.output
    for name in PAPER_MECHANISMS:
        assert any(line.startswith(name + " ") for line in result.stdout.splitlines()), name


def test_show_uer_paper_setting_as_json() -> None:
    result = run(
        "mechanisms",
        "show",
        "uer",
        "--epsilon",
        "0.5",
        "--alpha",
        "10",
        "-m",
        "4",
        "-n",
        "5",
        "--features",
        "1152",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    expected = mech.create_mechanism(
        "uer", epsilon=0.5, alpha=10.0, integer_bits=4, fraction_bits=5, features=1152
    ).report()
    assert report["mechanism"] == "uer"
    assert report["nominal_epsilon"] == 0.5
    assert report["exact_epsilon_per_record"] == pytest.approx(expected.exact_epsilon_per_record, rel=1e-12)
    assert report["exact_epsilon_per_record"] > 10_000
    assert report["sensitivity"] == 11520
    assert report["parameters"] == {
        "epsilon": 0.5,
        "integer_bits": 4,
        "fraction_bits": 5,
        "features": 1152,
        "sensitivity_rule": "paper",
        "alpha": 10.0,
    }
    assert mech.PrivacyReport.from_dict(report) == expected


def test_show_as_text_prints_both_epsilons() -> None:
    result = run("mechanisms", "show", "rr", "--features", "1152", "--sensitivity-rule", "reference-code")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "nominal epsilon      0.5" in text
    assert "per record of r*l = 11520 bits" in text
    assert "sensitivity          5760" in text


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("gaussian", ["--epsilon", "0.5", "--clip", "4", "--dim", "10"]),
        ("gaussian-wu", ["--sample-rate", "0.9", "--rounds", "20", "--delta", "0.001"]),
        ("ldpsign", ["--l2-sensitivity", "8"]),
        ("pdpm", ["-L", "2", "--center", "0.5", "--dim", "3"]),
        ("fedaw-gaussian", ["--sensitivity", "2", "--delta", "1e-5"]),
        ("none", []),
    ],
)
def test_show_every_kind_of_option(name: str, args: list[str]) -> None:
    result = run("mechanisms", "show", name, *args, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mechanism"] == name


@pytest.mark.parametrize(
    "args",
    [
        ["show", "uer", "--epsilon", "-1"],
        ["show", "uer", "--epsilon", "0"],
        ["show", "uer", "--epsilon", "nan"],
        ["show", "rr", "--alpha", "3"],
        ["show", "uer", "-m", "-1"],
        ["show", "ldpsign", "--delta", "1.5"],
        ["show", "pdpm", "-L", "0"],
        ["show", "uer", "--sensitivity-rule", "half"],
        ["show", "uer", "--epsilon", "abc"],
        ["show", "nonexistent"],
        ["show", "gaussian", "--dim", "0", "--json"],
        ["show", "pdpm", "--epsilon", "1000"],  # e^epsilon overflows a float
        ["show", "oue", "--features", "1", "--epsilon", "5000"],
    ],
)
def test_bad_parameters_give_one_error_line_and_exit_code_2(args: list[str]) -> None:
    result = run("mechanisms", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error:")
    assert "Traceback" not in result.output
    assert result.stdout == ""  # the error goes to stderr


def test_bad_epsilon_message_quotes_the_value() -> None:
    result = run("mechanisms", "show", "uer", "--epsilon", "-1")
    assert "epsilon must be a finite number > 0, got -1.0" in result.output
    result = run("mechanisms", "show", "rr", "--alpha", "3")
    assert "--alpha does not apply to mechanism 'rr'" in result.output


def test_mechanisms_command_imports_no_deep_learning_framework() -> None:
    stdout, heavy = heavy_modules_after(["mechanisms", "--json"], ["mechanisms", "show", "uer", "--json"])
    assert "uer" in stdout
    assert heavy == []
