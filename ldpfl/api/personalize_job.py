"""``ldpfl.personalize``: a silo's own model after a federation, made and kept on the silo (issue 41).

The library is ``ldpfl.stage2_federate.personalize``: the silo's clean records, the global model checked against
its file, the silo's DP-SGD accountant continued, the three methods (``clear``, ``dp``, ``interpolate``) and the
own held-out figures. This function validates the arguments, refuses what cannot be done before anything is
written, then trains and writes ``model.pt`` and ``personalization.json`` in ``out``. ``ldpfl personalize`` maps its
flags to it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl import mechanisms
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.write_targets import check_write_target
from ldpfl.stage2_federate.personalize.outputs import MODEL, SUMMARY, check_out, default_out, write_outputs
from ldpfl.stage2_federate.personalize.records import PersonalizeError
from ldpfl.stage2_federate.personalize.run import personalize_silo, prepare
from ldpfl.stage2_federate.personalize.settings import PersonalizeSettings

from .fields import StrPath
from .progress import ProgressCallback, Tally

STAGES = ("check", "train", "write")

__all__ = ["PersonalizeResult", "personalize"]


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
                momentum: float = 0.0, max_epsilon: float | None = None, validation: float = 0.2, weights: int = 11,
                seed: int | None = None, threads: int | None = None, progress: ProgressCallback | None = None,
                progress_bars: bool = False) -> PersonalizeResult:
    """Personalize the federation's global model on one silo, on its machine, from its own records.

    Parameters
    ----------
    run_dir : path
        The silo's export directory (its client file; a randomized one needs the silo's local-only clean file
        ``client_NNN.local.h5`` with training records).
    client_index : int
        The silo.
    method : {"clear", "dp", "interpolate"}
        Clear fine-tuning (local-only model), DP-SGD fine-tuning continuing the silo's accountant (a model that
        may be released), or the interpolation of the global and the silo's alone model with the weight chosen on
        its validation records (local-only).
    model : path, optional
        The global model; default ``RUN_DIR/federation/model.pt`` (``dp`` reads ``metrics.json`` beside it).
    resume : path, optional
        ``dp``: continue an earlier DP personalization of this silo (its folder): its model and its accountant.
    out : path, optional
        The output folder; default ``RUN_DIR/personalized/client_NNN.METHOD``.
    overwrite : bool
        Replace a personalization already in ``out``.
    epochs, batch_size, lr, steps, momentum, max_epsilon, validation, weights
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
                                   momentum=momentum, max_epsilon=max_epsilon, validation=validation, weights=weights)
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
    prepared = prepare(run_dir, client_index, settings, model=model_path, resume=resume)  # every refusal: no bar yet
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
