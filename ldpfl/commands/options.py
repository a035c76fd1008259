"""Flag helpers of the commands: options of a config's fields, groups of options, the options given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import click

from ldpfl.api.field_help import describe
from ldpfl.api.fields import config_defaults

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def flag(name: str) -> str:
    """Return the long flag of parameter ``name`` (``--cnn-epsilon``)."""
    return "--" + name.replace("_", "-")


def field_options(config: type, table: Mapping[str, str]) -> Callable[..., Decorator]:
    """Return ``click.option`` for the fields of ``config``: its default is the field's, its help ``table``'s."""
    defaults = config_defaults(config)

    def option(*decls: str, **attrs: Any) -> Decorator:
        name = next((d for d in decls if d.isidentifier()), None) or next(
            d for d in decls if d.startswith("--"))[2:].replace("-", "_")
        if not attrs.get("is_flag"):  # a flag is off by default, as every such field
            attrs.setdefault("default", defaults[name])
        if name in table:
            attrs.setdefault("help", describe(table, name, flag))
        return click.option(*decls, **attrs)
    return option


def options(*declared: Decorator) -> Decorator:
    """Return a decorator adding the ``declared`` click options to a command, in the order given."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(declared):
            command = option(command)
        return command
    return decorate


def given_values(ctx: click.Context) -> dict[str, Any]:
    """Return the options given on the command line (not left at their defaults), by parameter name."""
    defaults = (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP)
    return {name: value for name, value in ctx.params.items() if ctx.get_parameter_source(name) not in defaults}
