"""Experiment 7: the privacy-utility front on the honest figure: total ε per record over everything released.

Each point trains every client's CNN with record-level DP-SGD (``--cnn-epsilon``, ``--cnn-delta``), releases a
low-dimensional value per record (``scores`` with ``hybrid`` or ``label`` with ``krr``) and the record's label
through k-RR (``--label-epsilon``), then federates with the LDPFL Table I protocol (FMNIST: 10 clients, 9 per
round, one dropout per round) and evaluates the global model on the released test split and on the clients'
clean test records (``--keep-clean-test``/``--eval-clean``, which release nothing). The column that counts is
``release_guarantee.epsilon`` of the files: every part composed (dp-accounting PLD under replace-one), not the
budgets asked for. Baselines: each client's DP CNN alone (its accuracy on its own clean test split).

Usage (see docs/RESULTS.md, experiment 7)::

    python experiments/exp7_private_front.py --dataset fashion-mnist --points 8:4:2:2 --seed 22
    # a point is TOTAL:CNN_EPS:LABEL_EPS:RELEASE_EPS (TOTAL is the target; the table shows the composed figure)
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

from ldpfl.contract.client_reader import read_client_file  # noqa: E402
from ldpfl.contract.manifest import read_manifest  # noqa: E402
from ldpfl.contract.release_guarantee import ReleaseGuarantee, file_guarantee  # noqa: E402

NAME = "exp7_private_front"
DELTA = 1e-5
PROTOCOL = {
    "fashion-mnist": {"clients": 10, "clients_per_round": 9, "drop_per_round": 1, "rounds": 10, "local_epochs": 2,
                      "data": ["--data-dir", "/usr/share/datasets/fashion-mnist"]},
    "mnist5k": {"clients": 2, "clients_per_round": 2, "drop_per_round": 0, "rounds": 10, "local_epochs": 2,
                "data": []},
}
RELEASES = {"scores": "hybrid", "label": "krr"}


def _eps(value: Any) -> float:
    return math.inf if value in ("inf", None) else float(value)


def configuration_guarantee(run_dir: Path) -> list[ReleaseGuarantee]:
    """Each client's guarantee of this configuration alone, composed by the library from its file's attributes.

    A release ``--from-models`` of an earlier export composes that export's release too (the file's own
    guarantee, what a silo that sends both files signs); a configuration of the front is one alternative,
    so its figure composes the CNN, its values and its labels only (``file_guarantee`` without history).
    """
    manifest = read_manifest(run_dir)
    out = []
    for record in manifest.files:
        meta = read_client_file(run_dir / record.path).metadata
        out.append(file_guarantee(meta, records=sum(record.rows.values())))
    return out


def point(args: Any, spec: str, release: str, models_from: Path | None) -> dict[str, Any]:
    """One configuration; ``models_from``: re-release the DP CNNs of that export (same data, same training)."""
    target, cnn_eps, label_eps, release_eps = (float(v) for v in spec.split(":"))
    proto = PROTOCOL[args.dataset]
    name = (f"{args.dataset}_{release}_t{target:g}_c{cnn_eps:g}_b{args.cnn_batch_size}_e{args.cnn_epochs}"
            f"_l{label_eps:g}_r{release_eps:g}")
    run_dir = args.work / name
    common = ["--label-epsilon", label_eps, "--release", release, "--mechanism", RELEASES[release],
              "--epsilon", release_eps, "--keep-clean-test", "--clients-parallel", 2]
    if models_from is None:
        exported = C.export(run_dir, ["--dataset", args.dataset, *proto["data"], "--clients", proto["clients"],
                                      "--epochs", args.cnn_epochs, "--batch-size", args.cnn_batch_size,
                                      "--cnn-epsilon", cnn_eps, "--cnn-delta", DELTA, "--save-models", *common],
                            seed=args.seed)
    else:
        exported = C.export(run_dir, ["--from-models", models_from, *common], seed=args.seed)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    file_totals = [_eps(g["epsilon"]) for g in manifest["release_guarantee"].values()]
    own = configuration_guarantee(run_dir)
    totals = [g.epsilon for g in own]
    deltas = [g.delta for g in own]
    fed_dir = args.work / (f"{name}_fed" if args.fed_lr is None else f"{name}_fed_lr{args.fed_lr:g}")
    lr = [] if args.fed_lr is None else ["--lr", args.fed_lr]
    fed = C.federate(run_dir, fed_dir,
                     ["--rounds", proto["rounds"], "--local-epochs", proto["local_epochs"],
                      "--clients-per-round", proto["clients_per_round"], "--drop-per-round", proto["drop_per_round"],
                      "--optimizer", "adam", *lr, "--eval-clean"], seed=args.seed)
    metrics = json.loads((fed_dir / "metrics.json").read_text())
    clean = [r.get("clean_test_accuracy") for r in metrics["rounds"]]
    local = [a for a in exported["local_cnn_accuracy"] if a is not None]
    if models_from is not None:  # a re-release reports no training: the CNNs' accuracy is the first export's
        first = json.loads(Path(f"{models_from}.experiment.json").read_text())["summary"]["clients"]
        local = [c["local_accuracy"] for c in first if c.get("local_accuracy") is not None]
    return {"run_dir": str(run_dir), "cnn_batch_size": args.cnn_batch_size, "cnn_epochs": args.cnn_epochs,
            "fed_lr": args.fed_lr, "clean_test_per_round": clean,
            "file_total_epsilon": max(file_totals), "models_from": None if models_from is None else str(models_from),
            "target": target, "cnn_epsilon": cnn_eps, "label_epsilon": label_eps, "release": release,
            "mechanism": RELEASES[release], "release_epsilon": release_eps,
            "total_epsilon": max(totals), "delta": max(deltas), "dp_cnn_alone": sum(local) / len(local),
            "released_test": fed["final_accuracy"], "clean_test": clean[-1],
            "best_clean_test": max(c for c in clean if c is not None),
            "export_seconds": exported["seconds"], "federate_seconds": fed["seconds"],
            "commands": [exported["command"], fed["command"]]}


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--dataset", choices=sorted(PROTOCOL), default="fashion-mnist")
    p.add_argument("--points", nargs="+", default=["8:4:2:2"], help="TOTAL:CNN_EPS:LABEL_EPS:RELEASE_EPS ...")
    p.add_argument("--releases", nargs="+", choices=sorted(RELEASES), default=["scores"])
    p.add_argument("--cnn-epochs", type=int, default=10)
    p.add_argument("--cnn-batch-size", type=int, default=64)
    p.add_argument("--fed-lr", type=float, default=None, help="stage-2 learning rate (default: federate's, 1e-3)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    suffix = "" if args.fed_lr is None else f"_lr{args.fed_lr:g}"
    for spec in args.points:  # the first release of a point trains the DP CNNs; the others re-release them
        first: Path | None = None
        for release in args.releases:
            rows.append(point(args, spec, release, first))
            first = first or Path(rows[-1]["run_dir"])
        C.write_results(args.out, f"{NAME}_{args.dataset}{suffix}_partial", {"rows": rows}, "")
    header = ["release", "target ε", "cnn ε (add/remove)", "label ε", "release ε", "total ε per record (δ)",
              "DP CNN alone", "global, released test", "global, clean test (best)"]
    table = C.markdown_table(header, [[f"{r['release']}/{r['mechanism']}", f"{r['target']:g}",
                                       f"{r['cnn_epsilon']:g}", f"{r['label_epsilon']:g}",
                                       f"{r['release_epsilon']:g}", f"{r['total_epsilon']:.3g} ({r['delta']:g})",
                                       C.pct(r["dp_cnn_alone"]), C.pct(r["released_test"]),
                                       f"{C.pct(r['clean_test'])} ({C.pct(r['best_clean_test'])})"] for r in rows])
    C.write_results(args.out, f"{NAME}_{args.dataset}{suffix}",
                    {"rows": rows, "seconds": time.perf_counter() - started}, table)
    print(table)


if __name__ == "__main__":
    main()
