"""``ldpfl.personalize``: a silo's own model after a federation, made and kept on the silo (issue 41).

The library is ``ldpfl.stage2_federate.personalize``: the silo's clean records, the global model checked against
its file, the silo's DP-SGD accountant continued, the three methods (``clear``, ``dp``, ``interpolate``) and the
own held-out figures. This function validates the arguments, refuses what cannot be done before anything is
written, then trains and writes ``model.pt`` and ``personalization.json`` in ``out``. ``ldpfl personalize`` maps its
flags to it.

Where the silo keeps no clean training records in a file (a randomized client file, or a ``stats:K`` release
whose file holds synthetic rows), :func:`rebuilt_records` reruns the silo's export pipeline on its own data
(``ldpfl.silo``), so the job works over every kind of client file the federation accepts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl import silo as si
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.layout import local_file_name
from ldpfl.contract.schema import FormatError
from ldpfl.contract.write_targets import check_write_target
from ldpfl.stage1_features.models import cnn
from ldpfl.stage2_federate.personalize.outputs import MODEL, SUMMARY, check_out, default_out, write_outputs
from ldpfl.stage2_federate.personalize.records import (
    NoCleanRecords,
    OwnRecords,
    PersonalizeError,
    from_rows,
    own_records,
)
from ldpfl.stage2_federate.personalize.run import personalize_silo, prepare
from ldpfl.stage2_federate.personalize.settings import PersonalizeSettings

from .fields import StrPath
from .progress import ProgressCallback, Tally

STAGES = ("check", "train", "write")

__all__ = ["PersonalizeResult", "personalize", "rebuilt_records"]


@dataclass(frozen=True)
class PersonalizeResult:
    """What :func:`personalize` made.

    Attributes
    ----------
    method : str
        ``clear``, ``dp`` or ``interpolate``.
    client_index : int
        The silo.
    local_only : bool
        Whether the model must stay on the silo (epsilon = inf if shipped: ``clear``, ``interpolate``).
    epsilon : float
        The silo's epsilon if the model is shipped (its accountant's over the federation and the fine-tuning for
        ``dp``; inf for a local-only model).
    out, model, summary_path : Path
        The folder, its ``model.pt`` and its ``personalization.json``.
    summary : mapping
        The JSON summary (``--json``): settings, accountant, interpolation weight, own held-out accuracies (kept on
        the silo, not released).
    """

    method: str
    client_index: int
    local_only: bool
    epsilon: float
    out: Path
    model: Path
    summary_path: Path
    summary: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` output of ``ldpfl personalize`` (an infinite ε as ``"inf"``)."""
        return json_ready(dict(self.summary))


def personalize(run_dir: StrPath, *, client_index: int, method: str, model: StrPath | None = None,
                resume: StrPath | None = None, out: StrPath | None = None, overwrite: bool = False,
                epochs: int = 10, batch_size: int = 32, lr: float | None = None, steps: int = 30,
                momentum: float = 0.0, proximal: float = 0.0, max_epsilon: float | None = None, folds: int = 5,
                weights: int = 11, seed: int | None = None, threads: int | None = None,
                progress: ProgressCallback | None = None, progress_bars: bool = False) -> PersonalizeResult:
    """Personalize the federation's global model on one silo, on its machine, from its own records.

    Parameters
    ----------
    run_dir : path
        The silo's export directory (its client file; for a randomized or ``stats:K`` one, the silo's local-only
        clean file ``client_NNN.local.h5`` with training records, else its data, rerun through its pipeline).
    client_index : int
        The silo.
    method : {"clear", "dp", "interpolate"}
        Clear fine-tuning (local-only model), DP-SGD fine-tuning continuing the silo's accountant (a model that
        may be released), or the interpolation of the global and the silo's alone model with the weight chosen on
        its training records by cross-fitting (local-only).
    model : path, optional
        The global model; default ``RUN_DIR/federation/model.pt`` (``dp`` reads ``metrics.json`` beside it).
    resume : path, optional
        ``dp``: continue an earlier DP personalization of this silo (its folder): its model and its accountant.
    out : path, optional
        The output folder; default ``RUN_DIR/personalized/client_NNN.METHOD``.
    overwrite : bool
        Replace a personalization already in ``out``.
    epochs, batch_size, lr, steps, momentum, proximal, max_epsilon, folds, weights
        See ``ldpfl.stage2_federate.personalize.settings.PersonalizeSettings``.
    seed : int, optional
        Reproducible randomness (testing only: no privacy against anyone who knows it); default the OS CSPRNG.
    threads : int, optional
        CPU threads of torch.
    progress : callable, optional
        Called after each stage (check, train, write).
    progress_bars : bool
        A tqdm bar over the stages on stderr.

    Raises
    ------
    PersonalizeError
        Every refusal, before anything is written: bad settings, an occupied ``out``, no clean training records, a
        model whose shape or feature space is not the file's, a file from another run, a local-only or
        personalized model where the federation's is expected, a DP fine-tuning past ``max_epsilon`` or without
        the silo's accountant, ``resume`` of another silo's accountant.
    """
    settings = PersonalizeSettings(method, epochs=epochs, batch_size=batch_size, lr=lr, steps=steps,
                                   momentum=momentum, proximal=proximal, max_epsilon=max_epsilon, folds=folds,
                                   weights=weights)
    if isinstance(client_index, bool) or not isinstance(client_index, int) or client_index < 0:
        raise PersonalizeError(f"`client_index` must be an integer >= 0, got {client_index!r}")
    if resume is not None and model is not None:
        raise PersonalizeError("`resume` continues from the earlier personalization's model: leave out `model`")
    randomness = mechanisms.make_randomness(seed)
    run_dir, resume = Path(run_dir), None if resume is None else Path(resume)
    folder = Path(out) if out is not None else default_out(run_dir, client_index, method)
    check_out(folder, overwrite)
    if not (folder / SUMMARY).is_file():  # an earlier personalization's own files are replaced with `overwrite`
        for name in (MODEL, SUMMARY):
            check_write_target(folder / name, "out", [run_dir, model, resume])
    model_path = Path(model) if model is not None else Path(run_dir) / "federation" / MODEL
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        records = own_records(run_dir, client_index)
    except NoCleanRecords as missing:  # the silo reruns its export pipeline on its own data
        records = rebuilt_records(run_dir, client_index, str(missing), threads)
    prepared = prepare(run_dir, client_index, settings, model=model_path, resume=resume, records=records)
    # every refusal above: no bar yet
    from tqdm.auto import tqdm

    with tqdm(total=len(STAGES), desc="personalize", unit="stage", file=sys.stderr, disable=not progress_bars,
              dynamic_ncols=True, leave=False) as bar:
        tally = Tally(progress, "personalize", "step", len(STAGES), bar)
        tally.update()
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        made = personalize_silo(prepared, randomness)
        tally.update()
        summary = {**made.summary, "out": str(folder), "model": str(folder / MODEL)}
        written, summary_path = write_outputs(folder, made.model, made.trained_on, summary)
        tally.update()
    epsilon = float(summary["shipping"]["epsilon"])
    return PersonalizeResult(method, client_index, settings.local_only, epsilon, folder, written, summary_path,
                             summary)


def rebuilt_records(run_dir: Path, client_index: int, missing: str, threads: int | None = None) -> OwnRecords:
    """Return the silo's clean records rebuilt from its own data through its export pipeline (``ldpfl.silo``).

    For a randomized or ``stats:K`` client file without a clean local file of training records (``missing`` says
    so): the run's data, its stored hold-out split (``partition.npz``) and, for a CNN, the silo's saved CNN give
    the clean rows its release would hold (a ``stats:K`` release: projected and clipped). Where the silo kept its
    clean test file (``keep_clean_test``), its labels must be the rebuilt test split's.

    Raises
    ------
    PersonalizeError
        The records cannot be rebuilt (no data, no stored split, no CNN; the reason after ``missing``), or they are
        not the records of the silo's clean test file.
    """
    try:
        silo = si.open_silo(run_dir, client_index)
        if cnn.is_cnn(silo.metadata.extractor):
            if not silo.cnn_path().is_file():
                raise si.PredictError(f"no saved CNN {silo.cnn_path()} of client {client_index} (export with "
                                      "`save_models`)")
            cnn.import_keras(threads)
        train, test = si.clean_rows(silo, "train"), si.clean_rows(silo, "test")
        kept = Path(run_dir) / local_file_name(client_index)
        if kept.is_file() and not np.array_equal(read_client_file(kept, splits=("test",)).labels["test"], test[1]):
            raise si.PredictError(f"the rebuilt test split's labels are not those of the silo's {kept.name}: not "
                                  "the records the run exported")
    except (ValueError, FormatError, OSError) as error:  # PredictError, an unknown extractor, unreadable data
        raise PersonalizeError(f"{missing}; nor could it rebuild its clean records from its data: "
                               f"{' '.join(str(error).split())}") from None
    data = silo.config.get("data") or silo.metadata.dataset
    return from_rows(run_dir, client_index, train, test,
                     f"rebuilt on the silo from {data} (its stored training and test splits) through its export's "
                     f"pipeline, clean ({silo.metadata.extractor}, release {silo.metadata.release})")
