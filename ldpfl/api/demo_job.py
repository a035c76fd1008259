"""``ldpfl.demo``: the whole pipeline on the embedded MNIST-5k data, with a short summary (``ldpfl demo``).

Export (stage 1: CNN per client → flatten features → fixed-point → UER → HDF5), then federate
(stage 2: FedAvg over the randomized bits), then inspect the files. A rerun reuses the verified client
files: it never randomizes the same samples twice.

``private=True`` runs a second configuration with real privacy next to it, in ``OUT-private``: the best measured
private path (issue 34, docs/RESULTS.md section 7). Every silo maps its records with the weight-free ScatterNet
(the same feature space for all, learned from no record) into files that never leave it (``local_only``), and
the federation trains a linear head with record-level DP-SGD: only each silo's noisy updates leave it, and its
accountant composes every step. Its release guarantee is finite (the DP-SGD figure, replace-one and add-remove),
against ∞ for LDPFL as published (clear labels, a non-private CNN; UER alone is 39,245).

Every demo also runs the recommended way to ship files (issue 40), in ``OUT-stats``: each silo releases once
the noisy per-class sums, counts and second moments of its ScatterNet records projected to
``STATS_WIDTH`` values (``--release stats:K``, ε = ``STATS_EPSILON`` per silo, add/remove), and its file holds
synthetic records drawn from them. Both offline models over those files are free post-processing: the
closed-form LDA head on the pooled statistics and the FC federation over the synthetic records; each is
measured on the silos' own clean test records (kept locally, never released).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.federation_privacy import FederationGuarantee
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.release_guarantee import ReleaseGuarantee, weakest
from ldpfl.inspection.plot import write_plot
from ldpfl.inspection.report import inspect_path
from ldpfl.inspection.text import inspection_text
from ldpfl.mechanisms.randomness import UNRECORDED, randomness_label
from ldpfl.mechanisms.report import json_number
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.run import run_export

from .fields import StrPath

DEFAULT_OUT = "runs/demo"
"""Where the demo writes without ``out`` (``OUT-private`` beside it with ``private``)."""
PRIVATE_EXTRACTOR = "scatter"
PRIVATE_TARGET_EPSILON = 3.0
PRIVATE_DELTA = 1e-5
PRIVATE_LOCAL_STEPS = 20
PRIVATE_SERVER_MOMENTUM = 0.9
"""``private``: ScatterNet features kept local, DP-SGD of a linear head at ε = 3 per silo (replace-one, δ = 1e-5)
over the whole run, ``PRIVATE_LOCAL_STEPS`` steps a round, server momentum 0.9: the front's best private path
(docs/RESULTS.md section 7), scaled to the demo's rounds."""


STATS_WIDTH = 128
STATS_EPSILON = 3.0
"""The demo's ``stats:K`` release: K = 128 (chosen for MNIST-5k on validation records, docs/RESULTS.md section 9),
ε = 3 per silo under add/remove at δ = 1e-5."""


@dataclass(frozen=True)
class StatsRun:
    """The ``stats:K`` release of the demo: its guarantee and the two offline models' clean test accuracies."""

    run_dir: Path
    release: str
    epsilon_add_remove: float
    release_guarantee: ReleaseGuarantee | None
    lda_accuracy: float | None
    fc_accuracies: list[float | None]
    inspection_ok: bool

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary."""
        return {"run_dir": str(self.run_dir), "release": self.release,
                "epsilon_add_remove": json_number(self.epsilon_add_remove),
                "release_guarantee": _guarantee_json(self.release_guarantee),
                "lda_clean_test_accuracy": self.lda_accuracy, "fc_clean_test_accuracy_per_round": self.fc_accuracies,
                "inspection_ok": self.inspection_ok}


@dataclass(frozen=True)
class PrivateRun:
    """The private configuration of ``private=True``: its run, privacy and accuracies."""

    run_dir: Path
    release: str
    mechanism: str
    nominal_epsilon: float | None
    exact_epsilon_per_record: float | None
    local_accuracies: list[float | None]
    round_accuracies: list[float]
    clean_accuracies: list[float | None]
    inspection_ok: bool
    release_guarantee: FederationGuarantee | None = None  # the federation's (metrics.json): the weakest silo's

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary."""
        return {"run_dir": str(self.run_dir), "release": self.release, "mechanism": self.mechanism,
                "release_guarantee": _guarantee_json(self.release_guarantee),
                "nominal_epsilon": json_number(self.nominal_epsilon),
                "exact_epsilon_per_record": json_number(self.exact_epsilon_per_record),
                "local_cnn_accuracy": self.local_accuracies,
                "global_test_accuracy_per_round": self.round_accuracies,
                "clean_test_accuracy_per_round": self.clean_accuracies, "inspection_ok": self.inspection_ok}


@dataclass(frozen=True)
class DemoResult:
    """Paths and figures of one demo run."""

    run_dir: Path
    local_accuracies: list[float | None]
    round_accuracies: list[float]
    nominal_epsilon: float | None
    exact_epsilon_per_record: float | None
    randomness: str
    plots: list[Path]
    inspection_ok: bool
    private: PrivateRun | None = None
    release_guarantee: ReleaseGuarantee | None = None  # the weakest client's, over everything its file releases
    generator: str = UNRECORDED  # the noise's bit generator (``AES-CTR``, ``ChaCha20``, ``PCG64``)
    stats: StatsRun | None = None

    @property
    def ok(self) -> bool:
        """Every file of the run (and of the private and stats runs) checked out."""
        return (self.inspection_ok and (self.private is None or self.private.inspection_ok)
                and (self.stats is None or self.stats.inspection_ok))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary (the ``--json`` output)."""
        return {
            **({"private": self.private.to_dict()} if self.private is not None else {}),
            **({"stats": self.stats.to_dict()} if self.stats is not None else {}),
            "run_dir": str(self.run_dir),
            "local_cnn_accuracy": self.local_accuracies,
            "global_test_accuracy_per_round": self.round_accuracies,
            "nominal_epsilon": json_number(self.nominal_epsilon),
            "exact_epsilon_per_record": json_number(self.exact_epsilon_per_record),
            "randomness": self.randomness,
            "generator": self.generator,
            "plots": [str(p) for p in self.plots],
            "inspection_ok": self.inspection_ok,
            "release_guarantee": _guarantee_json(self.release_guarantee),
        }

    def format_text(self) -> str:
        """Return the closing summary as text."""
        exact = self.exact_epsilon_per_record
        exact_text = f"{exact:,.1f}" if isinstance(exact, float) and math.isfinite(exact) else str(exact)
        epsilon = "n/a" if self.release_guarantee is None else json_number(self.release_guarantee.epsilon)
        nominal = json_number(self.nominal_epsilon)
        lines = [
            "",
            "== ldpfl demo: summary ==",
            "local CNN test accuracy   "
            + ", ".join(f"client {i}: {_pct(a)}" for i, a in enumerate(self.local_accuracies)),
            "global test accuracy      "
            + ", ".join(f"r{i + 1}: {_pct(a)}" for i, a in enumerate(self.round_accuracies)),
            f"release guarantee         epsilon {epsilon} per record over everything the "
            "files release (clear labels and a non-DP CNN: inf; see docs/privacy.md)",
            f"features alone (UER)      nominal epsilon {nominal}  |  exact epsilon per record "
            f"{exact_text}  (one part of the guarantee)",
            f"randomness                {randomness_label(self.randomness, self.generator)}",
            f"files                     {self.run_dir}/client_*.h5, {self.run_dir}/manifest.json",
            f"federation outputs        {self.run_dir}/federation/ (metrics.csv, metrics.json, model.pt)",
            "plots                     " + ", ".join(str(p) for p in self.plots),
            f"inspection                {'all checks passed' if self.inspection_ok else 'PROBLEMS FOUND (see above)'}",
        ]
        if self.private is not None or self.stats is not None:
            lines += self._comparison()
        return "\n".join(lines)

    def _comparison(self) -> list[str]:
        """Return the side-by-side lines of LDPFL as published and the private configurations."""
        p, st = self.private, self.stats
        mean_local = [a for a in self.local_accuracies if a is not None]
        rows = [("LDPFL: flatten, uer eps 0.5", _eps(self.exact_epsilon_per_record), "inf",
                 _pct(_last(self.round_accuracies)), "n/a",
                 _pct(sum(mean_local) / len(mean_local) if mean_local else None))]
        if st is not None:
            stats_total = st.release_guarantee
            stats_text = ("n/a" if stats_total is None
                          else f"{_eps(stats_total.epsilon)} (delta {stats_total.delta:g})")
            rows += [(f"private files: {st.release}, LDA head", f"{st.epsilon_add_remove:g} add/remove", stats_text,
                      "n/a", _pct(st.lda_accuracy), "n/a"),
                     (f"private files: {st.release}, FC over synthetic", f"{st.epsilon_add_remove:g} add/remove",
                      stats_text, "n/a", _pct(_last(st.fc_accuracies)), "n/a")]
        if p is not None:
            total = p.release_guarantee
            total_text = f"{_eps(total.epsilon)} (delta {total.delta:g})" if total is not None else "n/a"
            rows.append((f"private: {p.release}, {p.mechanism} eps {p.nominal_epsilon:g} per silo",
                         _eps(p.exact_epsilon_per_record), total_text, _pct(_last(p.round_accuracies)),
                         _pct(_last(p.clean_accuracies)),
                         _pct(sum(a for a in p.local_accuracies if a is not None) / len(p.local_accuracies)
                              if p.local_accuracies else None)))
        header = ("configuration", "values eps/record", "TOTAL eps/record", "global acc (released test)",
                  "global acc (clean test)", "mean local model acc")
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]
        notes = []
        if st is not None:
            notes.append(f"stats files               {st.run_dir}/client_*.h5 (shareable: the noisy statistics of "
                         "each silo's records, released once, and synthetic records; both models are post-processing "
                         "of them, so any number of runs spends nothing more)")
        if p is not None:
            notes.append(f"private files             {p.run_dir}/client_*.h5 (local-only: clean ScatterNet features, "
                         "never shared; only the DP-SGD updates leave a silo)")
        return ["", "== configurations side by side ==", *table, *notes,
                "the clean test accuracy is what a client gets applying the global model to its own records "
                "(nothing is released for that); see README 'Which configuration to choose'"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _eps(value: Any) -> str:
    return f"{value:,.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def _last(values: list[Any]) -> Any:
    return values[-1] if values else None


def _guarantee_json(guarantee: ReleaseGuarantee | FederationGuarantee | None) -> dict[str, Any] | None:
    """Return the JSON form of a guarantee (the file boundary of ``--json``)."""
    return None if guarantee is None else guarantee.to_dict()


def _quiet(message: str) -> None:
    del message


def demo(out: StrPath = DEFAULT_OUT, *, clients: int = 2, epochs: int = 3, rounds: int = 5, local_epochs: int = 1,
         seed: int | None = None, private: bool = False, progress_bars: bool = False,
         on_message: Callable[[str], None] | None = None) -> DemoResult:
    """Run export → federate → inspect on MNIST-5k and return the summary (and, with ``private``, the private run).

    Parameters
    ----------
    out : path
        The run directory (client files, federation outputs, plots); the private run goes to ``OUT-private``.
    clients, epochs, rounds, local_epochs : int
        Clients, CNN epochs per client, federation rounds, local epochs per client per round.
    seed : int, optional
        A reproducible run (labelled ``seeded``; never stored): NO privacy against anyone who can guess it.
    private : bool
        Also run the best measured private path (module docstring) and compare the two.
    progress_bars : bool
        tqdm bars on stderr, as the command line shows them.
    on_message : callable, optional
        Called with each step's heading and each inspection's text (``ldpfl demo`` prints them).
    """
    from ldpfl.stage2_federate.federation import FederationConfig, run_federation

    echo = on_message or _quiet
    run_dir = Path(out)
    echo(f"== 1/3 export: MNIST-5k, {clients} clients, MNIST CNN for {epochs} epochs, "
         "UER (eps 0.5, alpha 10, m 4, n 5)")
    export = run_export(ExportConfig(dataset="mnist5k", clients=clients, epochs=epochs, seed=seed), run_dir,
                        progress=progress_bars)
    reused = sum(c.status != "new" for c in export.clients)
    if reused:
        echo(f"   {reused} client file(s) already existed and verified: reused, not randomized again")

    echo(f"== 2/3 federate: {rounds} rounds of FedAvg, {local_epochs} local epoch(s) per round")
    federation = run_federation(run_dir, FederationConfig(rounds=rounds, local_epochs=local_epochs, seed=seed),
                                progress=progress_bars, overwrite=True)

    echo("== 3/3 inspect")
    inspection = inspect_path(run_dir)
    echo(inspection_text(inspection))
    plot = write_plot(inspection, run_dir / "inspect.png")
    plots = [plot, *[p for p in [federation.paths.get("accuracy_png")] if p is not None and p.exists()]]

    stats_run = _run_stats(Path(f"{run_dir}-stats"), clients=clients, rounds=rounds, seed=seed,
                           progress_bars=progress_bars, echo=echo)
    private_run = None
    if private:
        private_run = _run_private(Path(f"{run_dir}-private"), clients=clients, rounds=rounds, seed=seed,
                                   progress_bars=progress_bars, echo=echo)
    return DemoResult(
        run_dir=run_dir,
        local_accuracies=[c.local_accuracy for c in export.clients],
        round_accuracies=[float(r["test_accuracy"]) for r in federation.history],
        nominal_epsilon=export.privacy.nominal_epsilon,
        exact_epsilon_per_record=export.privacy.exact_epsilon_per_record,
        randomness=export.randomness,
        generator=export.privacy.generator,
        plots=plots,
        inspection_ok=inspection.ok,
        private=private_run,
        release_guarantee=weakest_guarantee(run_dir),
        stats=stats_run,
    )


def _run_stats(run_dir: Path, *, clients: int, rounds: int, seed: int | None, progress_bars: bool,
               echo: Callable[[str], None]) -> StatsRun:
    """Run the stats:K release and its two free models (module docstring)."""
    from ldpfl.stage2_federate.federation import FederationConfig, run_federation

    release = f"stats:{STATS_WIDTH}"
    echo(f"== private files: each silo releases once the noisy statistics of its ScatterNet records ({release}, "
         f"eps {STATS_EPSILON:g} per silo, add/remove, delta 1e-5); the files hold synthetic records")
    export = run_export(ExportConfig(dataset="mnist5k", clients=clients, seed=seed, extractor=PRIVATE_EXTRACTOR,
                                     release=release, mechanism="gaussian-stats",
                                     mechanism_params={"epsilon": STATS_EPSILON}, keep_clean_test=True),
                        run_dir, progress=progress_bars)
    lda = run_federation(run_dir, FederationConfig(head="lda", eval_clean=True, seed=seed), progress=progress_bars,
                         overwrite=True, out_dir=run_dir / "federation-lda")
    fc = run_federation(run_dir, FederationConfig(rounds=rounds, hidden=(), eval_clean=True, seed=seed),
                        progress=progress_bars, overwrite=True)
    inspection = inspect_path(run_dir)
    echo(inspection_text(inspection))
    epsilon = export.privacy.probabilities.get("epsilon_add_remove", STATS_EPSILON)
    return StatsRun(run_dir, release, float(epsilon), weakest_guarantee(run_dir),
                    _last([r.get("clean_test_accuracy") for r in lda.history]),
                    [r.get("clean_test_accuracy") for r in fc.history], inspection.ok)


def _run_private(run_dir: Path, *, clients: int, rounds: int, seed: int | None, progress_bars: bool,
                 echo: Callable[[str], None]) -> PrivateRun:
    """Run the private configuration: shared ScatterNet features kept local, a DP-SGD federation of a linear head."""
    from ldpfl.stage2_federate.federation import FederationConfig, run_federation

    echo(f"== private configuration: ScatterNet features kept on each silo (local-only files), a linear head "
         f"trained with record-level DP-SGD, eps {PRIVATE_TARGET_EPSILON:g} per silo over the whole run (delta "
         f"{PRIVATE_DELTA:g}, replace-one); only the noisy updates leave a silo")
    run_export(ExportConfig(dataset="mnist5k", clients=clients, seed=seed, extractor=PRIVATE_EXTRACTOR,
                            mechanism="none", local_only=True), run_dir, progress=progress_bars)
    federation = run_federation(run_dir, FederationConfig(
        rounds=rounds, seed=seed, hidden=(), dp_sgd=True, target_epsilon=PRIVATE_TARGET_EPSILON,
        delta=PRIVATE_DELTA, local_steps=PRIVATE_LOCAL_STEPS, server_momentum=PRIVATE_SERVER_MOMENTUM),
        progress=progress_bars, overwrite=True)
    inspection = inspect_path(run_dir)
    echo(inspection_text(inspection))
    stored = json.loads(federation.paths["metrics_json"].read_text())["release_guarantee"]  # the file boundary
    guarantee = FederationGuarantee.from_dict(stored)
    accuracies = [float(r["test_accuracy"]) for r in federation.history]  # the silos' own clean test records
    return PrivateRun(run_dir, "ScatterNet features kept local", "dp-sgd", PRIVATE_TARGET_EPSILON,
                      guarantee.epsilon, [], accuracies, list(accuracies), inspection.ok, guarantee)


def weakest_guarantee(run_dir: StrPath) -> ReleaseGuarantee | None:
    """Return the manifest's weakest client ``release_guarantee`` (everything the files release, composed)."""
    stored = read_manifest(Path(run_dir)).info["release_guarantee"].values()
    return weakest(ReleaseGuarantee.from_dict(g) for g in stored)


__all__ = ["DemoResult", "PrivateRun", "StatsRun", "demo", "weakest_guarantee"]
