"""``ldpfl.federate``: stage 2 of LDPFL (Algorithm 1 lines 11-25) on either engine, a typed result out.

``engine="local"`` runs every client in this process (``ldpfl.stage2_federate.federation``);
``engine="flower"`` runs the same federation in Flower's simulation engine on this machine, one ClientApp
per client file (``ldpfl.stage2_federate.flower_engine.launch``; needs ``pip install -e '.[flower]'``), or,
with ``superlink``, on the SuperNodes of a running Flower SuperLink (real silos,
``ldpfl.stage2_federate.flower_engine.deployment``: ``run_dir`` then needs only its manifest and plan). At a
fixed seed all select and drop the same clients and reach the same accuracies. Both write the same outputs
(``metrics.json``, ``metrics.csv``, ``accuracy.png``, ``model.pt``, ``config.json``), and the result is built
the same way from what the engine returns. With ``head="lda"`` (local engine only) no round is played: the
closed-form head is fitted on the ``stats:K`` files' pooled released statistics (``ldpfl.stage2_federate.closed_form``)
and the same outputs are written. ``ldpfl federate`` maps its flags to this function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

from ldpfl.common.errors import ParameterError
from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.contract.layout import FEDERATION_DIR
from ldpfl.contract.release_guarantee import ReleaseGuarantee, weakest
from ldpfl.stage2_federate import budgets
from ldpfl.stage2_federate.closed_form import run_closed_form
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.flower_engine import require_flower
from ldpfl.stage2_federate.flower_engine.control import parse_superlink
from ldpfl.stage2_federate.flower_engine.deployment import run_on_superlink
from ldpfl.stage2_federate.flower_engine.launch import FlowerOptions, run_flower
from ldpfl.stage2_federate.runtime import apply_runtime_defaults

from .fields import FederationFields, StrPath, require_directory_name
from .progress import ProgressCallback, report

if TYPE_CHECKING:
    from ldpfl.stage2_federate.result import FederationResult

Engine = Literal["local", "flower"]
ENGINES: tuple[Engine, ...] = ("local", "flower")


@dataclass(frozen=True)
class FederationOutputs:
    """The files a federation wrote (``checkpoint`` None once deleted: it is seed-equivalent)."""

    directory: Path
    metrics_json: Path
    metrics_csv: Path
    accuracy_png: Path
    model: Path
    config: Path
    checkpoint: Path | None


@dataclass(frozen=True)
class FederateResult:
    """What :func:`federate` did.

    Attributes
    ----------
    run_dir : Path
        The export run directory federated over.
    engine : str
        ``local`` or ``flower``.
    config : FederationConfig
        The configuration the run was given.
    outputs : FederationOutputs
        The files written.
    rounds : tuple of mapping
        Each round's record, as in ``metrics.json`` (selected, dropped, weights, losses, accuracies, ...).
    test_accuracy : tuple of float or None
        The global model's accuracy on the clients' released test splits, per round; None where it has none (a
        round whose model was not evaluated: ``eval_every``).
    final_accuracy : float or None
        The last round's test accuracy.
    resumed_from_round : int or None
        The checkpoint's round when the run was resumed.
    warnings : tuple of str
        One line for each round in which clients were excluded or no upload survived.
    privacy_ledger : LedgerSection or None
        Each client's (ε, δ) over the rounds in which its upload reached the server (``metrics.json``'s
        ``privacy_ledger``).
    client_guarantees : mapping of int to ReleaseGuarantee
        Each client file's ``release_guarantee``: everything it released about one record. The model, its
        updates and its metrics are computed from those releases (post-processing).
    record : FederationResult
        The engine's own result (``to_dict`` is the ``--json`` output of ``ldpfl federate``).
    """

    run_dir: Path
    engine: Engine
    config: FederationConfig
    outputs: FederationOutputs
    rounds: tuple[Mapping[str, object], ...]
    test_accuracy: tuple[float | None, ...]
    final_accuracy: float | None
    resumed_from_round: int | None
    warnings: tuple[str, ...]
    privacy_ledger: LedgerSection | None
    client_guarantees: Mapping[int, ReleaseGuarantee]
    record: FederationResult

    @property
    def release_guarantee(self) -> ReleaseGuarantee | None:
        """Return the weakest client file's guarantee: the run's per-record figure (``metrics.json``)."""
        return weakest(self.client_guarantees.values())

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` output of ``ldpfl federate``."""
        return dict(self.record.to_dict())


def federate(run_dir: StrPath, config: FederationConfig | None = None, /, *, engine: Engine = "local",
             out: StrPath | None = None, resume: bool = False, overwrite: bool = False,
             keep_checkpoint: bool = False, cpus_per_client: int | None = None, client_timeout: float | None = None,
             superlink: str | None = None, root_certificates: StrPath | None = None, insecure: bool = False,
             min_clients_per_round: int | None = None, budget_presets: Sequence[str] = (),
             progress: ProgressCallback | None = None, progress_bars: bool = False,
             on_warning: Callable[[str], None] | None = None, **fields: Unpack[FederationFields]) -> FederateResult:
    """Run (or resume) a federation over the client files of the export run ``run_dir``.

    Parameters
    ----------
    run_dir : path
        An export run directory (``manifest.json`` and ``client_NNN.h5``).
    config : FederationConfig, optional
        The federation; or give its fields as keyword arguments (:class:`~ldpfl.api.fields.FederationFields`),
        not both.
    engine : {"local", "flower"}
        Where the clients run: in this process, or in Flower's simulation engine.
    out : path, optional
        The output directory; default ``RUN_DIR/federation``.
    resume, overwrite, keep_checkpoint : bool
        Continue from ``out/checkpoint.pt``; start afresh over an earlier run; keep the checkpoint at the end
        (it is seed-equivalent, so it is deleted by default).
    cpus_per_client, client_timeout : optional
        Flower only: whole CPUs per simulated client (default 1), seconds to wait for one exchange (600).
    superlink : str, optional
        Flower only: ``HOST:PORT`` of a running SuperLink whose SuperNodes (one per silo) serve the client
        files; the run is submitted there instead of simulated. ``run_dir`` needs only ``manifest.json`` (and
        ``plan.json``); the ServerApp writes ``out`` on the SuperLink's machine, where this must run.
    root_certificates, insecure : optional
        With ``superlink``: the PEM file of the CA that signed its certificate (default: the system's CAs), or
        no TLS at all (tests on 127.0.0.1 only).
    min_clients_per_round : int, optional
        The failure policy, on both engines: a failing client (on Flower: its node died, its code raised) or one
        whose reply the server rejected is logged with its index and reason, and the round goes on while at
        least this many selected clients trained; fewer end the run (``TooFewClientsError``, one line). Default:
        on Flower a client's own failure ends the run (a lost node is logged and the round goes on); on both
        engines a rejected reply is left out and the round goes on.
    budget_presets : sequence of str
        Named per-client ε or safe-range lengths (``ldpfl.stage2_federate.budgets``), each setting
        ``client_epsilons`` or ``client_ranges`` by its kind (keyword form only; one per kind).
    progress : callable, optional
        Called with a :class:`~ldpfl.api.progress.Progress` after each round (with its test accuracy).
    progress_bars : bool
        A tqdm bar over the rounds on stderr, as the command line shows it.
    on_warning : callable, optional
        Called with one line for each round in which clients were excluded or no upload survived (the lines
        are in the result's ``warnings`` either way).
    **fields
        ``FederationConfig``'s fields, for the keyword form.

    Raises
    ------
    ParameterError
        A setting that cannot be used (the message names the parameter), an output directory that holds a
        run (without ``resume`` or ``overwrite``).
    TooFewClientsError
        ``engine="local"`` with ``min_clients_per_round``: fewer selected clients trained in a round (one line naming
        the silos left out and why; on Flower the same reaches you as ``FlowerRunError``).
    FlowerMissingError, FlowerRunError
        ``engine="flower"``: Flower is not installed; the Flower run failed, or (``SuperLinkError``) the
        SuperLink cannot be reached, fails TLS, is none, refuses or is busy (one line each).
    """
    require_directory_name(out)
    if superlink is not None:
        superlink = parse_superlink(superlink)  # HOST:PORT (stdlib only), before anything loads
    if engine not in ENGINES:
        raise ParameterError(f"`engine` must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "flower" and (cpus_per_client is not None or client_timeout is not None or superlink is not None):
        raise ParameterError("`superlink`, `cpus_per_client` and `client_timeout` apply to `engine` flower only")
    policy = min_clients_per_round
    if policy is not None and (isinstance(policy, bool) or not isinstance(policy, int) or policy < 1):
        raise ParameterError(f"`min_clients_per_round` must be an integer >= 1, got {min_clients_per_round!r}")
    if superlink is None and (root_certificates is not None or insecure):
        raise ParameterError("`root_certificates` and `insecure` apply to `superlink` only")
    if superlink is not None and cpus_per_client is not None:
        raise ParameterError("`cpus_per_client` applies to a simulation, not to `superlink` (each silo's SuperNode "
                             "uses its own machine)")
    if insecure and root_certificates is not None:
        raise ParameterError("`insecure` (no TLS) and `root_certificates` (TLS with that CA) exclude each other")
    if budget_presets:
        if config is not None:
            raise ParameterError("`budget_presets` set fields of the keyword form: give them without `config`")
        epsilons, ranges = budgets.apply_presets(budget_presets, fields.get("client_epsilons"),
                                                 fields.get("client_ranges"))
        if epsilons is not None:
            fields["client_epsilons"] = epsilons
        if ranges is not None:
            fields["client_ranges"] = ranges
    if config is None:
        config = FederationConfig(**fields)
    elif fields:
        raise ParameterError("give `config` or its fields as keyword arguments, not both")

    if config.closed_form and engine != "local":
        raise ParameterError(f"`head` {config.head} runs on `engine` local only: it is fitted once on the files' "
                             "released statistics, with no round for Flower to carry")
    if config.closed_form and resume:
        raise ParameterError(f"`resume`: `head` {config.head} has no rounds to resume (run it again, with "
                             "`overwrite`: it spends nothing)")

    apply_runtime_defaults()  # before torch loads: huge pages, sleeping OpenMP threads (see runtime.py)
    rounds = config.rounds

    def on_round(record: Mapping[str, Any]) -> None:
        accuracy = record.get("test_accuracy")
        note = f"test accuracy {accuracy:.4f}" if isinstance(accuracy, float) and math.isfinite(accuracy) else ""
        report(progress, "federate", "round", int(record["round"]), rounds, note)

    target = None if out is None else Path(out)
    rounds_done = on_round if progress is not None else None
    if engine == "flower":
        require_flower(simulation=superlink is None)

        options = FlowerOptions(cpus_per_client=cpus_per_client or 1, round_timeout=client_timeout or 600.0,
                                min_clients=min_clients_per_round)
        record: FederationResult
        if superlink is not None:
            record = run_on_superlink(Path(run_dir), config, superlink=superlink, out_dir=target, resume=resume,
                                      progress=progress_bars, overwrite=overwrite, keep_checkpoint=keep_checkpoint,
                                      options=options, insecure=insecure,
                                      root_certificates=None if root_certificates is None else Path(root_certificates),
                                      on_warning=on_warning, on_round=rounds_done)
        else:
            record = run_flower(Path(run_dir), config, out_dir=target, resume=resume, progress=progress_bars,
                                overwrite=overwrite, keep_checkpoint=keep_checkpoint, options=options,
                                on_warning=on_warning, on_round=rounds_done)
    elif config.closed_form:  # no round: fitted on the files' pooled released statistics
        record = run_closed_form(Path(run_dir), config, Path(run_dir) / FEDERATION_DIR if target is None else target,
                                 overwrite=overwrite, on_round=rounds_done)
    else:
        from ldpfl.stage2_federate.federation import run_federation  # imports torch

        record = run_federation(Path(run_dir), config, out_dir=target, resume=resume, progress=progress_bars,
                                overwrite=overwrite, keep_checkpoint=keep_checkpoint, on_warning=on_warning,
                                on_round=rounds_done, min_clients=min_clients_per_round)
    return _result(Path(run_dir), engine, config, record)


def _result(run_dir: Path, engine: Engine, config: FederationConfig, record: FederationResult) -> FederateResult:
    """Build the typed result from an engine's ``FederationResult``."""
    paths: Mapping[str, Path] = record.paths
    outputs = FederationOutputs(paths["metrics_json"].parent, paths["metrics_json"], paths["metrics_csv"],
                                paths["accuracy_png"], paths["model"], paths["config"], paths.get("checkpoint"))
    history = tuple(dict(r) for r in record.history)
    guarantees = {p.client: p.release_guarantee for p in record.privacy if p.release_guarantee is not None}
    return FederateResult(run_dir, engine, config, outputs, history,
                          tuple(_figure(r.get("test_accuracy")) for r in history),
                          None if record.final_accuracy is None else float(record.final_accuracy),
                          record.resumed_from_round, tuple(record.warnings), record.privacy_ledger, guarantees,
                          record)


def _figure(value: object) -> float | None:
    """Return a round's figure as a float, None where it has none (null in metrics.json, NaN in memory)."""
    return float(value) if isinstance(value, int | float) and not math.isnan(value) else None


__all__ = ["ENGINES", "Engine", "FederateResult", "FederationOutputs", "federate"]
