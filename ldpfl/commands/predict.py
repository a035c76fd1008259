"""``ldpfl predict``: the command line of the API's ``ldpfl.predict`` (``ldpfl.api.predict_job``; issue 16 item 5).

A thin command: it maps the flags to the function's arguments and prints the result. Light at import time
(click); TensorFlow (a CNN extractor) and torch load inside the command.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import click

from ldpfl.api.fields import function_defaults
from ldpfl.api.predict_job import predict
from ldpfl.api.text import predict_lines
from ldpfl.contract.jsonout import echo_json
from ldpfl.stage1_features.own_data.formats import COLOR_MODES, SCALES
from ldpfl.stage2_federate.personalize.own_accuracy import own_heldout_lines

from .export_options import reader_fields
from .options import options

_EPILOG = """\b
Examples:
  # client 0's held-out records, clean release, federated model RUN/federation/model.pt
  ldpfl predict runs/mnist --client-index 0
  # the same records randomized by the silo's mechanism, as the model was trained (a new release!)
  ldpfl predict runs/mnist --client-index 0 --randomized --json
  # new records of a silo (own data, read as its export read them) into a CSV file
  ldpfl predict silo_a --data new_scans/ --model run/federation/model.pt --out predictions.csv
  # the rows the federation evaluated: a client file's (randomized) or local file's (clean) test split
  ldpfl predict --released runs/mnist/client_000.local.h5
"""


_with_options = options(
    click.option("--client-index", type=click.IntRange(min=0), default=None,
                 help="The silo: client_NNN.h5 of RUN_DIR  [default: the only client file there]"),
    click.option("--model", "model_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="The federated model  [default: RUN_DIR/federation/model.pt]"),
    click.option("--cnn", "cnn_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="The silo's trained CNN  [default: RUN_DIR/client_NNN.keras of --save-models]"),
    click.option("--dataset", default=None,
                 help="The benchmark dataset of the records  [default: the run's]"),
    click.option("--data", type=click.Path(exists=True, path_type=str), default=None,
                 help="Own data: the run's file or folder (its held-out split), or new records of the silo "
                      "(all predicted). Formats as ldpfl export --data (data/README.md)."),
    click.option("--data-dir", default=None, help="Where the benchmark files are  [default: the run's]"),
    click.option("--label-column", default=None, help="Table: the label column  [default: the run's]"),
    click.option("--image-size", type=(click.IntRange(1, 16384), click.IntRange(1, 16384)), default=None,
                 metavar="H W", help="Image folder: resize to H×W  [default: the run's]"),
    click.option("--color-mode", type=click.Choice(COLOR_MODES), default=None,
                 help="Image folder: channels  [default: the run's]"),
    click.option("--x-key", default=None, help=".npz/HDF5: the inputs' array  [default: the run's]"),
    click.option("--y-key", default=None, help=".npz/HDF5: the labels' array  [default: the run's]"),
    click.option("--scale", type=click.Choice(SCALES), default=None, help="Value scaling  [default: the run's]"),
    click.option("--split", type=click.Choice(["test", "train", "all"]), default=None,
                 help="Which of the silo's records: its held-out test split, its training split, or all  "
                      "[default: test; all for new records]"),
    click.option("--randomized", is_flag=True,
                 help="Randomize the release with the silo's mechanism, as in training (fresh randomness). "
                      "Costs privacy like a release if anything computed from it is shared; a warning says "
                      "how much."),
    click.option("--seed", type=click.IntRange(min=0), default=None,
                 help="With --randomized: reproducible randomness (testing only: no privacy against anyone who "
                      "knows the seed)."),
    click.option("--released", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="Predict the rows stored in a client file instead (client_NNN.h5: randomized; "
                      "client_NNN.local.h5: clean), as ldpfl federate evaluated them; no RUN_DIR needed."),
    click.option("--global-model", "global_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="With a personalized --model (ldpfl personalize): the federation's model it started from, "
                      "measured on the same records  [default: RUN_DIR/federation/model.pt when it is that model]"),
    click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="Write the predictions to a .csv or .json file (atomically) instead of stdout."),
    click.option("--batch-size", type=click.IntRange(min=1), default=function_defaults(predict)["batch_size"],
                 show_default=True,
                 help="Records per batch."),
    click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (torch, TensorFlow)."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print a JSON summary (with the predictions unless --out)."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary."))


@click.command("predict", epilog=_EPILOG, context_settings={"max_content_width": 100})
@click.argument("run_dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@_with_options
def predict_command(run_dir: Path | None, client_index: int | None, model_path: Path | None, cnn_path: Path | None,
                    dataset: str | None, data: str | None, data_dir: str | None,
                    split: Literal["test", "train", "all"] | None,
                    randomized: bool, seed: int | None, released: Path | None, global_path: Path | None,
                    out_path: Path | None,
                    batch_size: int, threads: int | None, as_json: bool, quiet: bool, **reader: Any) -> None:
    """Predict a silo's records with the federated model, through the silo's own pipeline.

    RUN_DIR is the silo's export directory (client_NNN.h5, the CNN client_NNN.keras of --save-models,
    partition.npz). Every setting comes from the client file: the CNN (or the raw features under the
    extractor none), the release point, the encoding and the mechanism. The model must have been trained
    on that release (its model.pt records classes, plan, release, width, encoding, mechanism): anything
    else is refused.

    By default the records go through the CLEAN release: encoded, not randomized. The records never leave
    the silo, so no privacy is spent (the predictions are computed from the unrandomized records: share
    them only as you would the records). The federation measured this input as clean_test_accuracy
    (ldpfl federate --eval-clean). --randomized applies the mechanism as in training, which is the input
    of test_accuracy; it is a fresh release of the records if its results leave the silo.

    Output: CSV on stdout (index,predicted_class[,class_name][,label]; index = the record's row in its
    dataset or file), or --out FILE (.csv or .json). With labels, the accuracy is printed (stderr when the
    CSV goes to stdout), overall and per class. On the silo's own held-out records (its test split, or its
    client_NNN.local.h5) the figures are the silo's own (own_heldout in --json): computed on the silo and NOT
    released. A personalized --model is measured beside the global model it started from (--global-model).
    """
    result = predict(run_dir, client_index=client_index, model=model_path, cnn=cnn_path, dataset=dataset, data=data,
                     data_dir=data_dir, data_options=reader_fields(reader, keep_auto=True), split=split,
                     randomized=randomized, seed=seed, released=released, global_model=global_path, out=out_path,
                     batch_size=batch_size,
                     threads=threads, progress_bars=not quiet, on_warning=_warn)
    if as_json:
        echo_json(result.to_dict())
        return
    if out_path is None:
        click.echo(result.csv_text(), nl=False)
    if not quiet:
        for line in [*predict_lines(result.summary), *own_lines(result.summary)]:
            click.echo(line, err=out_path is None)


def own_lines(summary: Mapping[str, Any]) -> list[str]:
    """Return the text of the summary's own held-out figures (each model, per class), or its per-class accuracy."""
    block = summary.get("own_heldout")
    if isinstance(block, Mapping):
        personal = block.get("personalized")
        if not isinstance(personal, Mapping):
            return own_heldout_lines(block)
        local = ", LOCAL ONLY" if personal.get("local_only") else ""
        return own_heldout_lines(block, {"personalized": f"personalized ({personal.get('method')}{local})"})
    per_class = summary.get("per_class_accuracy")
    if not per_class:
        return []
    cells = [f"{k}: {v:.4f}" for k, v in enumerate(per_class) if v is not None]
    return [f"accuracy per class: {', '.join(cells)}"]


def _warn(message: str) -> None:
    click.echo(f"Warning: {' '.join(message.split())}", err=True)
