"""One silo's export and the shared plan, on the stage-1 side (issue 16).

* :func:`load_export_data` loads what an export reads: a registered benchmark set (``dataset``) or the
  user's own files (``data``, ``ldpfl.stage1_features.own_data``), in the parent process and in workers alike.
* **Single-silo mode** (``client_index`` set): the whole input is this silo's data. Nothing is
  partitioned; :func:`silo_partition` gives client ``client_index`` every record (in an order drawn from
  the root stream; ``limit`` still draws a subset) and the other clients of the federation nothing. The
  silo then holds out its own test split (IV-C) like any client and writes ``client_{i:03d}.h5``.
* **The shared plan** (``ldpfl.contract.plan.SharedPlan``): :func:`build_plan` makes one from an export
  resolved over a sample silo (``ldpfl plan``); :func:`require_plan` refuses an export whose data or
  resolved settings contradict it (``PlanMismatch``, naming each setting).

Decision: under the extractor ``none`` the features are the flattened inputs, so only their number
matters: the plan records the input shape as ``(r,)`` and silos whose records have other shapes with
the same number of values (an image folder of 8×8 images and a table of 64 columns) agree. Under a
CNN or the weight-free ``scatter`` the silos' image shapes must be equal (and, for ``scatter``, J and L).

No TensorFlow: the extractor's width comes from ``cnn.flatten_width``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.contract.plan import DEFAULT_RELEASE, PlanMismatch, SharedPlan
from ldpfl.stage1_features.datasets.loaders import load_dataset
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.own_data.load import default_extractor, load_own_data

if TYPE_CHECKING:
    from ldpfl.stage1_features.export.config import ExportConfig

DATA_OPTIONS = ("x_key", "y_key", "label_column", "image_size", "color_mode", "scale", "classes")
"""Keyword arguments of ``load_own_data`` that an export passes through (``ExportConfig.data_options``)."""


def load_export_data(dataset: str, data_dir: str | None, data: str | None, data_options: Mapping[str, Any],
                     classes: Sequence[str] | None = None) -> Any:
    """Return the ``Dataset`` an export reads: the benchmark ``dataset``, or the user's files at ``data``.

    Parameters
    ----------
    dataset : str
        A registered dataset name; with ``data``, the name the files record.
    data_dir : str, optional
        Where the benchmark files are (``load_dataset``).
    data : str, optional
        The user's file or image folder (``load_own_data``).
    data_options : mapping
        ``load_own_data`` options (``DATA_OPTIONS``).
    classes : sequence of str, optional
        A shared plan's class list (own data only).
    """
    if data is None:
        return load_dataset(dataset, data_dir)

    unknown = sorted(set(data_options) - set(DATA_OPTIONS))
    if unknown:
        raise ValueError(f"unknown data option(s) {', '.join(unknown)}; valid: {', '.join(DATA_OPTIONS)}")
    options = dict(data_options)
    if classes is not None:
        options["classes"] = classes
    return load_own_data(data, name=dataset, **options)


def resolve_extractor(name: str, dataset: Any, own_data: bool, *, dp: bool = False) -> str:
    """Return the extractor ``name`` stands for (``auto``: the paper's per dataset, or by shape for own data).

    Under DP-SGD (``dp``) ``auto`` becomes ``cnn.DP_AUTO_EXTRACTOR`` wherever it would be a CNN.
    """
    if name == cnn.AUTO and own_data:
        chosen = default_extractor(dataset)
        return cnn.DP_AUTO_EXTRACTOR if dp and cnn.is_cnn(chosen) else chosen
    return cnn.resolve_extractor(name, dataset.name, dp=dp)


def plan_input_shape(extractor: str, input_shape: Sequence[int]) -> tuple[int, ...]:
    """Return the input shape a plan records: ``(r,)`` under ``none`` (module docstring), else the shape."""
    shape = tuple(int(s) for s in input_shape)
    if not cnn.is_cnn(extractor) and not cnn.is_fixed(extractor):
        return (int(np.prod(shape, dtype=np.int64)),)
    return shape


def silo_partition(labels: np.ndarray, client_index: int, clients: int, rng: np.random.Generator,
                   limit: int | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Single-silo mode: every record (or ``limit`` of them) to client ``client_index``, none to the others.

    Parameters
    ----------
    labels : np.ndarray
        The silo's labels (one per record).
    client_index : int
        This silo's index i in [0, clients).
    clients : int
        N, the federation's number of silos.
    rng : np.random.Generator
        The root stream: shuffles the records (and draws ``limit`` of them).
    limit : int, optional
        Use only this many records, drawn at random.

    Returns
    -------
    (list of np.ndarray, dict)
        N index arrays (all empty but the silo's) and the ``partition`` attribute.
    """
    n = int(len(labels))
    rows = rng.permutation(n).astype(np.int64)
    if limit is not None and limit < n:
        rows = rows[:limit]
    parts = [np.empty(0, dtype=np.int64) for _ in range(clients)]
    parts[client_index] = rows
    described = {"kind": "silo", "num_clients": clients, "client_index": client_index, "records": int(rows.size),
                 "pooled_records": n, "limit": limit}
    return parts, described


def plan_mechanism_parameters(plan: SharedPlan) -> dict[str, Any]:
    """Return the plan's mechanism parameters as an export takes them (without the record parameter r/d)."""
    record = plan.mechanism.mechanism_class.RECORD_PARAMETER
    return {k: v for k, v in plan.mechanism.recorded_parameters().items() if k != record}


def apply_plan(config: ExportConfig, plan: SharedPlan, given: Mapping[str, Any],
               source: str | os.PathLike[str] = "the plan") -> ExportConfig:
    """Return ``config`` with every setting ``plan`` fixes; refuse ``given`` settings that contradict it.

    Parameters
    ----------
    config : ExportConfig
        A silo's export of its own ``data``.
    plan : SharedPlan
        The shared plan (``ldpfl plan``).
    given : mapping
        The settings the user chose, by plan setting name (``dataset``, ``extractor``, ``mechanism``,
        ``mechanism_parameters``, ``release``, ``label_epsilon``) or extractor option (``scatter_j``,
        ``scatter_l``); the others come from the plan.
    source : path or str
        The plan file, named in the message.

    Raises
    ------
    PlanMismatch
        A given setting contradicts the plan (a ``ParameterError`` naming each setting).
    """
    options = {**cnn.option_defaults(), **plan.extractor_options}  # scatter's J and L: the plan's, or the defaults
    settings = {k: v for k, v in given.items() if k not in options}
    for key in sorted(set(given) & set(options)):
        if given[key] != options[key]:
            raise PlanMismatch(f"settings contradict {source}: `{key}` = {given[key]!r} contradicts the plan "
                               f"({options[key]!r})", [f"{key} = {given[key]!r} contradicts the plan"])
    plan.require_agreement(settings, source)
    return dataclasses.replace(config, dataset=plan.dataset, extractor=plan.extractor, mechanism=plan.mechanism.name,
                               mechanism_params=plan_mechanism_parameters(plan), plan=plan, release=plan.release,
                               label_epsilon=plan.label_epsilon, **options)


def plan_settings(*, dataset: Any, extractor: str, features: int, spec: mechanisms.MechanismSpec,
                  release: str = DEFAULT_RELEASE, extractor_options: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Return an export's resolved settings as ``ldpfl.contract.plan.SETTINGS`` names them."""
    return {"extractor_options": dict(extractor_options or {}),
        "dataset": dataset.name, "classes": getattr(dataset, "class_names", None), "extractor": extractor,
        "input_shape": plan_input_shape(extractor, dataset.input_shape), "release": release, "features": features,
        "mechanism": spec.name, "mechanism_parameters": spec.recorded_parameters(),
        "feature_format": spec.feature_format, "feature_width": spec.feature_width,
    }


def require_plan(plan: SharedPlan, source: str | os.PathLike[str], **resolved: Any) -> None:
    """Refuse an export whose data or resolved settings contradict ``plan``.

    ``resolved`` as for :func:`plan_settings`. Raises ``ValueError`` naming the data and every
    contradiction in plain words: the settings given were already checked against the plan
    (``ldpfl.api.export_job.with_plan``), so what is left comes from the data (input shape, r, classes).
    """
    found = plan.contradictions(plan_settings(**resolved))
    if found:
        where = getattr(resolved["dataset"], "path", None) or resolved["dataset"].name
        raise ValueError(f"{where} does not fit {source}: {'; '.join(found)}")


def build_plan(export: Any, classes: Sequence[str] | None = None) -> SharedPlan:
    """Return the shared plan of a resolved export (``ldpfl plan``: the export's settings over a sample silo).

    Parameters
    ----------
    export : ExportPlan
        ``export.plan.make_plan`` of the export's settings with a sample silo's ``data``: the extractor,
        r and the mechanism are resolved exactly as the silos' exports will resolve them.
    classes : sequence of str, optional
        The class list; default: the sample's class names (own data always has them: the labels as text, or
        the class folders).
    """
    dataset = export.dataset
    names = tuple(classes) if classes is not None else tuple(dataset.class_names)
    return SharedPlan(dataset=dataset.name, classes=names, extractor=export.extractor,
                      input_shape=plan_input_shape(export.extractor, dataset.input_shape), features=export.features,
                      mechanism=export.spec, release=export.config.release, label_epsilon=export.config.label_epsilon,
                      extractor_options=export.extractor_options)


__all__ = ["DATA_OPTIONS", "apply_plan", "build_plan", "load_export_data", "plan_input_shape",
           "plan_mechanism_parameters", "plan_settings", "require_plan", "resolve_extractor", "silo_partition"]
