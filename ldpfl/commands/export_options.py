"""The options ``ldpfl export`` and ``ldpfl plan`` share: mechanism parameters and a silo's own data (issue 16).

``mechanism_parameters`` merges the IV-D defaults, the dedicated options and every ``--param``.
``own_data_options`` adds ``--data`` and its reader options, ``--client-index`` and ``--plan`` to
``ldpfl export``; :func:`silo_config` turns them into the ``ExportConfig`` fields. With ``--plan``,
every setting the plan fixes (dataset name, extractor, mechanism, its parameters, release) is taken from
it; one given on the command line must agree with it, or the export stops before writing anything
(exit code 2, one line naming each contradicting option).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ldpfl.api.export_job import with_plan
from ldpfl.contract.datasets import paper_extractors
from ldpfl.contract.names import check_name
from ldpfl.contract.release_point import FLATTEN, RELEASES
from ldpfl.mechanisms.registry import mechanism_class, mechanism_names
from ldpfl.stage1_features.export.config import DEFAULT_MECHANISM_PARAMS, require_own_data
from ldpfl.stage1_features.export.release import takes_text
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.own_data.formats import COLOR_MODES, SCALES
from ldpfl.stage1_features.own_data.load import default_name

SILO_OPTIONS = ("data", "name", "label_column", "image_size", "color_mode", "x_key", "y_key", "scale",
                "client_index", "plan_path")
_READER_OPTIONS = ("label_column", "image_size", "color_mode", "x_key", "y_key", "scale")
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


def scatter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--scatter-j`` and ``--scatter-l`` (the ``scatter`` extractor's J and L) to a click command."""
    defaults = cnn.option_defaults()
    command = click.option("--scatter-l", "scatter_l", type=int, default=defaults["scatter_l"], show_default=True,
                           help="--extractor scatter: L, the wavelet orientations (Tramèr and Boneh: 8).")(command)
    return click.option("--scatter-j", "scatter_j", type=int, default=defaults["scatter_j"], show_default=True,
                        help="--extractor scatter: J, the scales; image sides must be divisible by 2^J (Tramèr "
                             "and Boneh: 2).")(command)


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


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → (key, int | float | str); dashes in KEY become underscores."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key or not key.isidentifier():
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--param")
    raw = raw.strip()
    for convert in (int, float):
        try:
            return key, convert(raw)
        except ValueError:
            continue
    return key, raw


def mechanism_parameters(epsilon: float | None, alpha: float | None, integer_bits: int | None,
                         fraction_bits: int | None, extra: tuple[str, ...]) -> dict[str, Any]:
    """IV-D defaults, overridden by the dedicated options, plus every ``--param``."""
    params = dict(DEFAULT_MECHANISM_PARAMS)
    for key, value in (("epsilon", epsilon), ("alpha", alpha), ("integer_bits", integer_bits),
                       ("fraction_bits", fraction_bits)):
        if value is not None:
            params[key] = value
    for text in extra:
        key, value = parse_param(text)
        if key in DEDICATED:
            raise click.BadParameter(f"use {DEDICATED[key]} for {key}", param_hint="--param")
        params[key] = value
    return params


def data_source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--data``, ``--name`` and the reader options (``ldpfl.stage1_features.own_data``) to a click command."""
    options = [
        click.option("--data", type=click.Path(exists=True, path_type=str), default=None,
                     help="Your own data instead of --dataset: an image folder (one subfolder per class), .npz, "
                          ".h5/.hdf5, .csv/.tsv or .parquet (see data/README.md)."),
        click.option("--name", default=None,
                     help="With --data: the dataset name the files record  [default: the file or folder name, "
                          "or the plan's]"),
        click.option("--label-column", default=None, help="Table: the label column (default: label, labels, y, "
                                                            "target or class)."),
        click.option("--image-size", type=(click.IntRange(1, 16384), click.IntRange(1, 16384)), default=None,
                     metavar="H W", help="Image folder: resize every image to H×W (needed for mixed sizes)."),
        click.option("--color-mode", type=click.Choice(COLOR_MODES), default=None,
                     help="Image folder: channels  [default: grayscale when every image is, else rgb]"),
        click.option("--x-key", default=None, help=".npz/HDF5: the inputs' array (default: x, X, images or "
                                                  "features)."),
        click.option("--y-key", default=None, help=".npz/HDF5: the labels' array (default: y, Y or labels)."),
        click.option("--scale", type=click.Choice(SCALES), default="auto", show_default=True,
                     help="auto: pixels / 255, tables min-max per column, other arrays as given; minmax; none."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def own_data_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the data options, ``--client-index`` and ``--plan`` to ``ldpfl export``."""
    command = click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                           default=None,
                           help="A shared plan (ldpfl plan): take extractor, mechanism and its parameters from "
                                "it; refuse settings or data that contradict it.")(command)
    command = click.option("--client-index", type=click.IntRange(min=0), default=None,
                           help="One silo, one file: the whole --data is client i of --clients N (no "
                                "partitioning); writes client_{i:03d}.h5.")(command)
    return data_source_options(command)


def data_options(silo: dict[str, Any]) -> dict[str, Any]:
    """Return ``load_own_data``'s options among the parsed command-line values (unset ones left out)."""
    options = {k: silo[k] for k in _READER_OPTIONS if silo.get(k) is not None}
    if options.get("scale") == "auto":
        del options["scale"]
    return options


def explicit_parameters(epsilon: float | None, alpha: float | None, integer_bits: int | None,
                        fraction_bits: int | None, params: tuple[str, ...]) -> dict[str, Any]:
    """Return the mechanism parameters given on the command line (not the IV-D defaults)."""
    given = {k: v for k, v in (("epsilon", epsilon), ("alpha", alpha), ("integer_bits", integer_bits),
                               ("fraction_bits", fraction_bits)) if v is not None}
    given.update(parse_param(text) for text in params)
    return given


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                 click.core.ParameterSource.DEFAULT_MAP)


def silo_config(ctx: click.Context, config: Any, silo: dict[str, Any], explicit: dict[str, Any]) -> Any:
    """Return ``config`` (an ``ExportConfig``) with the own-data, single-silo and plan settings of ``silo``.

    Parameters
    ----------
    ctx : click.Context
        The export command's context (which options were given explicitly).
    config : ExportConfig
        The config built from the other options.
    silo : dict
        The values of ``SILO_OPTIONS``.
    explicit : dict
        The mechanism parameters given on the command line (:func:`explicit_parameters`).

    Raises
    ------
    click.BadParameter
        ``--dataset`` with ``--data``.
    ParameterError
        A data option without ``--data`` (``require_own_data``).
    ValueError
        A plan that cannot be read, or settings that contradict it (``PlanMismatch``, naming each).
    """
    data = silo.get("data")
    if silo.get("name") is not None:
        check_name(silo["name"], "name")  # a file name is made of it (runs/<name>), never a path (issue 24)
    if data is None:  # the config's own check, with the flags given
        require_own_data([{"plan_path": "plan"}.get(name, name) for name in ("plan_path", "client_index", "name",
                                                                             *_READER_OPTIONS)
                          if silo.get(name) is not None and (name != "scale" or _given(ctx, "scale"))], data)
        return config
    if _given(ctx, "dataset"):
        raise click.BadParameter("--dataset and --data exclude each other", param_hint="--dataset")
    changes: dict[str, Any] = {"data": str(data), "data_options": data_options(silo),
                               "client_index": silo.get("client_index")}
    plan_path = silo.get("plan_path")
    if plan_path is None:
        changes["dataset"] = check_name(silo.get("name") or default_name(data), "name")  # before anything is made
        return dataclasses.replace(config, **changes)
    given: dict[str, Any] = {"dataset": silo.get("name"), "mechanism_params": explicit or None}
    given.update({key: getattr(config, key) for key in ("extractor", "mechanism", "release", "label_epsilon",
                                                         *cnn.option_defaults()) if _given(ctx, key)})
    return with_plan(dataclasses.replace(config, **changes), plan_path, given)  # the API's check, once
