"""Experiment 6: the privacy-utility front of low-dimensional releases (issue "private features that still learn").

For one dataset, the clients' CNNs are trained ONCE (an earlier ``ldpfl export --save-models`` run, passed as
``--models``); every point of the front re-releases the same records from those saved CNNs with
``ldpfl export --from-models`` (a release point, a mechanism and an exact per-record ε), then federates the
released files with the LDPFL Table I protocol (FMNIST: 10 clients, 9 per round, one dropout per round).

Each point reports:

* the exact per-record ε of the release (from the file's privacy report, i.e. from what the code samples);
* the federated test accuracy on the **randomized** test split (how LDPFL evaluates);
* the federated test accuracy on the **clean** test split (``--keep-clean-test`` / ``--eval-clean``): a silo
  predicting on its own records releases nothing, so inference needs no noise;
* the ceiling that no ε-LDP release of one record can pass on randomized test inputs for k classes,
  e^ε / (e^ε + k − 1) (attained by k-ary randomized response), times the local CNN's accuracy;
* the baseline of no federation at all: the clients' own CNNs (mean local test accuracy, nothing released).

Every re-release of the same records spends their privacy again: the scratch run directories of this script
are experiments, not deployments (each ``--from-models`` run's manifest records the whole release history).

Usage (see docs/RESULTS.md, experiment 6)::

    ldpfl export --dataset fashion-mnist --clients 10 --epochs 10 --save-models --seed 15 --out MODELS
    python experiments/exp6_front.py --dataset fashion-mnist --models MODELS --seed 15
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "exp6_front"
EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0, 50.0)
# release -> mechanisms on its front (all of them exact per-record ε at the given --epsilon)
FRONT = {
    "label": ("krr", "oue-label"),
    "scores": ("piecewise", "duchi", "hybrid", "laplace"),
    "bottleneck:16": ("piecewise", "duchi", "hybrid", "laplace"),  # needs --bottleneck-models
}
PROTOCOL = {
    # LDPFL Table I: 10 clients, 9 selected per round, the update of one random client dropped per round
    "fashion-mnist": {"clients_per_round": 9, "drop_per_round": 1, "rounds": 10, "local_epochs": 2},
    "mnist5k": {"clients_per_round": 2, "drop_per_round": 0, "rounds": 10, "local_epochs": 2},
}


def _eps(value: Any) -> float:
    return math.inf if value in ("inf", None) else float(value)


def local_accuracy(models: Path) -> list[float]:
    """The clients' own CNN accuracy on their held-out records (an attribute of the local-only files
    ``client_NNN.local.h5``, ``--keep-clean-test``; runs made before issue 22 kept it in the shared files)."""
    import h5py

    out = []
    for path in sorted(models.glob("client_*.h5")):
        if path.name.endswith(".local.h5"):
            continue
        local = path.with_name(path.name.replace(".h5", ".local.h5"))
        with h5py.File(local if local.is_file() else path, "r") as handle:
            value = handle.attrs.get("local_accuracy")
            if value is not None and math.isfinite(float(value)):
                out.append(float(value))
    return out


def rerandomize(source: Path, target: Path, mechanism: str, epsilon: float, seed: int, label: str) -> dict[str, Any]:
    """Randomize the clean release values stored by a ``--mechanism none`` run of the same release point.

    This is what ``ldpfl export --from-models MODELS --release R --mechanism M`` computes, without predicting
    the records with the CNNs again (on this 2-core machine a Fashion-MNIST prediction pass takes ~4 minutes
    per point under load): the same clean values (``none`` stores them unchanged), the same pipeline
    (``ldpfl.stage1_features.export.release.stored_layout``), the same writer and manifest. The randomness comes from
    SeedSequence(seed, label) instead of the export's client streams, so the draws differ from the CLI's but
    follow the same law (checked on MNIST-5k, where every point runs through the CLI).
    """
    import dataclasses
    import shutil
    import zlib

    import numpy as np

    from ldpfl.contract.client_reader import read_client_file
    from ldpfl.contract.client_writer import ClientFileWriter
    from ldpfl.contract.manifest import read_manifest, record_for, write_manifest
    from ldpfl.contract.release_point import parse_release
    from ldpfl.contract.schema import SPLITS, utc_now
    from ldpfl.mechanisms.spec import MechanismSpec
    from ldpfl.stage1_features.export.release import stored_layout
    from ldpfl.stage1_features.export.write import write_split

    start = time.perf_counter()
    if (target / "manifest.json").is_file():
        return json.loads((target / "manifest.json").read_text())
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    manifest = read_manifest(source)
    streams = np.random.SeedSequence([seed, zlib.crc32(label.encode())]).spawn(len(manifest.files))
    records, report = [], None
    for record, stream in zip(manifest.files, streams, strict=True):
        data = read_client_file(source / record.path)
        meta = data.metadata
        spec = MechanismSpec.resolve(mechanism, {"epsilon": epsilon}, features=meta.features)
        layout = stored_layout(parse_release(meta.release), spec)
        report = spec.report().with_randomness("seeded").to_dict()
        new_meta = dataclasses.replace(
            meta, mechanism=spec.name, mechanism_parameters=layout.mechanism_parameters, privacy_report=report,
            feature_format=layout.feature_format, integer_bits=layout.integer_bits,
            fraction_bits=layout.fraction_bits, randomness="seeded", created_utc=utc_now())
        rows = {s: len(data.labels[s]) for s in SPLITS}
        rng = np.random.default_rng(stream)
        path = tmp / record.path
        with ClientFileWriter(path, new_meta, rows) as writer:
            for split in SPLITS:
                write_split(writer, split, [(data.features[split], data.labels[split])], layout.pipeline, rng)
            digest = writer.commit()
        records.append(record_for(path, record.client_index, digest, rows))
    for local in source.glob("client_*.local.h5"):
        shutil.copy2(local, tmp / local.name)
    info = {k: v for k, v in manifest.info.items() if k not in ("schema", "schema_version", "updated_utc")}
    info.update(mechanism=mechanism, privacy_report=report, randomness="seeded",
                note=f"re-randomized from {source} by experiments/{NAME}.py (rerandomize)")
    write_manifest(tmp, records, info)
    tmp.rename(target)
    C.log(f"  re-randomized {label} in {time.perf_counter() - start:.1f} s")
    return json.loads((target / "manifest.json").read_text())


def release_point(args: Any, work: Path, release: str, mechanism: str, epsilon: float | None) -> dict[str, Any]:
    """One point: re-release from the saved CNNs, federate, read both accuracies."""
    label = f"{release}-{mechanism}" + ("" if epsilon is None else f"-e{epsilon:g}")
    models = args.bottleneck_models if release.startswith("bottleneck") else args.models
    options: list[Any] = ["--from-models", models, "--release", release, "--mechanism", mechanism,
                          "--keep-clean-test"]
    if epsilon is not None:
        options += ["--epsilon", epsilon]
    if args.rerandomize and mechanism != "none":
        start = time.perf_counter()
        rerandomize(work / "runs" / f"{release}-none", work / "runs" / label, mechanism, epsilon, args.seed, label)
        exported = {"command": C.shell_line([C.LDPFL, "export", *map(str, options), "--seed", str(args.seed),
                                             "--out", str(work / "runs" / label)]) + "  # equivalent; see rerandomize",
                    "seconds": round(time.perf_counter() - start, 1)}
    else:
        exported = C.export(work / "runs" / label, options, seed=args.seed)
    manifest = json.loads((work / "runs" / label / "manifest.json").read_text())
    report = manifest.get("privacy_report", {})
    protocol = PROTOCOL[args.dataset]
    fed_options: list[Any] = ["--rounds", args.rounds or protocol["rounds"], "--local-epochs", protocol["local_epochs"],
                              "-k", protocol["clients_per_round"], "--drop-per-round", protocol["drop_per_round"],
                              "--optimizer", "adam", "--hidden", args.hidden, "--eval-clean"]
    fed = C.federate(work / "runs" / label, work / "fed" / label, fed_options, seed=args.seed)
    metrics = json.loads((work / "fed" / label / "metrics.json").read_text())
    clean = [r.get("clean_test_accuracy") for r in metrics["rounds"]]
    return {
        "label": label, "release": release, "mechanism": mechanism, "epsilon": epsilon,
        "method": "rerandomize" if args.rerandomize and mechanism != "none" else "cli",
        "exact_epsilon_per_record": _eps(report.get("exact_epsilon_per_record")),
        "export_command": exported["command"], "export_seconds": exported["seconds"],
        "federate_command": fed["command"], "federate_seconds": fed["seconds"],
        "accuracy": fed["accuracy"], "final_accuracy": fed["final_accuracy"],
        "clean_accuracy": clean, "final_clean_accuracy": clean[-1],
    }


def ceiling(epsilon: float, classes: int, local: float) -> float:
    """e^ε / (e^ε + k − 1) × local accuracy: no ε-LDP release of one record does better on randomized inputs."""
    if math.isinf(epsilon):
        return local
    return math.exp(epsilon) / (math.exp(epsilon) + classes - 1) * local


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for pt in results["points"]:
        eps = pt["exact_epsilon_per_record"]
        rows.append([pt["release"], pt["mechanism"], "∞" if math.isinf(eps) else f"{eps:.4g}",
                     C.pct(pt["final_accuracy"]), C.pct(pt["final_clean_accuracy"]),
                     C.pct(ceiling(eps, results["classes"], results["local_mean"])),
                     f"`{pt['export_command']}`"])
    table = C.markdown_table(["release", "mechanism", "exact ε per record", "federated acc. (randomized test)",
                              "federated acc. (clean test)", "ceiling × local acc.", "export command"], rows)
    return (f"Baseline, no federation (mean local CNN accuracy of the {len(results['local_accuracy'])} clients): "
            f"{C.pct(results['local_mean'])}\n\n" + table)


def plot(results: dict[str, Any], path: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    points = [p for p in results["points"] if math.isfinite(p["exact_epsilon_per_record"])]
    infinite = [p for p in results["points"] if not math.isfinite(p["exact_epsilon_per_record"])]
    groups: dict[str, list[dict[str, Any]]] = {}
    for pt in points:
        groups.setdefault(f"{pt['release']} / {pt['mechanism']}", []).append(pt)
    eps_grid = [x / 10 for x in range(3, 600)]
    for ax, key, title in ((axes[0], "final_accuracy", "randomized test split (LDPFL's evaluation)"),
                           (axes[1], "final_clean_accuracy", "clean test split (a silo predicting locally)")):
        for name, pts in groups.items():
            pts = sorted(pts, key=lambda p: p["exact_epsilon_per_record"])
            ax.plot([p["exact_epsilon_per_record"] for p in pts], [p[key] for p in pts], marker="o", label=name)
            for p in pts:
                ax.annotate(f"{p['epsilon']:g}", (p["exact_epsilon_per_record"], p[key]), fontsize=6,
                            textcoords="offset points", xytext=(2, 3))
        for p in infinite:
            ax.axhline(p[key], ls=":", lw=1, color="grey")
            ax.annotate(f"{p['label']} (ε = ∞)", (0.35, p[key]), fontsize=7, color="grey")
        if key == "final_accuracy":
            ax.plot(eps_grid, [ceiling(e, results["classes"], results["local_mean"]) for e in eps_grid], color="black",
                    lw=1, ls="--", label="ceiling e^ε/(e^ε+k−1) × local acc.")
        ax.axhline(results["local_mean"], color="tab:red", lw=1, ls="-.", label="no federation: local CNNs")
        uer = results.get("uer_reference")
        if uer:
            ax.scatter([uer["exact_epsilon_per_record"]], [uer["final_accuracy"]], marker="*", s=120, color="black",
                       label=f"UER as published (ε ≈ {uer['exact_epsilon_per_record']:,.0f})")
        ax.set_xscale("log")
        ax.set_xlabel("exact ε per record (log)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("federated test accuracy")
    axes[0].set_ylim(0, 1)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{results['dataset']}: privacy-utility front of low-dimensional releases "
                 f"({results['clients']} clients; commands in {NAME}_{results['dataset']}.md)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--dataset", choices=sorted(PROTOCOL), default="fashion-mnist")
    p.add_argument("--models", type=Path, required=True, help="an export run made with --save-models")
    p.add_argument("--releases", default="label,scores", help="comma-separated releases to sweep")
    p.add_argument("--mechanisms", default=None, help="comma-separated subset of each release's mechanisms")
    p.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--hidden", default="256")
    p.add_argument("--bottleneck-models", type=Path, default=None,
                   help="an export run made with --release bottleneck:16 --save-models (for that release)")
    p.add_argument("--rerandomize", action="store_true",
                   help="compute each randomized point from the release's `none` run (see rerandomize)")
    p.add_argument("--uer-metrics", type=Path, default=None,
                   help="metrics.json of the federation of the UER-as-published export (reference point)")
    args = p.parse_args()
    work = args.work / NAME / args.dataset
    summary = json.loads((args.models / "manifest.json").read_text())
    local = local_accuracy(args.models)
    results: dict[str, Any] = {
        **C.experiment_header(NAME, args, PROTOCOL[args.dataset]), "dataset": args.dataset,
        "models": str(args.models), "clients": summary.get("client_count"), "local_accuracy": local,
        "local_mean": sum(local) / len(local), "classes": 10, "points": [],
    }
    start = time.perf_counter()
    wanted = None if args.mechanisms is None else set(args.mechanisms.split(","))
    epsilons = [float(e) for e in args.epsilons.split(",")]
    for release in args.releases.split(","):
        results["points"].append(release_point(args, work, release, "none", None))
        for mechanism in FRONT[release]:
            if wanted is not None and mechanism not in wanted:
                continue
            for eps in epsilons:
                results["points"].append(release_point(args, work, release, mechanism, eps))
                write(args, results)  # keep what is finished
    if args.uer_metrics:
        metrics = json.loads(args.uer_metrics.read_text())
        results["uer_reference"] = {
            "metrics": str(args.uer_metrics), "final_accuracy": float(metrics["rounds"][-1]["test_accuracy"]),
            "exact_epsilon_per_record": _eps(summary.get("privacy_report", {}).get("exact_epsilon_per_record")),
        }
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)
    write(args, results)


def write(args: Any, results: dict[str, Any]) -> None:
    name = f"{NAME}_{args.dataset}"
    plot(results, args.out / f"{name}.png")
    C.write_results(args.out, name, results, markdown(results))


if __name__ == "__main__":
    main()
