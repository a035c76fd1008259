"""The server's half of the Flower engine, without flwr: its plan from the clients' summaries, its checks.

The server never opens a client file: it learns N, the rows and the label histograms from the
clients' ``ClientDescription`` (what the local engine reads from the files) and builds its
plan with the local engine's builder (``plan.build_plan``): the model initialized from the server's
stream, each client's perturbation (for σ_i and the privacy reports; the clients build their own), the
strategy, the server rule, the records. The rounds are the shared loop's (``loop.run_rounds``), so a
seeded run selects, drops and aggregates exactly as the local engine does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ldpfl.common.errors import LdpflError
from ldpfl.contract.atomic import atomic_write_text
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.label_claims import histogram_refusal
from ldpfl.stage2_federate.left_out import LeftOut, enough_remain, needed_silos
from ldpfl.stage2_federate.left_out import TooFewSilosError as TooFewSilosError  # raised by screen
from ldpfl.stage2_federate.model import parameter_count
from ldpfl.stage2_federate.perturbation import perturbation_wiring
from ldpfl.stage2_federate.plan import FederationPlan, build_plan, resolve_device
from ldpfl.stage2_federate.round_record import SplitSums
from ldpfl.stage2_federate.round_record import union_evaluation as union_of

from .protocol import SERVERAPP_LOCK, SUBMISSION_FILE, AppRunConfig, ClientSetup, ManifestEntry

ENGINE = "flower"


@dataclass
class ServerPlan(FederationPlan):
    """A Flower run, set up on the server (``plan.build_plan``) plus what each client is sent of it."""

    setups: dict[int, ClientSetup]


def summary_refusal(s: ClientDescription) -> str | None:
    """Why the coordinator refuses ``s`` on its own (its claims do not add up), or None."""
    if len(s.label_histogram) != s.num_classes or sum(s.label_histogram) != s.train_rows:
        return (f"client {s.index}: its summary claims {s.train_rows} training rows but a label histogram of "
                f"{len(s.label_histogram)} classes totalling {sum(s.label_histogram)} (the run has {s.num_classes} "
                "classes): the silo's claims do not add up")
    return None


def check_summaries(summaries: Sequence[ClientDescription]) -> list[ClientDescription]:
    """Sort the summaries by client index; refuse duplicates and clients whose files do not form one run."""
    ordered = sorted(summaries, key=lambda s: s.index)
    indices = [s.index for s in ordered]
    if len(set(indices)) != len(indices):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        raise ValueError(f"two clients hold client index {twice[0]} (every SuperNode needs its own client file)")
    if not ordered:
        raise ValueError("no client described itself")
    first = ordered[0]
    for s in ordered:  # a silo's claims must add up: its training label histogram counts its training rows
        reason = summary_refusal(s)
        if reason is not None:
            raise ValueError(reason)
    for s in ordered[1:]:
        for key in ("dataset", "num_classes", "feature_format", "feature_width"):
            if getattr(s, key) != getattr(first, key):
                raise ValueError(f"client files do not form one run: {s.file} has {key} {getattr(s, key)!r}, "
                                 f"{first.file} has {getattr(first, key)!r}")
    return ordered


def plan_from_summaries(config: FederationConfig, summaries: Sequence[ClientDescription], *,
                        run_dir: str | None = None, left_out: Sequence[LeftOut] = (),
                        entries: Sequence[ManifestEntry] = ()) -> ServerPlan:
    """Set up the run from the clients' summaries with the local engine's builder (``plan.build_plan``).

    The server holds the model and the uploads of a round, and trains nothing itself: its memory check
    counts no batch. ``left_out``: the silos :func:`screen` refused, recorded in the run's ``run.left_out``.
    ``entries``: the manifest's; a silo whose entry lists no training label counts has a histogram the server
    cannot check, whose DP-FedAW weight is capped (``label_claims``).
    """
    ordered = check_summaries(summaries)
    first = ordered[0]
    run: dict[str, Any] = {"run_dir": run_dir, "dataset": first.dataset, "clients": len(ordered),
           "feature_format": first.feature_format, "input_width": first.feature_width,
           "num_classes": first.num_classes, "feature_mechanism": first.feature_mechanism,
           "train_rows": [s.train_rows for s in ordered], "test_rows": [s.test_rows for s in ordered]}
    if left_out:  # the silos refused before round 1 (``screen``), named in config.json and metrics.json
        run["left_out"] = [x.to_dict() for x in left_out]
    listed = {e.index for e in entries if e.train_labels is not None}  # screen compared these with the claims
    plan = build_plan(config, ordered, device=resolve_device(config.device), batch_rows=0, threads=config.threads,
                      run=run, engine={"engine": ENGINE, "resolved": {"flower": _flower_version()}},
                      unchecked_histograms=[s.index for s in ordered if s.index not in listed])
    return ServerPlan(**plan.base(), setups=client_setups(plan))


def client_setups(plan: FederationPlan) -> dict[int, ClientSetup]:
    """Return what each client is sent of the plan: its position, the model's shape, its ε_i, L_i, c_i."""
    clients_plan, training = plan.client_plan, plan.training
    budgeted = perturbation_wiring(plan.config.perturbation).budget
    first, dim = plan.clients[0], parameter_count(plan.model)
    label_noise = training.label_noise
    return {c.index: ClientSetup(
        position=position, clients=len(plan.clients), dim=dim, input_width=first.feature_width,
        num_classes=first.num_classes, optimizer=training.optimizer, lr=training.lr,
        epsilon=clients_plan.epsilons[position] if budgeted else None,
        range_length=None if clients_plan.ranges is None else clients_plan.ranges[position],
        centre=None if clients_plan.centres is None else clients_plan.centres[position],
        label_noise=label_noise,
        training=training.silo(c.index))
        for position, c in enumerate(plan.clients)}


def _flower_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flwr")
    except PackageNotFoundError:
        return None


def _short(digest: str) -> str:
    return digest[:12] + "…"


def manifest_refusal(s: ClientDescription, listed: dict[int, ManifestEntry],
                     plan_fingerprint: str | None = None) -> str | None:
    """Why the manifest (``listed``: its entries by index) refuses ``s``, or None (see :func:`check_manifest`)."""
    entry = listed.get(s.index)
    if entry is None:
        return (f"client {s.index}: its SuperNode serves {s.file}, but the run's manifest lists no client "
                f"{s.index} (clients {sorted(listed)}): the node serves another run's file")
    if s.file != entry.file or s.sha256 != entry.sha256:
        return (f"client {s.index}: its SuperNode serves {s.file} (sha256 {_short(s.sha256)}), but the "
                f"run's manifest lists {entry.file} (sha256 {_short(entry.sha256)}): the node serves "
                "another run's file, or the silo exported it again")
    for what, claimed, listed_rows in (("training", s.train_rows, entry.train_rows),
                                       ("test", s.test_rows, entry.test_rows)):
        if listed_rows is not None and claimed != listed_rows:
            return (f"client {s.index}: its SuperNode claims {claimed} {what} rows in {s.file}, the run's "
                    f"manifest lists {listed_rows}: the silo's claim is refused")
    if entry.train_labels is not None:  # issue 42 item 3: DP-FedAW's weight comes from the histogram
        reason = histogram_refusal(s.index, s.file, s.label_histogram, entry.train_labels, "the run's manifest lists")
        if reason is not None:
            return reason
    if plan_fingerprint and s.plan_fingerprint != plan_fingerprint:
        return (f"client {s.index}: {s.file} was not exported with the run's plan.json (plan fingerprint "
                f"{_short(str(s.plan_fingerprint))}, the plan's {_short(plan_fingerprint)})")
    return None


def check_manifest(summaries: Sequence[ClientDescription], entries: Sequence[ManifestEntry],
                   plan_fingerprint: str | None = None) -> None:
    """Refuse a SuperNode whose file is not the one the coordinator's manifest lists for its client index.

    A deployed run's coordinator holds only ``manifest.json`` (and ``plan.json``); each SuperNode
    describes the file it serves. Every described file must be the manifest's entry of its client index
    (same name and sha256) and, with a plan, carry the plan's fingerprint. The error names the client
    index and the reason (another run's file, a file exported again, a file off the plan). Where the manifest
    lists the file's rows, the silo's claimed training and test rows must be those (its weights under
    ``sample_weighted`` and the bound of its evaluation sums come from them).
    """
    listed = {e.index: e for e in entries}
    for s in sorted(summaries, key=lambda s: s.index):
        reason = manifest_refusal(s, listed, plan_fingerprint)
        if reason is not None:
            raise ValueError(reason)


def screen(described: Sequence[tuple[int, ClientDescription]], entries: Sequence[ManifestEntry] = (),
           plan_fingerprint: str | None = None, *, needed: int = 1, refused: Sequence[LeftOut] = ()
           ) -> tuple[list[ClientDescription], dict[int, int], list[LeftOut]]:
    """Leave out each silo whose summary the coordinator refuses; return the rest, client index → node, the left out.

    ``described``: (node id, summary) for every SuperNode. One silo never stops a run: a silo whose claims the
    manifest refuses (another file, other rows, another plan; :func:`manifest_refusal`) or whose claims do not
    add up (:func:`summary_refusal`) is left out and named, and the run goes on with the others.

    A client index claimed by two or more SuperNodes: the claimant serving the manifest's file of that index
    (same name and sha256) is the honest one and keeps the index; every other claimant is named an impostor
    and left out. Where the manifest cannot tell them apart (no manifest, or none or several serve the listed
    file), every claimant of the index is left out. The claimants are named in (file, sha256, node) order, never
    in reply order. ``refused``: the silos left out before any node started (a simulation's files that do not
    verify, ``launch.screen_silos``): they count among the listed silos and are named with the others, as the
    local engine names a refused file beside a refused claim. Raise :class:`TooFewSilosError` (one line naming
    every left-out silo) when fewer than ``needed`` remain (``left_out.needed_silos`` of every listed silo: two,
    as a run of one silo is no federation, or more where ``--min-clients-per-round`` or ``--clients-per-round``
    ask for more).
    """
    listed = {e.index: e for e in entries}
    by_index: dict[int, list[tuple[int, ClientDescription]]] = {}
    for node, s in described:
        by_index.setdefault(s.index, []).append((node, s))
    kept: list[tuple[int, ClientDescription]] = []
    left: list[LeftOut] = list(refused)
    for index in sorted(by_index):
        claimants = sorted(by_index[index], key=lambda ns: (ns[1].file, ns[1].sha256, ns[0]))
        if len(claimants) > 1:
            entry = listed.get(index)
            honest = [ns for ns in claimants if entry is not None and (ns[1].file, ns[1].sha256)
                      == (entry.file, entry.sha256)]
            files = ", ".join(f"{s.file} (sha256 {_short(s.sha256)})" for _, s in claimants)
            if entry is not None and len(honest) == 1:
                kept.append(honest[0])
                left.extend(LeftOut(index, s.file, (
                    f"client {index}: its SuperNode serves {s.file} (sha256 {_short(s.sha256)}) and claims client "
                    f"index {index}, which the run's manifest lists as {entry.file} (sha256 {_short(entry.sha256)}): "
                    "the impostor is left out")) for node, s in claimants if node != honest[0][0])
            else:
                left.extend(LeftOut(index, s.file, (
                    f"client {index}: claimed by {len(claimants)} SuperNodes ({files}), and the run's manifest "
                    "cannot tell the honest one: every claimant is left out")) for _, s in claimants)
            continue
        kept.append(claimants[0])
    screened: list[tuple[int, ClientDescription]] = []
    for node, s in kept:
        # a claim that contradicts itself is named so before it is compared with the manifest's counts
        reason = summary_refusal(s) or (manifest_refusal(s, listed, plan_fingerprint) if entries else None)
        if reason is None:
            screened.append((node, s))
        else:
            left.append(LeftOut(s.index, s.file, reason))
    left.sort(key=lambda x: (x.index, x.file))
    enough_remain(len(screened), len(described) + len(refused), left, needed)
    return [s for _, s in screened], {s.index: node for node, s in screened}, left


def screen_nodes(described: Sequence[tuple[int, ClientDescription]], settings: AppRunConfig
                 ) -> tuple[list[ClientDescription], dict[int, int], list[LeftOut]]:
    """Screen the ServerApp's nodes (:func:`screen`) under the run configuration ``settings``.

    The manifest and plan are the run's; the silos the launcher left out (``settings.left_out``: a simulation's
    files that do not verify) are named with those refused here, and the run needs ``left_out.needed_silos`` of
    every listed silo (the nodes and the launcher's left out), as the local engine does.
    """
    listed = len(described) + len(settings.left_out)
    needed = needed_silos(listed, min_clients=settings.min_clients,
                          clients_per_round=settings.federation.clients_per_round)
    return screen(described, list(settings.manifest), settings.plan_fingerprint, needed=needed,
                  refused=settings.left_out)


class OutDirUnseen(LdpflError, RuntimeError):
    """The ServerApp does not see the submitting command's output directory (it runs on another machine)."""


class StopRequested(LdpflError, RuntimeError):
    """The command that submitted the run asked it to stop (interrupted, or a newer command into OUT)."""


def stop_requested(out_dir: Path, token: str) -> bool:
    """Return whether ``out_dir``'s submission record no longer lets the run of ``token`` go on.

    The submitting command sets ``stop`` in the record when it is interrupted, and a later command into
    ``out_dir`` does so for the run of a command that was killed; the ServerApp checks before each exchange
    and ends between exchanges, with no message in flight (Flower 1.41's ``StopRun`` during an exchange
    can leave a SuperNode waiting for a reply that never comes).
    """
    try:
        record = json.loads((out_dir / SUBMISSION_FILE).read_text())
    except (OSError, ValueError):
        return True
    return not isinstance(record, dict) or record.get("token") != token or bool(record.get("stop"))


def claim_out_dir(out_dir: Path, token: str) -> FileLock:
    """Check that ``out_dir`` is the submitting command's (its token) and hold it for this ServerApp.

    The ServerApp writes the outputs where the SuperLink runs; the command that submitted the run wrote
    ``token`` into ``out_dir``/:data:`~.protocol.SUBMISSION_FILE` first, so reading it back proves that
    both see the same directory. The returned lock holds :data:`~.protocol.SERVERAPP_LOCK` (``filelock``: the
    system drops it when this process ends); keep it for the whole run and ``release()`` it at the end.

    Raises
    ------
    OutDirUnseen
        ``out_dir`` or its submission file is missing, or holds another submission's token.
    RuntimeError
        Another ServerApp writes into ``out_dir``.
    """
    try:
        stated = json.loads((out_dir / SUBMISSION_FILE).read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        stated = None
    if stated != token:
        raise OutDirUnseen(f"the ServerApp does not see the output directory {out_dir} of the command that submitted "
                           "the run (the ServerApp runs on the SuperLink's machine and writes the outputs there): run "
                           "ldpfl federate --superlink on the SuperLink's machine")
    lock = FileLock(out_dir / SERVERAPP_LOCK, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise RuntimeError(f"another ldpfl ServerApp is writing into {out_dir}") from None
    return lock


def union_evaluation(sums: Sequence[tuple[float, int, int]]) -> tuple[float, float]:
    """Mean loss and accuracy over the union of the test splits from per-client (loss sum, correct, rows)."""
    return union_of([SplitSums(*s) for s in sums])


# --------------------------------------------------------------------------------------------------
# The status file for the launcher (the outputs are ``run_outputs``'s, as in the local engine).


def write_status(path: str | Path, **values: Any) -> None:
    """Atomically write the status file the launcher polls (``state``: running, done or error)."""
    if str(path):
        atomic_write_text(Path(path), json.dumps({**values, "time": time.time()}))
