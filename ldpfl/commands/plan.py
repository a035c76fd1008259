"""``ldpfl plan``: the shared plan every silo of a cross-silo run exports with (issue 16).

It resolves an export's settings over a sample silo's data, exactly as the silos' exports will
(``export.plan.make_plan``), and writes the plan JSON (``ldpfl.contract.plan``).
"""

from __future__ import annotations

from pathlib import Path

import click

from ldpfl.api.plan_job import plan as make_shared_plan
from ldpfl.commands.export_options import (
    alpha_help,
    data_options,
    data_source_options,
    mechanism_parameters,
    scatter_options,
)
from ldpfl.contract.jsonout import echo_json
from ldpfl.contract.names import check_name
from ldpfl.stage1_features.export.config import exportable_mechanisms
from ldpfl.stage1_features.export.plan import describe_privacy
from ldpfl.stage1_features.models import cnn


def _mechanism_choices() -> list[str]:
    return exportable_mechanisms()


@click.command("plan", context_settings={"max_content_width": 100})
@data_source_options
@click.option("--classes", default=None, metavar="A,B,...",
              help="The class list, in order  [default: the sample's classes: sorted labels or folder names]")
@click.option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), default=cnn.AUTO,
              show_default=True,
              help="Feature extractor. auto: cifar-cnn for images of at least 8×8, none (raw inputs) otherwise. "
                   "scatter: weight-free wavelet scattering + GroupNorm (Tramèr and Boneh 2021), with J and L.")
@scatter_options
@click.option("--release", default="flatten", show_default=True,
              help="Where the released features are taken (see ldpfl export --help).")
@click.option("--mechanism", type=click.Choice(_mechanism_choices()), default="uer", show_default=True,
              help="Randomization every silo applies.")
@click.option("--epsilon", type=float, default=None, help="Nominal privacy budget ε  [default: 0.5, IV-D]")
@click.option("--alpha", type=float, default=None, help=alpha_help())
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
                 extractor: str, scatter_j: int, scatter_l: int, release: str, mechanism: str, epsilon: float | None,
                 alpha: float | None, integer_bits: int | None, fraction_bits: int | None, params: tuple[str, ...],
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
    if name is not None:  # --name is the API's `dataset`: named as the flag here
        check_name(name, "name")
    class_list = None
    if classes is not None:
        class_list = [c.strip() for c in classes.split(",")]
    options = data_options({"label_column": label_column, "image_size": image_size, "color_mode": color_mode,
                            "x_key": x_key, "y_key": y_key, "scale": scale})
    made = make_shared_plan(data, out=out, overwrite=overwrite, dataset=name, classes=class_list, extractor=extractor,
                            release=release, mechanism=mechanism, label_epsilon=label_epsilon, data_options=options,
                            scatter_j=scatter_j, scatter_l=scatter_l,
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
    fixed = "".join(f", {k} {v}" for k, v in plan.extractor_options.items())
    click.echo(f"extractor {plan.extractor}{fixed} (r = {plan.features}), release {plan.release}, mechanism "
               f"{plan.mechanism.name}, {width} per record")
    click.echo(f"privacy: {describe_privacy(made.privacy)}")
