"""A silo's personalization: every check first (nothing written on a refusal), then the training and its figures.

:func:`prepare` reads and checks the inputs: the silo's clean records, the global model against its file (shape,
feature space, run), the silo's accountant and the ``max_epsilon`` bound (``dp``), an earlier DP personalization
to continue (``resume``: the same silo's only). :func:`personalize_silo` then trains, evaluates the global and the
personalized model on the silo's held-out records, and returns the model, its ``trained_on`` record and the
summary; ``outputs.write_outputs`` writes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.layout import METRICS_JSON
from ldpfl.contract.released_statistics import is_statistics_file
from ldpfl.mechanisms.randomness import Randomness
from ldpfl.stage2_federate.silo_training.accountant import (
    SiloAccountant,
    check_budget,
    from_federation,
    resumed_accountant,
)

from .base_model import PERSONALIZATION, BaseModel, check_base_model, personalization_of
from .outputs import MODEL, read_json_object, read_summary
from .own_accuracy import own_heldout, own_heldout_lines
from .records import OwnRecords, PersonalizeError, fold_assignment, own_records
from .settings import DP, INTERPOLATE, PersonalizeSettings

__all__ = ["Personalization", "Prepared", "personalize_silo", "prepare", "summary_lines"]


@dataclass(frozen=True)
class Prepared:
    """Checked inputs of one personalization."""

    records: OwnRecords
    base: BaseModel
    settings: PersonalizeSettings
    accountant: SiloAccountant | None
    global_sha256: str


def _metrics(path: Path) -> dict[str, Any]:
    return read_json_object(path, f"no {METRICS_JSON} beside the model ({path}): DP fine-tuning reads the silo's "
                                  "accountant from its federation's metrics", str(path))


def prepare(run_dir: str | Path, client_index: int, settings: PersonalizeSettings, *, model: str | Path,
            resume: str | Path | None = None, records: OwnRecords | None = None) -> Prepared:
    """Read and check everything a personalization needs, before any training or writing.

    ``records``: the silo's clean records when the caller rebuilt them (``records.from_rows``); default read
    from the run (``records.own_records``).

    Raises
    ------
    PersonalizeError
        Every refusal of the job (module docstring), one line each.
    """
    if records is None:
        records = own_records(run_dir, client_index)
    if settings.method == DP and is_statistics_file(records.metadata):
        raise PersonalizeError(f"{records.client_file.name} released statistics once ({records.metadata.release}) "
                               "and its federation trained on their synthetic records: no training accountant covers "
                               "the silo's own records, so DP fine-tuning on them has none to continue; use `method` "
                               "clear or interpolate (local-only models)")
    common = dict(client=client_index, file_sha256=records.file_sha256, records=len(records.train_labels))
    if resume is not None:
        if settings.method != DP:
            raise PersonalizeError(f"`resume` continues a DP personalization (`method` dp), not {settings.method}")
        if settings.proximal:
            raise PersonalizeError("`proximal` ties the fine-tuning to the global model, which `resume` does not "
                                   "read: personalize from the global model again (leave out `resume`)")
        summary = read_summary(resume)
        accountant: SiloAccountant | None = resumed_accountant(summary, resume, **common)  # type: ignore[arg-type]
        base = check_base_model(Path(resume) / MODEL, records, resumed=True)
        earlier = personalization_of(base.trained_on) or {}
        if earlier.get("method") != DP or earlier.get("client_index") != client_index:
            raise PersonalizeError(f"`resume` {resume}'s model is not client {client_index}'s DP personalization")
        global_sha = str(earlier.get("global_model_sha256"))
    else:
        base = check_base_model(model, records)
        global_sha = base.sha256
        accountant = None
        if settings.method == DP:
            where = Path(model).parent / METRICS_JSON
            accountant = from_federation(_metrics(where), where, **common)  # type: ignore[arg-type]
    if accountant is not None:
        check_budget(accountant, settings.steps, settings.max_epsilon)
    if settings.method == INTERPOLATE and base.hidden:
        raise PersonalizeError(f"`method` interpolate mixes the weights of a linear head; {base.path} has hidden "
                               f"layers {list(base.hidden)} (use `method` clear or dp)")
    return Prepared(records, base, settings, accountant, global_sha)


@dataclass(frozen=True)
class Personalization:
    """The personalized model, its ``trained_on`` record and the JSON summary (kept on the silo)."""

    model: Any  # FederatedMLP
    trained_on: dict[str, Any]
    summary: dict[str, Any]
    accountant: SiloAccountant | None


def _generators(randomness: Randomness) -> tuple[np.random.Generator, np.random.Generator, Any]:
    import torch

    split, noise, train = randomness.child_sequences(3)
    seed = int(train.generate_state(1, np.uint64)[0])
    return randomness.stream(split), randomness.stream(noise), torch.Generator(device="cpu").manual_seed(seed)


def personalize_silo(prepared: Prepared, randomness: Randomness) -> Personalization:
    """Train the silo's personalized model and measure it and the global one on the silo's held-out records."""
    from . import evaluation, training

    records, base, settings = prepared.records, prepared.base, prepared.settings
    split_rng, noise_rng, generator = _generators(randomness)
    width, packed = records.width, records.packed
    train = training.as_split(records.train_features, records.train_labels, width, packed)
    test = training.as_split(records.test_features, records.test_labels, width, packed)
    start = training.load_model(base)
    model = training.load_model(base)
    details: dict[str, Any] = {}
    accountant = prepared.accountant
    figures: dict[str, Any] = {}
    if settings.method == DP:
        assert accountant is not None
        accountant = training.fine_tune_dp(model, train, accountant, settings, generator=generator, rng=noise_rng)
        details["accountant"] = accountant.to_json()
    elif settings.method == INTERPOLATE:
        fold = fold_assignment(len(train), settings.folds, split_rng)
        weight, table = training.cross_fitted_weight(start, base, records.train_features, records.train_labels,
                                                     fold, settings, width=width, packed=packed, generator=generator)
        alone = training.train_alone(base, train, settings, generator=generator)
        model = training.interpolate(start, alone, weight)
        details["interpolation"] = {
            "weight": weight, "of": "the global model (1 - weight: the silo's alone model, trained on every training "
                                    "record)",
            "chosen_on": f"the silo's {len(train)} training records by {int(fold.max()) + 1}-fold cross-fitting (each "
                         "scored by an alone model trained on the other folds); the test records play no part",
            "fold_sizes": np.bincount(fold).tolist(), "table": table}
        figures["alone"] = evaluation.own_accuracy(alone, test).to_json()
    else:
        training.fine_tune_clear(model, train, settings, generator=generator)
    local_only = settings.local_only
    figures = {"global": evaluation.own_accuracy(start, test).to_json(),
               "personalized": {**evaluation.own_accuracy(model, test).to_json(), "method": settings.method,
                                "local_only": local_only}, **figures}
    epsilon = math.inf if accountant is None else accountant.epsilons()[accountant.neighbours]
    mark = {"method": settings.method, "client_index": records.client_index, "client_file": records.client_file.name,
            "file_sha256": records.file_sha256, "global_model_sha256": prepared.global_sha256,
            "local_only": local_only, "epsilon": epsilon,
            "note": (f"LOCAL ONLY: trained on client {records.client_index}'s records in clear; epsilon = inf if "
                     "shipped" if local_only else
                     accountant.note() if accountant is not None else "")}
    record = {**base.trained_on, PERSONALIZATION: mark}
    summary = {"client_index": records.client_index, "method": settings.method, "local_only": local_only,
               "shipping": {"allowed": not local_only, "epsilon": epsilon, "note": mark["note"]},
               "global_model": str(base.path), "global_model_sha256": prepared.global_sha256,
               "records": {"source": str(records.source), "train": len(train), "test": len(test)},
               "settings": settings.to_json(), "randomness": randomness.label, **details,
               "own_heldout": own_heldout(figures, client_index=records.client_index, inputs="clean")}
    return Personalization(model, record, summary, accountant)


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """Return the text summary of a personalization (``ldpfl personalize`` without ``--json``)."""
    local = ", LOCAL ONLY" if summary["local_only"] else ", may be released"
    lines = [f"client {summary['client_index']}: {summary['method']} personalization of {summary['global_model']}",
             *own_heldout_lines(summary["own_heldout"], {"personalized": f"personalized ({summary['method']}{local})"})]
    if "interpolation" in summary:
        lines.append(f"interpolation weight of the global model {summary['interpolation']['weight']:.3g}, chosen on "
                     "the training records by cross-fitting (the test records play no part)")
    lines.append(summary["shipping"]["note"])
    if "out" in summary:
        lines.append(f"written to {summary['out']}")
    return lines
