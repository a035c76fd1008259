"""One federation run over the client files of an export run: configuration, rounds, checkpoint, resume.

The protocol is LDPFL Algorithm 1 lines 11-25:

1. the server initializes the model (line 13) and broadcasts it (line 14);
2. each round (line 17) the strategy selects k of the N clients (or γ·N, PLDP-FL Algorithm 1 line 4);
3. each selected client loads the global model, trains ``local_epochs`` epochs (line 19), and uploads its
   parameters (line 20), perturbed by its own mechanism with its own budget (Wu 3.1, PLDP Algorithm 1
   line 19, DP-FedAW eq. 9);
4. ``drop_per_round`` of the selected clients drop out after training (LDPFL IV-E: their uploads are lost);
5. uploads that are not finite are excluded (and logged); the server aggregates the rest (line 21, or
   Wu eqs. 12-16, PLDP eq. 7, DP-FedAW eq. 10); with no surviving upload the previous model is kept;
6. the global model is evaluated on the union of the clients' randomized test splits (as the LDPFL
   reference does), and the round's metrics and a checkpoint are written.

Randomness: a root seed sequence (the user's seed or the OS CSPRNG) gives independent streams: the
server's numpy Generator (selection, dropouts, ω), a torch Generator for the initialization, and per
client a numpy Generator (its perturbation) and a torch Generator (its shuffles and dropout masks).
The checkpoint stores every stream's state, so a resumed run equals an uninterrupted one bit for bit
(at a fixed thread count). The seed itself is never written anywhere.

Decisions:

* Clients are stateless between rounds: the optimizer is created afresh at each local training (the
  paper does not say whether Adam's moments survive a round; keeping them would make the checkpoint hold
  N optimizer states).
* ``local_epochs`` defaults to 2, not the paper's 20 (IV-E), to keep CPU runs short; pass 20 to match.
* Train loss and accuracy are the last local epoch's running values (dropout on), averaged over the
  clients that trained in the round (dropped clients trained too; their upload was lost afterwards).
* Per-client lists (ε, safe-range lengths, centres) are given in client-index order.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mechanisms as mech
from mechanisms.base import require_generator
from mechanisms.randomness import RANDOMNESS_DESCRIPTIONS
from mechanisms.validation import require_finite_positive, require_int_in_range

from . import aggregation as agg
from . import budgets
from . import outputs as out
from .data import FederatedData, evaluation_splits, load_run
from .model import (
    AUTO,
    DEFAULT_DROPOUT,
    DEFAULT_HIDDEN,
    DEFAULT_LR,
    OPTIMIZERS,
    build_model,
    evaluate,
    get_vector,
    make_optimizer,
    parameter_count,
    resolve_optimizer,
    set_vector,
    train_local,
)
from .perturbation import (
    PARAMETERS,
    SIGN_MODES,
    SIGN_UPDATE,
    TARGETS,
    ClientPerturbation,
    build_client_perturbations,
    perturbation_names,
    resolve_target,
)
from .strategies import ClientProfile, SignAggregation, Strategy, StrategyOptions, create_strategy, strategy_names

CHECKPOINT_FORMAT = "ldpfl-federation-checkpoint"
CHECKPOINT_VERSION = 1
DEVICES = ("auto", "cpu", "cuda")
# Options that may change when a run is resumed (they do not change what the run computes, or, for
# ``rounds``, only how long it goes on).
RESUMABLE_CHANGES = frozenset({"rounds", "device", "threads", "eval_batch_size"})
# Spawn keys of the server's streams, beyond any client index.
_SERVER_KEY = 2**31
_INIT_KEY = 2**31 + 1


@dataclass(frozen=True)
class FederationConfig:
    """Everything that defines a federation run. ``seed`` is never written to any output.

    Per-client values (``client_epsilons``, ``client_ranges``) are a tuple with one value per client in
    client-index order, or the name of a preset from ``budgets`` (resolved once N is known).
    """

    rounds: int = 10
    clients_per_round: int | None = None
    local_epochs: int = 2
    batch_size: int = 64
    optimizer: str = AUTO
    lr: float | None = None
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    dropout: float = DEFAULT_DROPOUT
    aggregation: str = "fedavg"
    sample_weighted: bool = False
    fraction: float | None = None
    perturbation: str = "none"
    perturb_target: str = "auto"
    epsilon: float = 1.0
    client_epsilons: tuple[float, ...] | str | None = None
    client_ranges: tuple[float, ...] | str | None = None
    range_length: float = 2.0
    client_centres: tuple[float, ...] | None = None
    range_centre: float = 0.0
    clip: float | None = None
    delta: float | str | None = None
    sensitivity: float | None = None
    sample_rate: float | None = None
    sign_mode: str = SIGN_UPDATE
    server_lr: float = 1e-3
    drop_per_round: int = 0
    device: str = "auto"
    threads: int | None = None
    eval_batch_size: int = 1024
    seed: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("hidden", "client_centres"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("client_epsilons", "client_ranges"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(float(v) for v in value))
        require_int_in_range("rounds", self.rounds, 1)
        if self.clients_per_round is not None:
            require_int_in_range("clients per round", self.clients_per_round, 1)
        require_int_in_range("local epochs", self.local_epochs, 1)
        require_int_in_range("batch size", self.batch_size, 1)
        require_int_in_range("eval batch size", self.eval_batch_size, 1)
        require_int_in_range("drop per round", self.drop_per_round, 0)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr is not None:
            require_finite_positive("learning rate", self.lr)
        for size in self.hidden:
            require_int_in_range("hidden layer size", size, 1)
        if not (isinstance(self.dropout, int | float) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.aggregation not in strategy_names():
            raise ValueError(f"aggregation must be one of {', '.join(strategy_names())}, got {self.aggregation!r}")
        if self.perturbation not in perturbation_names():
            raise ValueError(f"perturbation must be one of {', '.join(perturbation_names())}, "
                             f"got {self.perturbation!r}")
        if self.perturb_target not in TARGETS:
            raise ValueError(f"perturbation target must be one of {', '.join(TARGETS)}, got {self.perturb_target!r}")
        if self.sign_mode not in SIGN_MODES:
            raise ValueError(f"sign mode must be one of {', '.join(SIGN_MODES)}, got {self.sign_mode!r}")
        require_finite_positive("epsilon", self.epsilon)
        require_finite_positive("range length L", self.range_length)
        require_finite_positive("server learning rate", self.server_lr)
        if not math.isfinite(self.range_centre):
            raise ValueError(f"range centre must be a finite number, got {self.range_centre!r}")
        if self.fraction is not None and not (isinstance(self.fraction, int | float) and 0 < self.fraction <= 1):
            raise ValueError(f"fraction γ must lie in (0, 1], got {self.fraction!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.threads is not None:
            require_int_in_range("threads", self.threads, 1, 1024)
        for name in ("client_epsilons", "client_ranges"):
            value = getattr(self, name)
            if isinstance(value, str):
                kind = budgets.EPSILON if name == "client_epsilons" else budgets.RANGE
                if budgets.get_preset(value).kind != kind:
                    raise ValueError(f"budget preset {value!r} does not set {kind} values")
        if self.perturbation != "pdpm" and (self.client_ranges is not None or self.client_centres is not None):
            raise ValueError("client ranges and centres (PDPM safe ranges τ_i) apply to --perturbation pdpm only")
        if self.perturbation == "none" and self.client_epsilons is not None:
            raise ValueError("client epsilons budget the model perturbation; --perturbation none uses none "
                             "(choose a perturbation, or drop --client-epsilons)")
        if self.seed is not None:
            mech.make_randomness(self.seed)  # validates

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-ready values, without the seed."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seed"}
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data


@dataclass(frozen=True)
class FederationResult:
    """What ``run_federation`` returns: the per-round history, the final accuracy and the output paths."""

    history: list[dict[str, Any]]
    final_accuracy: float | None
    paths: dict[str, Path]
    config: dict[str, Any]
    privacy: list[dict[str, Any]]
    resumed_from_round: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return out.json_ready({
            "final_test_accuracy": self.final_accuracy, "rounds_completed": len(self.history),
            "resumed_from_round": self.resumed_from_round,
            "test_accuracy": [r["test_accuracy"] for r in self.history],
            "outputs": {k: str(v) for k, v in self.paths.items()}, "config": self.config,
        })


# --------------------------------------------------------------------------------------------------
# Random streams.


@dataclass
class Streams:
    """Every Generator of a run; ``state``/``restore`` round-trip them exactly."""

    server: np.random.Generator
    init: torch.Generator
    perturb: list[np.random.Generator]
    train: list[torch.Generator]

    @classmethod
    def create(cls, randomness: mech.Randomness, clients: int, device: torch.device) -> Streams:
        root = randomness.seed_sequence

        def child(*key: int) -> np.random.SeedSequence:
            return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, *key))

        def torch_generator(seq: np.random.SeedSequence) -> torch.Generator:
            return torch.Generator(device=device).manual_seed(int(seq.generate_state(1, np.uint64)[0]))

        client_seqs = randomness.child_sequences(clients)  # client i's stream is the root's child i
        return cls(
            server=np.random.Generator(np.random.PCG64(child(_SERVER_KEY))),
            init=torch_generator(child(_INIT_KEY)),
            perturb=[np.random.Generator(np.random.PCG64(s)) for s in client_seqs],
            train=[torch_generator(np.random.SeedSequence(s.entropy, spawn_key=(*s.spawn_key, 0)))
                   for s in client_seqs],
        )

    def state(self) -> dict[str, Any]:
        return {
            "server": self.server.bit_generator.state,
            "init": self.init.get_state(),
            "perturb": [g.bit_generator.state for g in self.perturb],
            "train": [g.get_state() for g in self.train],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        if len(state["perturb"]) != len(self.perturb) or len(state["train"]) != len(self.train):
            raise ValueError(f"the checkpoint holds random streams for {len(state['perturb'])} clients, "
                             f"this run has {len(self.perturb)}")
        self.server.bit_generator.state = state["server"]
        self.init.set_state(state["init"])
        for g, s in zip(self.perturb, state["perturb"], strict=True):
            g.bit_generator.state = s
        for g, s in zip(self.train, state["train"], strict=True):
            g.set_state(s)


# --------------------------------------------------------------------------------------------------
# Setup.


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU. ``cuda`` without a GPU is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but torch sees no CUDA device (use --device cpu or auto)")
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    return torch.device(name)


def draw_dropouts(selected: Sequence[int], count: int, rng: np.random.Generator) -> list[int]:
    """LDPFL IV-E: ``count`` of the selected clients, uniformly without replacement, drop after training."""
    require_generator(rng)
    if count == 0:
        return []
    if count > len(selected):
        raise ValueError(f"drop per round ({count}) exceeds the clients selected per round ({len(selected)})")
    return sorted(int(c) for c in rng.choice(np.asarray(selected), size=count, replace=False))


@dataclass
class _Setup:
    data: FederatedData
    device: torch.device
    randomness: mech.Randomness
    streams: Streams
    model: torch.nn.Module
    perturbations: dict[int, ClientPerturbation]
    strategy: Strategy
    target: str
    optimizer: str
    lr: float
    update_scale: float
    privacy: list[dict[str, Any]]
    record: dict[str, Any]


def _setup(run_dir: Path, config: FederationConfig) -> _Setup:
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    data = load_run(run_dir, device)
    clients = data.clients
    n = len(clients)
    ids = [c.index for c in clients]
    randomness = mech.make_randomness(config.seed)
    streams = Streams.create(randomness, n, device)
    model = build_model(data.input_width, config.hidden, data.num_classes, dropout=config.dropout,
                        generator=streams.init, device=device)
    dim = parameter_count(model)

    epsilons = budgets.resolve_values(config.client_epsilons, config.epsilon, n, what="client epsilons")
    ranges = centres = None
    if config.perturbation == "pdpm":
        ranges = budgets.resolve_values(config.client_ranges, config.range_length, n, what="client ranges")
        centres = (config.client_centres if config.client_centres is not None
                   else (config.range_centre,) * n)
        if len(centres) != n:
            raise ValueError(f"client centres list has {len(centres)} values but the run has {n} clients")
    target = resolve_target(config.perturbation, config.perturb_target, config.sign_mode)
    built = build_client_perturbations(
        config.perturbation, dim=dim, epsilons=epsilons, target=target, ranges=ranges, centres=centres,
        train_sizes=[len(c.train) for c in clients], clip=config.clip, delta=config.delta,
        sensitivity=config.sensitivity, sample_rate=config.sample_rate,
        rounds=config.rounds if config.perturbation == "gaussian-wu" else None)
    perturbations = {cid: dataclasses.replace(p, client=cid) for cid, p in zip(ids, built, strict=True)}

    profiles = [ClientProfile(c.index, len(c.train), c.label_histogram, perturbations[c.index].noise_scale,
                              perturbations[c.index].epsilon) for c in clients]
    options = StrategyOptions(config.clients_per_round, config.sample_weighted, config.fraction)
    strategy: Strategy = create_strategy(config.aggregation, profiles, options)
    signed = config.perturbation == "ldpsign"
    if signed:
        strategy = SignAggregation(strategy)  # Wu eqs. 10, 13, 16
    if config.drop_per_round > strategy.clients_per_round:
        raise ValueError(f"drop per round ({config.drop_per_round}) exceeds the {strategy.clients_per_round} "
                         "clients selected per round")
    optimizer = resolve_optimizer(config.optimizer, data.dataset)
    lr = DEFAULT_LR if config.lr is None else float(config.lr)
    # Update targets: W ← W + s·aggregate, s = η_s for sign steps (signSGD), 1 otherwise.
    update_scale = config.server_lr if signed else 1.0

    privacy = []
    for c in clients:
        report = perturbations[c.index].report(randomness.mode)
        report.update(file=c.path.name, feature_privacy=dict(c.metadata.privacy_report),
                      feature_mechanism=c.metadata.mechanism)
        privacy.append(report)
    record = {
        **config.to_dict(),
        "randomness": randomness.mode,
        "resolved": {
            "device": str(device), "optimizer": optimizer, "lr": lr, "parameters": dim,
            "perturbation_target": target, "sign_aggregation": signed,
            "server_update": ("W <- W + server_lr * sign(aggregate)" if signed and target != PARAMETERS else
                              "W <- sign(aggregate)" if signed else
                              "W <- W + aggregate" if target != PARAMETERS else "W <- aggregate"),
            "client_ids": ids, "client_epsilons": list(epsilons) if config.perturbation != "none" else None,
            "client_ranges": None if ranges is None else list(ranges),
            "client_centres": None if centres is None else list(centres),
            "noise_scales": [perturbations[i].noise_scale for i in ids],
            "clients_per_round": strategy.clients_per_round, "strategy": strategy.describe(),
            "threads": torch.get_num_threads(),
        },
        "run": data.describe(),
    }
    return _Setup(data, device, randomness, streams, model, perturbations, strategy, target, optimizer, lr,
                  update_scale, privacy, record)


# --------------------------------------------------------------------------------------------------
# Checkpoint.


def _save_checkpoint(path: Path, *, round_number: int, setup: _Setup, config: FederationConfig,
                     history: list[dict[str, Any]]) -> None:
    payload = {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "round": round_number,
        "model": {k: v.detach().cpu() for k, v in setup.model.state_dict().items()},
        "rng": setup.streams.state(),
        "history": history, "config": config.to_dict(), "randomness": setup.randomness.mode,
    }
    out.atomic_write(path, lambda handle: torch.save(payload, handle))


def _load_checkpoint(path: Path, config: FederationConfig) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"cannot resume: {path} does not exist (run without --resume to start)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unpickling failure means an unusable checkpoint
        raise ValueError(f"cannot resume: {path} is not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"cannot resume: {path} is not an ldpfl federation checkpoint")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"cannot resume: {path} has checkpoint version {payload.get('version')!r}, this code "
                         f"reads {CHECKPOINT_VERSION}")
    saved, now = payload["config"], config.to_dict()
    differing = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))
    if differing:
        shown = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in differing)
        raise ValueError(f"cannot resume {path}: the configuration differs ({shown})")
    if saved.get("rounds") != now["rounds"] and config.perturbation == "gaussian-wu":
        raise ValueError(f"cannot resume {path} with --rounds {now['rounds']}: gaussian-wu's sigma depends on "
                         f"R (Wu eq. 4), which was {saved.get('rounds')}")
    if payload["round"] > config.rounds:
        raise ValueError(f"cannot resume: the checkpoint is at round {payload['round']}, beyond --rounds "
                         f"{config.rounds}")
    return payload


# --------------------------------------------------------------------------------------------------
# The run.


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _run_round(round_number: int, setup: _Setup, config: FederationConfig, eval_splits: list) -> dict[str, Any]:
    started = time.perf_counter()
    streams, model, strategy = setup.streams, setup.model, setup.strategy
    clients = {c.index: c for c in setup.data.clients}
    position = {c.index: k for k, c in enumerate(setup.data.clients)}
    selected = strategy.select(round_number, streams.server)
    global_t = get_vector(model)
    global_np = global_t.cpu().numpy()
    uploads: dict[int, np.ndarray] = {}
    excluded: list[int] = []
    notes: list[str] = []
    losses, accuracies = [], []
    for cid in selected:
        set_vector(model, global_t)
        optimizer = make_optimizer(setup.optimizer, model.parameters(), setup.lr)
        stats = train_local(model, clients[cid].train, epochs=config.local_epochs, batch_size=config.batch_size,
                            optimizer=optimizer, generator=streams.train[position[cid]])
        losses.append(stats.loss)
        accuracies.append(stats.accuracy)
        local = get_vector(model).cpu().numpy()
        if not np.all(np.isfinite(local)):
            excluded.append(cid)
            notes.append(f"client {cid}: excluded, its parameters are not finite after local training")
            continue
        upload = setup.perturbations[cid].perturb(local, global_np, rng=streams.perturb[position[cid]])
        if not np.all(np.isfinite(upload)):
            excluded.append(cid)
            notes.append(f"client {cid}: excluded, its perturbed upload is not finite")
            continue
        uploads[cid] = upload
    dropped = draw_dropouts(selected, config.drop_per_round, streams.server)  # after training (IV-E)
    surviving = {cid: u for cid, u in uploads.items() if cid not in dropped}
    result = strategy.aggregate(global_np, surviving, rng=streams.server)
    kept_previous = result.vector is None
    if kept_previous:
        notes.append("no upload survived (dropped or excluded): the previous global model is kept")
        new_global = global_np
    elif setup.target == PARAMETERS:
        new_global = result.vector
    else:
        new_global = agg.apply_update(global_np, result.vector * np.float32(setup.update_scale))
    if not kept_previous and not np.all(np.isfinite(new_global)):
        kept_previous = True
        notes.append("the aggregate is not finite: the previous global model is kept")
        new_global = global_np
    set_vector(model, torch.from_numpy(np.ascontiguousarray(new_global, dtype=np.float32)))
    test_loss, test_accuracy = evaluate(model, eval_splits, config.eval_batch_size)
    return {
        "round": round_number,
        "train_loss": _nanmean(losses), "train_accuracy": _nanmean(accuracies),
        "test_loss": test_loss, "test_accuracy": test_accuracy,
        "selected": list(selected), "dropped": dropped, "excluded": excluded,
        "aggregated": list(result.used), "weights": list(result.weights),
        "client_epsilons": [setup.perturbations[c].epsilon for c in selected],
        "kept_previous_model": kept_previous, "notes": notes,
        **({"omega": result.info["omega"]} if "omega" in result.info else {}),
        "seconds": time.perf_counter() - started,
    }


def default_out_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "federation"


def run_federation(run_dir: str | Path, config: FederationConfig, *, out_dir: str | Path | None = None,
                   resume: bool = False, progress: bool = True, overwrite: bool = False,
                   keep_checkpoint: bool = False) -> FederationResult:
    """Run (or resume) a federation over the client files in ``run_dir``; write the outputs to ``out_dir``.

    Parameters
    ----------
    run_dir
        An export run directory (``manifest.json`` + ``client_XXX.h5``).
    config
        The run's configuration.
    out_dir
        Where to write ``metrics.csv``, ``metrics.json``, ``accuracy.png``, ``model.pt``, ``config.json``
        and ``checkpoint.pt``; default ``RUN_DIR/federation``.
    resume
        Continue from ``out_dir/checkpoint.pt``; the configuration must match the checkpoint's (only
        ``rounds``, ``device``, ``threads`` and ``eval_batch_size`` may change).
    progress
        Show a tqdm bar over rounds on stderr with the current test accuracy.
    overwrite
        Start afresh even if ``out_dir`` already holds a run.
    keep_checkpoint
        Keep ``checkpoint.pt`` once the run completes (it allows ``resume`` with more rounds). Off by
        default: it holds the state of every generator, from which each client's perturbation noise can
        be recomputed (PCG64 can be stepped backwards), so it is seed-equivalent and, like a seed, is not
        left among the outputs. An interrupted run always keeps its last checkpoint for ``--resume``.

    Returns
    -------
    FederationResult
        The per-round metrics, the final test accuracy and the output paths.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist or is not a directory")
    target_dir = default_out_dir(run_dir) if out_dir is None else Path(out_dir)
    paths = {
        "metrics_csv": target_dir / out.METRICS_CSV, "metrics_json": target_dir / out.METRICS_JSON,
        "accuracy_png": target_dir / out.PLOT_PNG, "model": target_dir / out.MODEL_PT,
        "config": target_dir / out.CONFIG_JSON, "checkpoint": target_dir / out.CHECKPOINT_PT,
    }
    checkpoint_path = paths["checkpoint"]
    if not resume and not overwrite and (checkpoint_path.exists() or (target_dir / out.METRICS_JSON).exists()):
        raise ValueError(f"{target_dir} already holds a federation run; pass --resume to continue it or "
                         "--overwrite to start again")
    payload = _load_checkpoint(checkpoint_path, config) if resume else None
    setup = _setup(run_dir, config)
    history: list[dict[str, Any]] = []
    start = 1
    if payload is not None:
        setup.model.load_state_dict(payload["model"])
        setup.streams.restore(payload["rng"])
        history = list(payload["history"])
        start = int(payload["round"]) + 1
        setup.record["randomness"] = payload["randomness"]
        for report in setup.privacy:
            report["randomness"] = payload["randomness"]
            report["randomness_description"] = RANDOMNESS_DESCRIPTIONS[payload["randomness"]]
    target_dir.mkdir(parents=True, exist_ok=True)
    out.write_json(paths["config"], setup.record)
    eval_splits = evaluation_splits(setup.data)

    def write_metrics() -> None:
        out.write_metrics_csv(paths["metrics_csv"], history)
        out.write_metrics_json(paths["metrics_json"], config=setup.record, privacy=setup.privacy, rounds=history)

    from tqdm.auto import tqdm

    bar = tqdm(total=config.rounds, initial=start - 1, desc="federate", unit="round", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, leave=True)
    try:
        if history:
            bar.set_postfix(test_acc=_fmt(history[-1]["test_accuracy"]))
        for round_number in range(start, config.rounds + 1):
            record = _run_round(round_number, setup, config, eval_splits)
            history.append(record)
            _save_checkpoint(checkpoint_path, round_number=round_number, setup=setup, config=config,
                             history=history)
            write_metrics()
            bar.update(1)
            bar.set_postfix(test_acc=_fmt(record["test_accuracy"]))
    finally:
        bar.close()
    write_metrics()
    state = {k: v.detach().cpu() for k, v in setup.model.state_dict().items()}
    out.atomic_write(paths["model"], lambda handle: torch.save(state, handle))
    if history:
        out.plot_history(paths["accuracy_png"], history, title=f"{setup.data.dataset}: {config.aggregation}, "
                                                                f"perturbation {config.perturbation}")
    if not keep_checkpoint:
        checkpoint_path.unlink(missing_ok=True)
        del paths["checkpoint"]
    final = history[-1]["test_accuracy"] if history else None
    return FederationResult(history, final, paths, setup.record, setup.privacy,
                            None if payload is None else int(payload["round"]))


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
