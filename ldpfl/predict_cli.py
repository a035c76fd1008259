"""``ldpfl predict``: the command line of ``ldpfl.prediction`` (issue 16 item 5).

Light at import time (click); TensorFlow (a CNN extractor) and torch load inside the command.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

OUT_SUFFIXES = (".csv", ".json")

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


def _option_list() -> list[Any]:
    from ldpfl.stage1_features.own_data import COLOR_MODES, SCALES

    return [
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
        click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write the predictions to a .csv or .json file (atomically) instead of stdout."),
        click.option("--batch-size", type=click.IntRange(min=1), default=1024, show_default=True,
                     help="Records per batch."),
        click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (torch, TensorFlow)."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print a JSON summary (with the predictions unless --out)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary."),
    ]


def _with_options(command: Any) -> Any:
    for option in reversed(_option_list()):
        command = option(command)
    return command


READER_OPTIONS = ("label_column", "image_size", "color_mode", "x_key", "y_key", "scale")


@click.command("predict", epilog=_EPILOG, context_settings={"max_content_width": 100})
@click.argument("run_dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@_with_options
def predict_command(run_dir: Path | None, client_index: int | None, model_path: Path | None, cnn_path: Path | None,
                    dataset: str | None, data: str | None, data_dir: str | None, split: str | None,
                    randomized: bool, seed: int | None, released: Path | None, out_path: Path | None,
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
    CSV goes to stdout).
    """
    from ldpfl.contract.write_targets import check_write_target
    from ldpfl.prediction import PredictError

    reader_options = {k: v for k, v in reader.items() if k in READER_OPTIONS and v is not None}
    if out_path is not None and (not str(out_path).strip() or out_path.suffix.lower() not in OUT_SUFFIXES):
        raise PredictError(f"`out` must name a .csv or .json file, got {str(out_path)!r}")
    if out_path is not None:  # never onto an input or a run's artifact (issue 24)
        check_write_target(out_path, "out", [run_dir, released, model_path, cnn_path, data])
    if seed is not None and not randomized:
        raise PredictError("`seed` applies to `randomized` only")
    if released is not None:
        extra = [name for name, value in (("RUN_DIR", run_dir), ("`client_index`", client_index),
                                          ("`dataset`", dataset), ("`data`", data), ("`cnn`", cnn_path),
                                          ("`randomized`", randomized or None)) if value is not None]
        extra += [f"`{name}`" for name in sorted(reader_options)]
        if extra:
            raise PredictError(f"`released` predicts the rows stored in a client file: leave out {', '.join(extra)}")
        if split == "all":
            raise PredictError("`split` of a client file is train or test")
    elif run_dir is None:
        raise PredictError("give RUN_DIR (the silo's export directory), or `released`")
    elif data is None and reader_options:
        raise PredictError(f"`{sorted(reader_options)[0]}` applies to own data: add `data`")
    _run(run_dir, client_index, model_path, cnn_path, dataset, data, data_dir, split, randomized, seed, released,
         out_path, batch_size, threads, as_json, quiet, reader_options)


def _run(run_dir: Path | None, client_index: int | None, model_path: Path | None, cnn_path: Path | None,
         dataset: str | None, data: str | None, data_dir: str | None, split: str | None, randomized: bool,
         seed: int | None, released: Path | None, out_path: Path | None, batch_size: int, threads: int | None,
         as_json: bool, quiet: bool, reader_options: dict[str, Any]) -> None:
    from ldpfl import prediction as pr

    if threads is not None:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    base = released.parent if released is not None else run_dir
    assert base is not None
    model_path = model_path if model_path is not None else pr.default_model_path(base)
    if not model_path.is_file():
        raise pr.PredictError(f"no federated model at {model_path}: run ldpfl federate on the run first, or pass "
                              "`model`")
    model = pr.load_global_model(model_path)
    warnings: list[str] = []
    if released is not None:
        from ldpfl.contract.client_reader import open_client_file

        with open_client_file(released) as (_handle, meta, rows):
            warnings = pr.check_model(model, meta, str(released))  # before the bar: an error is one line
        with _progress(quiet, rows.get(split or "test")) as bar:
            result = pr.predict_released(released, model, split=split or "test", batch_rows=batch_size,
                                         progress=bar)
    else:
        assert run_dir is not None
        silo = pr.open_silo(run_dir, client_index)
        warnings = pr.check_inputs(silo, model, cnn_path)
        from ldpfl.stage1_features import cnn

        if cnn.is_cnn(silo.metadata.extractor):
            cnn.import_keras(threads)
        records = pr.silo_records(silo, dataset=dataset, data=data, data_options=reader_options or None,
                                  data_dir=data_dir, split=split)
        rng = None
        if randomized:
            from ldpfl import mechanisms
            randomness = mechanisms.make_randomness(seed)
            rng = randomness.generator()
            _warn(_randomized_warning(silo, len(records.rows), model, randomness.mode))
        with _progress(quiet, len(records.rows)) as bar:
            result = pr.predict_silo(silo, records, model, randomized=randomized, rng=rng, cnn_path=cnn_path,
                                     batch_rows=batch_size, progress=bar)
    for warning in dict.fromkeys([*warnings, *result.warnings]):
        _warn(warning)
    _emit(result, out_path, as_json, quiet)


def _progress(quiet: bool, total: int | None) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="predict", unit="record", file=sys.stderr, disable=quiet, dynamic_ncols=True,
                leave=False)


def _warn(message: str) -> None:
    click.echo(f"Warning: {' '.join(message.split())}", err=True)


def _randomized_warning(silo: Any, rows: int, model: Any, mode: str) -> str:
    from ldpfl.contract.release_guarantee import stored_or_computed

    report = silo.metadata.privacy_report
    epsilon = report.get("exact_epsilon_per_record")
    evaluated = ", ".join((model.trained_on or {}).get("evaluated_on") or ["(not recorded)"])
    seeded = ", seeded: NO privacy against anyone who knows the seed" if mode == "seeded" else ""
    guarantee = stored_or_computed(silo.metadata, records=rows)
    return (f"--randomized releases these {rows} records again through mechanism {silo.metadata.mechanism!r} "
            f"(exact ε = {epsilon} per record for the values alone{seeded}; the file's {guarantee.headline()}): "
            "keep the predictions on the silo, or count this release in the records' privacy budget. The global "
            f"model was trained on randomized releases and evaluated on: {evaluated}.")


def _rows(result: Any) -> list[dict[str, Any]]:
    names = result.class_names
    rows = []
    for i, (index, predicted) in enumerate(zip(result.index.tolist(), result.predicted.tolist(), strict=True)):
        row: dict[str, Any] = {"index": index, "predicted_class": predicted}
        if names is not None:
            row["class_name"] = names[predicted]
        if result.labels is not None:
            row["label"] = int(result.labels[i])
        rows.append(row)
    return rows


def _csv_text(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _columns(result: Any) -> list[str]:
    return ["index", "predicted_class", *(["class_name"] if result.class_names is not None else []),
            *(["label"] if result.labels is not None else [])]


def _emit(result: Any, out_path: Path | None, as_json: bool, quiet: bool) -> None:
    from ldpfl.contract.atomic import atomic_write_text
    from ldpfl.contract.jsonout import echo_json, json_ready

    rows = _rows(result)
    summary = dict(result.summary)
    if out_path is not None:
        if out_path.suffix.lower() == ".json":
            text = json.dumps(json_ready({"summary": summary, "predictions": rows}), indent=1) + "\n"
        else:
            text = _csv_text(rows, _columns(result))
        atomic_write_text(out_path, text)
        summary["out"] = str(out_path)
    if as_json:
        echo_json(summary | ({} if out_path is not None else {"predictions": rows}))
        return
    if out_path is None:
        click.echo(_csv_text(rows, _columns(result)), nl=False)
    if not quiet:
        for line in summary_lines(summary):
            click.echo(line, err=out_path is None)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Return the closing lines: what was predicted, on which input, the accuracy, the run's accuracies."""
    inputs = {"clean": "clean release (not randomized; nothing leaves the silo, no privacy spent)",
              "randomized": "randomized release (the silo's mechanism, fresh randomness)",
              "released": "rows as stored in the file"}[summary["inputs"]]
    lines = [f"predicted {summary['records']} records: {summary['source']}", f"input: {inputs}"]
    if summary.get("accuracy") is not None:
        lines.append(f"accuracy {summary['accuracy']:.4f} ({summary['correct']}/{summary['records']})")
    last = summary.get("model_last_round")
    if last:
        measured = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k != "round" and isinstance(v, float))
        lines.append(f"the federation's last round ({last.get('round')}), on all clients: {measured}")
    if summary.get("out"):
        lines.append(f"predictions written to {summary['out']}")
    return lines
