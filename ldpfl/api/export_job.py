"""``ldpfl.export``: stage 1 of LDPFL (Algorithm 1 lines 1-10) as one call, a config in, an ``ExportResult`` out.

Two ways to say what to export:

* an ``ExportConfig`` (``ldpfl.stage1_features.export.config``), taken as it is: ``ldpfl export`` builds one
  from its flags (with a shared plan already applied) and calls this function;
* keyword arguments, the config's fields (:class:`~ldpfl.api.fields.ExportFields`). The mechanism's
  parameters are the IV-D defaults overridden by ``mechanism_params`` (as the command's ``--epsilon``,
  ``--param`` ... do); own ``data`` is named ``dataset`` (default: its file or folder name); with ``plan``
  every setting the plan fixes comes from it, and one given here must agree with it; with ``from_models``
  a given data setting must agree with the source run's; ``local_only`` without a ``mechanism`` means ``none``
  (``extractor="scatter", scatter_j=2, scatter_l=8, local_only=True``: clean ScatterNet features that stay).

Either way the job runs ``run_export`` (``ldpfl.stage1_features.export.run``): the same files, bit for bit,
for the same settings and seed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Unpack

from ldpfl.common.errors import ParameterError
from ldpfl.contract.names import check_name, child_path
from ldpfl.contract.plan import SharedPlan, read_plan
from ldpfl.contract.release_point import STATS
from ldpfl.mechanisms.gaussian_statistics import GaussianStatistics
from ldpfl.stage1_features.export.config import DEFAULT_MECHANISM_PARAMS, ExportConfig, require_own_data
from ldpfl.stage1_features.export.from_models import read_source_run, source_conflicts
from ldpfl.stage1_features.export.results import ExportResult
from ldpfl.stage1_features.export.run import run_export
from ldpfl.stage1_features.export.silo import apply_plan
from ldpfl.stage1_features.own_data.load import default_name

from .fields import ExportFields, StrPath, require_directory_name
from .progress import ProgressCallback, report

RUNS_DIR = "runs"
"""Where an export goes without ``out``: ``runs/<dataset>``, as ``ldpfl export`` does."""


def export(config: ExportConfig | None = None, /, *, out: StrPath | None = None,
           plan: SharedPlan | StrPath | None = None, progress: ProgressCallback | None = None,
           progress_bars: bool = False, **fields: Unpack[ExportFields]) -> ExportResult:
    """Run (or resume) an export: per client, train a CNN, release its features randomized, write HDF5.

    Parameters
    ----------
    config : ExportConfig, optional
        What to export, taken as it is. Give it, or the fields as keyword arguments, not both.
    out : path, optional
        The run directory; default ``runs/<dataset>``. An export there is resumed (verified clients kept).
    plan : SharedPlan or path, optional
        Keyword form only: the shared plan (``ldpfl.plan``) this silo's export follows.
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` (clients finished of clients to export) when
        the run directory is ready and after each client.
    progress_bars : bool
        tqdm bars on stderr (per client, per epoch, per release), as the command line shows them.
    **fields
        ``ExportConfig``'s fields (:class:`~ldpfl.api.fields.ExportFields`), for the keyword form.

    Returns
    -------
    ExportResult
        The run directory, the manifest, the privacy report of the mechanism, one summary per client,
        and each client file's ``release_guarantee`` (``release_guarantee``: the weakest of them).

    Raises
    ------
    ParameterError
        A setting that cannot be used (the message names the parameter), settings that contradict the
        plan or the source run, or a run directory that cannot be resumed as asked.
    ValueError, OSError
        Other bad input (a dataset's files missing), or writing failed.
    """
    require_directory_name(out)
    if config is not None and (fields or plan is not None):
        raise ParameterError("give `config` or its fields as keyword arguments (with `plan`), not both")
    check_from_models(config.from_models if config is not None else fields.get("from_models"), out)
    if config is None:
        config = config_from_fields(fields, plan)
    target = Path(out) if out is not None else child_path(RUNS_DIR, config.dataset, "dataset")

    def on_progress(done: int, total: int) -> None:
        report(progress, "export", "client", done, total)

    return run_export(config, target, progress=progress_bars, on_progress=on_progress if progress else None)


def config_from_fields(fields: ExportFields, plan: SharedPlan | StrPath | None = None) -> ExportConfig:
    """Return the ``ExportConfig`` of the keyword form (module docstring): defaults, own data, plan, source run.

    Raises
    ------
    ParameterError
        A field the config refuses, a name that cannot be a file name, or settings that contradict the plan
        or the ``from_models`` source run.
    """
    given: dict[str, Any] = dict(fields)
    values = dict(given)
    values["mechanism_params"] = {**DEFAULT_MECHANISM_PARAMS, **dict(given.get("mechanism_params") or {})}
    if given.get("local_only") and "mechanism" not in given:
        values["mechanism"] = "none"  # local-only files hold the clean features
    if str(given.get("release", "")).strip().lower().startswith(f"{STATS}:") and plan is None:
        if "mechanism" not in given:
            values["mechanism"] = GaussianStatistics.NAME  # the one release of noisy statistics (issue 40)
        if "epsilon" not in (given.get("mechanism_params") or {}):
            raise ParameterError("`release` stats:K spends its budget once: give it as `epsilon` (--epsilon), "
                                 "under add/remove unless `neighbours` says replace-one")
    data = given.get("data")
    if data is not None and (plan is None or "dataset" in given):  # with a plan: the plan's name by default

        values["dataset"] = check_name(given.get("dataset") or default_name(data), "dataset")
    config = ExportConfig(**values)
    if plan is not None:
        config = with_plan(config, plan, given)
    check_from_models(config.from_models, None, given, needs_out=False)
    return config


def with_plan(config: ExportConfig, plan: SharedPlan | StrPath, given: Mapping[str, Any]) -> ExportConfig:
    """Apply the shared plan to ``config``; the fields in ``given`` (those set explicitly) must agree with it.

    The keyword form calls it with its fields, ``ldpfl export --plan`` with the options given on the command line.

    Raises
    ------
    ParameterError
        No own ``data``, or settings that contradict the plan (``PlanMismatch``, naming each).
    """
    require_own_data(["plan"], config.data)
    shared = plan if isinstance(plan, SharedPlan) else read_plan(plan)
    source = "the plan given" if isinstance(plan, SharedPlan) else os.fspath(plan)
    settings = {"dataset": given.get("dataset"), "mechanism": given.get("mechanism"),
                "release": given.get("release"), "label_epsilon": given.get("label_epsilon"),
                "extractor": None if given.get("extractor") in (None, "auto") else given["extractor"],
                "mechanism_parameters": given.get("mechanism_params") or None}
    settings.update({k: given[k] for k in ("scatter_j", "scatter_l") if k in given})
    return apply_plan(config, shared, {k: v for k, v in settings.items() if v is not None}, source)


def check_from_models(from_models: str | None, out: StrPath | None, given: Mapping[str, Any] | None = None, *,
                      needs_out: bool = True) -> None:
    """Refuse ``from_models`` without ``out``, or with settings in ``given`` that contradict the source run's.

    A re-release writes a new run, and its records are the source run's, so its data settings apply.
    ``ldpfl export`` calls it too.

    Raises
    ------
    ParameterError
        Naming ``from_models`` and ``out``, or each contradicting setting.
    """
    if from_models is None:
        return
    if needs_out and out is None:
        raise ParameterError("`from_models` writes a new run: give its directory with `out`")
    problems = source_conflicts(read_source_run(from_models), given) if given else []  # SOURCE_SETTINGS only
    if problems:
        raise ParameterError(f"`from_models` releases the records of {from_models}, whose settings apply: "
                             f"{'; '.join(problems)}; leave these out")


__all__ = ["ExportResult", "check_from_models", "config_from_fields", "export", "with_plan"]
