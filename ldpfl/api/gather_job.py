"""``ldpfl.gather``: the exports of separate silos into one run directory (``ldpfl.contract.gather``).

Every source is validated (manifest, sha256, structure); the silos must carry the same plan, have distinct
client indices and form one run. ``ldpfl gather`` maps its arguments to this function.
"""

from __future__ import annotations

from collections.abc import Sequence

from ldpfl.contract.gather import GatherResult, gather_runs
from ldpfl.contract.plan import SharedPlan, read_plan

from .fields import StrPath
from .progress import ProgressCallback, report


def gather(sources: Sequence[StrPath], *, out: StrPath, plan: SharedPlan | StrPath | None = None,
           dedupe: bool = False, progress: ProgressCallback | None = None) -> GatherResult:
    """Gather the silos' export directories ``sources`` into the new run directory ``out``.

    Parameters
    ----------
    sources : sequence of path
        Each silo's ``ldpfl.export(plan=..., data=..., client_index=i)`` directory.
    out : path
        The new run directory (must not exist, or be empty); on any error nothing is left there.
    plan : SharedPlan or path, optional
        The plan every source must carry; default the sources' ``plan.json``, which must agree.
    dedupe : bool
        Drop the duplicated records of each silo's file (training rows repeated, test rows repeated, test rows
        that repeat a training row); by default they are counted (``GatherResult.duplicates``) and kept.
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` when the job starts and when it is done.

    Returns
    -------
    GatherResult
        The run directory, each client index with its source file, the plan's fingerprint, each
        client file's ``release_guarantee`` (``release_guarantee``: the weakest) and its duplicated records.

    Raises
    ------
    ValueError
        ``GatherError`` (sources that cannot form one run, a target that is not empty) or ``FormatError``
        (a source that does not validate); the message names the file.
    """
    report(progress, "gather", "step", 0, 1)
    shared = plan if isinstance(plan, SharedPlan) or plan is None else read_plan(plan)
    result = gather_runs(list(sources), out, plan=shared, dedupe=dedupe)
    report(progress, "gather", "step", 1, 1, str(result.run_dir))
    return result


__all__ = ["GatherResult", "gather"]
