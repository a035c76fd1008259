"""``ldpfl mechanisms``: list mechanisms and print privacy reports. Imports no TensorFlow or torch."""

from __future__ import annotations

import json
from typing import Any

import click

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.base import ParamSpec

_FLAG_TYPES = {float: float, int: int, str: str}


def _all_parameter_specs() -> dict[str, ParamSpec]:
    """Return the union of every mechanism's parameters, by name (first declaration wins for help text)."""
    specs: dict[str, ParamSpec] = {}
    for name in mech.mechanism_names():
        for spec in mech.mechanism_class(name).parameter_specs():
            specs.setdefault(spec.name, spec)
    return specs


def _listing() -> list[dict[str, Any]]:
    rows = []
    for name in mech.mechanism_names():
        cls = mech.mechanism_class(name)
        rows.append({
            "name": name, "domain": cls.DOMAIN, "source": cls.SOURCE, "summary": cls.SUMMARY,
            "parameters": [
                {"name": s.name, "option": s.option, "flags": list(s.flags), "type": s.type.__name__,
                 "default": s.default, "help": s.help}
                for s in cls.parameter_specs()
            ],
        })
    return rows


@click.group("mechanisms", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def mechanisms_command(ctx: click.Context, as_json: bool) -> None:
    """List every registered mechanism with its parameters.

    Use 'ldpfl mechanisms show NAME [options]' for one mechanism's privacy report.
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = _listing()
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
    accepted = {s.name: s for s in mech.mechanism_class(name).parameter_specs()}
    refused = [k for k in parameters if k not in accepted]
    if refused:
        options = ", ".join(_all_parameter_specs()[k].option for k in refused)
        raise click.UsageError(f"{options} does not apply to mechanism {name!r}; it takes: "
                               f"{', '.join(s.option for s in accepted.values()) or 'no options'}")
    try:
        report = mech.create_mechanism(name, **parameters).report()
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    except OverflowError:  # e.g. e^epsilon for epsilon > 709: a usage error, not a crash
        raise click.BadParameter(f"numeric overflow computing the report of {name!r} with {parameters}; "
                                 "use smaller values") from None
    click.echo(report.to_json() if as_json else report.format_text())
