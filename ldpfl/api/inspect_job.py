"""``ldpfl.inspect``: what a client file (or every file of a run directory) holds, and whether it verifies.

The checks are those of ``ldpfl.inspection.report.inspect_path`` (schema and structure before any data is read,
sha256 against the manifest, every data chunk through Fletcher-32, the privacy report against the
mechanism's parameters, labels against their histograms, bit or float statistics, and a ``stats:K`` file's
released statistics: ε recomputed from its noise, its synthetic rows regenerated); the result adds each
file's ``release_guarantee`` and, on request, a PNG. Imports neither TensorFlow nor torch; matplotlib loads
only for the plot. ``ldpfl inspect`` maps its arguments to this function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.common.errors import ParameterError
from ldpfl.contract.federation_privacy import FederationGuarantee, LedgerSection
from ldpfl.contract.release_guarantee import ReleaseGuarantee, weakest
from ldpfl.contract.write_targets import check_write_target
from ldpfl.inspection.plot import write_plot
from ldpfl.inspection.report import Inspection, inspect_path
from ldpfl.inspection.text import inspection_text

from .fields import StrPath
from .progress import ProgressCallback, report


@dataclass(frozen=True)
class InspectResult:
    """What :func:`inspect` found.

    Attributes
    ----------
    path : Path
        The file or run directory inspected.
    kind : str
        ``file`` or ``run``.
    ok : bool
        Every file checked out and the run has no problem.
    release_guarantees : mapping of str to ReleaseGuarantee
        Each readable file's guarantee (everything it releases about one record), by file name.
    plot : Path or None
        The PNG written (``plot``); None when none was asked for or no file could be read.
    report : Inspection
        Everything found, file by file (``format_text``, ``to_dict``).
    """

    path: Path
    kind: str
    ok: bool
    release_guarantees: Mapping[str, ReleaseGuarantee]
    plot: Path | None
    report: Inspection

    @property
    def release_guarantee(self) -> ReleaseGuarantee | None:
        """Return the weakest file's guarantee (a run's figure); None when no file could be read."""
        return weakest(self.release_guarantees.values())

    @property
    def federation_guarantee(self) -> FederationGuarantee | None:
        """Return ``federation/metrics.json``'s release guarantee (each silo's, the weakest's); None without one."""
        federation = self.report.federation
        return None if federation is None else federation.guarantee

    @property
    def privacy_ledger(self) -> LedgerSection | None:
        """Return ``federation/metrics.json``'s stage-2 privacy ledger; None without a (well-formed) one."""
        federation = self.report.federation
        return None if federation is None else federation.ledger

    @property
    def exit_code(self) -> int:
        """Return the command's exit status: 0 when everything checked out, 1 otherwise."""
        return self.report.exit_code

    def to_dict(self) -> dict[str, Any]:
        """Return everything found, JSON-ready (the ``--json`` output of ``ldpfl inspect``)."""
        return self.report.to_dict()

    def format_text(self, *, details: bool = False) -> str:
        """Return the human-readable report (a run's table; with ``details``, every file's section), then records."""
        return "\n".join([inspection_text(self.report, details=details), *record_lines(self.report)])


def record_lines(found: Inspection) -> list[str]:
    """Return what the records say beyond the file sections (issue 42): duplicated records, clamped values.

    A file: both, always (clamped values where the file records them); a run: the clients that have any.
    """
    lines = []
    for f in found.files:
        client = "?" if f.metadata is None else f.metadata.client_index
        clamped = None if f.metadata is None else f.metadata.clamped_values
        if found.kind == "file":
            lines += [] if f.duplicates is None else [f"records     {f.duplicates.describe()}"]
            lines += [] if clamped is None else [f"clamped     {clamped.describe()}"]
            continue
        if f.duplicates is not None and f.duplicates.total:
            lines.append(f"  client {client}: {f.duplicates.describe()}")
        if clamped is not None and clamped.values:
            lines.append(f"  client {client}: {clamped.describe()}")
    return lines if found.kind == "file" or not lines else ["records", *lines]


def inspect(path: StrPath, *, plot: StrPath | None = None, recompute: bool = False,
            progress: ProgressCallback | None = None) -> InspectResult:
    """Inspect a client file or a run directory (see the module docstring for every check).

    Parameters
    ----------
    path : path
        A client file (``client_000.h5``) or a run directory (``manifest.json`` and client files).
    plot : path, optional
        Also write a PNG there: bit density per feature and bit position (``stats:K`` files: the released class
        counts and the covariance's eigenvalues against the noise edge), label histograms per client, and the
        accuracy per round when ``federation/metrics.json`` exists.
    recompute : bool
        Recompute each DP-SGD part's guarantee with the exact accountant (dp-accounting's PLD: seconds per
        distinct training). By default the stored figure is checked against a valid bracket of it in numpy,
        and recomputed only where the bracket disagrees.
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` when the job starts and when it is done.

    Raises
    ------
    ParameterError
        ``path`` does not exist, or ``plot`` would overwrite an input or a run's artifact.
    FormatError
        A directory without client files.
    """
    source = Path(path)
    if not source.exists():
        raise ParameterError(f"`path` {source} does not exist")
    target = None if plot is None else Path(plot)
    if target is not None:  # never onto the inspected file or a run's artifact (issue 24)

        check_write_target(target, "plot", [source])
    report(progress, "inspect", "step", 0, 1)
    found = inspect_path(source, recompute=recompute)
    written = None
    if target is not None and any(f.metadata is not None and (f.bits or f.floats) for f in found.files):
        written = write_plot(found, target)
    guarantees = {f.name: f.guarantee for f in found.files if f.guarantee is not None}
    report(progress, "inspect", "step", 1, 1, "ok" if found.ok else "problems found")
    return InspectResult(source, found.kind, found.ok, guarantees, written, found)


__all__ = ["InspectResult", "inspect"]
