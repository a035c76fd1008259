"""``ldpfl.predict``: a silo's records through its own pipeline and the federated model (issue 16 item 5).

The pipeline is the one the silo's export ran, read from its client file (``ldpfl.prediction``). What the
model is given: the **clean** release (default: encoded, not randomized; nothing leaves the silo, no privacy
is spent), the **randomized** release (``randomized``: the silo's mechanism with fresh randomness, a new
release of the records if anything computed from it is shared), or rows **released** in a client file
(``released``), as ``ldpfl federate`` evaluated them. ``ldpfl predict`` maps its flags to this function.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ldpfl import mechanisms
from ldpfl import prediction as pr
from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.release_guarantee import ReleaseGuarantee, stored_or_computed
from ldpfl.contract.write_targets import check_write_target
from ldpfl.mechanisms.report import json_number
from ldpfl.prediction import BATCH_ROWS, GlobalModel, PredictError, Prediction, Silo
from ldpfl.stage1_features.models import cnn
from ldpfl.stage2_federate.personalize.base_model import is_local_only, personalization_of

from . import own_figures as own
from .fields import StrPath
from .progress import Bar, ProgressCallback, Tally

OUT_SUFFIXES = (".csv", ".json")
Split = Literal["test", "train", "all"]


@dataclass(frozen=True)
class PredictResult:
    """What :func:`predict` found.

    Attributes
    ----------
    predicted : np.ndarray
        The predicted class of each record (int64).
    index : np.ndarray
        Each record's row in its source (the dataset's or file's row; the file split's row for ``released``).
    labels : np.ndarray or None
        The records' labels, when known.
    class_names : tuple of str or None
        The class names of the files (own data), if any.
    inputs : str
        ``clean``, ``randomized`` or ``released``.
    summary : mapping
        The JSON summary: source, inputs, accuracy, the model and what it was evaluated on, the privacy of the
        inputs, the predicted counts (and ``out`` when written).
    warnings : tuple of str
        What the command line prints as warnings (a randomized release's cost first).
    out : Path or None
        The .csv or .json file written.
    release_guarantee : ReleaseGuarantee or None
        The silo's client file's guarantee (everything it released about one record); what a randomized
        prediction releases again if it is shared.
    """

    predicted: np.ndarray
    index: np.ndarray
    labels: np.ndarray | None
    class_names: tuple[str, ...] | None
    inputs: str
    summary: Mapping[str, object]
    warnings: tuple[str, ...]
    out: Path | None
    release_guarantee: ReleaseGuarantee | None

    @property
    def accuracy(self) -> float | None:
        """Return the share of records predicted as labelled (None without labels or records)."""
        if self.labels is None or not len(self.labels):
            return None
        return float(np.mean(self.predicted == self.labels))

    def columns(self) -> list[str]:
        """Return the CSV columns: index, predicted_class[, class_name][, label]."""
        return ["index", "predicted_class", *(["class_name"] if self.class_names is not None else []),
                *(["label"] if self.labels is not None else [])]

    def rows(self) -> list[dict[str, object]]:
        """Return one dict per record (the columns of :meth:`columns`)."""
        return prediction_rows(self.index, self.predicted, self.labels, self.class_names)

    def csv_text(self) -> str:
        """Return the predictions as CSV (the command's stdout without ``--out``)."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns(), lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows())
        return buffer.getvalue()

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` output of ``ldpfl predict``: the summary, with the predictions unless written."""
        return dict(self.summary) | ({} if self.out is not None else {"predictions": self.rows()})


def predict(run_dir: StrPath | None = None, *, client_index: int | None = None, model: StrPath | None = None,
            cnn: StrPath | None = None, dataset: str | None = None, data: StrPath | None = None,
            data_dir: str | None = None, data_options: Mapping[str, object] | None = None, split: Split | None = None,
            randomized: bool = False, seed: int | None = None, released: StrPath | None = None,
            global_model: StrPath | None = None, out: StrPath | None = None, batch_size: int = BATCH_ROWS,
            threads: int | None = None,
            progress: ProgressCallback | None = None, progress_bars: bool = False,
            on_warning: Callable[[str], None] | None = None) -> PredictResult:
    """Predict a silo's records with the federated model, through the silo's own pipeline.

    Parameters
    ----------
    run_dir : path, optional
        The silo's export directory; not with ``released``.
    client_index : int, optional
        The silo: ``client_NNN.h5`` of ``run_dir`` (default: the only client file there).
    model : path, optional
        The federated model; default ``RUN_DIR/federation/model.pt`` (beside ``released``'s file).
    cnn : path, optional
        The silo's trained CNN; default ``RUN_DIR/client_NNN.keras`` of ``save_models``.
    dataset, data_dir : str, optional
        The benchmark dataset of the records and where its files are; default the run's.
    data : path, optional
        Own data: the run's file or folder (its held-out split), or new records of the silo (all predicted).
    data_options : mapping, optional
        How to read ``data`` (``label_column``, ``image_size``, ``color_mode``, ``x_key``, ``y_key``,
        ``scale``); default the run's.
    split : {"test", "train", "all"}, optional
        Which of the silo's records; default test (all for new records).
    randomized : bool
        Randomize the release with the silo's mechanism (fresh randomness; a new release if shared).
    seed : int, optional
        With ``randomized``: reproducible randomness (testing only: no privacy against anyone who knows it).
    released : path, optional
        Predict the rows stored in a client file instead (its ``split``, test by default).
    global_model : path, optional
        With a personalized ``model`` (``ldpfl personalize``): the federation's model it started from, measured on
        the same records (``own_heldout``); default ``RUN_DIR/federation/model.pt`` when it is that model.
    out : path, optional
        Also write the predictions to this .csv or .json file (atomically).
    batch_size : int
        Records per batch.
    threads : int, optional
        CPU threads of torch and TensorFlow.
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` after each batch of records.
    progress_bars : bool
        A tqdm bar over the records on stderr.
    on_warning : callable, optional
        Called with each warning as it arises (they are in the result's ``warnings`` either way).

    Raises
    ------
    PredictError
        Inputs that cannot be used together, no model, a model not trained on this silo's release (a
        ``ParameterError`` naming the parameter).
    """
    reader_options = {k: v for k, v in (data_options or {}).items() if v is not None}
    target = None if out is None else Path(out)
    if target is not None and (not str(target).strip() or target.suffix.lower() not in OUT_SUFFIXES):
        raise PredictError(f"`out` must name a .csv or .json file, got {str(out)!r}")
    if target is not None:  # never onto an input or a run's artifact (issue 24)
        check_write_target(target, "out", [run_dir, released, model, cnn, data, global_model])
    if seed is not None and not randomized:
        raise PredictError("`seed` applies to `randomized` only")
    if released is not None:
        extra = [name for name, value in (("RUN_DIR", run_dir), ("`client_index`", client_index),
                                          ("`dataset`", dataset), ("`data`", data), ("`cnn`", cnn),
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
    warned: list[str] = []

    def warn(message: str) -> None:
        warned.append(message)
        if on_warning is not None:
            on_warning(message)

    result, guarantee = _predict(run_dir, released, client_index=client_index, model_path=model,
                                 global_path=None if global_model is None else Path(global_model), cnn_path=cnn,
                                 dataset=dataset, data=data, data_dir=data_dir, reader_options=reader_options,
                                 split=split, randomized=randomized, seed=seed, batch_size=batch_size,
                                 threads=threads, progress=progress, progress_bars=progress_bars, warn=warn)
    summary = dict(result.summary)
    done = PredictResult(result.predicted, result.index, result.labels, result.class_names, str(summary["inputs"]),
                         summary | ({} if target is None else {"out": str(target)}), tuple(warned), target, guarantee)
    if target is not None:
        _write(target, summary, done)
    return done


def _predict(run_dir: StrPath | None, released: StrPath | None, *, client_index: int | None,
             model_path: StrPath | None, global_path: Path | None, cnn_path: StrPath | None, dataset: str | None,
             data: StrPath | None, data_dir: str | None, reader_options: dict[str, object], split: Split | None,
             randomized: bool, seed: int | None, batch_size: int, threads: int | None,
             progress: ProgressCallback | None, progress_bars: bool,
             warn: Callable[[str], None]) -> tuple[Prediction, ReleaseGuarantee | None]:
    """Load the model, predict (the silo's records or a client file's rows) and pass on the warnings."""
    if threads is not None:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if released is not None:
        base = Path(released).parent
    elif run_dir is not None:
        base = Path(run_dir)
    else:  # refused by predict()
        raise PredictError("give RUN_DIR (the silo's export directory), or `released`")
    model_file = Path(model_path) if model_path is not None else pr.default_model_path(base)
    if not model_file.is_file():
        raise pr.PredictError(f"no federated model at {model_file}: run ldpfl federate on the run first, or pass "
                              "`model`")
    model = pr.load_global_model(model_file)
    personal = personalization_of(model.trained_on)
    others = own.started_from(model, global_path, pr.default_model_path(base), warn)  # refusals before warnings
    if personal is not None:  # a silo's own model (ldpfl personalize): say what it is and whether it may travel
        warn(f"{model_file} is client {personal.get('client_index')}'s personalized model ({personal.get('method')}): "
             f"{personal.get('note')}" + ("; it and its predictions stay on that silo" if is_local_only(
                 model.trained_on) else ""))
    if released is not None:
        with open_client_file(released) as (_handle, meta, rows):
            warnings = pr.check_model(model, meta, str(released))  # before the bar: an error is one line
        guarantee = stored_or_computed(meta, records=sum(rows.values()))
        with _counter(progress, progress_bars, rows.get(split or "test")) as bar:
            result = pr.predict_released(Path(released), model, split=split or "test", batch_rows=batch_size,
                                         progress=bar, others=others)
    else:
        silo = pr.open_silo(base, client_index)
        warnings = pr.check_inputs(silo, model, None if cnn_path is None else Path(cnn_path))

        if cnn.is_cnn(silo.metadata.extractor):
            cnn.import_keras(threads)
        records = pr.silo_records(silo, dataset=dataset, data=None if data is None else os.fspath(data),
                                  data_options=reader_options or None, data_dir=data_dir, split=split)
        rng = None
        if randomized and silo.metadata.release.startswith("stats:"):
            raise PredictError(f"`randomized` releases records again through the file's mechanism; a "
                               f"{silo.metadata.release} file released statistics, not records: predict clean")
        if randomized:
            randomness = mechanisms.make_randomness(seed)
            rng = randomness.generator()
            warn(randomized_warning(silo, len(records.rows), model, randomness.mode))
        with open_client_file(silo.file) as (_handle, meta, rows):
            guarantee = stored_or_computed(meta, records=sum(rows.values()))
        with _counter(progress, progress_bars, len(records.rows)) as bar:
            result = pr.predict_silo(silo, records, model, randomized=randomized, rng=rng,
                                     cnn_path=None if cnn_path is None else Path(cnn_path), batch_rows=batch_size,
                                     progress=bar, others=others)
    if personal is not None:
        result.summary["model_personalization"] = {
            key: personal.get(key) for key in ("method", "client_index", "local_only", "epsilon")}
    result.summary |= own.figures(result, model, others)
    for warning in dict.fromkeys([*warnings, *result.warnings]):
        warn(warning)
    return result, guarantee


@contextlib.contextmanager
def _counter(callback: ProgressCallback | None, bars: bool, total: int | None) -> Iterator[Bar]:
    """Yield the job's record counter: a tqdm bar on stderr (``bars``) and the callback."""
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="predict", unit="record", file=sys.stderr, disable=not bars, dynamic_ncols=True,
              leave=False) as bar:
        yield Tally(callback, "predict", "record", total, bar)


def randomized_warning(silo: Silo, rows: int, model: GlobalModel, mode: str) -> str:
    """Return the warning of a randomized prediction: a fresh release of ``rows`` records through the mechanism."""
    epsilon = json_number(silo.metadata.privacy_report.exact_epsilon_per_record)
    evaluated = ", ".join((model.trained_on or {}).get("evaluated_on") or ["(not recorded)"])
    seeded = ", seeded: NO privacy against anyone who knows the seed" if mode == "seeded" else ""
    guarantee = stored_or_computed(silo.metadata, records=rows)
    return (f"--randomized releases these {rows} records again through mechanism {silo.metadata.mechanism!r} "
            f"(exact ε = {epsilon} per record for the values alone{seeded}; the file's {guarantee.headline()}): "
            "keep the predictions on the silo, or count this release in the records' privacy budget. The global "
            f"model was trained on randomized releases and evaluated on: {evaluated}.")


def prediction_rows(index: np.ndarray, predicted: np.ndarray, labels: np.ndarray | None,
                    names: tuple[str, ...] | None) -> list[dict[str, object]]:
    """Return one dict per record: index, predicted_class[, class_name][, label]."""
    rows: list[dict[str, object]] = []
    for i, (row, klass) in enumerate(zip(index.tolist(), predicted.tolist(), strict=True)):
        record: dict[str, object] = {"index": row, "predicted_class": klass}
        if names is not None:
            record["class_name"] = names[klass]
        if labels is not None:
            record["label"] = int(labels[i])
        rows.append(record)
    return rows


def _write(target: Path, summary: Mapping[str, object], result: PredictResult) -> None:
    """Write the predictions to ``target`` atomically: JSON (``summary`` and the predictions) or CSV."""
    if target.suffix.lower() == ".json":
        text = json.dumps(json_ready({"summary": dict(summary), "predictions": result.rows()}), indent=1) + "\n"
    else:
        text = result.csv_text()
    atomic_write_text(target, text)


__all__ = ["PredictResult", "predict", "prediction_rows", "randomized_warning"]
