"""The saved global model ``model.pt``: its parameters and a record of what it was trained on (issue 16 item 5).

``model.pt`` is a ``torch.save`` of one dictionary (readable with ``torch.load(path, weights_only=True)``)::

    {"format": "ldpfl-global-model", "version": 1,
     "state_dict": {"net.0.weight": tensor, ...},      # FederatedMLP.state_dict(), on the CPU
     "trained_on": {...}}                               # JSON values only

``trained_on`` says what the model's inputs are, so that ``ldpfl predict`` can refuse records released
any other way (``mismatches``):

* the client files' common attributes (``TRAINED_ON_ATTRIBUTES``): dataset, classes and their names, the
  shared plan's fingerprint, extractor and input shape, release point, r, encoding (m, n), the stored
  feature format and width, the mechanism; ``mechanism_parameters``, the distinct parameter sets of the
  clients (separate silos may use other ε);
* ``clients``: each client file's index, name and sha256;
* ``model``: input width, hidden layers, classes and dropout of the ``FederatedMLP``;
* ``evaluated_on``: which test inputs the run measured (the randomized test splits; with ``eval_clean``
  also the clean local files), and ``last_round``: the last round's accuracies on them;
* ``engine`` and ``package_version``.

An engine that does not know an attribute leaves its key out (the Flower server sees the clients'
summaries, not their files); ``mismatches`` compares only the keys recorded. Nothing here depends on
time or on paths, so two identical runs write byte-identical files. Models written before this record
existed are a bare state dict: :func:`read_model` returns them with ``trained_on = None``.

torch is imported inside the functions that save or load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.atomic import atomic_write
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.schema import ClientMetadata, FormatError
from ldpfl.contract.small_files import not_regular_reason
from ldpfl.contract.torch_archive import check_archive
from ldpfl.contract.version import package_version
from ldpfl.stage2_federate.round_record import RoundRecord

MODEL_FORMAT = "ldpfl-global-model"
MODEL_VERSION = 1

TRAINED_ON_ATTRIBUTES = ("dataset", "num_classes", "class_names", "plan_fingerprint", "extractor", "input_shape",
                         "release", "features", "integer_bits", "fraction_bits", "feature_format", "feature_width",
                         "mechanism")
"""Client-file attributes that every client of a run shares (``ldpfl.contract.schema.RUN_CONSISTENT_ATTRIBUTES``,
plus the derived width and the input shape) and that the model's inputs depend on."""

RANDOMIZED_TEST = "randomized test splits"
CLEAN_TEST = "clean local test files"

__all__ = ["CLEAN_TEST", "MODEL_FORMAT", "MODEL_VERSION", "RANDOMIZED_TEST", "TRAINED_ON_ATTRIBUTES", "SavedModel",
           "file_attributes", "mismatches", "read_model", "run_record", "save_model", "summary_record", "trained_on"]


def file_attributes(meta: ClientMetadata) -> dict[str, Any]:
    """Return the ``TRAINED_ON_ATTRIBUTES`` of one client file, JSON-ready."""
    values = {key: getattr(meta, key) for key in TRAINED_ON_ATTRIBUTES}
    values["class_names"] = None if meta.class_names is None else list(meta.class_names)
    values["input_shape"] = [int(v) for v in meta.input_shape]
    return json_ready(values)


def _numbers_as_float(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _numbers_as_float(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_as_float(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def _canonical(value: Any) -> str:
    """Return ``value`` as canonical JSON; numbers compare by value (``50`` equals ``50.0``)."""
    return json.dumps(_numbers_as_float(json_ready(value)), sort_keys=True)


def trained_on(attributes: Mapping[str, Any], *, clients: Sequence[Mapping[str, Any]],
               mechanism_parameters: Sequence[Mapping[str, Any]] | None, model: Mapping[str, Any],
               eval_clean: bool, rounds: Sequence[RoundRecord], engine: str) -> dict[str, Any]:
    """Return the ``trained_on`` record of a finished run.

    Parameters
    ----------
    attributes : mapping
        The clients' common attributes (:func:`file_attributes` of the first file), or the subset an
        engine knows.
    clients : sequence of mapping
        Per client file: ``index``, ``file`` (its name), ``sha256``.
    mechanism_parameters : sequence of mapping, optional
        Each client file's recorded mechanism parameters (duplicates are dropped); None: not known.
    model : mapping
        ``input_width``, ``hidden``, ``num_classes``, ``dropout`` of the model.
    eval_clean : bool
        Whether the run also evaluated on the clean local test files.
    rounds : sequence of RoundRecord
        The rounds; the last one's accuracies are kept.
    engine : str
        ``local`` or ``flower``.
    """
    record: dict[str, Any] = {key: attributes[key] for key in TRAINED_ON_ATTRIBUTES if key in attributes}
    if mechanism_parameters is not None:
        distinct: dict[str, Any] = {}
        for params in mechanism_parameters:
            distinct.setdefault(_canonical(params), dict(params))
        record["mechanism_parameters"] = list(distinct.values())
    record["clients"] = [{"index": int(c["index"]), "file": str(c["file"]), "sha256": c.get("sha256")}
                         for c in sorted(clients, key=lambda c: int(c["index"]))]
    record["model"] = {"input_width": int(model["input_width"]), "hidden": [int(h) for h in model["hidden"]],
                       "num_classes": int(model["num_classes"]), "dropout": float(model["dropout"])}
    record["evaluated_on"] = [RANDOMIZED_TEST, *([CLEAN_TEST] if eval_clean else [])]
    last = rounds[-1].to_dict() if rounds else None
    record["last_round"] = None if last is None else {
        key: last.get(key) for key in ("round", "test_accuracy", "clean_test_accuracy") if key in last}
    record["engine"] = engine
    record["package_version"] = package_version()
    return json_ready(record)


def run_record(data: Any, config: Any, rounds: Sequence[RoundRecord]) -> dict[str, Any]:
    """Return the local engine's ``trained_on``, from its ``FederatedData`` and ``FederationConfig``."""
    digests = {Path(r.path).name: r.sha256 for r in data.manifest.files}
    clients = [{"index": c.index, "file": c.path.name, "sha256": digests.get(c.path.name)} for c in data.clients]
    return trained_on(file_attributes(data.first), clients=clients,
                      mechanism_parameters=[c.metadata.mechanism_parameters for c in data.clients],
                      model={"input_width": data.input_width, "hidden": config.hidden,
                             "num_classes": data.num_classes, "dropout": config.dropout},
                      eval_clean=_evaluated_clean(rounds), rounds=rounds, engine="local")


def summary_record(summaries: Sequence[Any], config: Any, rounds: Sequence[RoundRecord]) -> dict[str, Any]:
    """Return the Flower server's ``trained_on``, from the clients' summaries (it never opens their files).

    The summaries carry dataset, classes, feature format, width and mechanism; the other attributes are
    left out (not recorded, so not compared).
    """
    first = summaries[0]
    attributes = {"dataset": first.dataset, "num_classes": first.num_classes, "feature_format": first.feature_format,
                  "feature_width": first.feature_width, "mechanism": first.feature_mechanism}
    clients = [{"index": s.index, "file": s.file, "sha256": s.sha256} for s in summaries]
    return trained_on(attributes, clients=clients, mechanism_parameters=None,
                      model={"input_width": first.feature_width, "hidden": config.hidden,
                             "num_classes": first.num_classes, "dropout": config.dropout},
                      eval_clean=_evaluated_clean(rounds), rounds=rounds, engine="flower")


def _evaluated_clean(rounds: Sequence[RoundRecord]) -> bool:
    """Return whether a round was also evaluated on the clean local test files (its row has ``clean_test_*``)."""
    return any(r.clean_test_loss is not None or r.clean_test_accuracy is not None for r in rounds)


def save_model(path: str | os.PathLike[str], model: Any, record: Mapping[str, Any]) -> Path:
    """Atomically write ``model.pt``: the model's parameters (CPU) and ``record`` (:func:`trained_on`)."""
    import torch

    payload = {"format": MODEL_FORMAT, "version": MODEL_VERSION,
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
               "trained_on": json_ready(dict(record))}
    return atomic_write(path, lambda handle: torch.save(payload, handle))


@dataclass(frozen=True)
class SavedModel:
    """A read ``model.pt``: its parameters and what it was trained on (None for a model saved before the record)."""

    path: Path
    state_dict: dict[str, Any]
    trained_on: dict[str, Any] | None


def read_model(path: str | os.PathLike[str]) -> SavedModel:
    """Read a global model written by ``ldpfl federate`` (tensors and JSON values only: ``weights_only``).

    Raises
    ------
    FormatError
        No such file, not a torch file, not a model of ``ldpfl federate``, or a newer format version.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FormatError(path, not_regular_reason(path))
    check_archive(path)  # declared sizes against the stored bytes and the memory, before torch allocates (issue 24)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many types for a file it cannot read
        raise FormatError(path, f"not a model saved by ldpfl federate ({type(error).__name__}: "
                                f"{' '.join(str(error).split())[:200]})") from None
    if isinstance(payload, Mapping) and payload.get("format") == MODEL_FORMAT:
        version = payload.get("version")
        if not isinstance(version, int) or version > MODEL_VERSION:
            raise FormatError(path, f"model format version {version!r} is newer than this ldpfl reads "
                                    f"({MODEL_VERSION}); upgrade ldpfl")
        state, record = payload.get("state_dict"), payload.get("trained_on")
        if not isinstance(state, Mapping) or not isinstance(record, Mapping):
            raise FormatError(path, "the model lacks its state_dict or trained_on record")
    elif isinstance(payload, Mapping) and payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
        state, record = payload, None  # a bare state dict: written before the record existed
    else:
        raise FormatError(path, "not a model saved by ldpfl federate (neither its format nor a state dict)")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise FormatError(path, "the model's state_dict holds something other than named tensors")
    return SavedModel(path, dict(state), None if record is None else dict(record))


def mismatches(record: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Return how the inputs described by ``found`` differ from those the model was trained on.

    Parameters
    ----------
    record : mapping
        The model's ``trained_on``.
    found : mapping
        The same keys for the inputs at hand (:func:`file_attributes` of the silo's client file, and
        optionally ``mechanism_parameters``: one parameter set). Keys missing on either side are not
        compared.

    Returns
    -------
    list of str
        One phrase per difference, e.g. ``"release is 'scores' here, the model was trained on 'flatten'"``.
    """
    problems = []
    for key in TRAINED_ON_ATTRIBUTES:
        if key in record and key in found and _canonical(record[key]) != _canonical(found[key]):
            problems.append(f"{key} is {json_ready(found[key])!r} here, the model was trained on "
                            f"{json_ready(record[key])!r}")
    if "mechanism_parameters" in record and "mechanism_parameters" in found:
        known = {_canonical(p): json.dumps(json_ready(p), sort_keys=True) for p in record["mechanism_parameters"]}
        if _canonical(found["mechanism_parameters"]) not in known:
            here = json.dumps(json_ready(found["mechanism_parameters"]), sort_keys=True)
            problems.append(f"mechanism_parameters are {here} here, the model was trained on "
                            f"{' or '.join(sorted(known.values()))}")
    return problems
