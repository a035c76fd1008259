"""``ldpfl predict``'s figures on a silo's own held-out records: per class, for the global and the personalized model.

A prediction with labels reports its accuracy per class. When the records are the silo's own held-out split in
clear (its run's test split through its pipeline, or its local-only clean file), the summary's ``own_heldout``
block holds each model's figures by role: ``global`` for the federation's model, ``personalized`` for a silo's own
model (``ldpfl personalize``: its method, whether it is local-only, its ε if shipped), and beside a personalized
model the global model it started from (found by its sha256), predicted from the same rows in the same pass.
These figures are computed on the silo and are not released (``own_accuracy.KEPT_ON_SILO``): nothing adds noise
to them or accounts for them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ldpfl import prediction as pr
from ldpfl.contract.digest import sha256_file
from ldpfl.prediction import GlobalModel, PredictError, Prediction
from ldpfl.stage2_federate.personalize.base_model import personalization_of
from ldpfl.stage2_federate.personalize.own_accuracy import class_accuracy, own_heldout

__all__ = ["figures", "started_from"]


def started_from(model: GlobalModel, given: Path | None, default: Path, warn: Callable[[str], None]
                 ) -> list[GlobalModel]:
    """Return the global model a personalized ``model`` started from (``given``, else ``default`` if it is that one).

    Raises
    ------
    PredictError
        ``given`` beside a model that is not personalized, or ``given`` missing or another model than the one the
        personalization started from (its sha256). Without ``given``, a missing or other ``default`` is a warning.
    """
    personal = personalization_of(model.trained_on)
    if personal is None:
        if given is not None:
            raise PredictError(f"`global_model` is the model a personalized `model` started from; {model.path} is "
                               "not a personalized model: leave out `global_model`")
        return []
    path = given if given is not None else default
    alone = "; the own held-out figures are the personalized model's alone (pass `global_model`)"
    if not path.is_file():
        if given is not None:
            raise PredictError(f"no model at `global_model` {path}")
        warn(f"no global model at {path}{alone}")
        return []
    digest, expected = sha256_file(path), str(personal.get("global_model_sha256"))
    if digest != expected:
        problem = (f"{path} is not the global model {model.path} started from (sha256 {digest[:12]}... there, "
                   f"{expected[:12]}... recorded)")
        if given is not None:
            raise PredictError(f"`global_model` {problem}")
        warn(problem + alone)
        return []
    return [pr.load_global_model(path)]


def figures(result: Prediction, model: GlobalModel, others: list[GlobalModel]) -> dict[str, Any]:
    """Return the summary's per-class figures and, on the silo's own held-out records, its ``own_heldout`` block."""
    labels, summary = result.labels, result.summary
    if labels is None:
        return {}
    try:
        main = class_accuracy(result.predicted, labels, model.num_classes)
    except ValueError:  # labels outside the model's classes: no per-class figure
        return {}
    out: dict[str, Any] = {"per_class_accuracy": list(main.per_class),
                           "per_class_records": list(main.per_class_records)}
    own_records = summary.get("split") == "test" and (summary["inputs"] != pr.RELEASED or summary.get("local_only"))
    if not own_records:
        return out
    personal = personalization_of(model.trained_on)
    about: dict[str, Any] = {"model": str(model.path)}
    if personal is not None:
        about |= {key: personal.get(key) for key in ("method", "local_only", "epsilon")}
    roles = {"global" if personal is None else "personalized": {**main.to_json(), **about}}
    for other, predicted in zip(others, result.others, strict=True):
        roles["global"] = {**class_accuracy(predicted, labels, other.num_classes).to_json(), "model": str(other.path)}
    return out | {"own_heldout": own_heldout(roles, client_index=summary.get("client_index"),
                                             inputs=summary["inputs"])}
