"""The command-line side of release points and re-releases: ``--release``, ``--from-models``, ``--keep-clean-test``.

``release_options`` adds the options to ``ldpfl export``; :func:`check_from_models` refuses data
options that contradict the source run of ``--from-models`` (its records, so its settings, apply).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ldpfl.api.export_job import check_from_models as check_from_models_of_api
from ldpfl.stage1_features.export.release import release_help

FROM_MODELS_HELP = (
    "Release the records of an earlier export RUN_DIR again, from its saved client CNNs (exported with "
    "--save-models), its partition and hold-out splits, instead of training. Its data settings apply (leave "
    "--dataset, --clients, --epochs, ... out). A second release spends the records' privacy again: the manifest "
    "records every release and 'ldpfl inspect' shows the total epsilon per record. A run exported before "
    "hold-out splits were stored needs the --seed it was made with. Needs --out.")
KEEP_CLEAN_HELP = (
    "Also write client_NNN.local.h5 per client: its UNRANDOMIZED test split of the release (mechanism none, "
    "marked local_only), for 'ldpfl federate --eval-clean'. A silo predicting on its own records releases "
    "nothing; these files must never leave the client.")
NOISE_AWARE_HELP = (
    "bottleneck:K only: train the CNN with Gaussian noise of the mechanism's per-coordinate variance after the "
    "bottleneck layer (training only, never released), so the layer learns codes that survive the noise. Uses "
    "only the client's own data: costs no privacy.")

# ``ldpfl export`` parameter -> ExportConfig field it sets (the data settings a source run fixes)
SOURCE_OPTIONS = {"dataset": "dataset", "clients": "clients", "max_clients": "max_clients", "partition": "partition",
                  "beta": "beta", "unb": "unb", "shards_per_client": "shards_per_client",
                  "test_fraction": "test_fraction", "extractor": "extractor", "epochs": "epochs",
                  "batch_size": "batch_size", "no_augment": "augment", "limit": "limit"}


def release_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--release``, ``--from-models``, ``--keep-clean-test`` and ``--noise-aware`` to a click command."""
    options = [
        click.option("--release", default="flatten", show_default=True, metavar="flatten|bottleneck:K|scores|label",
                     help=release_help()),
        click.option("--from-models", type=click.Path(exists=True, file_okay=False, path_type=str), default=None,
                     metavar="RUN_DIR", help=FROM_MODELS_HELP),
        click.option("--keep-clean-test", is_flag=True, help=KEEP_CLEAN_HELP),
        click.option("--noise-aware", is_flag=True, help=NOISE_AWARE_HELP),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                 click.core.ParameterSource.DEFAULT_MAP)


def check_from_models(ctx: click.Context, from_models: str | None, out: str | Path | None) -> None:
    """Refuse ``--from-models`` without ``--out``, or with data options that contradict the source run.

    The checks are the API's (``ldpfl.api.export_job.check_from_models``); this maps the options given to its
    settings (``SOURCE_OPTIONS``).
    """
    given = {}
    for param, field in SOURCE_OPTIONS.items():
        if _given(ctx, param):
            value = ctx.params[param]
            given[field] = (not value) if param == "no_augment" else value
    check_from_models_of_api(from_models, out, given)
