"""The server's half of the Flower engine, without flwr: its plan from the clients' summaries, and its outputs.

The server never opens a client file: it learns N, the rows and the label histograms from the
clients' :class:`~.protocol.ClientSummary` (what the local engine reads from the files) and builds the
same plan as ``plan.plan_federation``: the model initialized from the server's stream, each client's
perturbation (for σ_i and the privacy reports; the clients build their own), the strategy, the server
rule, the records. The round itself reuses ``rounds`` (``strategy.select``, ``draw_dropouts``,
``server_step``, ``round_record``) in the local engine's order, so a seeded run selects, drops and
aggregates exactly as the local engine does.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from ldpfl import mechanisms as mech
from ldpfl.contract.atomic import atomic_write, atomic_write_text
from ldpfl.contract.version import package_version

from .. import outputs as out
from ..checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, check_inputs, load_checkpoint
from ..config import DEFAULT_LR, FederationConfig
from ..label_noise import resolve_label_noise
from ..model import FederatedMLP, build_model, get_vector, parameter_count, resolve_optimizer, set_vector
from ..model_file import save_model, summary_record
from ..perturbation import ClientPerturbation, ServerRule, perturbation_wiring
from ..plan import (
    ClientSize,
    check_noise_scales,
    plan_perturbations,
    plan_strategy,
    relabel,
    resolve_device,
    resolved_settings,
)
from ..rounds import LocalTraining
from ..strategies import Strategy
from ..streams import Streams
from .protocol import SERVERAPP_LOCK, SUBMISSION_FILE, ClientSetup, ClientSummary, ManifestEntry

ENGINE = "flower"


@dataclass
class ServerPlan:
    """A Flower run, set up on the server: streams, model, strategy, rule, per-client setups, records."""

    config: FederationConfig
    summaries: list[ClientSummary]
    randomness: mech.Randomness
    streams: Streams
    model: FederatedMLP
    perturbations: dict[int, ClientPerturbation]
    strategy: Strategy
    rule: ServerRule
    training: LocalTraining
    setups: dict[int, ClientSetup]
    privacy: list[dict[str, Any]]
    record: dict[str, Any]

    @property
    def vector(self) -> np.ndarray:
        """Return the current global vector (float32, CPU)."""
        return get_vector(self.model).cpu().numpy()

    def set_vector(self, vector: np.ndarray) -> None:
        """Make ``vector`` the global model."""
        tensor = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float32))
        set_vector(self.model, tensor.to(next(self.model.parameters()).device))


def check_summaries(summaries: Sequence[ClientSummary]) -> list[ClientSummary]:
    """Sort the summaries by client index; refuse duplicates and clients whose files do not form one run."""
    ordered = sorted(summaries, key=lambda s: s.index)
    indices = [s.index for s in ordered]
    if len(set(indices)) != len(indices):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        raise ValueError(f"two clients hold client index {twice[0]} (every SuperNode needs its own client file)")
    if not ordered:
        raise ValueError("no client described itself")
    first = ordered[0]
    for s in ordered[1:]:
        for key in ("dataset", "num_classes", "feature_format", "feature_width"):
            if getattr(s, key) != getattr(first, key):
                raise ValueError(f"client files do not form one run: {s.file} has {key} {getattr(s, key)!r}, "
                                 f"{first.file} has {getattr(first, key)!r}")
    return ordered


def plan_from_summaries(config: FederationConfig, summaries: Sequence[ClientSummary], *,
                        run_dir: str | None = None) -> ServerPlan:
    """Set up the run from the clients' summaries as ``plan.plan_federation`` does from their files."""
    ordered = check_summaries(summaries)
    first = ordered[0]
    device = resolve_device(config.device)
    randomness = mech.make_randomness(config.seed)
    streams = Streams.create(randomness, len(ordered))
    model = build_model(first.feature_width, config.hidden, first.num_classes, dropout=config.dropout,
                        generator=streams.init, device=device)
    dim = parameter_count(model)
    sizes = [ClientSize(s.index, s.train_rows, s.label_histogram) for s in ordered]
    clients_plan, target, perturbations = plan_perturbations(config, sizes, dim)
    check_noise_scales(config, perturbations)
    strategy = plan_strategy(config, sizes, perturbations)
    rule = ServerRule.for_perturbation(config.perturbation, target, config.server_lr)
    label_noise = resolve_label_noise(config.label_noise_correction,  # issue 22: every file's T must agree
                                      [(s.file, s.label_release) for s in ordered])
    training = LocalTraining(resolve_optimizer(config.optimizer, first.dataset),
                             DEFAULT_LR if config.lr is None else float(config.lr), config.local_epochs,
                             config.batch_size, label_noise)
    budgeted = perturbation_wiring(config.perturbation).budget
    setups = {}
    for position, s in enumerate(ordered):
        setups[s.index] = ClientSetup(
            position=position, clients=len(ordered), dim=dim, input_width=first.feature_width,
            num_classes=first.num_classes, optimizer=training.optimizer, lr=training.lr,
            epsilon=clients_plan.epsilons[position] if budgeted else None,
            range_length=None if clients_plan.ranges is None else clients_plan.ranges[position],
            centre=None if clients_plan.centres is None else clients_plan.centres[position],
            label_noise=None if label_noise is None else label_noise.to_dict())
    privacy = []
    for s in ordered:
        report = perturbations[s.index].report(randomness.mode, randomness.generator_name)
        report.update(file=s.file, feature_privacy=dict(s.feature_privacy), feature_mechanism=s.feature_mechanism)
        if s.release_guarantee is not None:
            report.update(release_guarantee=dict(s.release_guarantee))
        privacy.append(report)
    record = {
        **config.to_dict(),
        "randomness": randomness.mode,
        "generator": randomness.generator_name,
        "engine": ENGINE,
        "resolved": {
            **resolved_settings(device=device, training=training, dim=dim, target=target, rule=rule,
                                plan=clients_plan, budgeted=budgeted, perturbations=perturbations,
                                strategy=strategy, threads=config.threads),
            "flower": _flower_version(),
        },
        "run": {
            "run_dir": run_dir, "dataset": first.dataset, "clients": len(ordered),
            "feature_format": first.feature_format, "input_width": first.feature_width,
            "num_classes": first.num_classes, "feature_mechanism": first.feature_mechanism,
            "train_rows": [s.train_rows for s in ordered], "test_rows": [s.test_rows for s in ordered],
        },
    }
    return ServerPlan(config, ordered, randomness, streams, model, perturbations, strategy, rule, training, setups,
                      privacy, record)


def _flower_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flwr")
    except PackageNotFoundError:
        return None


def _short(digest: str) -> str:
    return digest[:12] + "…"


def check_manifest(summaries: Sequence[ClientSummary], entries: Sequence[ManifestEntry],
                   plan_fingerprint: str | None = None) -> None:
    """Refuse a SuperNode whose file is not the one the coordinator's manifest lists for its client index.

    A deployed run's coordinator holds only ``manifest.json`` (and ``plan.json``); each SuperNode
    describes the file it serves. Every described file must be the manifest's entry of its client index
    (same name and sha256) and, with a plan, carry the plan's fingerprint. The error names the client
    index and the reason (another run's file, a file exported again, a file off the plan).
    """
    listed = {e.index: e for e in entries}
    for s in sorted(summaries, key=lambda s: s.index):
        entry = listed.get(s.index)
        if entry is None:
            raise ValueError(f"client {s.index}: its SuperNode serves {s.file}, but the run's manifest lists no client "
                             f"{s.index} (clients {sorted(listed)}): the node serves another run's file")
        if s.file != entry.file or s.sha256 != entry.sha256:
            raise ValueError(f"client {s.index}: its SuperNode serves {s.file} (sha256 {_short(s.sha256)}), but the "
                             f"run's manifest lists {entry.file} (sha256 {_short(entry.sha256)}): the node serves "
                             "another run's file, or the silo exported it again")
        if plan_fingerprint and s.plan_fingerprint != plan_fingerprint:
            raise ValueError(f"client {s.index}: {s.file} was not exported with the run's plan.json (plan fingerprint "
                             f"{_short(str(s.plan_fingerprint))}, the plan's {_short(plan_fingerprint)})")


class OutDirUnseen(RuntimeError):
    """The ServerApp does not see the submitting command's output directory (it runs on another machine)."""


class StopRequested(RuntimeError):
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


def claim_out_dir(out_dir: Path, token: str) -> IO[str]:
    """Check that ``out_dir`` is the submitting command's (its token) and hold it for this ServerApp.

    The ServerApp writes the outputs where the SuperLink runs; the command that submitted the run wrote
    ``token`` into ``out_dir``/:data:`~.protocol.SUBMISSION_FILE` first, so reading it back proves that
    both see the same directory. The returned handle holds :data:`~.protocol.SERVERAPP_LOCK` (an
    advisory ``flock`` that the kernel drops when this process ends); keep it open for the whole run.

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
    import fcntl

    handle = open(out_dir / SERVERAPP_LOCK, "a+")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"another ldpfl ServerApp is writing into {out_dir}") from None
    return handle


def union_evaluation(sums: Sequence[tuple[float, int, int]]) -> tuple[float, float]:
    """Mean loss and accuracy over the union of the test splits from per-client (loss sum, correct, rows)."""
    rows = sum(r for _, _, r in sums)
    if rows == 0:
        return math.nan, math.nan
    return sum(loss for loss, _, _ in sums) / rows, sum(c for _, c, _ in sums) / rows


# --------------------------------------------------------------------------------------------------
# Outputs: the local engine's files, and a status file for the launcher.


def output_paths(out_dir: Path) -> dict[str, Path]:
    """Return the output paths of a run in ``out_dir`` (the local engine's names)."""
    return {
        "metrics_csv": out_dir / out.METRICS_CSV, "metrics_json": out_dir / out.METRICS_JSON,
        "accuracy_png": out_dir / out.PLOT_PNG, "model": out_dir / out.MODEL_PT,
        "config": out_dir / out.CONFIG_JSON, "checkpoint": out_dir / out.CHECKPOINT_PT,
    }


def write_status(path: str | Path, **values: Any) -> None:
    """Atomically write the status file the launcher polls (``state``: running, done or error)."""
    if str(path):
        atomic_write_text(Path(path), json.dumps({**values, "time": time.time()}))


@dataclass(frozen=True)
class Snapshot:
    """The server's model and streams after a round, kept until that round's record is complete."""

    model: dict[str, torch.Tensor]
    rng: dict[str, Any]


def snapshot(plan: ServerPlan) -> Snapshot:
    """Return a copy of ``plan``'s model parameters (CPU) and stream states now."""
    return Snapshot({k: v.detach().cpu().clone() for k, v in plan.model.state_dict().items()},
                    copy.deepcopy(plan.streams.state()))


def save_checkpoint(path: Path, *, round_number: int, plan: ServerPlan, history: list[dict[str, Any]],
                    inputs: Mapping[str, str], state: Snapshot | None = None) -> None:
    """Write the server's checkpoint: the local engine's format plus ``engine`` = flower.

    ``inputs``: each client file's name → sha256, as the clients reported them. ``state``: the model and
    streams as they were after ``round_number`` (default: ``plan``'s now).

    Its ``rng`` holds the server's streams only in substance (selection, dropouts, ω, the initialization);
    each client keeps its own streams in its own resume file.
    """
    state = snapshot(plan) if state is None else state
    payload = {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "round": round_number, "engine": ENGINE,
        "model": state.model,
        "rng": state.rng, "history": history, "config": plan.config.to_dict(),
        "randomness": str(plan.record["randomness"]), "ldpfl": package_version(), "inputs": dict(inputs),
    }
    atomic_write(path, lambda handle: torch.save(payload, handle))


def load_server_checkpoint(path: Path, config: FederationConfig, inputs: Mapping[str, str]) -> dict[str, Any]:
    """Read a checkpoint with the local engine's checks (configuration, client files); refuse a local one."""
    payload = load_checkpoint(path, config, engine=ENGINE)
    check_inputs(path, payload, inputs)
    return payload


def restore(plan: ServerPlan, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Load the checkpoint's model and streams into ``plan``; return its history."""
    plan.model.load_state_dict(payload["model"])
    plan.streams.restore(payload["rng"])
    relabel(plan.record, plan.privacy, payload["randomness"], plan.streams.generator_name)
    return list(payload["history"])


def finish_outputs(paths: Mapping[str, Path], plan: ServerPlan, history: list[dict[str, Any]], *,
                   keep_checkpoint: bool) -> None:
    """Write metrics, the model and the plot; delete the checkpoint unless kept (as the local engine does)."""
    out.write_metrics_csv(paths["metrics_csv"], history)
    out.write_metrics_json(paths["metrics_json"], config=plan.record, privacy=plan.privacy, rounds=history)
    save_model(paths["model"], plan.model, summary_record(plan.summaries, plan.config, history))
    if history:
        from ..ledger import ledger_caption, ledger_section

        out.plot_history(paths["accuracy_png"], history, title=f"{plan.summaries[0].dataset}: "
                         f"{plan.config.aggregation}, perturbation {plan.config.perturbation} (Flower)",
                         caption=ledger_caption(ledger_section(history, plan.privacy)))
    if not keep_checkpoint:
        paths["checkpoint"].unlink(missing_ok=True)
