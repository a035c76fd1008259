"""The flags ``ldpfl export`` and ``ldpfl plan`` share, and their mapping onto the API's fields (issue 16).

The mechanism's parameters (``--epsilon`` ... ``--param``), a silo's own data (``--data`` and its reader options,
``--client-index``, ``--plan``) and the release (``--release``, ``--from-models``, ...). Only the options given are
passed: what is left out keeps the config's default, and the API checks the rest (plan, source run, own data).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ldpfl.contract.datasets import paper_extractors
from ldpfl.contract.release_point import FLATTEN, RELEASES
from ldpfl.mechanisms.registry import mechanism_class, mechanism_names
from ldpfl.stage1_features.export.release import release_help, takes_text
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.own_data.formats import COLOR_MODES, SCALES

READER_OPTIONS = ("label_column", "image_size", "color_mode", "x_key", "y_key", "scale")
DEDICATED = {"epsilon": "--epsilon", "alpha": "--alpha", "integer_bits": "-m", "fraction_bits": "-n"}


def extractor_help() -> str:
    """Return ``--extractor``'s help; ``auto``'s choice per dataset comes from the dataset registry."""
    groups = paper_extractors()
    paper = ", ".join(f"{extractor} for {'/'.join(names)}" for extractor, names in groups.items()
                      if extractor != cnn.NO_EXTRACTOR)
    return ("Feature extractor: mnist-cnn (Fig. 3), cifar-cnn (Fig. 4), none (raw inputs), scatter (weight-free "
            "wavelet scattering + GroupNorm, Tramèr and Boneh 2021: the same for every silo, learned from no record). "
            f"auto: the paper's choice ({paper}, none otherwise); under --cnn-epsilon, dp-cnn wherever it would be a "
            "CNN. DP-SGD variants: mnist-cnn-gn, cifar-cnn-gn (GroupNorm for BatchNorm) and dp-cnn (small tanh net), "
            "each a labelled deviation from the paper.")


def mechanism_help() -> str:
    """Return ``ldpfl export --mechanism``'s help; what each release takes comes from the registries."""
    takes: dict[str, list[str]] = {}
    for name, kind in RELEASES.items():
        if name != FLATTEN:
            takes.setdefault(takes_text(kind.domains), []).append(kind.usage)
    others = ", ".join(f"{' and '.join(kinds)} {'take' if len(kinds) > 1 else 'takes'} {text}"
                       for text, kinds in takes.items())
    return ("Randomization: a bit mechanism over the fixed-point encoding, a float mechanism over the features, "
            f"or none (NOT private). --release {others}.")


def alpha_help() -> str:
    """Return ``--alpha``'s help: the mechanisms that take α, from the mechanism registry."""
    takers = [n for n in mechanism_names() if "alpha" in mechanism_class(n).parameter_names()]
    return f"α of {'/'.join(takers)}  [default: 10, IV-D]"


def options(*declared: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """Return a decorator adding ``declared`` click options to a command, in the order given."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(declared):
            command = option(command)
        return command
    return decorate


scatter_options = options(
    click.option("--scatter-j", "scatter_j", type=int, default=cnn.option_defaults()["scatter_j"], show_default=True,
                 help="--extractor scatter: J, the scales; image sides must be divisible by 2^J (Tramèr and Boneh: "
                      "2)."),
    click.option("--scatter-l", "scatter_l", type=int, default=cnn.option_defaults()["scatter_l"], show_default=True,
                 help="--extractor scatter: L, the wavelet orientations (Tramèr and Boneh: 8)."))

mechanism_options = options(
    click.option("--epsilon", type=float, default=None, help="Nominal privacy budget ε  [default: 0.5, IV-D]"),
    click.option("--alpha", type=float, default=None, help=alpha_help()),
    click.option("-m", "--integer-bits", type=int, default=None, help="m, integer bits  [default: 4, IV-D]"),
    click.option("-n", "--fraction-bits", type=int, default=None, help="n, fraction bits  [default: 5, IV-D]"))

data_source_options = options(
    click.option("--data", type=click.Path(exists=True, path_type=str), default=None,
                 help="Your own data instead of --dataset: an image folder (one subfolder per class), .npz, "
                      ".h5/.hdf5, .csv/.tsv or .parquet (see data/README.md)."),
    click.option("--name", default=None,
                 help="With --data: the dataset name the files record  [default: the file or folder name, or the "
                      "plan's]"),
    click.option("--label-column", default=None,
                 help="Table: the label column (default: label, labels, y, target or class)."),
    click.option("--image-size", type=(click.IntRange(1, 16384), click.IntRange(1, 16384)), default=None,
                 metavar="H W", help="Image folder: resize every image to H×W (needed for mixed sizes)."),
    click.option("--color-mode", type=click.Choice(COLOR_MODES), default=None,
                 help="Image folder: channels  [default: grayscale when every image is, else rgb]"),
    click.option("--x-key", default=None, help=".npz/HDF5: the inputs' array (default: x, X, images or features)."),
    click.option("--y-key", default=None, help=".npz/HDF5: the labels' array (default: y, Y or labels)."),
    click.option("--scale", type=click.Choice(SCALES), default="auto", show_default=True,
                 help="auto: pixels / 255, tables min-max per column, other arrays as given; minmax; none."))

own_data_options = options(
    data_source_options,
    click.option("--client-index", type=click.IntRange(min=0), default=None,
                 help="One silo, one file: the whole --data is client i of --clients N (no partitioning); writes "
                      "client_{i:03d}.h5."),
    click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="A shared plan (ldpfl plan): take extractor, mechanism and its parameters from it; refuse "
                      "settings or data that contradict it."))

release_options = options(
    click.option("--release", default="flatten", show_default=True, metavar="flatten|bottleneck:K|scores|label",
                 help=release_help()),
    click.option("--from-models", type=click.Path(exists=True, file_okay=False, path_type=str), default=None,
                 metavar="RUN_DIR",
                 help="Release the records of an earlier export RUN_DIR again, from its saved client CNNs (exported "
                      "with --save-models), its partition and hold-out splits, instead of training. Its data "
                      "settings apply (leave --dataset, --clients, --epochs, ... out). A second release spends the "
                      "records' privacy again: the manifest records every release and 'ldpfl inspect' shows the "
                      "total epsilon per record. A run exported before hold-out splits were stored needs the --seed "
                      "it was made with. Needs --out."),
    click.option("--keep-clean-test", is_flag=True,
                 help="Also write client_NNN.local.h5 per client: its UNRANDOMIZED test split of the release "
                      "(mechanism none, marked local_only), for 'ldpfl federate --eval-clean'. A silo predicting on "
                      "its own records releases nothing; these files must never leave the client."),
    click.option("--noise-aware", is_flag=True,
                 help="bottleneck:K only: train the CNN with Gaussian noise of the mechanism's per-coordinate "
                      "variance after the bottleneck layer (training only, never released), so the layer learns "
                      "codes that survive the noise. Uses only the client's own data: costs no privacy."))


def given_values(ctx: click.Context) -> dict[str, Any]:
    """Return the options given on the command line (not left at their defaults), by parameter name."""
    defaults = (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP)
    return {name: value for name, value in ctx.params.items() if ctx.get_parameter_source(name) not in defaults}


def mechanism_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Pop the mechanism's options from ``values``; return the parameters they give (``mechanism_params``)."""
    params = {key: value for key in DEDICATED if (value := values.pop(key, None)) is not None}
    for text in values.pop("params", ()):
        key, sep, raw = text.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not key.isidentifier():
            raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--param")
        if key in DEDICATED:
            raise click.BadParameter(f"use {DEDICATED[key]} for {key}", param_hint="--param")
        params[key] = _number(raw.strip())
    return params


def _number(raw: str) -> int | float | str:
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            continue
    return raw


def reader_fields(values: dict[str, Any], *, keep_auto: bool = False) -> dict[str, Any]:
    """Pop the reader options from ``values``; return ``data_options`` (``--scale auto``, the reader's, left out)."""
    found = {key: value for key in READER_OPTIONS if (value := values.pop(key, None)) is not None}
    if found.get("scale") == "auto" and not keep_auto:
        del found["scale"]
    return found
