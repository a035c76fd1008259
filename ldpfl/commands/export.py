"""``ldpfl export``: stage 1 of LDPFL as one command (Algorithm 1 lines 1-10).

A thin click command: it maps the options given to the fields of the API's ``ldpfl.export``
(``ldpfl.api.export_job``), which applies the config's defaults, the plan and the source run's checks. At import
time it loads click and numpy-level modules only (the registries); TensorFlow loads when a CNN trains.
"""

from __future__ import annotations

from typing import Any

import click

from ldpfl.api.export_job import export
from ldpfl.api.fields import config_defaults
from ldpfl.api.text import export_text
from ldpfl.commands.export_options import (
    extractor_help,
    given_values,
    mechanism_fields,
    mechanism_help,
    mechanism_options,
    own_data_options,
    reader_fields,
    release_options,
    scatter_options,
)
from ldpfl.contract.datasets import dataset_names
from ldpfl.contract.jsonout import echo_json
from ldpfl.contract.names import check_name
from ldpfl.stage1_features.export.config import ExportConfig, exportable_mechanisms, require_own_data
from ldpfl.stage1_features.export.partition import PARTITION_KINDS
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.keras_backend import DEVICES, KERAS_BACKENDS
from ldpfl.stage1_features.own_data.load import default_name

DEFAULTS = config_defaults(ExportConfig)


@click.command("export", context_settings={"max_content_width": 100})
@click.option("--dataset", type=click.Choice(dataset_names()), default=DEFAULTS["dataset"], show_default=True,
              help="Dataset (train and test splits pooled). mnist5k is embedded and needs no download.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Directory holding the dataset files (default: data/<dataset>/).")
@click.option("--clients", type=int, default=DEFAULTS["clients"], show_default=True,
              help="Number of clients N to export.")
@click.option("--max-clients", type=int, default=None,
              help="N_h: cut the pool into this many equal groups (LDPFL IV-B); default --clients.")
@click.option("--partition", type=click.Choice(PARTITION_KINDS), default=DEFAULTS["partition"], show_default=True,
              help="How records are split among clients.")
@click.option("--beta", type=float, default=DEFAULTS["beta"], show_default=True,
              help="Dirichlet concentration (dirichlet).")
@click.option("--unb", type=float, default=DEFAULTS["unb"], show_default=True,
              help="Fraction of non-IID clients (shards).")
@click.option("--shards-per-client", type=int, default=DEFAULTS["shards_per_client"], show_default=True,
              help="Blocks per client (shards).")
@click.option("--test-fraction", type=float, default=DEFAULTS["test_fraction"], show_default=True,
              help="Each client's hold-out share (IV-C: 10 %).")
@click.option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), default=cnn.AUTO,
              show_default=True,
              help=extractor_help())
@scatter_options
@click.option("--epochs", type=int, default=DEFAULTS["epochs"], show_default=True,
              help="CNN training epochs (IV-C: 50). CPU runs often use a few.")
@click.option("--batch-size", type=int, default=DEFAULTS["batch_size"], show_default=True,
              help="CNN batch size (IV-C: 64).")
@click.option("--no-augment", is_flag=True, help="Train without rotation/shift augmentation.")
@click.option("--mechanism", type=click.Choice(exportable_mechanisms()), default=DEFAULTS["mechanism"],
              show_default=True,
              help=mechanism_help())
@mechanism_options
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Another mechanism parameter, e.g. sensitivity_rule=reference-code or safe_range_length=2 "
                   "(repeatable; see 'ldpfl mechanisms').")
@click.option("--label-epsilon", type=float, default=None,
              help="Release each record's label (train and test) by k-ary randomized response at this ε instead "
                   "of in clear; stage 2 corrects for the known noise. Its ε adds to the features' per record  "
                   "[default: clear labels, label ε = inf]")
@click.option("--limit", type=int, default=None, help="Use only this many pooled records (random), for quick runs.")
@click.option("--save-models", is_flag=True,
              help="Also save each client's CNN as client_XXX.keras. WARNING: trained on raw data, NOT covered by "
                   "the LDP guarantee.")
@click.option("--store-input-density", is_flag=True,
              help="Store the density of 1s of the UNRANDOMIZED encoding per bit (train split) in "
                   "/stats/input_bit_density, for 'ldpfl inspect'. WARNING: this aggregate is NOT covered by "
                   "the LDP guarantee; do not release such files.")
@click.option("--clients-parallel", type=int, default=DEFAULTS["clients_parallel"], show_default=True,
              help="Export this many clients at once, in separate processes. Same partition and randomness "
                   "as sequential; CNN features may differ in float rounding (fewer threads each). One per "
                   "core is fastest for the paper's CNNs (2 cores: 16 % more samples/s than 1 process with 2 "
                   "threads, bench/cnn_training.py).")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="Run each client as a task on a Ray cluster: auto (the cluster started here with ray start), "
                   "local (a Ray on this machine for this run) or host:port. The same files as a local run; this "
                   "process writes them (docs/cluster.md).")
@click.option("--ray-cpus-per-client", type=int, default=DEFAULTS["ray_cpus_per_client"], show_default=True,
              help="--ray-address: CPUs each client's task declares (and its TensorFlow threads).")
@click.option("--ray-gpus-per-client", type=float, default=DEFAULTS["ray_gpus_per_client"], show_default=True,
              help="--ray-address: GPUs each client's task declares.")
@click.option("--keras-backend", type=click.Choice(list(KERAS_BACKENDS)), default=None,
              help="Keras 3 backend that trains and runs the CNNs  [default: tensorflow; jax under --cnn-epsilon, "
                   "which needs it]. TensorFlow is the fastest on CPU here (torch 16-23 % and jax 52-57 % slower on "
                   "the Fig. 4 CNN, bench/RESULTS.md); same model, same files.")
@click.option("--device", type=click.Choice(list(DEVICES)), default=DEFAULTS["device"], show_default=True,
              help="Where the CNNs train and run: auto (a GPU the backend sees, else the CPU), cpu, or cuda (needs "
                   "a CUDA build of the backend, e.g. --keras-backend torch with CUDA torch; refused where none is "
                   "seen). Seeded GPU runs use deterministic kernels. Not recorded: it changes speed, not files.")
@click.option("--cnn-epsilon", type=float, default=None,
              help="Train each client's CNN with record-level DP-SGD (jax-privacy, Poisson sampling, noise "
                   "calibrated to this ε over the planned epochs), in (0, 100]. Without it the CNN is trained "
                   "without DP and its outputs carry no finite per-record guarantee.")
@click.option("--cnn-delta", type=float, default=None,
              help="δ of --cnn-epsilon, in (0, 1)  [default: 1e-5]")
@click.option("--local-only", is_flag=True,
              help="Files that never leave the silo (a Flower deployment where only DP-SGD updates leave): clean "
                   "float32 features (--mechanism none) and true labels, every file marked local_only. NOT private "
                   "(epsilon = inf if shipped).")
@click.option("--overwrite", is_flag=True,
              help="Redo every client (removes this run's client files, models, manifest and partition first).")
@click.option("--seed", type=int, default=None,
              help="Reproducible run, for tests and research only: output seeded this way has NO privacy against "
                   "anyone who can guess the seed. Never stored. Default: the OS CSPRNG.")
@click.option("--out", "out", type=click.Path(path_type=str), default=None,
              help="Run directory  [default: runs/<dataset>]")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@release_options
@own_data_options
def export_command(out: str | None, as_json: bool, quiet: bool, **options: Any) -> None:
    """Stage 1: per client, train a CNN, encode and randomize its flatten features, write HDF5.

    Each client gets its share of the pooled dataset, holds out 10 % for testing, trains the CNN of
    LDPFL Fig. 3/4, and releases the flatten-layer output of every sample: fixed-point encoded (m, n)
    and randomized (UER by default, ε = 0.5, α = 10). Files go to OUT/client_XXX.h5 with
    OUT/manifest.json. A rerun resumes: finished clients are kept (never randomized twice) and only
    missing ones are done.

    \b
    Examples:
      ldpfl export --dataset mnist5k --clients 2 --epochs 1 --out runs/mnist5k
      ldpfl export --dataset fashion-mnist --clients 10 --out runs/fmnist --clients-parallel 2
      ldpfl export --dataset fashion-mnist --clients 10 --out runs/fmnist --ray-address auto
      ldpfl export --extractor none --mechanism pdpm --param safe_range_length=2
      ldpfl export --release label --mechanism krr --epsilon 2 --out runs/mnist5k-label
      ldpfl export --cnn-epsilon 4 --cnn-delta 1e-5 --epochs 5 --out runs/mnist5k-dp
      ldpfl export --release bottleneck:16 --mechanism piecewise --epsilon 5 --out runs/mnist5k-bn16
      ldpfl export --dataset fashion-mnist --extractor scatter --scatter-j 2 --scatter-l 8 --local-only
      ldpfl export --from-models runs/mnist5k --release scores --mechanism duchi --epsilon 2 \
                   --out runs/mnist5k-scores

    \b
    Your own data (--data; formats in data/README.md), one silo at a time with a shared plan
    (ldpfl plan; walkthrough in docs/cross-silo.md):
      ldpfl export --data scans/ --image-size 28 28 --color-mode grayscale --clients 4 --out runs/scans
      ldpfl export --plan plan.json --data scans.npz --client-index 0 --clients 3 --out export_a
      ldpfl export --plan plan.json --data records.csv --label-column diagnosis --client-index 2 --clients 3
    """
    values = given_values(click.get_current_context())  # the rest keeps the config's defaults
    for name in ("out", "as_json", "quiet"):
        values.pop(name, None)
    plan, name, data = values.pop("plan_path", None), values.pop("name", None), values.get("data")
    if name is not None:  # --name is the API's `dataset` with --data: named as the flag here
        check_name(name, "name")  # a file name is made of it (runs/<name>), never a path (issue 24)
        require_own_data(["name"], data)
    if data is not None and "dataset" in values:
        raise click.BadParameter("--dataset and --data exclude each other", param_hint="--dataset")
    if data is not None and plan is None:  # the API's default name, checked as the flag that sets it
        name = check_name(name or default_name(data), "name")
    if "no_augment" in values:
        values["augment"] = not values.pop("no_augment")
    fields: dict[str, Any] = {**values, **({"dataset": name} if name is not None else {})}
    if mechanism_params := mechanism_fields(fields):
        fields["mechanism_params"] = mechanism_params
    if data_options := reader_fields(fields, keep_auto=data is None):  # without --data: refused by the API
        fields["data_options"] = data_options
    result = export(out=out, plan=plan, progress_bars=not quiet, **fields)  # out None: the API's runs/<dataset>
    for note in result.notes:
        click.echo(f"warning: {note}", err=True)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(export_text(result))
