"""``ldpfl plan``: the shared plan every silo of a cross-silo run exports with (issue 16).

It resolves an export's settings over a sample silo's data, exactly as the silos' exports will
(``export.plan.make_plan``), and writes the plan JSON (``ldpfl.contract.plan``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ldpfl.api.fields import function_defaults
from ldpfl.api.plan_job import plan as make_shared_plan
from ldpfl.api.text import plan_text
from ldpfl.commands.export_options import (
    data_source_options,
    mechanism_fields,
    mechanism_options,
    reader_fields,
    scatter_options,
)
from ldpfl.contract.jsonout import echo_json
from ldpfl.contract.names import check_name
from ldpfl.stage1_features.export.config import exportable_mechanisms
from ldpfl.stage1_features.models import cnn

DEFAULTS = function_defaults(make_shared_plan)


@click.command("plan", context_settings={"max_content_width": 100})
@data_source_options
@click.option("--classes", default=None, metavar="A,B,...",
              help="The class list, in order  [default: the sample's classes: sorted labels or folder names]")
@click.option("--extractor", type=click.Choice([cnn.AUTO, *cnn.extractor_names()]), default=DEFAULTS["extractor"],
              show_default=True,
              help="Feature extractor. auto: cifar-cnn for images of at least 8×8, none (raw inputs) otherwise. "
                   "scatter: weight-free wavelet scattering + GroupNorm (Tramèr and Boneh 2021), with J and L.")
@scatter_options
@click.option("--release", default=DEFAULTS["release"], show_default=True,
              help="Where the released features are taken (see ldpfl export --help).")
@click.option("--mechanism", type=click.Choice(exportable_mechanisms()), default=DEFAULTS["mechanism"],
              show_default=True,
              help="Randomization every silo applies.")
@mechanism_options
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Another mechanism parameter.")
@click.option("--label-epsilon", type=float, default=None,
              help="Every silo releases its labels by k-ary randomized response at this ε  [default: clear labels]")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("plan.json"),
              show_default=True, help="Where to write the plan.")
@click.option("--overwrite", is_flag=True, help="Replace an existing plan file.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(data: str | None, name: str | None, classes: str | None, out: Path, overwrite: bool,
                 as_json: bool, **options: Any) -> None:
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
    class_list = None if classes is None else [c.strip() for c in classes.split(",")]
    made = make_shared_plan(data, out=out, overwrite=overwrite, dataset=name, classes=class_list,
                            mechanism_params=mechanism_fields(options), data_options=reader_fields(options), **options)
    if as_json:
        echo_json(made.to_dict())
    else:
        click.echo(plan_text(made))
