"""The global model a silo personalizes, checked against its file, and the mark of a local-only model. Torch-free.

A personalized ``model.pt`` has the global model's format (``stage2_federate.model_file``): its ``trained_on``
record is the global model's, plus ``personalization`` (:data:`PERSONALIZATION`): the method, the silo, the
global model's sha256, and ``local_only``. A local-only model was computed from the silo's records in clear
(``clear``, ``interpolate``): ε = ∞ if it leaves the silo. :func:`released_model_problem` is the test any reader
that expects a released model applies (``ldpfl personalize`` itself refuses such a model as its global model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.digest import sha256_file
from ldpfl.stage2_federate.model_file import file_attributes, mismatches, read_model

from .records import OwnRecords, PersonalizeError

PERSONALIZATION = "personalization"
"""The key of ``trained_on`` that marks a personalized model."""

__all__ = ["PERSONALIZATION", "BaseModel", "check_base_model", "is_local_only", "personalization_of",
           "released_model_problem"]


def personalization_of(trained_on: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Return a model's personalization record (None: the federation's global model, or not recorded)."""
    value = None if trained_on is None else trained_on.get(PERSONALIZATION)
    return value if isinstance(value, Mapping) else None


def is_local_only(trained_on: Mapping[str, Any] | None) -> bool:
    """Return whether the model is a silo's local-only model (trained on its records in clear)."""
    record = personalization_of(trained_on)
    return bool(record is not None and record.get("local_only", True))


def released_model_problem(path: str | Path, trained_on: Mapping[str, Any] | None) -> str | None:
    """Return why the model at ``path`` is no released model (None when it may be one).

    A local-only personalized model is a function of a silo's records in clear: shipping it releases them with
    ε = ∞.
    """
    record = personalization_of(trained_on)
    if record is None or not is_local_only(trained_on):
        return None
    return (f"{path} is client {record.get('client_index')}'s local-only model ({record.get('method')} "
            "personalization on its records in clear: epsilon = inf if shipped), not a released model")


@dataclass(frozen=True)
class BaseModel:
    """The model personalization starts from: its parameters, shape, ``trained_on`` record and sha256."""

    path: Path
    state: dict[str, Any]  # name -> torch.Tensor (CPU)
    trained_on: dict[str, Any]
    input_width: int
    hidden: tuple[int, ...]
    num_classes: int
    dropout: float
    sha256: str


def _shape(path: Path, state: Mapping[str, Any]) -> list[int]:
    weights = sorted((int(k.split(".")[1]), v) for k, v in state.items()
                     if k.startswith("net.") and k.endswith(".weight") and k.split(".")[1].isdigit())
    if not weights or any(v.ndim != 2 for _, v in weights):
        raise PersonalizeError(f"{path} does not hold the federated model's layers (net.N.weight)")
    return [int(weights[0][1].shape[1])] + [int(v.shape[0]) for _, v in weights]


def check_base_model(path: str | Path, records: OwnRecords, *, resumed: bool = False) -> BaseModel:
    """Read the global model and refuse one that the silo's file cannot personalize (one line each).

    Parameters
    ----------
    path : path
        The model (``RUN/federation/model.pt``, or a DP personalization's model when ``resumed``).
    records : OwnRecords
        The silo's records and client file.
    resumed : bool
        Whether the model is an earlier DP personalization of this silo that the job continues.

    Raises
    ------
    PersonalizeError
        No model there; a personalized model where the federation's is expected (a local-only one: not a
        released model); a model whose shape or feature space (classes, plan, extractor, release, encoding,
        width, mechanism) is not the file's; a model not trained on this client file (another run).
    """
    path = Path(path)
    if not path.is_file():
        raise PersonalizeError(f"no global model at {path}: run ldpfl federate on the run first, or pass `model`")
    saved = read_model(path)
    record = saved.trained_on
    if record is None:
        raise PersonalizeError(f"{path} records nothing of what it was trained on (written before ldpfl recorded "
                               "it): personalization cannot check it against the silo's file")
    problem = released_model_problem(path, record)
    if problem is not None:
        raise PersonalizeError(f"{problem}: personalize from the federation's global model (`model`)")
    if personalization_of(record) is not None and not resumed:
        raise PersonalizeError(f"{path} is already a personalized model: personalize from the federation's global "
                               "model (`model`), or continue a DP personalization with `resume`")
    meta, index = records.metadata, records.client_index
    widths = _shape(path, saved.state_dict)
    problems = []
    if widths[-1] != meta.num_classes:
        problems.append(f"num_classes is {meta.num_classes} here, the model predicts {widths[-1]}")
    if widths[0] != meta.feature_width:
        problems.append(f"feature_width is {meta.feature_width} here, the model takes {widths[0]}")
    found: dict[str, Any] = file_attributes(meta)
    if not meta.local_only:
        found["mechanism_parameters"] = dict(meta.mechanism_parameters)
    problems += mismatches(record, found)
    if problems:
        raise PersonalizeError(f"{path} was not trained on the feature space of {records.client_file.name}: "
                               f"{'; '.join(dict.fromkeys(problems))}")
    clients = {int(c["index"]): c for c in record.get("clients") or () if isinstance(c, Mapping)}
    if index not in clients:
        raise PersonalizeError(f"{path} was not trained with client {index} (its clients: "
                               f"{', '.join(map(str, sorted(clients))) or 'none'}); check `client_index`")
    expected = clients[index].get("sha256")
    if expected is not None and expected != records.file_sha256:
        raise PersonalizeError(f"{records.client_file} is not the file {path} was trained on (sha256 "
                               f"{records.file_sha256[:12]}... here, {str(expected)[:12]}... there): a file from "
                               "another run")
    model = record.get("model") or {}
    return BaseModel(path, dict(saved.state_dict), dict(record), widths[0], tuple(widths[1:-1]), widths[-1],
                     float(model.get("dropout", 0.0)), sha256_file(path))
