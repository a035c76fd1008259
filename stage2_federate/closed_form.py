"""The closed-form head (``head`` lda): LDA fitted once on the pooled released statistics of ``stats:K`` files.

A ``stats:K`` client file (``ldpfl export --release stats:K``, issue 40) carries its silo's one release: noisy
per-class sums, class counts and second moments of its projected, clipped records (``/released_statistics``, read
through ``contract.released_statistics``). The statistics are sums, so the silos' releases pool by addition, and so
do their noise variances (``Statistics.__add__``, ``NoiseScales.__add__``). From the pooled release,
``mechanisms.statistics_model.estimate`` gives the class-conditional Gaussian with a pooled covariance, regularized
by ``shrinkage`` times its noise's spectral edge, and ``GaussianModel.discriminant`` Fisher's linear discriminant:
weights W (K, c) and biases b (c,). The head is the ``FederatedMLP(K, (), c)`` whose one linear layer holds Wᵀ and b,
written as the same ``model.pt`` the round loop writes, so ``ldpfl predict`` reads it unchanged.

Everything here is post-processing of the released files: no round, no upload, no random draw, nothing added to
the privacy ledger (``ledger.closed_form_ledger``); each silo's guarantee stays its file's, whatever the number of
fits (any ``shrinkage``: tuning is free). The head is evaluated as the round loop evaluates a global model
(``round_record.evaluation_of``): on the union of the files' test splits (empty for ``stats:K``), with ``eval_clean``
on the silos' local-only clean test files (``clean_files``), and on each file's synthetic training rows (the round's
``train_*``, the mean over the clients). One record (round 1) holds the figures.

Torch-free: only the writing of ``model.pt`` loads torch (:func:`save_head`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.contract.manifest import Manifest
from ldpfl.contract.release_guarantee import stored_or_computed
from ldpfl.contract.released_statistics import is_statistics_file, mechanism_of, read_release
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms.gaussian_statistics import Released
from ldpfl.mechanisms.identity import NoRandomization
from ldpfl.mechanisms.statistics_model import SHRINKAGE, estimate, noise_edge

from . import outdir
from . import outputs as out
from .clean_files import read_clean_test
from .client_privacy import ClientPrivacy
from .config import LDA, FederationConfig
from .ledger import closed_form_ledger, ledger_caption
from .model_file import file_attributes, save_model, trained_on
from .result import FederationResult
from .round_record import ClientEvaluation, RoundRecord, SplitSums, evaluation_of, rows

NO_UPLOAD = ("none: the closed-form head uploads nothing; the coordinator read the client file's released statistics "
             "once (post-processing of the file)")
"""Each client's ``release`` in ``metrics.json``'s privacy entries under the closed-form head."""
ESTIMATOR = ("Fisher's linear discriminant (Hastie, Tibshirani, Friedman 2009, eq. 4.10) on the class-conditional "
             "Gaussian of the pooled released statistics (mechanisms.statistics_model.estimate), its covariance "
             "ridge `shrinkage` x the noise's spectral edge")
TARGET = "none"
"""The ``target`` of a privacy entry without an upload."""
EVAL_ROWS = 65536
"""Rows evaluated at once (their logits are this many x c float64 values)."""


@dataclass(frozen=True)
class StatsClient:
    """One ``stats:K`` client file: its release, its synthetic training rows and its (empty) test split."""

    index: int
    path: Path
    sha256: str
    metadata: ClientMetadata
    released: Released
    train: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]

    @property
    def rows(self) -> int:
        """Return the file's rows (training and test)."""
        return len(self.train[1]) + len(self.test[1])


@dataclass(frozen=True)
class StatsRun:
    """The ``stats:K`` client files of one export run, validated and read, in client-index order."""

    run_dir: Path
    manifest: Manifest
    clients: tuple[StatsClient, ...]

    @property
    def first(self) -> ClientMetadata:
        """Return the first client's metadata (the files agree on the run's attributes)."""
        return self.clients[0].metadata


@dataclass(frozen=True)
class LdaHead:
    """The fitted head: weights (K, c) and biases (c,) as the model stores them (float32), and how it was fitted."""

    weights: np.ndarray
    biases: np.ndarray
    shrinkage: float
    noise_edge: float
    records: float

    def logits(self, features: np.ndarray) -> np.ndarray:
        """Return the class scores of rows ``features`` (n, K): x W + b, in float64 from the stored float32 values."""
        return np.asarray(features, dtype=np.float64) @ self.weights.astype(np.float64) + self.biases

    def sums(self, features: np.ndarray, labels: np.ndarray) -> SplitSums:
        """Return the summed cross-entropy, correct predictions and rows over ``features`` with ``labels``."""
        loss, correct = 0.0, 0
        for start in range(0, len(labels), EVAL_ROWS):
            scores = self.logits(features[start:start + EVAL_ROWS])
            truth = labels[start:start + EVAL_ROWS]
            top = scores.max(axis=1, keepdims=True)
            log_norm = np.log(np.exp(scores - top).sum(axis=1)) + top[:, 0]
            loss += float(np.sum(log_norm - scores[np.arange(len(truth)), truth]))
            correct += int(np.count_nonzero(scores.argmax(axis=1) == truth))
        return SplitSums(loss, correct, int(len(labels)))

    def describe(self) -> dict[str, Any]:
        """Return ``metrics.json``'s ``closed_form`` section: the head, its estimator and its regularization."""
        return {"head": LDA, "estimator": ESTIMATOR, "shrinkage": self.shrinkage, "noise_edge": self.noise_edge,
                "ridge": self.shrinkage * self.noise_edge, "pooled_records": self.records,
                "input_width": int(self.weights.shape[0]), "num_classes": int(self.weights.shape[1])}


def _space(meta: ClientMetadata) -> tuple[int, int, float]:
    """Return the space a file's statistics live in: (projection key, K, clip C)."""
    mechanism = mechanism_of(meta)
    return int(mechanism.projection_key), int(meta.features), mechanism.clip_for(int(meta.features))


def read_stats_run(run_dir: str | Path) -> StatsRun:
    """Validate the run (``contract.run_dir.validate_run``) and read every client's release and rows.

    Raises
    ------
    ParameterError
        A file that is not a shareable ``stats:K`` release, or files whose statistics live in other spaces (another
        projection key, K or clip): they cannot be pooled.
    FormatError
        A file that fails validation (its statistics against its ε and its synthetic rows included).
    """
    run_dir = Path(run_dir)
    manifest, checked = validate_run(run_dir)
    for record, meta in checked:
        if not is_statistics_file(meta):
            raise ParameterError(f"`head` {LDA} fits on the released statistics of stats:K files (ldpfl export "
                                 f"--release stats:K); {record.path} is a {meta.release} release (mechanism "
                                 f"{meta.mechanism}): federate it with `head` mlp")
    clients = []
    for record, meta in sorted(checked, key=lambda item: item[1].client_index):
        path = run_dir / record.path
        with open_client_file(path) as (handle, metadata, _rows):
            released = read_release(handle, metadata)
        data = read_client_file(path)
        clients.append(StatsClient(meta.client_index, path, record.sha256, meta, released,
                                   (data.features["train"], data.labels["train"]),
                                   (data.features["test"], data.labels["test"])))
    spaces = {c.path.name: _space(c.metadata) for c in clients}
    if len(set(spaces.values())) > 1:
        shown = "; ".join(f"{name}: projection key {key}, K {k}, clip {clip:g}" for name, (key, k, clip)
                          in spaces.items())
        raise ParameterError(f"`head` {LDA} pools the files' statistics, which must share one space (projection key, "
                             f"K and clip); these differ: {shown}")
    return StatsRun(run_dir, manifest, tuple(clients))


def fit_lda(releases: Sequence[Released], shrinkage: float = SHRINKAGE) -> LdaHead:
    """Return the LDA head of the pooled ``releases`` (their statistics and noise summed), ridge ``shrinkage``."""
    if not releases:
        raise ValueError("the closed-form head needs at least one release")
    pooled = functools.reduce(operator.add, (r.statistics for r in releases))
    scales = functools.reduce(operator.add, (r.scales for r in releases))
    model = estimate(pooled, scales, shrinkage=shrinkage)
    weights, biases = model.discriminant()
    records = float(model.counts.sum())
    return LdaHead(weights.astype(np.float32), biases.astype(np.float32), float(shrinkage),
                   noise_edge(scales, records, pooled.classes, pooled.width), records)


def client_privacy(client: StatsClient) -> ClientPrivacy:
    """Return a client's ``metrics.json`` privacy entry: no upload, its file's report and guarantee."""
    upload = dataclasses.replace(NoRandomization().report(), notes=(NO_UPLOAD,))
    meta = client.metadata
    return ClientPrivacy(client.index, upload, TARGET, None, client.path.name, meta.mechanism, meta.privacy(),
                         stored_or_computed(meta, records=client.rows), release=NO_UPLOAD)


def evaluate_head(head: LdaHead, run: StatsRun, *, eval_clean: bool, seconds: float = math.nan) -> RoundRecord:
    """Return the fit's record (round 1): its figures on the files' training and test rows, and the clean files'."""
    ids = tuple(c.index for c in run.clients)
    trained = [head.sums(*c.train) for c in run.clients]
    total = sum(s.rows for s in trained)
    reports = []
    for client in run.clients:
        clean = None
        if eval_clean:
            records = read_clean_test(client.path, client.index, client.metadata, len(client.test[1]))
            clean = head.sums(records.features, records.labels)
        reports.append(ClientEvaluation(client.index, head.sums(*client.test), clean))
    record = RoundRecord(
        round=1, train_loss=float(np.mean([s.loss_sum / s.rows for s in trained if s.rows] or [math.nan])),
        train_accuracy=float(np.mean([s.correct / s.rows for s in trained if s.rows] or [math.nan])),
        test_loss=math.nan, test_accuracy=math.nan, selected=ids, dropped=(), excluded=(), aggregated=ids,
        weights=tuple(s.rows / total if total else 1.0 / len(ids) for s in trained),
        client_epsilons=(None,) * len(ids), kept_previous_model=False, notes=(), seconds=math.nan)
    return record.evaluated(evaluation_of(reports, clean=eval_clean), seconds)


def head_record(run: StatsRun, head: LdaHead, history: Sequence[RoundRecord]) -> dict[str, Any]:
    """Return ``model.pt``'s ``trained_on``: the files' attributes, the model ``FederatedMLP(K, (), c)``, the head."""
    clients = [{"index": c.index, "file": c.path.name, "sha256": c.sha256} for c in run.clients]
    record = trained_on(file_attributes(run.first), clients=clients,
                        mechanism_parameters=[c.metadata.mechanism_parameters for c in run.clients],
                        model={"input_width": head.weights.shape[0], "hidden": (),
                               "num_classes": head.weights.shape[1], "dropout": 0.0},
                        eval_clean=any(r.clean_test_accuracy is not None for r in history), rounds=history,
                        engine="local")
    return record | {"head": {"head": LDA, "shrinkage": head.shrinkage}}


def save_head(path: Path, head: LdaHead, record: Mapping[str, Any]) -> Path:
    """Write ``model.pt``: the ``FederatedMLP(K, (), c)`` whose linear layer holds Wᵀ and b (loads torch)."""
    import torch

    from .model import FederatedMLP

    model = FederatedMLP(int(head.weights.shape[0]), (), int(head.weights.shape[1]), dropout=0.0)
    (layer,) = model.linear_layers()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(head.weights.T)))
        layer.bias.copy_(torch.from_numpy(np.ascontiguousarray(head.biases)))
    return save_model(path, model, record)


def output_paths(out_dir: Path) -> dict[str, Path]:
    """Return the outputs a closed-form run writes, by name (``run_outputs.output_paths`` without the checkpoint)."""
    return {"metrics_csv": out_dir / out.METRICS_CSV, "metrics_json": out_dir / out.METRICS_JSON,
            "accuracy_png": out_dir / out.PLOT_PNG, "model": out_dir / out.MODEL_PT,
            "config": out_dir / out.CONFIG_JSON}


def run_closed_form(run_dir: str | Path, config: FederationConfig, out_dir: Path, *, overwrite: bool = False,
                    on_round: Callable[[Mapping[str, Any]], None] | None = None) -> FederationResult:
    """Fit the closed-form head on the run's files and write the federation's outputs into ``out_dir``.

    ``config.head`` must be lda. The files are read and checked before anything is written: a refusal
    (``ParameterError``: files that are not ``stats:K`` releases, statistics in other spaces) leaves nothing.
    ``out_dir`` is held as a federation's (``outdir.locked``); one that holds a run needs ``overwrite``.
    """
    if not config.closed_form:
        raise ValueError(f"run_closed_form fits `head` {LDA}, got {config.head!r}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist or is not a directory")
    out_dir = Path(out_dir)
    with outdir.locked(out_dir):
        outdir.remove_temporaries(out_dir)
        if not overwrite and ((out_dir / out.CHECKPOINT_PT).exists() or (out_dir / out.METRICS_JSON).exists()):
            raise ParameterError(f"{out_dir} already holds a federation run; start again with `overwrite`")
        started = time.perf_counter()
        run = read_stats_run(run_dir)
        shrinkage = SHRINKAGE if config.shrinkage is None else float(config.shrinkage)
        head = fit_lda([c.released for c in run.clients], shrinkage)
        history = [evaluate_head(head, run, eval_clean=config.eval_clean)]  # reads the clean files before writing
        history = [dataclasses.replace(history[0], seconds=time.perf_counter() - started)]
        privacy = tuple(client_privacy(c) for c in run.clients)
        ledger = closed_form_ledger(privacy, rounds=len(history))
        record = {**config.to_dict(), "randomness": None, "generator": None,
                  "resolved": {"head": LDA, "shrinkage": shrinkage, "hidden": [],  # the model: one linear layer
                               "parameters": int(head.weights.size + head.biases.size),
                               "client_ids": [c.index for c in run.clients]},
                  "run": _describe(run)}
        if overwrite:
            outdir.clear_outputs(out_dir)
        written = _write(out_dir, run, head, history, privacy, ledger, record)
        outdir.remove_temporaries(out_dir)
    if on_round is not None:
        on_round(history[-1].to_dict())
    return FederationResult(rows(history), history[-1].test_accuracy, written, record, privacy, None, (), ledger)


def _describe(run: StatsRun) -> dict[str, Any]:
    """Return ``config.json``'s ``run``: what the files are (as ``data.FederatedData.describe``)."""
    first = run.first
    return {"run_dir": str(run.run_dir), "dataset": first.dataset, "clients": len(run.clients),
            "feature_format": first.feature_format, "input_width": first.feature_width,
            "num_classes": first.num_classes, "feature_mechanism": first.mechanism,
            "train_rows": [len(c.train[1]) for c in run.clients], "test_rows": [len(c.test[1]) for c in run.clients]}


def _write(out_dir: Path, run: StatsRun, head: LdaHead, history: list[RoundRecord],
           privacy: tuple[ClientPrivacy, ...], ledger: LedgerSection, record: dict[str, Any]) -> dict[str, Path]:
    """Write config.json, metrics.csv, metrics.json, model.pt and accuracy.png; return their paths."""
    paths = output_paths(out_dir)
    out.write_json(paths["config"], record)
    written = rows(history)
    out.write_metrics_csv(paths["metrics_csv"], written)
    out.write_metrics_json(paths["metrics_json"], config=record, privacy=privacy, rounds=written, ledger=ledger,
                           extra={"closed_form": head.describe()})
    save_head(paths["model"], head, head_record(run, head, history))
    out.plot_history(paths["accuracy_png"], history, title=f"{run.first.dataset}: closed-form head {LDA}",
                     caption=ledger_caption(ledger))
    return paths


__all__ = ["ESTIMATOR", "NO_UPLOAD", "LdaHead", "StatsClient", "StatsRun", "client_privacy", "evaluate_head",
           "fit_lda", "head_record", "read_stats_run", "run_closed_form", "save_head"]
