"""``ldpfl.plan``: the shared plan of a cross-silo federation, resolved over a sample silo's data (issue 16).

The plan fixes what every silo's files must share: the dataset name, the class list, the extractor and its
input shape, the release point, the mechanism with all its parameters and the encoding (m, n). It is the
export's settings resolved exactly as the silos' exports will resolve them (``export.plan.make_plan`` over
the sample), written as JSON (``ldpfl.contract.plan``). ``ldpfl plan`` maps its flags to this function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.names import check_name
from ldpfl.contract.plan import SharedPlan, write_plan
from ldpfl.contract.write_targets import check_write_target
from ldpfl.stage1_features.export.config import DEFAULT_MECHANISM_PARAMS, ExportConfig
from ldpfl.stage1_features.export.plan import make_plan
from ldpfl.stage1_features.export.silo import build_plan
from ldpfl.stage1_features.models.scatter import DEFAULT_J, DEFAULT_L
from ldpfl.stage1_features.own_data.load import default_name

from .fields import StrPath
from .progress import ProgressCallback, report


@dataclass(frozen=True)
class PlanResult:
    """What :func:`plan` wrote.

    Attributes
    ----------
    path : Path
        The plan file.
    plan : SharedPlan
        The plan itself.
    privacy : PrivacyReport
        The privacy report of the planned mechanism over the planned features (per record, each silo's
        feature release); each silo's file adds its labels and extractor to its ``release_guarantee``.
    """

    path: Path
    plan: SharedPlan
    privacy: mechanisms.PrivacyReport

    @property
    def fingerprint(self) -> str:
        """Return the plan's fingerprint (``sha256:...``), which every silo's files record."""
        return self.plan.fingerprint

    def to_dict(self) -> dict[str, Any]:
        """Return the plan as JSON (``ldpfl plan --json``)."""
        return self.plan.to_dict()


def plan(data: StrPath | None, *, out: StrPath = "plan.json", overwrite: bool = False, dataset: str | None = None,
         classes: Sequence[str] | None = None, extractor: str = "auto", release: str = "flatten",
         mechanism: str = "uer", mechanism_params: Mapping[str, object] | None = None,
         label_epsilon: float | None = None, data_options: Mapping[str, object] | None = None,
         scatter_j: int = DEFAULT_J, scatter_l: int = DEFAULT_L, progress: ProgressCallback | None = None
         ) -> PlanResult:
    """Resolve an export's settings over a sample silo's ``data`` and write the shared plan to ``out``.

    Parameters
    ----------
    data : path
        A sample silo's own data (image folder, .npz, HDF5, CSV or Parquet; ``data/README.md``).
    out : path
        The plan file to write.
    overwrite : bool
        Replace an existing plan file.
    dataset : str, optional
        The dataset name every silo's files record; default the data's file or folder name.
    classes : sequence of str, optional
        The class list, in order; default the sample's classes (sorted labels or folder names).
    extractor, release, mechanism : str
        As for ``ldpfl.export`` (``auto``: a CNN for images of at least 8×8, ``none`` otherwise).
    mechanism_params : mapping, optional
        The mechanism's parameters over the IV-D defaults (ε = 0.5, α = 10, m = 4, n = 5).
    label_epsilon : float, optional
        Every silo releases its labels by k-ary randomized response at this ε (default: clear labels).
    data_options : mapping, optional
        How to read ``data`` (``label_column``, ``image_size``, ``color_mode``, ``x_key``, ``y_key``, ``scale``).
    scatter_j, scatter_l : int
        ``extractor`` scatter: J and L (Tramèr and Boneh: 2 and 8), recorded in the plan.
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` when the job starts and when the plan is written.

    Raises
    ------
    ParameterError
        ``out`` exists without ``overwrite`` or is an input, a name that cannot be a file name, a setting the
        export refuses.
    """
    if data is None:
        raise ParameterError("a plan is made over a sample silo's data: pass `data`")
    report(progress, "plan", "step", 0, 1)
    if dataset is not None:
        check_name(dataset, "dataset")
    target = Path(out)
    check_write_target(target, "out", [data])  # never onto the sample data or a run's artifact (issue 24)
    if target.exists() and not overwrite:
        raise ParameterError(f"{target} exists; pass `overwrite` to replace it")
    options: dict[str, Any] = dict(data_options or {})
    if classes is not None:
        options["classes"] = [str(c) for c in classes]
    config = ExportConfig(dataset=dataset or default_name(data), data=str(data), data_options=options,
                          extractor=extractor, mechanism=mechanism, release=release, label_epsilon=label_epsilon,
                          scatter_j=scatter_j, scatter_l=scatter_l,
                          mechanism_params={**DEFAULT_MECHANISM_PARAMS, **dict(mechanism_params or {})})
    export = make_plan(config)
    shared = build_plan(export, options.get("classes"))
    write_plan(shared, target)
    report(progress, "plan", "step", 1, 1, str(target))
    return PlanResult(target, shared, export.privacy)


__all__ = ["PlanResult", "plan"]
