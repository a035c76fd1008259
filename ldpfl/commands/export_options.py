"""The flags ``ldpfl export`` and ``ldpfl plan`` share, and their mapping onto the API's fields (issue 16).

The mechanism's parameters (``--epsilon`` ... ``--param``), a silo's own data (``--data`` and its reader options,
``--client-index``, ``--plan``) and the release (``--release``, ``--from-models``, ...). Only the options given are
passed: what is left out keeps the config's default, and the API checks the rest (plan, source run, own data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ldpfl.api.field_help import export_help
from ldpfl.mechanisms.registry import mechanism_class, mechanism_names
from ldpfl.stage1_features.export.config import DEFAULT_MECHANISM_PARAMS, ExportConfig
from ldpfl.stage1_features.export.release import release_help
from ldpfl.stage1_features.own_data.formats import COLOR_MODES, SCALES

from .options import field_options, options

READER_OPTIONS = ("label_column", "image_size", "color_mode", "x_key", "y_key", "scale")
DEDICATED = {"epsilon": "--epsilon", "alpha": "--alpha", "integer_bits": "-m", "fraction_bits": "-n"}


def _iv_d(name: str) -> str:
    """Return the ``[default: ...]`` of a mechanism parameter: the config's (LDPFL IV-D)."""
    return f"  [default: {DEFAULT_MECHANISM_PARAMS[name]:g}, IV-D]"


def alpha_help() -> str:
    """Return ``--alpha``'s help: the mechanisms that take α, from the mechanism registry."""
    takers = [n for n in mechanism_names() if "alpha" in mechanism_class(n).parameter_names()]
    return f"α of {'/'.join(takers)}{_iv_d('alpha')}"


option = field_options(ExportConfig, export_help())
"""``click.option`` of an ``ExportConfig`` field: the config's default, the API's text of it."""

scatter_options = options(option("--scatter-j", "scatter_j", type=int, show_default=True),
                          option("--scatter-l", "scatter_l", type=int, show_default=True))

mechanism_options = options(
    click.option("--epsilon", type=float, default=None, help="Nominal privacy budget ε" + _iv_d("epsilon")),
    click.option("--delta", type=float, default=None,
                 help="δ of a mechanism that takes one (gaussian-stats: the whole release's)  [default: the "
                      "mechanism's, 1e-5]"),
    click.option("--alpha", type=float, default=None, help=alpha_help()),
    click.option("-m", "--integer-bits", type=int, default=None, help="m, integer bits" + _iv_d("integer_bits")),
    click.option("-n", "--fraction-bits", type=int, default=None, help="n, fraction bits" + _iv_d("fraction_bits")))

data_source_options = options(
    option("--data", type=click.Path(exists=True, path_type=str)),
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
    option("--client-index", type=click.IntRange(min=0)),
    click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="A shared plan (ldpfl plan): take extractor, mechanism and its parameters from it; refuse "
                      "settings or data that contradict it."))

release_options = options(
    click.option("--release", default="flatten", show_default=True, metavar="flatten|bottleneck:K|scores|label|stats:K",
                 help=release_help()),
    option("--from-models", type=click.Path(exists=True, file_okay=False, path_type=str), metavar="RUN_DIR"),
    option("--keep-clean-test", is_flag=True),
    option("--noise-aware", is_flag=True))


def mechanism_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Pop the mechanism's options from ``values``; return the parameters they give (``mechanism_params``)."""
    params = {key: value for key in (*DEDICATED, "delta") if (value := values.pop(key, None)) is not None}
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
