"""Experiment 5: privacy against utility, nominal ε and exact per-record ε, over LDPFL's feature mechanisms.

One CNN training, many mechanisms: the script exports the 2-client MNIST-5k run once with
``--mechanism none`` (the *unrandomized* fixed-point encoding of the Fig. 3 CNN's flatten features,
m = 4, n = 5, r = 1,024, r·l = 10,240 bits), then re-randomizes the stored bits with each mechanism
through the Python API (``ldpfl.mechanisms.create_mechanism`` +
``ldpfl.contract.client_writer.write_client_file``) into its own
run directory, and federates each run briefly with ``ldpfl federate``:

* UER (Theorem 2, eq. 17): α ∈ {2, 5, 10, 20} x ε ∈ {0.5, 5, 50};
* OUE (eqs. 11-13) and RR (eqs. 5, 15), budget ε/s per bit with s = r·l: ε ∈ {0.5, 5, 50, 500};
* PDPM (PLDP-FL eq. 10) on the decoded features (float32 files), safe range τ = [0, 2]
  (the flatten output is ReLU-then-pool, so ≥ 0; 97 % of values are ≤ 2): ε ∈ {0.5, 5, 20} per
  coordinate (not 50: the privacy report of PDPM fails from ε ≈ 37 on, see RESULTS.md);
* none: the unrandomized bits (upper reference, not private).

The exact ε is taken from each mechanism's privacy report (``mech.report()``; the same numbers as
``ldpfl mechanisms show NAME ... --json``). Randomization draws come from ``SeedSequence(seed)``, one
child stream per (configuration, client).

Scales: cpu = CNN 10 epochs, 3 rounds x 1 local epoch, FC hidden 512 (paper's DNN: 2,048);
gpu = CNN 50 epochs, 20 rounds x 20 local epochs, hidden 2048.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from ldpfl import mechanisms  # noqa: E402
from ldpfl.contract.client_reader import read_client_file  # noqa: E402
from ldpfl.contract.client_writer import write_client_file  # noqa: E402
from ldpfl.contract.manifest import read_manifest, record_for, write_manifest  # noqa: E402
from ldpfl.contract.schema import SPLITS, utc_now  # noqa: E402

NAME = "exp5_privacy_utility"
SCALES = {
    "cpu": {"cnn_epochs": 10, "rounds": 3, "local_epochs": 1, "hidden": 512},
    "gpu": {"cnn_epochs": 50, "rounds": 20, "local_epochs": 20, "hidden": 2048},
}
PDPM_RANGE = {"center": 1.0, "safe_range_length": 2.0}  # τ = [0, 2]
# Not 50: PDPM's privacy report fails from ε ≈ 37 on (math domain error in
# mechanisms/calibration.py pdpm_exact_epsilon, cancellation in eq. 10 at v = -L/2; see RESULTS.md).
PDPM_EPSILONS = (0.5, 5, 20)


def configurations() -> list[tuple[str, str, dict]]:
    """(label, mechanism, parameters) of every point of the sweep."""
    out = [("none", "none", {})]
    for alpha in (2, 5, 10, 20):
        for eps in (0.5, 5, 50):
            out.append((f"uer-a{alpha}-e{eps}", "uer", {"epsilon": eps, "alpha": alpha}))
    for name in ("oue", "rr"):
        for eps in (0.5, 5, 50, 500):
            out.append((f"{name}-e{eps}", name, {"epsilon": eps}))
    for eps in PDPM_EPSILONS:
        out.append((f"pdpm-e{eps}", "pdpm", {"epsilon": eps, **PDPM_RANGE}))
    return out


def rerandomize(source: Path, target: Path, mech_name: str, params: dict, seq: np.random.SeedSequence) -> dict:
    """Write ``target`` as an export run: each client file of ``source`` (mechanism none, packed bits)
    re-randomized by ``mech_name``; returns the mechanism's privacy report."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    manifest = read_manifest(source)
    records = []
    report = None
    streams = seq.spawn(len(manifest.files))
    for record, stream in zip(manifest.files, streams, strict=True):
        data = read_client_file(source / record.path)
        meta = data.metadata
        r, m, n = meta.features, meta.integer_bits, meta.fraction_bits
        encoding = mechanisms.FixedPointEncoding(m, n)
        rng = np.random.default_rng(stream)
        if mech_name == "pdpm":
            mech = mechanisms.create_mechanism("pdpm", dim=r, **params)
            fmt, bits_m, bits_n = mechanisms.FLOAT32, 0, 0
        else:
            kwargs = {"features": r, "integer_bits": m, "fraction_bits": n, **params} if mech_name != "none" else {}
            mech = mechanisms.create_mechanism(mech_name, **kwargs)
            fmt, bits_m, bits_n = mechanisms.PACKED_BITS, m, n
        splits = {}
        for split in SPLITS:
            bits = mechanisms.unpack_bits(data.features[split], meta.feature_width)
            if fmt == mechanisms.FLOAT32:
                values = encoding.decode(bits).astype(np.float32)
                stored = mech.randomize(values, rng=rng).astype(np.float32)
            else:
                stored = mechanisms.pack_bits(mech.randomize(bits, rng=rng) if mech_name != "none" else bits)
            splits[split] = (stored, data.labels[split].astype(np.int32))
        report = mech.report().with_randomness("seeded").to_dict()
        mech_params = dict(mech.parameters())
        if fmt == mechanisms.PACKED_BITS:
            mech_params.update(integer_bits=m, fraction_bits=n)
        new_meta = dataclasses.replace(meta, mechanism=mech_name, mechanism_parameters=mech_params,
                                       privacy_report=report, feature_format=fmt, integer_bits=bits_m,
                                       fraction_bits=bits_n, randomness="seeded", created_utc=utc_now())
        path = target / record.path
        digest = write_client_file(path, new_meta, splits)
        records.append(record_for(path, record.client_index, digest, {s: len(splits[s][1]) for s in SPLITS}))
    info = {k: v for k, v in manifest.info.items() if k not in ("schema", "schema_version", "updated_utc")}
    info["config"] = {**info.get("config", {}), "mechanism": mech_name, "mechanism_params": dict(params)}
    info.update(mechanism=mech_name,
                feature_format=mechanisms.FLOAT32 if mech_name == "pdpm" else mechanisms.PACKED_BITS,
                feature_width=new_meta.feature_width, privacy_report=report, randomness="seeded",
                note=f"re-randomized from {source} by experiments/{NAME}.py")
    write_manifest(target, records, info)
    return report


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--reuse-export", type=Path, default=None,
                   help="an existing mnist5k export with --mechanism none (skips the CNN training)")
    args = p.parse_args()
    scale = SCALES[args.scale]
    work = args.work / NAME / args.scale
    results = C.experiment_header(NAME, args, scale)
    start = time.perf_counter()
    if args.reuse_export:
        base = {"command": "(reused)", "seconds": 0.0, "run_dir": str(args.reuse_export),
                "summary": json.loads((args.reuse_export / "manifest.json").read_text())}
    else:
        base = C.export(work / "mnist5k-none", ["--dataset", "mnist5k", "--clients", 2, "--extractor", "mnist-cnn",
                                                "--epochs", scale["cnn_epochs"], "--mechanism", "none"], seed=args.seed)
    results["export"] = base
    source = Path(base["run_dir"])
    fed = ["--rounds", scale["rounds"], "--local-epochs", scale["local_epochs"], "--hidden", scale["hidden"]]
    configs = configurations()
    seqs = np.random.SeedSequence(args.seed).spawn(len(configs))
    results["points"] = []
    for (label, name, params), seq in zip(configs, seqs, strict=True):
        t0 = time.perf_counter()
        run_dir = work / "variants" / label
        report = rerandomize(source, run_dir, name, params, seq)
        seconds = round(time.perf_counter() - t0, 1)
        C.log(f"{label}: re-randomized in {seconds} s; exact ε per record {report['exact_epsilon_per_record']}")
        fedres = C.federate(run_dir, work / "fed" / label, fed, seed=args.seed)
        results["points"].append({
            "label": label, "mechanism": name, "parameters": params,
            "nominal_epsilon": report["nominal_epsilon"],
            "exact_epsilon_per_coordinate": report["exact_epsilon_per_coordinate"],
            "exact_epsilon_per_record": report["exact_epsilon_per_record"],
            "coordinate": report.get("coordinate"), "record": report.get("record"),
            "rerandomize_seconds": seconds, **fedres})
        shutil.rmtree(run_dir)  # the files are re-creatable from the seed; keep /tmp small
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)
    plot(results, args.out / f"{NAME}.png")
    C.write_results(args.out, NAME, results, markdown(results))


def _eps(value) -> float:
    return float("inf") if value in ("inf", None) else float(value)


def markdown(results: dict) -> str:
    rows = []
    for pt in results["points"]:
        rows.append([pt["label"], "—" if pt["mechanism"] == "none" else f"{_eps(pt['nominal_epsilon']):g}",
                     f"{_eps(pt['exact_epsilon_per_coordinate']):.4g}", f"{_eps(pt['exact_epsilon_per_record']):.4g}",
                     C.pct(pt["final_accuracy"])])
    return C.markdown_table(["configuration", "nominal ε", "exact ε per coordinate", "exact ε per record",
                             f"accuracy (round {results['scale_settings']['rounds']})"], rows)


def plot(results: dict, path: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    points = results["points"]
    none = next(p for p in points if p["mechanism"] == "none")
    groups = {}
    for pt in points:
        if pt["mechanism"] == "none":
            continue
        key = f"UER α={pt['parameters']['alpha']}" if pt["mechanism"] == "uer" else pt["mechanism"].upper()
        groups.setdefault(key, []).append(pt)
    markers = dict(zip(groups, "osD^vP<>", strict=False))
    for ax, field, title in ((axes[0], "nominal_epsilon", "against nominal ε (what the user asks for)"),
                             (axes[1], "exact_epsilon_per_record", "against exact ε per record (what the code gives)")):
        for key, pts in groups.items():
            pts = sorted(pts, key=lambda p: _eps(p[field]))
            ax.plot([_eps(p[field]) for p in pts], [p["final_accuracy"] for p in pts], marker=markers[key],
                    label=key)
        ax.axhline(none["final_accuracy"], color="black", ls="--", lw=1, label="no randomization")
        ax.axhline(0.1, color="grey", ls="-.", lw=0.6)
        ax.set_xscale("log")
        ax.set_xlabel(field.replace("_", " ") + " (log)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("test accuracy")
    axes[0].set_ylim(0, 1)
    axes[1].legend(fontsize=8, loc="center left")
    fig.suptitle("MNIST-5k, 2 clients, Fig. 3 CNN features (r·l = 10,240 bits): privacy against utility. "
                 "PDPM's ε is per coordinate (r = 1,024)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
