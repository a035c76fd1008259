"""``ldpfl mechanisms show`` on the settings of issue 12: ε = ∞ where the sampler is deterministic, one-line
errors (exit 2) for values without a finite σ or exact grid, and the record-size bound."""

from __future__ import annotations

import json

import pytest
from cli_checks import run


@pytest.mark.parametrize("args", [
    ("pdpm", "--epsilon", "50", "--dim", "10"),
    ("ldpsign", "--epsilon", "100", "--dim", "10"),
])
def test_deterministic_settings_report_infinite_epsilon(args: tuple[str, ...]) -> None:
    text = run("mechanisms", "show", *args)
    assert text.exit_code == 0, text.output
    assert "inf (not private) per coordinate" in text.output
    as_json = run("mechanisms", "show", *args, "--json")
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert report["exact_epsilon_per_coordinate"] == "inf"
    assert report["exact_epsilon_per_record"] == "inf"


def test_finite_settings_stay_finite() -> None:
    result = run("mechanisms", "show", "pdpm", "--epsilon", "30", "--dim", "10", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["exact_epsilon_per_coordinate"] == pytest.approx(30.0, rel=1e-5)


@pytest.mark.parametrize(("args", "fragment"), [
    (("gaussian-wu", "--epsilon", "1e-300"), "epsilon=1e-300"),
    (("pdpm", "--epsilon", "1e-300"), "epsilon=1e-300"),
    (("fedaw-gaussian", "--epsilon", "1e-10"), "no exact grid"),
    (("gaussian", "--dim", "10000001"), "dim must be an integer <= 10000000"),
    (("pdpm", "--dim", "10000001"), "dim must be an integer <= 10000000"),
])
def test_out_of_range_values_are_one_line_usage_errors(args: tuple[str, ...], fragment: str) -> None:
    result = run("mechanisms", "show", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    assert fragment in lines[0]
    assert "Traceback" not in result.output


def test_gaussian_report_names_the_discrete_sampler() -> None:
    result = run("mechanisms", "show", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--clip", "4",
                    "--dim", "100", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    sampler = report["probabilities"]["sampler"]
    assert sampler["kind"] == "discrete-gaussian" and sampler["grid"] == 2.0**-15
    assert report["exact_epsilon_per_coordinate"] == pytest.approx(0.750977, rel=1e-5)
    assert report["exact_epsilon_per_record"] == pytest.approx(11.1463, rel=1e-4)
