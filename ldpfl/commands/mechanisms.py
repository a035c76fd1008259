"""``ldpfl mechanisms``: list mechanisms and print privacy reports (``ldpfl.api.mechanism_reports``).

Imports no TensorFlow or torch.
"""

from __future__ import annotations

import json

import click

from ldpfl import mechanisms as mech
from ldpfl.api.mechanism_reports import check_parameters, mechanism_listing, mechanism_report
from ldpfl.mechanisms.base import ParamSpec

_FLAG_TYPES = {float: float, int: int, str: str}


def _all_parameter_specs() -> dict[str, ParamSpec]:
    """Return the union of every mechanism's parameters, by name (first declaration wins for help text)."""
    specs: dict[str, ParamSpec] = {}
    for name in mech.mechanism_names():
        for spec in mech.mechanism_class(name).parameter_specs():
            specs.setdefault(spec.name, spec)
    return specs


@click.group("mechanisms", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def mechanisms_command(ctx: click.Context, as_json: bool) -> None:
    """List every registered mechanism with its parameters.

    Use 'ldpfl mechanisms show NAME [options]' for one mechanism's privacy report.
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = mechanism_listing()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        click.echo(f"{row['name']:<15} [{row['domain']}] {row['summary']}  ({row['source']})")
        for p in row["parameters"]:
            flags = ", ".join([*p["flags"], p["option"]])
            click.echo(f"    {flags:<28} {p['type']:<6} default {p['default']!s:<8} {p['help']}")


def _show_options(func):
    for spec in reversed(list(_all_parameter_specs().values())):
        func = click.option(*spec.flags, spec.option, spec.name, type=_FLAG_TYPES.get(spec.type, str), default=None,
                            help=spec.help)(func)
    return func


@mechanisms_command.command("show")
@click.argument("name", metavar="NAME", type=click.Choice(mech.mechanism_names()))
@_show_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def show_command(name: str, as_json: bool, **given: object) -> None:
    """Print the privacy report of mechanism NAME with the given parameters.

    Options that NAME does not take are refused. Example:

        ldpfl mechanisms show uer --epsilon 0.5 --alpha 10 -m 4 -n 5 --features 1152
    """
    parameters = {k: v for k, v in given.items() if v is not None}
    check_parameters(name, parameters)  # the API's refusal, spelled with these flags
    try:
        report = mechanism_report(name, **parameters)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    click.echo(report.to_json() if as_json else report.format_text())
