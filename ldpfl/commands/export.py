"""``ldpfl export``: stage 1 of LDPFL as one command (Algorithm 1 lines 1-10).

A thin click command: it parses and checks options, builds an ``ExportConfig`` and calls the API's
``ldpfl.export`` (``ldpfl.api.export_job``) with it. At import time it loads click and numpy-level modules only
(the registries of datasets, partitions, extractors and mechanisms); TensorFlow loads when a CNN trains.
"""

from __future__ import annotations

from typing import Any

import click

from ldpfl.api.export_job import export
from ldpfl.commands.export_options import (
    alpha_help,
    explicit_parameters,
    extractor_help,
    mechanism_help,
    mechanism_parameters,
    own_data_options,
    scatter_options,
    silo_config,
)
from ldpfl.commands.release import check_from_models, release_options
from ldpfl.contract.datasets import dataset_names
from ldpfl.contract.jsonout import echo_json
from ldpfl.stage1_features.export.config import ExportConfig, exportable_mechanisms
from ldpfl.stage1_features.export.partition import PARTITION_KINDS
from ldpfl.stage1_features.export.plan import describe_privacy
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.keras_backend import DEVICES, KERAS_BACKENDS

MECHANISM_CHOICES = exportable_mechanisms()


def _given_option(name: str) -> bool:
    source = click.get_current_context().get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                 click.core.ParameterSource.DEFAULT_MAP)


def _format_accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print_table(result: Any) -> None:
    click.echo(f"run directory  {result.run_dir}")
    width = (f"r·l = {result.feature_width} bits" if result.feature_format == "packed-bits"
             else f"{result.features} float32 values")
    click.echo(f"dataset {result.dataset}, extractor {result.extractor}, release {result.release} "
               f"({result.features} values per record), mechanism {result.mechanism}, {width} per record")
    click.echo(f"{'client':>6}  {'train':>7}  {'test':>6}  {'local acc':>9}  {'file':<16} status")
    for c in result.clients:
        click.echo(f"{c.index:>6}  {c.rows.get('train', 0):>7}  {c.rows.get('test', 0):>6}  "
                   f"{_format_accuracy(c.local_accuracy):>9}  {c.file:<16} {c.status}")
    click.echo(f"privacy: {describe_privacy(result.privacy)}")
    labels = result.label_release or {"mechanism": "clear"}
    if labels["mechanism"] == "krr":
        click.echo(f"labels: k-RR, exact ε = {labels['epsilon']:.6g} per record (p_keep {labels['p_keep']:.4g}); "
                   "it adds to the features' ε")
    else:
        click.echo("labels: in clear (label ε = inf; --label-epsilon randomizes them)")
    click.echo(f"randomness: {result.privacy.randomness_label}; {len(result.clients)} clients ({result.new} new) in "
               f"{result.seconds:.1f} s; manifest {result.manifest.name}")


@click.command("export", context_settings={"max_content_width": 100})
@click.option("--dataset", type=click.Choice(dataset_names()), default="mnist5k", show_default=True,
              help="Dataset (train and test splits pooled). mnist5k is embedded and needs no download.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Directory holding the dataset files (default: data/<dataset>/).")
@click.option("--clients", type=int, default=2, show_default=True, help="Number of clients N to export.")
@click.option("--max-clients", type=int, default=None,
              help="N_h: cut the pool into this many equal groups (LDPFL IV-B); default --clients.")
@click.option("--partition", type=click.Choice(PARTITION_KINDS), default="iid", show_default=True,
              help="How records are split among clients.")
@click.option("--beta", type=float, default=0.5, show_default=True, help="Dirichlet concentration (dirichlet).")
@click.option("--unb", type=float, default=0.5, show_default=True, help="Fraction of non-IID clients (shards).")
@click.option("--shards-per-client", type=int, default=2, show_default=True, help="Blocks per client (shards).")
@click.option("--test-fraction", type=float, default=0.1, show_default=True,
              help="Each client's hold-out share (IV-C: 10 %).")
@click.option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), default=cnn.AUTO,
              show_default=True,
              help=extractor_help())
@scatter_options
@click.option("--epochs", type=int, default=50, show_default=True,
              help="CNN training epochs (IV-C: 50). CPU runs often use a few.")
@click.option("--batch-size", type=int, default=64, show_default=True, help="CNN batch size (IV-C: 64).")
@click.option("--no-augment", is_flag=True, help="Train without rotation/shift augmentation.")
@click.option("--mechanism", type=click.Choice(MECHANISM_CHOICES), default="uer", show_default=True,
              help=mechanism_help())
@click.option("--epsilon", type=float, default=None, help="Nominal privacy budget ε  [default: 0.5, IV-D]")
@click.option("--alpha", type=float, default=None, help=alpha_help())
@click.option("-m", "--integer-bits", type=int, default=None, help="m, integer bits  [default: 4, IV-D]")
@click.option("-n", "--fraction-bits", type=int, default=None, help="n, fraction bits  [default: 5, IV-D]")
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
@click.option("--clients-parallel", type=int, default=1, show_default=True,
              help="Export this many clients at once, in separate processes. Same partition and randomness "
                   "as sequential; CNN features may differ in float rounding (fewer threads each). One per "
                   "core is fastest for the paper's CNNs (2 cores: 16 % more samples/s than 1 process with 2 "
                   "threads, bench/cnn_training.py).")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="Run each client as a task on a Ray cluster: auto (the cluster started here with ray start), "
                   "local (a Ray on this machine for this run) or host:port. The same files as a local run; this "
                   "process writes them (docs/cluster.md).")
@click.option("--ray-cpus-per-client", type=int, default=1, show_default=True,
              help="--ray-address: CPUs each client's task declares (and its TensorFlow threads).")
@click.option("--ray-gpus-per-client", type=float, default=0.0, show_default=True,
              help="--ray-address: GPUs each client's task declares.")
@click.option("--keras-backend", type=click.Choice(list(KERAS_BACKENDS)), default=None,
              help="Keras 3 backend that trains and runs the CNNs  [default: tensorflow; jax under --cnn-epsilon, "
                   "which needs it]. TensorFlow is the fastest on CPU here (torch 16-23 % and jax 52-57 % slower on "
                   "the Fig. 4 CNN, bench/RESULTS.md); same model, same files.")
@click.option("--device", type=click.Choice(list(DEVICES)), default="auto", show_default=True,
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
def export_command(dataset: str, data_dir: str | None, clients: int, max_clients: int | None, partition: str,
                   beta: float, unb: float, shards_per_client: int, test_fraction: float, extractor: str,
                   scatter_j: int, scatter_l: int, epochs: int, batch_size: int, no_augment: bool, mechanism: str,
                   epsilon: float | None, alpha: float | None, integer_bits: int | None, fraction_bits: int | None,
                   params: tuple[str, ...],
                   label_epsilon: float | None, limit: int | None, save_models: bool, store_input_density: bool,
                   clients_parallel: int, ray_address: str | None, ray_cpus_per_client: int,
                   ray_gpus_per_client: float, keras_backend: str | None, device: str, cnn_epsilon: float | None,
                   cnn_delta: float | None, local_only: bool, overwrite: bool, seed: int | None, out: str | None,
                   as_json: bool, quiet: bool,
                   release: str, from_models: str | None, keep_clean_test: bool, noise_aware: bool,
                   **silo: Any) -> None:
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
    if local_only and not _given_option("mechanism"):
        mechanism = "none"  # local-only files hold the clean features
    config = ExportConfig(
        dataset=dataset, data_dir=data_dir, clients=clients, max_clients=max_clients, partition=partition,
        beta=beta, unb=unb, shards_per_client=shards_per_client, test_fraction=test_fraction, extractor=extractor,
        scatter_j=scatter_j, scatter_l=scatter_l, local_only=local_only,
        epochs=epochs, batch_size=batch_size, augment=not no_augment, mechanism=mechanism,
        mechanism_params=mechanism_parameters(epsilon, alpha, integer_bits, fraction_bits, params), limit=limit,
        save_models=save_models, store_input_density=store_input_density, clients_parallel=clients_parallel,
        keras_backend=keras_backend, device=device, overwrite=overwrite, seed=seed, release=release,
        from_models=from_models,
        keep_clean_test=keep_clean_test, noise_aware=noise_aware, label_epsilon=label_epsilon,
        cnn_epsilon=cnn_epsilon, cnn_delta=cnn_delta, ray_address=ray_address,
        ray_cpus_per_client=ray_cpus_per_client, ray_gpus_per_client=ray_gpus_per_client)
    check_from_models(click.get_current_context(), from_models, out)
    config = silo_config(click.get_current_context(), config, silo,  # --data, --client-index, --plan (issue 16)
                         explicit_parameters(epsilon, alpha, integer_bits, fraction_bits, params))
    result = export(config, out=out, progress_bars=not quiet)  # out None: the API's runs/<dataset>
    for note in result.notes:
        click.echo(f"warning: {note}", err=True)
    if as_json:
        echo_json(result.to_dict())
    else:
        _print_table(result)
