"""``ldpfl demo``: the whole pipeline on the embedded MNIST-5k data (the API's ``ldpfl.demo``), with a summary."""

from __future__ import annotations

import click

from ldpfl.api.demo_job import demo
from ldpfl.api.fields import function_defaults
from ldpfl.contract.jsonout import echo_json

DEFAULTS = function_defaults(demo)


@click.command("demo")
@click.option("--out", type=click.Path(file_okay=False), default=DEFAULTS["out"], show_default=True,
              help="Run directory for the client files, federation outputs and plots.")
@click.option("--clients", type=click.IntRange(1, 10), default=DEFAULTS["clients"], show_default=True,
              help="Number of clients.")
@click.option("--epochs", type=click.IntRange(1), default=DEFAULTS["epochs"], show_default=True,
              help="CNN epochs per client.")
@click.option("--rounds", type=click.IntRange(1), default=DEFAULTS["rounds"], show_default=True,
              help="Federation rounds.")
@click.option("--local-epochs", type=click.IntRange(1), default=DEFAULTS["local_epochs"], show_default=True,
              help="Local epochs per client per round.")
@click.option("--seed", type=click.IntRange(0), default=None,
              help="Make the run reproducible (labelled 'seeded'; the seed is never stored). Output seeded this "
                   "way has NO privacy against anyone who can guess the seed.")
@click.option("--private", is_flag=True,
              help="Also run the best measured private path, in OUT-private: ScatterNet features kept on each silo "
                   "(local-only files) and a DP-SGD federation of a linear head at eps 3 per silo over the whole "
                   "run (delta 1e-5); its total eps per record over everything released is finite, against inf "
                   "for LDPFL as published. Compares the two side by side.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo_command(out: str, clients: int, epochs: int, rounds: int, local_epochs: int, seed: int | None,
                 private: bool, quiet: bool, as_json: bool) -> int:
    """Run the whole pipeline on the embedded MNIST-5k data: export, federate, inspect.

    Takes a few minutes on 2 CPU cores (twice that with --private). A rerun reuses the client files
    that verify.
    """
    result = demo(out, clients=clients, epochs=epochs, rounds=rounds, local_epochs=local_epochs, seed=seed,
                  private=private, progress_bars=not quiet, on_message=None if as_json else click.echo)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(result.format_text())
    return 0 if result.ok else 1
