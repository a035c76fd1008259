"""Shared helpers of the experiment scripts: run the public ``ldpfl`` CLI, time it, keep the command,
read ``metrics.json``, and write one table (JSON + markdown fragment) and plot (PNG) per experiment.

Every experiment calls the CLI as a subprocess (``<venv>/bin/ldpfl ...``) so that the command recorded
next to each number is exactly what a reader can paste into a shell. Seeds are passed with ``--seed``
and recorded here, in the experiment's own JSON (ldpfl itself never stores them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LDPFL = str(Path(sys.executable).with_name("ldpfl"))
DEFAULT_RESULTS = REPO / "docs" / "results"
DEFAULT_WORK = Path(os.environ.get("LDPFL_EXPERIMENTS_WORK", "/tmp/ldpfl-experiments"))
SCALES = ("cpu", "gpu")


def results_dir(value: str) -> Path:
    """``--out``: the results directory, created if missing."""
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def parser(description: str) -> argparse.ArgumentParser:
    """The options every experiment script takes: ``--scale``, ``--seed``, ``--out``, ``--work``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=SCALES, default="cpu",
                   help="cpu: reduced scale for a 2-core machine (see the script's SCALES); gpu: the paper's scale")
    p.add_argument("--seed", type=int, default=1, help="seed of every export and federation (default 1)")
    p.add_argument("--out", type=results_dir, default=str(DEFAULT_RESULTS),
                   help=f"where the JSON, markdown and PNG results go (default {DEFAULT_RESULTS.relative_to(REPO)})")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK,
                   help=f"scratch directory for export runs and federation outputs (default {DEFAULT_WORK})")
    return p


def shell_line(argv: Sequence[str]) -> str:
    """The command as a reader would type it (``ldpfl`` instead of the venv path)."""
    words = ["ldpfl" if a == LDPFL else str(a) for a in argv]
    return " ".join(shlex.quote(w) for w in words)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(argv: Sequence[str]) -> tuple[float, str, str]:
    """Run one command, fail loudly (with its output), return (wall seconds, shell line, stdout)."""
    argv = [str(a) for a in argv]
    line = shell_line(argv)
    log(f"$ {line}")
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"command failed with exit code {done.returncode}: {line}")
    log(f"  done in {seconds:.1f} s")
    return seconds, line, done.stdout


def _sidecar(out_dir: Path) -> Path:
    return Path(f"{out_dir}.experiment.json")


def _cached(out_dir: Path, line: str, required: Path) -> dict[str, Any] | None:
    """A finished step with the same command (kept beside its output) is not run again."""
    sidecar = _sidecar(out_dir)
    if sidecar.is_file() and required.is_file():
        record = json.loads(sidecar.read_text())
        if record.get("command") == line:
            log(f"$ {line}\n  (reused the finished run, {record['seconds']} s)")
            return record
    return None


def export(out_dir: Path, options: Sequence[Any], *, seed: int) -> dict[str, Any]:
    """``ldpfl export ... --out OUT --seed SEED --json --quiet``; returns the summary, command and wall time."""
    argv = [LDPFL, "export", *options, "--seed", seed, "--out", out_dir, "--json", "--quiet"]
    cached = _cached(out_dir, shell_line([str(a) for a in argv]), out_dir / "manifest.json")
    if cached and "summary" in cached:
        seconds, line, summary = cached["seconds"], cached["command"], cached["summary"]
    else:
        seconds, line, stdout = run(argv)
        summary = json.loads(stdout)
        _sidecar(out_dir).write_text(json.dumps({"command": line, "seconds": round(seconds, 1), "summary": summary}))
    clients = summary.get("clients", [])
    local = [c.get("local_accuracy") for c in clients]
    log(f"  local CNN accuracy per client: {local}")
    return {"command": line, "seconds": round(seconds, 1), "run_dir": str(out_dir),
            "local_cnn_accuracy": local, "summary": summary}


def federate(run_dir: Path, out_dir: Path, options: Sequence[Any], *, seed: int) -> dict[str, Any]:
    """``ldpfl federate RUN_DIR ... --seed SEED --out OUT --overwrite --quiet``; reads metrics.json."""
    argv = [LDPFL, "federate", run_dir, *options, "--seed", seed, "--out", out_dir, "--overwrite", "--quiet"]
    cached = _cached(out_dir, shell_line([str(a) for a in argv]), out_dir / "metrics.json")
    if cached:
        seconds, line = cached["seconds"], cached["command"]
    else:
        seconds, line, _ = run(argv)
        _sidecar(out_dir).write_text(json.dumps({"command": line, "seconds": round(seconds, 1)}))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    rounds = metrics["rounds"]
    accuracy = [float(r["test_accuracy"]) for r in rounds]
    log(f"  accuracy per round: {' '.join(f'{a:.3f}' for a in accuracy)}")
    return {
        "command": line,
        "seconds": round(seconds, 1),
        "accuracy": accuracy,
        "final_accuracy": accuracy[-1],
        "best_accuracy": max(accuracy),
        "weights_last_round": rounds[-1].get("weights"),
        "resolved": metrics["config"].get("resolved", {}),
    }


def mechanism_report(name: str, options: Sequence[Any]) -> dict[str, Any]:
    """``ldpfl mechanisms show NAME ... --json``: the privacy report (nominal and exact ε)."""
    argv = [LDPFL, "mechanisms", "show", name, *[str(o) for o in options], "--json"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    report["command"] = shell_line(argv)
    return report


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def command_seconds(data: Any) -> float:
    """Sum of the recorded wall times of every ldpfl command in ``data`` (cached steps count their first run)."""
    if isinstance(data, Mapping):
        own = float(data["seconds"]) if "command" in data and isinstance(data.get("seconds"), int | float) else 0.0
        return own + sum(command_seconds(v) for k, v in data.items() if k != "summary")
    if isinstance(data, list):
        return sum(command_seconds(v) for v in data)
    return 0.0


def write_results(out: Path, name: str, data: dict[str, Any], markdown: str) -> None:
    """``OUT/NAME.json`` and ``OUT/NAME.md`` (the markdown fragment RESULTS.md quotes)."""
    out.mkdir(parents=True, exist_ok=True)
    data["ldpfl_command_seconds_total"] = round(command_seconds(data), 1)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown)
    log(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")


def seed_stats(values) -> dict:
    """Sweeps: mean and standard error over seeds (None for one seed)."""
    v = np.asarray(values, dtype=np.float64)
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
    return {"mean": float(v.mean()), "se": se, "n": int(v.size)}


def verdict(stats: dict) -> str:
    """'seen' when the paired difference exceeds 2 standard errors, 'contradicted' below −2 s.e."""
    mean, se = stats["mean"], stats["se"]
    if se is None:
        return "one seed"
    if mean > 2 * se:
        return "seen"
    if mean < -2 * se:
        return "contradicted"
    return "not resolved"


def pyplot():
    """matplotlib with the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def experiment_header(name: str, args: argparse.Namespace, scale: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "experiment": name,
        "scale": args.scale,
        "scale_settings": dict(scale),
        "seed": args.seed,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
