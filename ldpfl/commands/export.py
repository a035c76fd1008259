"""``ldpfl export``: stage 1 of LDPFL as one command (Algorithm 1 lines 1-10).

A thin click command: it maps the options given to the fields of the API's ``ldpfl.export``
(``ldpfl.api.export_job``), which applies the config's defaults, the plan and the source run's checks. At import
time it loads click and numpy-level modules only (the registries); TensorFlow loads when a CNN trains.
"""

from __future__ import annotations

from typing import Any

import click

from ldpfl.api.export_job import export
from ldpfl.api.text import export_text
from ldpfl.commands.export_options import (
    mechanism_fields,
    mechanism_options,
    option,
    own_data_options,
    reader_fields,
    release_options,
    scatter_options,
)
from ldpfl.contract.datasets import dataset_names
from ldpfl.contract.jsonout import echo_json
from ldpfl.contract.names import check_name
from ldpfl.stage1_features.export.config import exportable_mechanisms, require_own_data
from ldpfl.stage1_features.export.partition import PARTITION_KINDS
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.keras_backend import DEVICES, KERAS_BACKENDS
from ldpfl.stage1_features.own_data.load import default_name

from .options import given_values


@click.command("export", context_settings={"max_content_width": 100})
@option("--dataset", type=click.Choice(dataset_names()), show_default=True)
@option("--data-dir", type=click.Path(file_okay=False, path_type=str))
@option("--clients", type=int, show_default=True)
@option("--max-clients", type=int)
@option("--partition", type=click.Choice(PARTITION_KINDS), show_default=True)
@option("--beta", type=float, show_default=True)
@option("--unb", type=float, show_default=True)
@option("--shards-per-client", type=int, show_default=True)
@option("--test-fraction", type=float, show_default=True)
@option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), show_default=True)
@scatter_options
@option("--epochs", type=int, show_default=True)
@option("--batch-size", type=int, show_default=True)
@click.option("--no-augment", is_flag=True, help="Train without rotation/shift augmentation.")
@option("--mechanism", type=click.Choice(exportable_mechanisms()), show_default=True)
@mechanism_options
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Another mechanism parameter, e.g. sensitivity_rule=reference-code or safe_range_length=2 "
                   "(repeatable; see 'ldpfl mechanisms').")
@option("--label-epsilon", type=float)
@option("--limit", type=int)
@option("--save-models", is_flag=True)
@option("--store-input-density", is_flag=True)
@option("--clients-parallel", type=int, show_default=True)
@option("--ray-address", metavar="ADDRESS")
@option("--ray-cpus-per-client", type=int, show_default=True)
@option("--ray-gpus-per-client", type=float, show_default=True)
@option("--keras-backend", type=click.Choice(list(KERAS_BACKENDS)))
@option("--device", type=click.Choice(list(DEVICES)), show_default=True)
@option("--cnn-epsilon", type=float)
@option("--cnn-delta", type=float)
@option("--local-only", is_flag=True)
@option("--overwrite", is_flag=True)
@option("--seed", type=int)
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
    del options  # read with their sources: only the options given are passed, the rest keeps the config's defaults
    values = given_values(click.get_current_context())
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
