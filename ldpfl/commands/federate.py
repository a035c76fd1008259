"""``ldpfl federate``: stage 2 over the HDF5 files of one export run.

A thin click command over the API's ``ldpfl.federate`` (``ldpfl.api.federate_job``): it maps the flags to
the function's arguments. This module imports click and the light stage-2 modules only; torch loads inside
the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click

from ldpfl.api.federate_job import federate
from ldpfl.api.field_help import federation_help
from ldpfl.api.text import federate_text
from ldpfl.common.errors import LdpflError
from ldpfl.contract.jsonout import echo_json
from ldpfl.stage2_federate import budgets
from ldpfl.stage2_federate.config import HEADS, FederationConfig
from ldpfl.stage2_federate.console import print_warning
from ldpfl.stage2_federate.flower_engine import FlowerMissingError
from ldpfl.stage2_federate.flower_engine.control import SuperLinkError
from ldpfl.stage2_federate.flower_engine.launch import FlowerRunError
from ldpfl.stage2_federate.options import FEDERATION_OPTIONS
from ldpfl.stage2_federate.perturbation import SIGN_MODES, TARGETS, perturbation_names
from ldpfl.stage2_federate.server_optimizers import server_optimizer_names
from ldpfl.stage2_federate.strategies import strategy_names

from .options import field_options, flag

option = field_options(FederationConfig, federation_help())
"""``click.option`` of a ``FederationConfig`` field: the config's default, the API's text of it."""
_HIDDEN_HELP = "Hidden layer sizes, e.g. 2048 (default, LDPFL's DNN) or 512,256; 'none' = logistic regression."


def _parse_hidden(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    text = value.strip().lower()
    if text in ("none", "0", ""):
        return ()
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers or 'none'") from None
    if any(s < 1 for s in sizes):
        raise click.BadParameter(f"layer sizes must be >= 1, got {value!r}")
    return sizes


def _parse_params(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    """Return NAME → number from the NAME=VALUE texts of a repeated option."""
    params: dict[str, float] = {}
    for text in value:
        name, sep, number = text.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{text!r} is not NAME=VALUE")
        if name.strip() in params:
            raise click.BadParameter(f"{name.strip()!r} is given twice")
        try:
            params[name.strip()] = float(number)
        except ValueError:
            raise click.BadParameter(f"{text!r}: {number.strip()!r} is not a number") from None
    return params


def federation_option_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one flag per registered federation option (``FEDERATION_OPTIONS``), with help from the registries."""
    types = {"positive": click.FloatRange(min=0.0, min_open=True),
             "probability": click.FloatRange(0.0, 1.0, min_open=True, max_open=True)}
    for spec in reversed(list(FEDERATION_OPTIONS.values())):  # click lists the flags in the order they were added
        extra: dict[str, Any] = {} if spec.kind == "delta" else {"type": types[spec.kind]}  # δ: the config reads it
        command = option(flag(spec.name), **extra)(command)
    return command


_EPILOG = "\b\nBudget presets (--budget-preset NAME, or as the value of --client-epsilons / --client-ranges):\n" + \
    budgets.presets_help() + """

\b
Examples:
  ldpfl federate runs/fmnist --rounds 80 --clients-per-round 9 --drop-per-round 1
  ldpfl federate runs/mnist --perturbation gaussian-wu --aggregation weighted --budget-preset wu-mnist-LH
  ldpfl federate runs/mnist --perturbation pdpm --aggregation fraction --fraction 0.7 \\
        --budget-preset pldp-eps2 --budget-preset pldp-tau1
  ldpfl federate runs/mnist --perturbation ldpsign --aggregation probability --client-epsilons @eps.csv
"""


@click.command("federate", epilog=_EPILOG, context_settings={"max_content_width": 110})
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@option("--rounds", type=click.IntRange(min=1), show_default=True)
@option("--clients-per-round", "-k", type=click.IntRange(min=1))
@option("--local-epochs", "--el", "local_epochs", type=click.IntRange(min=1), show_default=True)
@option("--batch-size", type=click.IntRange(min=1), show_default=True)
@option("--optimizer", type=click.Choice(["auto", "adam", "sgd"]), show_default=True)
@option("--lr", type=float)
@click.option("--hidden", default="2048", show_default=True, callback=_parse_hidden, help=_HIDDEN_HELP)
@option("--dropout", type=click.FloatRange(0.0, 1.0, max_open=True), show_default=True)
@option("--head", type=click.Choice(list(HEADS)), show_default=True)
@option("--shrinkage", type=click.FloatRange(min=0.0))
@option("--aggregation", type=click.Choice(strategy_names()), show_default=True)
@option("--sample-weighted", is_flag=True)
@option("--fraction", type=click.FloatRange(0.0, 1.0, min_open=True))
@option("--perturbation", type=click.Choice(perturbation_names()), show_default=True)
@option("--perturb-target", type=click.Choice(list(TARGETS)), show_default=True)
@option("--epsilon", type=click.FloatRange(min=0.0, min_open=True), show_default=True)
@option("--client-epsilons")
@option("--client-ranges")
@option("--client-centres")
@option("--range-length", type=click.FloatRange(min=0.0, min_open=True), show_default=True)
@option("--range-centre", type=float, show_default=True)
@click.option("--budget-preset", "budget_presets", multiple=True, type=click.Choice(budgets.preset_names()),
              metavar="NAME",
              help="Named per-client epsilons or safe-range lengths (listed below); may be repeated once per kind.")
@federation_option_flags
@option("--sign-mode", type=click.Choice(list(SIGN_MODES)), show_default=True)
@option("--server-lr", type=click.FloatRange(min=0.0, min_open=True), show_default=True)
@option("--drop-per-round", type=click.IntRange(min=0), show_default=True)
@option("--device", type=click.Choice(["auto", "cpu", "cuda"]), show_default=True)
@option("--threads", type=click.IntRange(min=1))
@option("--seed", type=click.IntRange(min=0))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Output directory (default RUN_DIR/federation).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUT/checkpoint.pt.")
@click.option("--overwrite", is_flag=True, help="Start afresh even if OUT already holds a run.")
@click.option("--keep-checkpoint", is_flag=True,
              help="Keep checkpoint.pt after the run completes, to --resume it later with more rounds. By default "
                   "it is deleted then: it holds every generator's state, from which the clients' perturbation "
                   "noise can be recomputed, so it is seed-equivalent. An interrupted run always keeps it.")
@option("--eval-clean", is_flag=True)
@option("--label-noise-correction", type=click.Choice(["auto", "forward", "backward", "none"]), show_default=True)
@option("--dp-sgd", is_flag=True)
@option("--target-epsilon", type=click.FloatRange(min=0.0, min_open=True))
@option("--noise-multiplier", type=click.FloatRange(min=0.0, min_open=True))
@option("--neighbours", type=click.Choice(["replace-one", "add-remove"]), show_default=True)
@option("--eval-epsilon", type=click.FloatRange(min=0.0, min_open=True))
@option("--eval-every", type=int, metavar="K", show_default=True)
@option("--local-steps", type=click.IntRange(min=1), show_default=True)
@option("--server-momentum", type=click.FloatRange(0.0, 1.0, max_open=True), show_default=True)
@option("--server-optimizer", type=click.Choice(server_optimizer_names()), show_default=True)
@option("--server-params", multiple=True, default=(), metavar="NAME=VALUE", callback=_parse_params)
@option("--max-update-norm", type=click.FloatRange(min=0.0, min_open=True))
@option("--max-client-weight", type=click.FloatRange(0.0, 1.0, min_open=True))
@option("--trim-fraction", type=click.FloatRange(0.0, 0.5, max_open=True))
@option("--outlier-report", is_flag=True)
@click.option("--engine", type=click.Choice(["local", "flower"]), default="local", show_default=True,
              help="local: every client in this process. flower: Flower's simulation engine on this machine (a "
                   "private SuperLink, one ClientApp per client file, each opening only its own file; needs "
                   "pip install -e '.[flower]'), or with --superlink real silos; same selections and accuracies "
                   "at a fixed --seed. See docs/flower.md.")
@click.option("--superlink", metavar="HOST:PORT", default=None,
              help="flower: submit the run to this running Flower SuperLink, whose SuperNodes (one per silo, "
                   "flower-supernode --node-config \"client-file='...'\") serve the client files. RUN_DIR then needs "
                   "only its manifest.json (and plan.json if the silos exported with one), never the client files; "
                   "run this on the SuperLink's machine: its ServerApp writes OUT there. TLS with the system's CAs "
                   "unless --root-certificates or --insecure.")
@click.option("--root-certificates", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="--superlink: PEM file of the CA that signed the SuperLink's TLS certificate.")
@click.option("--insecure", is_flag=True,
              help="--superlink: no TLS. FOR TESTS ON 127.0.0.1 ONLY: the run's configuration and every update "
                   "travel in clear.")
@click.option("--cpus-per-client", type=click.IntRange(min=1), default=None,
              help="flower simulation: whole CPUs Ray reserves for each simulated client (default 1).")
@click.option("--round-timeout", "--client-timeout", "client_timeout", type=click.FloatRange(min=0.0, min_open=True),
              default=None,
              help="flower: seconds to wait for the replies of one exchange (default 600); a client that does not "
                   "answer in time is logged as lost for the round.")
@click.option("--min-clients-per-round", "min_clients", type=click.IntRange(min=1), default=None,
              help="The failure policy (both engines). A client that fails (its node dies, its file was replaced, "
                   "its code raised) or whose reply the server rejects is logged with its index and reason and the "
                   "round goes on while at least this many selected clients trained; fewer end the run. Default: "
                   "on flower a client's own failure ends the run, a lost node is logged and the round goes on; a "
                   "rejected reply is left out and the round goes on.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
def federate_command(run_dir: Path, budget_presets: tuple[str, ...], out_dir: str | None, resume: bool,
                     overwrite: bool, keep_checkpoint: bool, as_json: bool, quiet: bool,
                     engine: Literal["local", "flower"], cpus_per_client: int | None,
                     client_timeout: float | None, superlink: str | None, root_certificates: Path | None,
                     insecure: bool, min_clients: int | None, **options: Any) -> None:
    """Federated training of a fully-connected model over the client files in RUN_DIR (LDPFL stage 2).

    Each round selects clients, trains them locally on their randomized features, perturbs their uploads
    with their own privacy budgets, aggregates, and evaluates the global model on the union of the
    clients' randomized test splits. Writes metrics.csv, metrics.json, accuracy.png, model.pt, config.json
    and checkpoint.pt to OUT. With --head lda over stats:K files, no round: the closed-form head is fitted on
    the files' pooled released statistics and written to the same outputs.
    """
    try:
        result = federate(run_dir, engine=engine, out=out_dir, resume=resume, overwrite=overwrite,
                          keep_checkpoint=keep_checkpoint, cpus_per_client=cpus_per_client,
                          client_timeout=client_timeout, superlink=superlink, root_certificates=root_certificates,
                          insecure=insecure, min_clients_per_round=min_clients, budget_presets=budget_presets,
                          progress_bars=not quiet and not as_json, on_warning=print_warning, **options)
    except FlowerMissingError as error:  # --engine flower: one Error: line each
        raise click.ClickException(str(error)) from None
    except FlowerRunError as error:
        if isinstance(error, SuperLinkError):  # the SuperLink itself: its own line
            raise click.ClickException(str(error)) from None
        raise click.ClickException(f"the Flower run failed: {error}") from None
    except RuntimeError as error:  # the local engine's failure policy (loop.TooFewClientsError): its one line
        if not isinstance(error, LdpflError):
            raise
        raise click.ClickException(str(error)) from None
    if as_json:
        echo_json(result.to_dict())
    elif not quiet:
        click.echo(federate_text(result))
