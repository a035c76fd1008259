"""The Flower engine's start-up time and per-round overhead against the local engine, on the same run.

Runs the same seeded federation with ``--engine local``, with Flower's simulation engine (a private
SuperLink, Ray, one ClientApp per client file) at the CPUs per client of ``--cpus``, and, with
``--deployment``, deployed: a SuperLink and one SuperNode per client file on 127.0.0.1, submitted as
``ldpfl federate --superlink`` does (``deployment.run_on_superlink``). For each it reports the wall time,
the time per round (the median over rounds 2..E; the local engine's is its rounds' ``seconds``, a
deployment's the time between two rounds' records) and the start-up + tear-down time, and it checks
that every engine selected the same clients and reached the same accuracies, bit for bit.

For the deployment it prints where a round's time goes, per message (the median over the rounds' messages
of one kind), from each message's timeline (run config ``timings-file``: when the ServerApp pushed it,
when the ClientApp process started, when its module (with Flower's runtime, ldpfl and torch) was
loaded, when its handler started, when the client file was open and checked, when the handler was done,
when the reply reached the ServerApp):

* waiting for the node: from the push to the ClientApp process's start (the SuperNode's pull loop, which
  sleeps 3 s whenever it finds no message, and the SuperExec's task poll, ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``);
* process start + Flower's runtime: the interpreter, Flower's imports, pulling the task, installing the app
  (up to ``client_entry.IMPORTS_STARTED``);
* imports: ldpfl and torch (the ClientApp module);
* opening and checking the client file;
* the work: training and perturbing, or evaluating;
* the reply: pushing it, the SuperNode's reply poll (0.5 s), the ServerApp's pull.

Without RUN_DIR it writes a small synthetic run (``tests/federate_files.py``).

Usage::

    .venv/bin/python bench/flower_overhead.py [RUN_DIR] [--rounds 5] [--clients 4] [--hidden 2048] [--cpus 1,2]
        [--deployment]

Needs ``pip install -e '.[flower]'``. Time it on an idle machine: Ray's start-up and Flower's per-message
overhead are very sensitive to other load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(label: str, run, round_times=None) -> dict:
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    rounds = round_times() if round_times is not None else [float(r["seconds"]) for r in result.history]
    later = rounds[1:] or rounds
    return {"engine": label, "wall_s": wall, "round_s_median": statistics.median(later),
            "startup_and_teardown_s": wall - sum(rounds), "selected": [r["selected"] for r in result.history],
            "test_accuracy": [r["test_accuracy"] for r in result.history],
            "test_loss": [r["test_loss"] for r in result.history]}


def breakdown(lines: list[dict]) -> tuple[dict[str, dict[str, float]], list[float]]:
    """Median seconds per component and message kind (rounds 2..E), and the times between rounds' records."""
    rounds = sorted((int(row["round"]), row["time"]) for row in lines if row.get("event") == "round")
    between = [b - a for (_, a), (_, b) in zip(rounds, rounds[1:], strict=False)]
    parts: dict[str, dict[str, list[float]]] = {}
    for row in lines:
        if "event" in row or "handler_done" not in row or row["round"] in ("", "0", "1"):
            continue
        kind = row["kind"]
        started = row["process_started"] if row.get("process_started") is not None else row["imports_started"]
        file_ready = row.get("file_ready", row["handler_started"])
        values = {
            "waiting for the node (SuperNode poll, SuperExec poll)": started - row["pushed"],
            "process start + Flower's runtime": row["imports_started"] - started,
            "imports: ldpfl and torch": row["module_ready"] - row["imports_started"],
            "opening and checking the client file": file_ready - row["handler_started"],
            "the work (evaluation, training)": row["handler_done"] - file_ready,
            "the reply (push, SuperNode poll, ServerApp pull)": row["arrived"] - row["handler_done"],
            "message total (push to reply)": row["arrived"] - row["pushed"],
        }
        for name, value in values.items():
            parts.setdefault(name, {}).setdefault(kind, []).append(value)
    return {name: {kind: statistics.median(v) for kind, v in kinds.items()} for name, kinds in parts.items()}, \
        [float(b) for b in between]


def deployed(run_dir: Path, config, work: Path, clients: int):
    """Run the federation on a SuperLink and one SuperNode per client file on 127.0.0.1; return the result and lines."""
    from ldpfl.stage2_federate.flower_engine.deployment import run_on_superlink
    from ldpfl.stage2_federate.flower_engine.launch import FlowerOptions, start_superlink, start_supernode
    from ldpfl.stage2_federate.flower_engine.processes import stop_all

    timings = work / "timings.jsonl"
    daemons = []
    try:
        link, port = start_superlink(work / "deploy", timeout=180)
        daemons.append(link)
        for index in range(clients):
            daemons.append(start_supernode(work / "deploy", f"127.0.0.1:{port}", run_dir / f"client_{index:03d}.h5",
                                           index=index, state_dir=work / f"state{index}"))
        result = run_on_superlink(run_dir, config, superlink=f"127.0.0.1:{port}", insecure=True,
                                  out_dir=work / "deployed", progress=False, on_warning=None,
                                  options=FlowerOptions(timings_file=str(timings), round_timeout=900))
    finally:
        left = stop_all(daemons)
    if left:
        print(f"warning: processes left: {left}", file=sys.stderr)
    return result, [json.loads(line) for line in timings.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4, help="clients of the synthetic run (without RUN_DIR)")
    parser.add_argument("--hidden", default="2048", help="hidden layer sizes, e.g. 2048 or 64 or none")
    parser.add_argument("--cpus", default="1,2", help="CPUs per simulated client to time, comma-separated ('' none)")
    parser.add_argument("--deployment", action="store_true",
                        help="also deploy: a SuperLink and one SuperNode per client file on 127.0.0.1")
    args = parser.parse_args()

    from ldpfl.stage2_federate.runtime import apply_runtime_defaults

    apply_runtime_defaults()
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.federation import run_federation
    from ldpfl.stage2_federate.flower_engine.launch import FlowerOptions, run_flower

    work = Path(tempfile.mkdtemp(prefix="ldpfl-bench-flower-"))
    run_dir = args.run_dir
    if run_dir is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from federate_files import write_run

        run_dir = write_run(work / "run", clients=args.clients, rows=512, features=64)
    clients = len(json.loads((Path(run_dir) / "manifest.json").read_text())["files"])
    hidden = () if args.hidden.lower() == "none" else tuple(int(v) for v in args.hidden.split(","))
    config = FederationConfig(rounds=args.rounds, hidden=hidden, seed=1, device="cpu")
    rows = [timed("local", lambda: run_federation(run_dir, config, out_dir=work / "local", progress=False,
                                                  on_warning=None))]
    for cpus in (int(c) for c in args.cpus.split(",") if c.strip()):
        options = FlowerOptions(cpus_per_client=cpus)
        rows.append(timed(f"flower, {cpus} CPU/client", lambda o=options, c=cpus: run_flower(
            run_dir, config, out_dir=work / f"flower{c}", progress=False, options=o, on_warning=None)))
    parts = None
    if args.deployment:
        holder: dict = {}

        def deploy():
            holder["result"], holder["lines"] = deployed(run_dir, config, work, clients)
            return holder["result"]

        def between() -> list[float]:
            parts_, gaps = breakdown(holder["lines"])
            holder["parts"] = parts_
            return [float(r["seconds"]) for r in holder["result"].history[:1]] + gaps

        rows.append(timed(f"flower, {clients} SuperNodes", deploy, between))
        parts = holder["parts"]
    same = all(r["selected"] == rows[0]["selected"] for r in rows)
    identical = all(r["test_accuracy"] == rows[0]["test_accuracy"] and r["test_loss"] == rows[0]["test_loss"]
                    for r in rows)
    print(f"run {run_dir}, {clients} clients, {args.rounds} rounds, hidden {hidden or 'none'}; load average "
          f"{os.getloadavg()[0]:.1f}; same selections: {same}; identical accuracies and losses: {identical}")
    print(f"{'engine':<26}{'wall s':>9}{'per round s':>13}{'start-up + tear-down s':>25}")
    for r in rows:
        print(f"{r['engine']:<26}{r['wall_s']:>9.1f}{r['round_s_median']:>13.3f}{r['startup_and_teardown_s']:>25.1f}")
    if parts is not None:
        kinds = sorted({k for values in parts.values() for k in values})
        print(f"\ndeployed round, per message (median over rounds 2..{args.rounds} and clients), seconds")
        print(f"{'':<56}" + "".join(f"{k:>12}" for k in kinds))
        for name, values in parts.items():
            print(f"{name:<56}" + "".join(f"{values.get(k, float('nan')):>12.2f}" for k in kinds))
        local, deploy_round = rows[0]["round_s_median"], rows[-1]["round_s_median"]
        print(f"round: local {local:.2f} s, deployed {deploy_round:.2f} s: {deploy_round - local:+.2f} s")
    print(json.dumps({"rows": rows, "breakdown": parts}, default=float))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
