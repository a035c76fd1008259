"""Experiment 1: LDPFL (Chamikara et al.), Table I analogue on Fashion-MNIST and the 2-client MNIST run.

Paper (IV-A to IV-E, Table I): Fashion-MNIST, N_h = 10 clients of 6,000 train + 1,000 test records,
each holding out 10 %; per client the Fig. 4 CNN (50 epochs, RMSprop, batch 64, augmentation); flatten
features (r = 1,152) fixed-point encoded with m = 4, n = 5 (r·l = 11,520 bits) and randomized by UER
with ε = 0.5, α = 10; then FedAvg of the FC DNN (11,520-2,048-10, SGD lr 0.001, batch 64, 20 local
epochs) for 80 rounds with 9 of 10 clients per round, and the update of one random client dropped each
round. Table I: LDPFL ~81 % after 80 rounds. MNIST (Fig. 6): 2 clients (N_h = 2), the Fig. 3 CNN
(r = 1,024, r·l = 10,240), Adam, 100 rounds; the text gives no number for Fig. 6, only that "LDPFL
generates good model performance".

Here: the same pipeline through the CLI; MNIST is the embedded 5,000-record MNIST-5k.

Scales (what cpu reduces):

=========================  ================================  ===========================
setting                    cpu                               gpu (= paper)
=========================  ================================  ===========================
FMNIST records             30,000 (``--limit``): 2,700 train  70,000: 6,300 train + 700
                           + 300 test per client             test per client
FMNIST CNN epochs, batch   3, batch 32 (see below)           50, batch 64
FMNIST rounds x local ep.  10 x 1; SGD, and Adam as well     80 x 20; SGD
MNIST-5k CNN epochs        10                                50
MNIST-5k rounds x local    10 x 2                            100 x 20
=========================  ================================  ===========================

Why batch 32 at cpu scale: when this script was written, the CNNs' BatchNormalization used Keras'
momentum 0.99 and the features are extracted in inference mode (moving statistics). After ~130 steps
(3 epochs of 2,700 records at batch 64) those statistics still lagged the weights and the CNN's own
test accuracy in inference mode was near chance (measured: 8 % in inference mode against 96 % in
training mode, MNIST-5k, 3 epochs); halving the batch doubles the steps for the same compute. Since
commit 14d21ea the momentum is 0.9 and batch 64 would do; batch 32 is kept so that the published
numbers can be reproduced.

``--fmnist-run DIR`` federates an existing Fashion-MNIST UER export instead of exporting one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "exp1_ldpfl"
SCALES = {
    "cpu": {"fmnist_limit": 30000, "fmnist_cnn_epochs": 3, "fmnist_cnn_batch": 32, "fmnist_rounds": 10,
            "fmnist_local_epochs": 1, "fmnist_extra_optimizer": "adam",
            "mnist_cnn_epochs": 10, "mnist_rounds": 10, "mnist_local_epochs": 2},
    "gpu": {"fmnist_limit": None, "fmnist_cnn_epochs": 50, "fmnist_cnn_batch": 64, "fmnist_rounds": 80,
            "fmnist_local_epochs": 20, "fmnist_extra_optimizer": None,
            "mnist_cnn_epochs": 50, "mnist_rounds": 100, "mnist_local_epochs": 20},
}
UER = ["--mechanism", "uer", "--epsilon", 0.5, "--alpha", 10, "-m", 4, "-n", 5]
PAPER = {"fmnist_after_80_rounds": 0.81, "fmnist_non_private": 0.90,
         "mnist_fig6": "no number in the text: 'LDPFL generates good model performance' (IV-E 1)"}


def run_mnist(args, scale: dict, work: Path) -> dict:
    run = C.export(work / "mnist5k-uer", ["--dataset", "mnist5k", "--clients", 2, "--extractor", "mnist-cnn",
                                          "--epochs", scale["mnist_cnn_epochs"], *UER], seed=args.seed)
    fed = C.federate(Path(run["run_dir"]), work / "fed-mnist5k",
                     ["--rounds", scale["mnist_rounds"], "--local-epochs", scale["mnist_local_epochs"]], seed=args.seed)
    return {"export": run, "federation": fed}


def run_fmnist(args, scale: dict, work: Path) -> dict:
    if args.fmnist_run:
        run = {"command": f"(reused export {args.fmnist_run})", "seconds": None, "run_dir": str(args.fmnist_run),
               "summary": json.loads((args.fmnist_run / "manifest.json").read_text())}
    else:
        options = ["--dataset", "fashion-mnist", "--clients", 10, "--extractor", "cifar-cnn",
                   "--epochs", scale["fmnist_cnn_epochs"], "--batch-size", scale["fmnist_cnn_batch"], *UER]
        if scale["fmnist_limit"]:
            options += ["--limit", scale["fmnist_limit"]]
        run = C.export(work / "fmnist-uer", options, seed=args.seed)
    options = ["--rounds", scale["fmnist_rounds"], "--local-epochs", scale["fmnist_local_epochs"],
               "-k", 9, "--drop-per-round", 1]
    out = {"export": run, "federation": C.federate(Path(run["run_dir"]), work / "fed-fmnist", options, seed=args.seed)}
    if scale["fmnist_extra_optimizer"]:
        # SGD at lr 0.001 (IV-E) needs the paper's 80 x 20 local epochs; with 10 x 1 it has barely started, so
        # the cpu scale also shows what the same features give with Adam (IV-E's optimizer for MNIST).
        opt = scale["fmnist_extra_optimizer"]
        out["federation_" + opt] = C.federate(Path(run["run_dir"]), work / f"fed-fmnist-{opt}",
                                              options + ["--optimizer", opt], seed=args.seed)
    return out


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--part", choices=("all", "mnist", "fmnist"), default="all")
    p.add_argument("--fmnist-run", type=Path, default=None, help="reuse this Fashion-MNIST UER export")
    args = p.parse_args()
    scale = SCALES[args.scale]
    work = args.work / NAME / args.scale
    path = args.out / f"{NAME}.json"
    # parts run separately (cheapest first) accumulate into one result file
    results = json.loads(path.read_text()) if path.exists() and args.part != "all" else {}
    results.update(C.experiment_header(NAME, args, scale))
    results["paper"] = PAPER
    for part, fn in (("mnist", run_mnist), ("fmnist", run_fmnist)):
        if args.part in ("all", part):
            start = time.perf_counter()
            results[part] = fn(args, scale, work)
            results[part]["invocation_seconds"] = round(time.perf_counter() - start, 1)
    plot(results, args.out / f"{NAME}.png")
    C.write_results(args.out, NAME, results, markdown(results))


def markdown(results: dict) -> str:
    rows = []
    if "fmnist" in results:
        f = results["fmnist"]["federation"]
        rows.append(["Fashion-MNIST, 10 clients, 9/round, 1 dropout, UER ε=0.5 α=10, SGD lr 0.001 (IV-E)",
                     "~81% (80 rounds x 20 local epochs)",
                     f"{C.pct(f['final_accuracy'])} (round {len(f['accuracy'])})", C.pct(f["best_accuracy"])])
        if "federation_adam" in results["fmnist"]:
            f = results["fmnist"]["federation_adam"]
            rows.append(["same files, Adam lr 0.001 (deviation: IV-E uses Adam for MNIST only)", "—",
                         f"{C.pct(f['final_accuracy'])} (round {len(f['accuracy'])})", C.pct(f["best_accuracy"])])
    if "mnist" in results:
        f = results["mnist"]["federation"]
        rows.append(["MNIST(-5k), 2 clients, UER ε=0.5 α=10", "Fig. 6: no number given",
                     f"{C.pct(f['final_accuracy'])} (round {len(f['accuracy'])})", C.pct(f["best_accuracy"])])
    return C.markdown_table(["setting", "paper", "ours (final)", "ours (best round)"], rows)


def plot(results: dict, path: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, part, title in ((axes[0], "fmnist", "Fashion-MNIST, 10 clients (Table I)"),
                            (axes[1], "mnist", "MNIST-5k, 2 clients (cf. Fig. 6)")):
        if part in results:
            acc = results[part]["federation"]["accuracy"]
            optimizer = "SGD lr 0.001" if part == "fmnist" else "Adam"
            ax.plot(range(1, len(acc) + 1), acc, marker="o", ms=3, label=f"ours: UER ε = 0.5, α = 10, {optimizer}")
            if "federation_adam" in results[part]:
                acc = results[part]["federation_adam"]["accuracy"]
                ax.plot(range(1, len(acc) + 1), acc, marker="s", ms=3, label="ours: same files, Adam (deviation)")
        if part == "fmnist":
            ax.axhline(0.81, color="tab:red", ls=":", label="paper LDPFL ~81% (80 rounds)")
            ax.axhline(0.90, color="grey", ls=":", label="paper non-private ~90%")
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
