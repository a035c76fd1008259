"""``ldpfl federate``: stage 2 over the HDF5 files of one export run.

A thin click command over the API's ``ldpfl.federate`` (``ldpfl.api.federate_job``): it maps the flags to
the function's arguments. This module imports click and the light stage-2 modules only; torch loads inside
the command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click

from ldpfl.api.federate_job import federate
from ldpfl.api.text import federate_text
from ldpfl.common.errors import LdpflError
from ldpfl.contract.jsonout import echo_json
from ldpfl.stage2_federate import budgets
from ldpfl.stage2_federate.flower_engine import FlowerMissingError
from ldpfl.stage2_federate.flower_engine.control import SuperLinkError
from ldpfl.stage2_federate.flower_engine.launch import FlowerRunError
from ldpfl.stage2_federate.options import FEDERATION_OPTIONS
from ldpfl.stage2_federate.perturbation import (
    SIGN_MODES,
    TARGETS,
    option_help,
    perturbation_names,
    perturbation_wiring,
)
from ldpfl.stage2_federate.strategies import strategy_class, strategy_names

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


def federation_option_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one flag per registered federation option (``FEDERATION_OPTIONS``), with help from the registries."""
    types = {"positive": click.FloatRange(min=0.0, min_open=True),
             "probability": click.FloatRange(0.0, 1.0, min_open=True, max_open=True)}
    for option in reversed(list(FEDERATION_OPTIONS.values())):  # click lists the flags in the order they were added
        extra: dict[str, Any] = {} if option.kind == "delta" else {"type": types[option.kind]}  # δ: the config reads it
        command = click.option(f"--{option.name.replace('_', '-')}", default=None, help=option_help(option.name),
                               **extra)(command)
    return command


def _aggregation_help() -> str:
    return "; ".join(f"{name}: {strategy_class(name).SUMMARY}" for name in strategy_names())


def _perturbation_help() -> str:
    wirings = {name: perturbation_wiring(name) for name in perturbation_names()}
    return "; ".join(f"{name}: {wiring.summary} [perturbs the {wiring.target}]" for name, wiring in wirings.items())


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
@click.option("--rounds", type=click.IntRange(min=1), default=10, show_default=True,
              help="Global rounds E (LDPFL: 80 for FMNIST, 100 for MNIST).")
@click.option("--clients-per-round", "-k", type=click.IntRange(min=1), default=None,
              help="Clients k selected per round out of N (default: all N; LDPFL Table I: 9 of 10).")
@click.option("--local-epochs", "--el", "local_epochs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Local epochs el per round (LDPFL IV-E uses 20; the default is smaller to keep CPU runs short).")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Local batch size.")
@click.option("--optimizer", type=click.Choice(["auto", "adam", "sgd"]), default="auto", show_default=True,
              help="auto: Adam(0.9, 0.999, eps 1e-8) for MNIST datasets, SGD otherwise (LDPFL IV-E), read from "
                   "the files' dataset name.")
@click.option("--lr", type=float, default=None, help="Local learning rate (default 0.001, LDPFL IV-E).")
@click.option("--hidden", default="2048", show_default=True, callback=_parse_hidden, help=_HIDDEN_HELP)
@click.option("--dropout", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.1, show_default=True,
              help="Dropout after each hidden layer.")
@click.option("--aggregation", type=click.Choice(strategy_names()), default="fedavg", show_default=True,
              help=_aggregation_help() + " (P_i sums to 1, so one uniform omega could select nobody: omega is "
                   "drawn uniformly below the largest P_i, the same as redrawing it until someone is selected).")
@click.option("--sample-weighted", is_flag=True, help="fedavg: weight clients by n_k/n (DP-FedAW eq. 2).")
@click.option("--fraction", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="fraction: select floor(gamma*N) clients per round (PLDP-FL Algorithm 1).")
@click.option("--perturbation", type=click.Choice(perturbation_names()), default="none", show_default=True,
              help="Model perturbation of each client's upload. " + _perturbation_help() + ".")
@click.option("--perturb-target", type=click.Choice(list(TARGETS)), default="auto", show_default=True,
              help="Override what the mechanism perturbs: the parameters or the update (local - global).")
@click.option("--epsilon", type=click.FloatRange(min=0.0, min_open=True), default=1.0, show_default=True,
              help="epsilon of every client when --client-epsilons is not given.")
@click.option("--client-epsilons", default=None,
              help="Per-client epsilon: 1,1,10,…, @file.json, @file.csv or a preset name; one value per client.")
@click.option("--client-ranges", default=None,
              help="pdpm: per-client safe-range lengths L_i (list, @file or preset pldp-tau1/2/3).")
@click.option("--client-centres", default=None,
              help="pdpm: per-client safe-range centres c_i (list or @file; default --range-centre).")
@click.option("--range-length", type=click.FloatRange(min=0.0, min_open=True), default=2.0, show_default=True,
              help="pdpm: L of every client when --client-ranges is not given (tau = [-1, 1]).")
@click.option("--range-centre", type=float, default=0.0, show_default=True, help="pdpm: centre c of every client.")
@click.option("--budget-preset", "budget_presets", multiple=True, type=click.Choice(budgets.preset_names()),
              metavar="NAME",
              help="Named per-client epsilons or safe-range lengths (listed below); may be repeated once per kind.")
@federation_option_flags
@click.option("--sign-mode", type=click.Choice(list(SIGN_MODES)), default="update", show_default=True,
              help="ldpsign: 'update' perturbs local-global and steps W += server_lr*sign(mean) (signSGD, Wu "
                   "ref. [19]); 'literal' perturbs the parameters and sets W = sign(mean) (Wu eq. 10).")
@click.option("--server-lr", type=click.FloatRange(min=0.0, min_open=True), default=1e-3, show_default=True,
              help="ldpsign update mode: server step size.")
@click.option("--drop-per-round", type=click.IntRange(min=0), default=0, show_default=True,
              help="Selected clients dropped at random after training each round (LDPFL IV-E drops 1).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: CUDA when available, else CPU.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed for reproducible runs, for tests and research only: output seeded this way has NO privacy "
                   "against anyone who can guess the seed. Default: the OS CSPRNG. Never written to outputs.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Output directory (default RUN_DIR/federation).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUT/checkpoint.pt.")
@click.option("--overwrite", is_flag=True, help="Start afresh even if OUT already holds a run.")
@click.option("--keep-checkpoint", is_flag=True,
              help="Keep checkpoint.pt after the run completes, to --resume it later with more rounds. By default "
                   "it is deleted then: it holds every generator's state, from which the clients' perturbation "
                   "noise can be recomputed, so it is seed-equivalent. An interrupted run always keeps it.")
@click.option("--eval-clean", is_flag=True,
              help="Also evaluate the global model each round on each client's UNRANDOMIZED local test file "
                   "(client_NNN.local.h5 of 'ldpfl export --keep-clean-test'): clean_test_accuracy in the metrics. "
                   "A silo predicting on its own records releases nothing; see docs/privacy.md.")
@click.option("--label-noise-correction", type=click.Choice(["auto", "forward", "backward", "none"]), default="auto",
              show_default=True,
              help="Loss correction for labels released by k-RR (ldpfl export --label-epsilon), with T read from the "
                   "files (Patrini et al. 2017): forward CE(T^T softmax(z), y~) (consistent), backward T^-1 applied "
                   "to the per-class losses (unbiased, higher variance), none. auto: forward when the files' "
                   "labels are randomized, none when clear.")
@click.option("--dp-sgd", is_flag=True,
              help="Record-level DP-SGD of every silo's local training (Opacus; Abadi et al. 2016): Poisson "
                   "batches of rate --sample-rate (default 0.1365), per-record L2 clip --clip (default 0.1), "
                   "Gaussian noise --noise-multiplier or calibrated per silo from --target-epsilon over the whole run, "
                   "--local-steps steps a round. Each silo's accountant (dp-accounting PLD) covers every step it "
                   "took; metrics.json states its epsilon under replace-one and add-remove. Needs --perturbation "
                   "none; default lr under it: 4.")
@click.option("--target-epsilon", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="--dp-sgd: each silo's epsilon over the whole run (at --delta, under --neighbours); sigma is "
                   "calibrated for it. A resumed run may not go past it.")
@click.option("--noise-multiplier", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="--dp-sgd: sigma, the noise std over the clip C (instead of --target-epsilon).")
@click.option("--neighbours", type=click.Choice(["replace-one", "add-remove"]), default="replace-one",
              show_default=True,
              help="--dp-sgd: the relation --target-epsilon is stated under (the project's replace-one, or the "
                   "DP-SGD literature's add-remove); both figures are reported.")
@click.option("--local-steps", type=click.IntRange(min=1), default=1, show_default=True,
              help="--dp-sgd: DP-SGD steps of each silo per round (they replace --local-epochs).")
@click.option("--server-momentum", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0, show_default=True,
              help="Server momentum beta (FedAvgM, Hsu et al. 2019): v <- beta v + (aggregate - W), W <- W + v.")
@click.option("--max-update-norm", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="The server refuses a silo's upload whose update (upload - global model, or the uploaded update) "
                   "has an L2 norm above this; the silo is named in the round's 'rejected' and left out of the "
                   "round. Default: 10 x the lower median update norm of the round's uploads (scaled up for a silo "
                   "whose perturbation adds more noise, or with more training rows, than the median silo).")
@click.option("--max-client-weight", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Cap on any silo's normalized aggregation weight (e.g. 0.3); the excess is shared by the others "
                   "in proportion to their weights. Below 1/n the weights are equal.")
@click.option("--trim-fraction", type=click.FloatRange(0.0, 0.5, max_open=True), default=None,
              help="trimmed-mean: the fraction beta of the values dropped at each end of every coordinate "
                   "(floor(beta*n) silos; default 0.2).")
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
    and checkpoint.pt to OUT.
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


def print_warning(message: str) -> None:
    """Print ``Warning: message`` on stderr above the progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(f"Warning: {' '.join(message.split())}", file=sys.stderr)
