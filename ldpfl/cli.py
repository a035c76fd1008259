"""The ``ldpfl`` command line: a thin click group over library calls.

Every subcommand module imported here is light (click and numpy at most); TensorFlow and torch load
inside the commands that need them. Bad input gives one line on stderr and exit code 2.

Library errors name parameters, not flags (``ldpfl.common.errors.ParameterError`` marks them as
```overwrite```); this layer spells each one as the invoked command's option (``--overwrite``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from typing import Any

import click

from ldpfl.common.errors import ParameterError

from . import __version__

DEBUG_VARIABLE = "LDPFL_DEBUG"


# Subcommands load on demand, so `ldpfl mechanisms` and `ldpfl inspect` never pay for TensorFlow or torch, and
# `ldpfl --help` lists them from here without importing any (click's lazy-group pattern).
LAZY_COMMANDS = {
    "export": "ldpfl.commands.export:export_command",
    "plan": "ldpfl.commands.plan:plan_command",
    "gather": "ldpfl.commands.gather:gather_command",
    "federate": "ldpfl.commands.federate:federate_command",
    "predict": "ldpfl.commands.predict:predict_command",
    "personalize": "ldpfl.commands.personalize:personalize_command",
    "inspect": "ldpfl.commands.inspect:inspect_command",
    "mechanisms": "ldpfl.commands.mechanisms:mechanisms_command",
    "demo": "ldpfl.commands.demo:demo_command",
}
SHORT_HELP = {
    "demo": "the whole pipeline on the embedded MNIST-5k data: export, federate, inspect",
    "export": "stage 1: features per client (a CNN or the fixed ScatterNet), encoded, randomized, written as HDF5",
    "plan": "the shared plan that separate silos export with (own data, one silo at a time)",
    "gather": "put the files of separate silos into one run directory",
    "federate": "stage 2: federated training over the HDF5 files (model perturbations or record-level DP-SGD)",
    "predict": "a silo's records through its pipeline and the federated model (clean by default)",
    "personalize": "a silo's own model from the global one, on its own records: clear, dp or interpolate",
    "inspect": "what a randomized HDF5 file is, what privacy it carries, whether its bits look right",
    "mechanisms": "list the randomization mechanisms and their privacy reports",
}


class LdpflGroup(click.Group):
    """A lazily loaded group whose errors are one line each.

    Usage and input errors (``ValueError``) exit 2; I/O errors, exhausted memory and any other exception
    exit 1, as one ``Error: ...`` line (the traceback only with ``LDPFL_DEBUG=1``).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Return the subcommands whose modules are installed, sorted."""
        available = [name for name, target in LAZY_COMMANDS.items()
                     if importlib.util.find_spec(target.split(":")[0]) is not None]
        return sorted(set(available) | set(super().list_commands(ctx)))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        """Import subcommand ``name``'s module on demand and return the command."""
        if name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[name].split(":")
            if importlib.util.find_spec(module_name) is None:
                return None
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the subcommands with their one-line help without importing them (``SHORT_HELP``)."""
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                            list[str]]:
        """Resolve the subcommand and remember it: its options spell the parameters of a library error."""
        name, command, rest = super().resolve_command(ctx, args)
        self.invoked = command
        return name, command, rest

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the command line; turn every error into one ``Error:`` line and an exit code."""
        if not standalone_mode or debugging():
            return super().main(args, prog_name, complete_var, standalone_mode=standalone_mode, **extra)
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning  # Pillow's, torch's, ...: one line each (issue 24)
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as error:
            _fail(error.format_message(), error.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 130)
        except ValueError as error:
            _fail(cli_message(error, getattr(self, "invoked", None)), 2)
        except OSError as error:
            _fail(f"{error.strerror or error}: {error.filename}" if error.filename else str(error), 1)
        except MemoryError as error:
            _fail(f"out of memory{f' ({error})' if str(error) else ''}; set {DEBUG_VARIABLE}=1 for the traceback", 1)
        except RecursionError:
            _fail(f"input nested too deeply to process (RecursionError); set {DEBUG_VARIABLE}=1 for the traceback",
                  1)
        except Exception as error:  # noqa: BLE001 - the last resort: one line, never a traceback
            _fail(f"{type(error).__name__}: {error} (an unexpected error; set {DEBUG_VARIABLE}=1 for the "
                  "traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Print a third-party warning as one ``Warning: ...`` line on stderr (where it came from: with LDPFL_DEBUG)."""
    del file, line
    text = " ".join(str(message).split())
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + " ..."
    where = f" [{filename}:{lineno}]" if debugging() else ""
    click.echo(f"Warning: {text} ({category.__name__}){where}", err=True)


def debugging() -> bool:
    """Return whether ``LDPFL_DEBUG`` asks for tracebacks (set, and not ``0``)."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def option_flag(command: click.Command | None, parameter: str) -> str:
    """Return the flag that sets library parameter ``parameter``.

    That is the long flag of ``command``'s option of that name, the name of its argument of that name (``PATH``),
    or ``--parameter-name`` when it has none.
    """
    for param in command.params if command is not None else ():
        if isinstance(param, click.Option) and param.name == parameter:
            longs = [opt for opt in param.opts if opt.startswith("--")]
            return longs[0] if longs else param.opts[0]
        if isinstance(param, click.Argument) and param.name == parameter:
            return param.human_readable_name  # PATH
    return "--" + parameter.replace("_", "-")


def cli_message(error: ValueError, command: click.Command | None = None) -> str:
    """Return the message of a library error with its parameters spelled as ``command``'s flags."""
    if isinstance(error, ParameterError):
        return error.render(lambda name: option_flag(command, name))
    return str(error)


MAX_MESSAGE = 2000


def _fail(message: str, code: int) -> None:
    text = " ".join(message.split())
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + " ..."
    click.echo(f"Error: {text}", err=True)
    sys.exit(code)


@click.group(cls=LdpflGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ldpfl")
def cli() -> None:
    """Federated learning over locally differentially private (LDP) features.

    Every command has --help. Set LDPFL_DEBUG=1 to see full tracebacks.
    """


def main() -> None:
    """Entry point of the ``ldpfl`` script."""
    cli(prog_name="ldpfl")


if __name__ == "__main__":  # pragma: no cover
    main()
