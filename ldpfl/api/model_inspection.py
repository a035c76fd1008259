"""``ldpfl inspect`` of a model: what a ``model.pt`` is, what it was trained on, and whether it may leave the silo.

A federation's global model (``RUN/federation/model.pt``) and a silo's personalized model (``ldpfl personalize``:
``RUN/personalized/client_NNN.METHOD/model.pt``) share one format (``stage2_federate.model_file``). The description
says which one it is; for a personalized model its method, its silo, whether it is **local-only** (trained on the
silo's records in clear: ε = ∞ if shipped) or may be released (DP fine-tuning: the silo's ε over the federation and
the fine-tuning, with its δ and neighbouring relation from ``personalization.json`` beside it), and the global
model it started from. ``ldpfl inspect`` calls :func:`inspect_model` for a ``.pt`` file, or a folder holding
``model.pt`` and no client file. torch loads when the model is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.digest import sha256_file
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.layout import client_files
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.personalize.base_model import is_local_only, personalization_of
from ldpfl.stage2_federate.personalize.outputs import MODEL, SUMMARY

from .fields import StrPath

__all__ = ["ModelInspection", "inspect_model", "is_model_path"]


def is_model_path(path: StrPath) -> bool:
    """Return whether ``ldpfl inspect`` should describe ``path`` as a model (a ``.pt`` file, or its folder)."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".pt"
    return path.is_dir() and (path / MODEL).is_file() and not client_files(path)


@dataclass(frozen=True)
class ModelInspection:
    """What a ``model.pt`` is (``to_dict`` for ``--json``, ``format_text`` for the text)."""

    path: Path
    description: Mapping[str, Any]

    @property
    def exit_code(self) -> int:
        """Return 0: a model that reads is described (an unreadable one raises ``FormatError``)."""
        return 0

    def to_dict(self) -> dict[str, Any]:
        """Return the description, JSON-ready (an infinite ε as ``"inf"``)."""
        return json_ready(dict(self.description))

    def format_text(self) -> str:
        """Return the human-readable description."""
        d = self.description
        model = d.get("model") or {}
        lines = [f"{self.path}: {d['kind']}", f"sha256 {d['sha256']}",
                 f"model: input width {model.get('input_width')}, hidden {model.get('hidden')}, "
                 f"{model.get('num_classes')} classes"]
        trained = d.get("trained_on")
        if trained:
            lines.append("trained on: " + ", ".join(f"{k} {v}" for k, v in trained.items() if v is not None))
        personal = d.get("personalization")
        if personal:
            epsilon = personal["epsilon"]
            lines.append(f"personalization: {personal['method']} of client {personal['client_index']}'s records "
                         f"(file {personal.get('client_file')}), from the global model sha256 "
                         f"{str(personal.get('global_model_sha256'))[:12]}...")
            if personal["local_only"]:
                lines.append("LOCAL ONLY: trained on the silo's records in clear; epsilon = inf if shipped: keep it, "
                             "and its predictions, on the silo")
            else:
                extra = (f" at delta {personal['delta']:g} ({personal['neighbours']})" if "delta" in personal else "")
                lines.append(f"may be released: epsilon {epsilon:.6g}{extra} in each of client "
                             f"{personal['client_index']}'s training records, over its federation and fine-tuning")
        else:
            lines.append(d["shipping"])
        return "\n".join(lines)


def inspect_model(path: StrPath) -> ModelInspection:
    """Describe the model at ``path`` (a ``model.pt``, or a folder holding one; module docstring).

    Raises
    ------
    FormatError
        Not a model of ``ldpfl federate`` or ``ldpfl personalize``.
    """
    path = Path(path)
    file = path / MODEL if path.is_dir() else path
    saved = read_model(file)
    record = saved.trained_on or {}
    personal = personalization_of(record)
    keys = ("dataset", "num_classes", "extractor", "release", "feature_format", "feature_width", "mechanism",
            "engine")
    description: dict[str, Any] = {
        "path": str(file), "sha256": sha256_file(file), "model": record.get("model"),
        "trained_on": {k: record.get(k) for k in keys if k in record} | (
            {"clients": len(record.get("clients") or ())} if record else {}),
        "kind": "a federation's global model" if personal is None else
                f"client {personal.get('client_index')}'s personalized model ({personal.get('method')})"}
    if not record:
        description["kind"] += " (saved before ldpfl recorded what a model was trained on)"
    if personal is None:
        description["shipping"] = ("the federation's global model: what the silos were sent (its guarantee is the "
                                   "run's, in federation/metrics.json)")
        return ModelInspection(file, description)
    local = is_local_only(record)
    epsilon = math.inf if local else float(personal.get("epsilon", math.inf))
    summary = _summary(file.parent / SUMMARY)
    same = (summary.get("client_index") == personal.get("client_index")
            and summary.get("global_model_sha256") == personal.get("global_model_sha256"))
    accountant = summary.get("accountant") if same and isinstance(summary.get("accountant"), Mapping) else None
    details = {key: personal.get(key) for key in ("method", "client_index", "client_file", "global_model_sha256")}
    details |= {"local_only": local, "released": not local, "epsilon": epsilon}
    if accountant is not None and not local:
        details |= {"delta": accountant.get("delta"), "neighbours": accountant.get("neighbours"),
                    "steps": accountant.get("steps")}
    description["personalization"] = details
    description["shipping"] = str(personal.get("note") or "")
    return ModelInspection(file, description)


def _summary(path: Path) -> dict[str, Any]:
    """Return ``personalization.json`` beside the model, or nothing when there is none or it does not read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
