"""The ``ldpfl`` command line: a thin click group over library calls.

Every subcommand module imported here is light (click and numpy at most); TensorFlow and torch load
inside the commands that need them. Bad input gives one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys

import click

from . import __version__
from .mechanisms_cli import mechanisms_command

DEBUG_VARIABLE = "LDPFL_DEBUG"


class LdpflGroup(click.Group):
    """A group whose errors are one line each: usage and input errors exit 2, I/O errors exit 1."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode or os.environ.get(DEBUG_VARIABLE):
            return super().main(args, prog_name, complete_var, standalone_mode=standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as error:
            _fail(error.format_message(), error.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 130)
        except ValueError as error:
            _fail(str(error), 2)
        except OSError as error:
            _fail(f"{error.strerror or error}: {error.filename}" if error.filename else str(error), 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {' '.join(message.split())}", err=True)
    sys.exit(code)


@click.group(cls=LdpflGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ldpfl")
def cli() -> None:
    """Federated learning over locally differentially private (LDP) features.

    \b
    export      stage 1: train a CNN per client, encode and randomize its features, write HDF5
    federate    stage 2: federated training of a fully-connected model over the HDF5 files
    inspect     what a randomized HDF5 file is, what privacy it carries, whether its bits look right
    mechanisms  list the randomization mechanisms and their privacy reports

    Set LDPFL_DEBUG=1 to see full tracebacks.
    """


cli.add_command(mechanisms_command)


def echo_json(payload: object) -> None:
    """Print ``payload`` as indented JSON (the --json output of every command)."""
    click.echo(json.dumps(payload, indent=2, sort_keys=True, default=str))


def main() -> None:
    cli(prog_name="ldpfl")


if __name__ == "__main__":  # pragma: no cover
    main()
