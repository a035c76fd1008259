"""The command-line side of own data and the shared plan (issue 16): export's data options and ``ldpfl plan``.

``own_data_options`` adds ``--data`` and its reader options, ``--client-index`` and ``--plan`` to
``ldpfl export``; :func:`silo_config` turns them into the ``ExportConfig`` fields. With ``--plan``,
every setting the plan fixes (dataset name, extractor, mechanism, its parameters, release) is taken from
it; one given on the command line must agree with it, or the export stops before writing anything
(exit code 2, one line naming each contradicting option).

``ldpfl plan`` resolves an export's settings over a sample silo's data, exactly as the silos' exports
will (``export_plan.make_plan``), and writes the plan JSON (``ldpfl.contract.plan``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ldpfl.contract.names import check_name
from ldpfl.stage1_features import cnn

SILO_OPTIONS = ("data", "name", "label_column", "image_size", "color_mode", "x_key", "y_key", "scale",
                "client_index", "plan_path")
_READER_OPTIONS = ("label_column", "image_size", "color_mode", "x_key", "y_key", "scale")


def data_source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--data``, ``--name`` and the reader options (``ldpfl.stage1_features.own_data``) to a click command."""
    from ldpfl.stage1_features.own_data import COLOR_MODES, SCALES

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
    from ldpfl.export_cli import parse_param

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
        ``--dataset`` with ``--data``, or a data option without ``--data``.
    ValueError
        A plan that cannot be read, or settings that contradict it (``PlanMismatch``, naming each).
    """
    from ldpfl.contract.plan import read_plan
    from ldpfl.stage1_features.own_data import default_name
    from ldpfl.stage1_features.silo import apply_plan

    data = silo.get("data")
    if silo.get("name") is not None:
        check_name(silo["name"], "name")  # a file name is made of it (runs/<name>), never a path (issue 24)
    if data is None:
        for name in ("plan_path", "client_index", "name", *_READER_OPTIONS):
            if silo.get(name) is not None and (name != "scale" or _given(ctx, "scale")):
                flag = "--plan" if name == "plan_path" else "--" + name.replace("_", "-")
                raise click.BadParameter("applies to your own data: add --data PATH", param_hint=flag)
        return config
    if _given(ctx, "dataset"):
        raise click.BadParameter("--dataset and --data exclude each other", param_hint="--dataset")
    changes: dict[str, Any] = {"data": str(data), "data_options": data_options(silo),
                               "client_index": silo.get("client_index")}
    plan_path = silo.get("plan_path")
    if plan_path is None:
        changes["dataset"] = check_name(silo.get("name") or default_name(data), "name")  # before anything is made
        return dataclasses.replace(config, **changes)
    plan = read_plan(plan_path)
    given: dict[str, Any] = {}
    if silo.get("name") is not None:
        given["dataset"] = silo["name"]
    if _given(ctx, "extractor") and config.extractor != cnn.AUTO:
        given["extractor"] = config.extractor
    if _given(ctx, "mechanism"):
        given["mechanism"] = config.mechanism
    if _given(ctx, "release"):
        given["release"] = config.release
    if explicit:
        given["mechanism_parameters"] = explicit
    if _given(ctx, "label_epsilon"):
        given["label_epsilon"] = config.label_epsilon
    return apply_plan(dataclasses.replace(config, **changes), plan, given, plan_path)


# ---------------------------------------------------------------------------------------------------
# ldpfl plan


def _mechanism_choices() -> list[str]:
    from ldpfl.stage1_features.export_config import exportable_mechanisms

    return exportable_mechanisms()


@click.command("plan", context_settings={"max_content_width": 100})
@data_source_options
@click.option("--classes", default=None, metavar="A,B,...",
              help="The class list, in order  [default: the sample's classes: sorted labels or folder names]")
@click.option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), default=cnn.AUTO,
              show_default=True,
              help="Feature extractor. auto: cifar-cnn for images of at least 8×8, none (raw inputs) otherwise.")
@click.option("--release", default="flatten", show_default=True,
              help="Where the released features are taken (see ldpfl export --help).")
@click.option("--mechanism", type=click.Choice(_mechanism_choices()), default="uer", show_default=True,
              help="Randomization every silo applies.")
@click.option("--epsilon", type=float, default=None, help="Nominal privacy budget ε  [default: 0.5, IV-D]")
@click.option("--alpha", type=float, default=None, help="α of uer/moue  [default: 10, IV-D]")
@click.option("-m", "--integer-bits", type=int, default=None, help="m, integer bits  [default: 4, IV-D]")
@click.option("-n", "--fraction-bits", type=int, default=None, help="n, fraction bits  [default: 5, IV-D]")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Another mechanism parameter.")
@click.option("--label-epsilon", type=float, default=None,
              help="Every silo releases its labels by k-ary randomized response at this ε  [default: clear labels]")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("plan.json"),
              show_default=True, help="Where to write the plan.")
@click.option("--overwrite", is_flag=True, help="Replace an existing plan file.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(data: str | None, name: str | None, label_column: str | None, image_size: tuple[int, int] | None,
                 color_mode: str | None, x_key: str | None, y_key: str | None, scale: str, classes: str | None,
                 extractor: str, release: str, mechanism: str, epsilon: float | None, alpha: float | None,
                 integer_bits: int | None, fraction_bits: int | None, params: tuple[str, ...],
                 label_epsilon: float | None, out: Path,
                 overwrite: bool, as_json: bool) -> None:
    """Write the shared plan that every silo of a cross-silo federation exports with.

    The plan fixes what the silos' files must share: the dataset name, the class list, the extractor
    and its input shape, the release point, the mechanism with all its parameters and the encoding
    (m, n). Input shape and classes come from a sample silo's --data. Each silo then runs
    'ldpfl export --plan plan.json --data ITS_DATA --client-index i --clients N'. See docs/cross-silo.md.

    \b
    Examples:
      ldpfl plan --data silo_a/images --name scans --extractor cifar-cnn --epsilon 1 --out plan.json
      ldpfl plan --data records.csv --label-column diagnosis --extractor none --mechanism pdpm \\
                 --param safe_range_length=2
    """
    from ldpfl.api.plan_job import plan as make_shared_plan
    from ldpfl.contract.jsonout import echo_json
    from ldpfl.export_cli import mechanism_parameters
    from ldpfl.stage1_features.export_plan import describe_privacy

    if data is None:
        raise click.BadParameter("a plan is made over a sample silo's data: pass --data PATH", param_hint="--data")
    if name is not None:
        check_name(name, "name")
    from ldpfl.contract.write_targets import check_write_target

    check_write_target(out, "out", [data])  # never onto the sample data or a run's artifact (issue 24)
    if out.exists() and not overwrite:
        raise click.BadParameter(f"{out} exists; pass --overwrite to replace it", param_hint="--out")
    class_list = None
    if classes is not None:
        class_list = [c.strip() for c in classes.split(",")]
    options = data_options({"label_column": label_column, "image_size": image_size, "color_mode": color_mode,
                            "x_key": x_key, "y_key": y_key, "scale": scale})
    made = make_shared_plan(data, out=out, overwrite=overwrite, dataset=name, classes=class_list, extractor=extractor,
                            release=release, mechanism=mechanism, label_epsilon=label_epsilon, data_options=options,
                            mechanism_params=mechanism_parameters(epsilon, alpha, integer_bits, fraction_bits, params))
    plan = made.plan
    if as_json:
        echo_json(made.to_dict())
        return
    click.echo(f"plan {out}  {plan.fingerprint}")
    click.echo(f"dataset {plan.dataset}: {plan.num_classes} classes ({', '.join(plan.classes)}), input shape "
               f"{plan.input_shape}")
    width = (f"r·l = {plan.feature_width} bits" if plan.mechanism.encoding is not None
             else f"{plan.features} float32 values")
    click.echo(f"extractor {plan.extractor} (r = {plan.features}), release {plan.release}, mechanism "
               f"{plan.mechanism.name}, {width} per record")
    click.echo(f"privacy: {describe_privacy(made.privacy)}")
