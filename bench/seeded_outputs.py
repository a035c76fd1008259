"""Seeded outputs of every release mode and both engines, captured from one checkout and compared with another
(issue 33: "the seeded outputs ... are identical before and after, or each difference is listed and explained").

    .venv/bin/python bench/seeded_outputs.py capture --out /tmp/seeded/before --ldpfl /tmp/before-venv/bin/ldpfl
    .venv/bin/python bench/seeded_outputs.py capture --out /tmp/seeded/after
    .venv/bin/python bench/seeded_outputs.py compare /tmp/seeded/before /tmp/seeded/after

``capture`` runs a fixed matrix of small seeded runs through the CLI (one subprocess per command, run in DIR with
relative paths): stage-1 exports of every release point and mechanism family on mnist5k (2 clients, 1 epoch,
400 records), the ScatterNet and DP-SGD extractors, k-RR labels, re-releases from saved CNNs, a plan with two silos
and ``gather``; federations of 2 rounds on the local engine and on Flower's simulation engine (the default run,
DP-SGD over local-only files, a model perturbation), every update perturbation, robust aggregation and label-noise
correction on the local engine; ``predict``; ``inspect`` (text and --json) of every run directory; ``mechanisms
--json``. Each command's stdout, its ``warning:``/``Error:`` lines and its exit status are kept with its files
(96 commands; 7-14 min wall on the shared 2-core machine, 270 MB).

To capture another commit with the very same third-party packages (so that a difference can only come from the
code): ``git worktree add /tmp/before REV``; ``python3 -m venv /tmp/before-venv``; ``/tmp/before-venv/bin/pip
install --no-deps -e /tmp/before``; then a ``.pth`` file in its site-packages naming ``.venv``'s site-packages, and
``.venv/bin``'s console scripts copied with their first line pointing at the new interpreter (the Flower engine
starts ``flower-superlink`` from beside ``sys.executable``).

``compare A B`` compares two captures item by item: HDF5 files by their datasets (dtype, shape, storage filters,
values) and attributes, JSON files after dropping the keys of ``VOLATILE_KEYS``, ``.pt`` files by bytes and else by
their tensors, ``.keras`` archives member by member, ``.npz`` by arrays, PNG by pixels, text after replacing UTC
times; in every string, each capture's own directory, venv and checkout are replaced by a placeholder. It prints one
line per item and exits 1 when anything differs. Two captures of the same code compare equal (431 items, same).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SEED = "11"
EXPORT = ("--dataset", "mnist5k", "--clients", "2", "--epochs", "1", "--limit", "400")
QUICK = ("--seed", SEED, "--quiet", "--json")
FEDERATE = ("--rounds", "2", "--seed", SEED, "--quiet", "--json")
SMALL = ("--hidden", "64")
#: every mechanism --release flatten takes, each over the raw inputs (--extractor none: no CNN to train)
FLATTEN_MECHANISMS = ("fedaw-gaussian", "gaussian", "gaussian-wu", "ldpsign", "moue", "none", "oue", "pdpm", "rr",
                      "uer")
#: bounded mechanisms that --release flatten refuses: the refusal message is an output too
REFUSED_ON_FLATTEN = ("duchi", "hybrid", "laplace", "piecewise")

#: keys dropped from every JSON document (files, stdout, JSON strings in HDF5 attributes), with the reason
VOLATILE_KEYS: dict[str, str] = {
    "created_utc": "the wall-clock time a file was written",
    "updated_utc": "the wall-clock time a manifest was rewritten",
    "date_saved": "Keras metadata.json: the wall-clock time a model was saved",
    "shared_object_id": "Keras config.json: the id() (memory address) of an object that layers share",
    "seconds": "durations (a client's export, a round, a command)",
    "train_samples_per_s": "throughput of a client's CNN training",
    "sha256": ("a hash of a whole file: an HDF5 file's bytes embed created_utc; every hashed file (client files, "
               "partition.npz) is compared itself, dataset by dataset"),
}
#: files that are not compared, with the reason
IGNORED_FILES: dict[str, str] = {
    "capture.json": "what captured it: paths, commit, date (printed by compare as the header)",
    "logs/": "each command's full stderr: progress bars, TensorFlow/absl/Ray logging with PIDs and times; its "
             "'warning:' and 'Error:' lines are compared (out/*.messages.txt)",
}
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:\+00:00|Z)?")
CLEAN_ENVIRONMENT = ("KERAS_BACKEND", "LDPFL_KERAS_DEVICE", "KERAS_TORCH_DEVICE", "JAX_PLATFORMS", "XLA_FLAGS",
                     "LDPFL_DEBUG")


# ---------------------------------------------------------------------------------------------------------- matrix
def matrix() -> Iterator[tuple[str, tuple[str, ...]]]:
    """The fixed list of (step name, ldpfl arguments), in order; a later step may read an earlier one's files.

    Step names starting with ``copy:`` copy a run directory's files (not its federation) to a second run
    directory, so that a second federation of the same files sits at ``RUN_DIR/federation`` where inspect reads it.
    """
    yield "mechanisms", ("mechanisms", "--json")
    # stage 1: the CNN paths (mnist-cnn), one export per release point
    yield "export-uer-flatten", ("export", *EXPORT, *QUICK, "--save-models", "--keep-clean-test",
                                 "--out", "runs/uer-flatten")
    yield "export-bottleneck16-piecewise", ("export", *EXPORT, *QUICK, "--release", "bottleneck:16",
                                            "--mechanism", "piecewise", "--epsilon", "5",
                                            "--out", "runs/bottleneck16-piecewise")
    yield "export-scores-laplace", ("export", *EXPORT, *QUICK, "--release", "scores", "--mechanism", "laplace",
                                    "--epsilon", "2", "--out", "runs/scores-laplace")
    yield "export-label-krr", ("export", *EXPORT, *QUICK, "--release", "label", "--mechanism", "krr",
                               "--epsilon", "2", "--out", "runs/label-krr")
    # re-releases of the first export's records from its saved CNNs
    yield "export-from-models-scores-duchi", ("export", "--from-models", "runs/uer-flatten", *QUICK, "--release",
                                              "scores", "--mechanism", "duchi", "--epsilon", "2",
                                              "--out", "runs/from-models-scores-duchi")
    yield "export-from-models-scores-hybrid", ("export", "--from-models", "runs/uer-flatten", *QUICK, "--release",
                                               "scores", "--mechanism", "hybrid", "--epsilon", "4",
                                               "--out", "runs/from-models-scores-hybrid")
    yield "export-from-models-label-oue", ("export", "--from-models", "runs/uer-flatten", *QUICK, "--release",
                                           "label", "--mechanism", "oue-label", "--epsilon", "2",
                                           "--out", "runs/from-models-label-oue")
    # the DP-SGD extractor (jax-privacy) with k-RR labels: one client, 256 records, one epoch
    yield "export-dp-cnn-labels-krr", ("export", "--dataset", "mnist5k", "--clients", "1", "--epochs", "1",
                                       "--limit", "256", *QUICK, "--cnn-epsilon", "4", "--cnn-delta", "1e-5",
                                       "--label-epsilon", "2", "--out", "runs/dp-cnn-labels-krr")
    yield "export-scatter-local-only", ("export", *EXPORT, *QUICK, "--extractor", "scatter", "--local-only",
                                        "--out", "runs/scatter-local-only")
    # raw inputs: every flatten mechanism, k-RR labels, and the refusals of the bounded mechanisms
    for name in FLATTEN_MECHANISMS:
        extra = ("--param", "safe_range_length=2") if name == "pdpm" else ()
        yield f"export-none-{name}", ("export", "--dataset", "mnist5k", "--clients", "2", "--limit", "200",
                                      *QUICK, "--extractor", "none", "--mechanism", name, *extra,
                                      "--out", f"runs/none-{name}")
    yield "export-none-uer-labels-krr", ("export", "--dataset", "mnist5k", "--clients", "2", "--limit", "400",
                                         *QUICK, "--extractor", "none", "--label-epsilon", "2",
                                         "--out", "runs/none-uer-labels-krr")
    for name in REFUSED_ON_FLATTEN:
        yield f"export-none-{name}-refused", ("export", "--dataset", "mnist5k", "--clients", "2", "--limit", "200",
                                              *QUICK, "--extractor", "none", "--mechanism", name,
                                              "--out", f"runs/none-{name}")
    # cross-silo: a plan, two silos' own data (written by this script), gather
    yield "plan", ("plan", "--data", "silos/silo_0.npz", "--name", "synth", "--extractor", "none", "--mechanism",
                   "pdpm", "--param", "safe_range_length=4", "--epsilon", "2", "--label-epsilon", "1",
                   "--out", "silos/plan.json", "--json")
    for index in (0, 1):
        yield f"export-silo-{index}", ("export", "--plan", "silos/plan.json", "--data", f"silos/silo_{index}.npz",
                                       "--client-index", str(index), "--clients", "2", *QUICK,
                                       "--out", f"runs/silo-{index}")
    yield "gather", ("gather", "runs/silo-0", "runs/silo-1", "--out", "runs/gathered", "--json")
    # stage 2 on both engines: the default run, DP-SGD over local-only files, a model perturbation
    yield "copy:runs/uer-flatten:runs/uer-flatten-flower", ()
    yield "copy:runs/scatter-local-only:runs/scatter-local-only-flower", ()
    yield "federate-local-default", ("federate", "runs/uer-flatten", *FEDERATE)
    yield "federate-flower-default", ("federate", "runs/uer-flatten-flower", *FEDERATE, "--engine", "flower")
    dp_sgd = ("--dp-sgd", "--target-epsilon", "3")
    yield "federate-local-dp-sgd", ("federate", "runs/scatter-local-only", *FEDERATE, *dp_sgd)
    yield "federate-flower-dp-sgd", ("federate", "runs/scatter-local-only-flower", *FEDERATE, *dp_sgd,
                                     "--engine", "flower")
    wu = ("--perturbation", "gaussian-wu", "--aggregation", "weighted", "--client-epsilons", "1,10", *SMALL)
    yield "federate-local-gaussian-wu", ("federate", "runs/uer-flatten", *FEDERATE, *wu, "--eval-clean",
                                         "--out", "runs/fed-local-gaussian-wu")
    yield "federate-flower-gaussian-wu", ("federate", "runs/uer-flatten", *FEDERATE, *wu, "--eval-clean",
                                          "--engine", "flower", "--out", "runs/fed-flower-gaussian-wu")
    # stage 2, local engine: the other perturbations and strategies, label-noise correction, the gathered run
    yield "federate-local-pdpm-fraction", ("federate", "runs/none-pdpm", *FEDERATE, *SMALL, "--perturbation",
                                           "pdpm", "--aggregation", "fraction", "--fraction", "0.5",
                                           "--budget-preset", "pldp-tau1", "--client-epsilons", "pldp-eps2",
                                           "--out", "runs/fed-local-pdpm-fraction")
    yield "federate-local-ldpsign-probability", ("federate", "runs/none-uer", *FEDERATE, *SMALL, "--perturbation",
                                                 "ldpsign", "--aggregation", "probability",
                                                 "--out", "runs/fed-local-ldpsign-probability")
    yield "federate-local-fedaw", ("federate", "runs/none-uer", *FEDERATE, *SMALL, "--perturbation",
                                   "fedaw-gaussian", "--aggregation", "fedaw", "--delta", "1/n",
                                   "--out", "runs/fed-local-fedaw")
    # issue 42: a trimmed mean or a median over these runs' 2 clients acts on nobody and is refused; the robust
    # jobs use norm clipping, which acts on 2 clients (the refusals are tested in tests/hardening)
    yield "federate-local-gaussian-clipped", ("federate", "runs/none-uer", *FEDERATE, *SMALL, "--perturbation",
                                              "gaussian", "--aggregation", "norm-clipped", "--server-momentum",
                                              "0.5", "--out", "runs/fed-local-gaussian-clipped")
    yield "federate-local-clipped-sgd", ("federate", "runs/none-oue", *FEDERATE, *SMALL, "--aggregation",
                                         "norm-clipped", "--optimizer", "sgd", "--lr", "0.05", "--max-client-weight",
                                         "0.6", "--drop-per-round", "1", "--out", "runs/fed-local-clipped-sgd")
    yield "federate-local-labels-forward", ("federate", "runs/none-uer-labels-krr", *FEDERATE, *SMALL,
                                            "--label-noise-correction", "forward")
    yield "federate-local-labels-backward", ("federate", "runs/none-uer-labels-krr", *FEDERATE, *SMALL,
                                             "--label-noise-correction", "backward",
                                             "--out", "runs/fed-local-labels-backward")
    yield "federate-local-gathered", ("federate", "runs/gathered", *FEDERATE, "--hidden", "16")
    # predict through the silo's pipeline with the default federation's model
    model = ("--model", "runs/uer-flatten/federation/model.pt")
    yield "predict-clean", ("predict", "runs/uer-flatten", "--client-index", "0", *model, "--json", "--quiet")
    yield "predict-randomized", ("predict", "runs/uer-flatten", "--client-index", "1", *model, "--randomized",
                                 "--seed", SEED, "--json", "--quiet")
    yield "predict-released", ("predict", "--released", "runs/uer-flatten/client_000.h5", *model, "--json",
                               "--quiet")


def inspected_runs() -> list[str]:
    """Every run directory the matrix writes (federations at RUN_DIR/federation are read by inspect)."""
    runs = []
    for name, arguments in matrix():
        if arguments[:1] in (("export",), ("gather",)) and not name.endswith("-refused"):
            out = arguments[arguments.index("--out") + 1]
            if out not in runs:
                runs.append(out)
    return runs + ["runs/uer-flatten-flower", "runs/scatter-local-only-flower"]


def write_silos(directory: Path) -> None:
    """Two silos' own data (.npz, 8 features, 3 classes), from a fixed generator: the same bytes of data each run."""
    import numpy as np

    rng = np.random.default_rng(20261126)
    directory.mkdir(parents=True)
    for index, rows in enumerate((90, 70)):
        y = rng.integers(0, 3, size=rows)
        x = (rng.normal(size=(rows, 8)) + y[:, None]).astype(np.float32)
        np.savez(directory / f"silo_{index}.npz", x=x, y=y.astype(np.int64))


# --------------------------------------------------------------------------------------------------------- capture
def interpreter_of(executable: Path) -> str:
    first = executable.read_text(errors="replace").splitlines()[0]
    return first[2:].strip() if first.startswith("#!") else sys.executable


def describe(executable: Path) -> dict[str, Any]:
    """Which code the executable runs: its interpreter, package root, commit and whether the tree is dirty."""
    python = interpreter_of(executable)
    root = subprocess.run([python, "-c", "import ldpfl, pathlib; print(pathlib.Path(ldpfl.__file__).resolve()"
                           ".parents[1])"], capture_output=True, text=True, check=True).stdout.strip()
    git = ["git", "-C", root]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.splitlines()
    return {"ldpfl": str(executable), "python": python, "package_root": root, "head": head,
            "modified_tracked_files": dirty, "venv": str(Path(python).parent.parent)}


def message_lines(stderr: str) -> str:
    keep = [line for line in stderr.splitlines() if line.startswith(("warning:", "Error:"))]
    return "".join(f"{line}\n" for line in keep)


def capture(out: Path, executable: Path) -> int:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty: capture into a fresh directory")
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    meta = describe(executable)
    meta.update(capture_dir=str(out), started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    meta.update(finished_utc=None, seconds=None)
    (out / "capture.json").write_text(json.dumps(meta, indent=1) + "\n")
    env = {key: value for key, value in os.environ.items() if key not in CLEAN_ENVIRONMENT}
    write_silos(out / "silos")
    (out / "out").mkdir()
    (out / "logs").mkdir()
    steps = []
    plan = list(matrix()) + [(f"inspect-{kind}-{run.removeprefix('runs/')}", ("inspect", run, *flags))
                             for run in inspected_runs() for kind, flags in (("json", ("--json",)), ("text", ()))]
    start_all = time.perf_counter()
    for name, arguments in plan:
        if name.startswith("copy:"):
            _, source, target = name.split(":")
            shutil.copytree(out / source, out / target, ignore=shutil.ignore_patterns("federation", "*.lock"))
            continue
        start = time.perf_counter()
        done = subprocess.run([str(executable), *arguments], cwd=out, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        suffix = ".json" if "--json" in arguments else ".txt"
        (out / "out" / f"{name}.stdout{suffix}").write_text(done.stdout)
        (out / "out" / f"{name}.messages.txt").write_text(message_lines(done.stderr))
        (out / "logs" / f"{name}.stderr").write_text(done.stderr)
        steps.append({"name": name, "arguments": list(arguments), "exit_code": done.returncode,
                      "seconds": round(seconds, 1)})
        print(f"{name:45s} exit {done.returncode}  {seconds:6.1f} s", flush=True)
    end = describe(executable)
    meta.update(seconds=round(time.perf_counter() - start_all, 1),
                finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                code_changed_during_capture=(end["head"], end["modified_tracked_files"]) != (
                    meta["head"], meta["modified_tracked_files"]))
    (out / "steps.json").write_text(json.dumps(steps, indent=1) + "\n")
    (out / "capture.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{len(steps)} commands in {meta['seconds']} s into {out}")
    return 0


# --------------------------------------------------------------------------------------------------------- compare
class Normalizer:
    """Replaces what locates a capture (its directory, the code's checkout and venv) in strings, and UTC times in
    text outputs (JSON drops its time keys instead: ``VOLATILE_KEYS``)."""

    def __init__(self, meta: dict[str, Any]):
        pairs = [(meta.get("capture_dir"), "<CAPTURE>"), (meta.get("venv"), "<VENV>"),
                 (meta.get("package_root"), "<PACKAGE>")]
        self.pairs = sorted(((p, r) for p, r in pairs if p), key=lambda pair: -len(pair[0]))

    def paths(self, value: str) -> str:
        for prefix, replacement in self.pairs:
            value = value.replace(prefix, replacement)
        return value

    def text(self, value: str) -> str:
        return ISO_UTC.sub("<UTC>", self.paths(value))

    def json(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.json(v) for k, v in value.items() if k not in VOLATILE_KEYS}
        if isinstance(value, list | tuple):
            return [self.json(v) for v in value]
        if isinstance(value, str):
            stripped = value.strip()
            if stripped[:1] in "{[" and stripped[-1:] in "}]":
                try:
                    return {"<json>": self.json(json.loads(stripped))}
                except ValueError:
                    pass
            return self.paths(value)
        return value


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths at which two normalized JSON values differ (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}/{key}"
            if key not in a or key not in b:
                found.append(f"{where} only in {'B' if key not in a else 'A'}")
            else:
                found += json_differences(a[key], b[key], where)
        return found
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path} length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in json_differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    if type(a) is not type(b) or a != b:
        return [f"{path}: {short(a)} vs {short(b)}"]
    return []


def summary(found: list[str], limit: int = 4) -> str:
    more = f" (+{len(found) - limit} more)" if len(found) > limit else ""
    return "; ".join(found[:limit]) + more


def array_difference(a: Any, b: Any) -> str | None:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    numeric = a.dtype.kind in "fc"
    if np.array_equal(a, b, equal_nan=numeric):
        return None
    if a.dtype.kind in "iufcb":
        unequal = a != b
        if numeric:
            unequal &= ~(np.isnan(a) & np.isnan(b))
        detail = f"{int(unequal.sum())} of {a.size} values differ"
        if a.dtype.kind in "fc" or a.dtype.kind in "iu":
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))[unequal]
            detail += f", max |a-b| {float(gap.max()):.3g}"
        return detail
    return "values differ"


def attribute_value(value: Any, normalize: Normalizer) -> Any:
    import numpy as np

    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return normalize.json(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return normalize.json([v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel().tolist()])
    return value


def h5_objects(handle: Any) -> dict[str, Any]:
    import h5py

    found = {"/": handle}
    handle.visititems(lambda name, obj: found.__setitem__("/" + name, obj))
    return {k: v for k, v in found.items() if isinstance(v, h5py.Group | h5py.Dataset)}


def h5_differences(file_a: Any, file_b: Any, norm_a: Normalizer, norm_b: Normalizer) -> list[str]:
    """Every dataset (dtype, shape, storage filters, values) and attribute of two HDF5 files."""
    import h5py

    found: list[str] = []
    with h5py.File(file_a, "r") as a, h5py.File(file_b, "r") as b:
        objects_a, objects_b = h5_objects(a), h5_objects(b)
        for name in sorted(set(objects_a) | set(objects_b)):
            if name not in objects_a or name not in objects_b:
                found.append(f"{name} only in {'B' if name not in objects_a else 'A'}")
                continue
            x, y = objects_a[name], objects_b[name]
            for key in sorted(set(x.attrs) | set(y.attrs)):
                if key in VOLATILE_KEYS:
                    continue
                if key not in x.attrs or key not in y.attrs:
                    found.append(f"{name}@{key} only in {'B' if key not in x.attrs else 'A'}")
                    continue
                u, v = attribute_value(x.attrs[key], norm_a), attribute_value(y.attrs[key], norm_b)
                if isinstance(u, dict | list | str) or isinstance(v, dict | list | str):
                    found += [f"{name}@{key}{d}" for d in json_differences(u, v)]
                else:
                    detail = array_difference(u, v)
                    if detail:
                        found.append(f"{name}@{key}: {detail}")
            if isinstance(x, h5py.Dataset) != isinstance(y, h5py.Dataset):
                found.append(f"{name}: a group in one file, a dataset in the other")
            elif isinstance(x, h5py.Dataset):
                for prop in ("chunks", "compression", "compression_opts", "shuffle", "fletcher32", "maxshape"):
                    if getattr(x, prop) != getattr(y, prop):
                        found.append(f"{name}.{prop}: {getattr(x, prop)} vs {getattr(y, prop)}")
                detail = array_difference(x[()], y[()])
                if detail:
                    found.append(f"{name}: {detail}")
    return found


def torch_differences(a: Any, b: Any, norm_a: Normalizer, norm_b: Normalizer, path: str = "") -> list[str]:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
        if torch.equal(a, b) or (a.is_floating_point() and bool(torch.equal(a.isnan(), b.isnan()))
                                 and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))):
            return []
        return [f"{path}: {array_difference(a.detach().cpu().numpy(), b.detach().cpu().numpy())}"]
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        detail = array_difference(a, b)
        return [f"{path}: {detail}"] if detail else []
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            if key in VOLATILE_KEYS:
                continue
            if key not in a or key not in b:
                found.append(f"{path}/{key} only in {'B' if key not in a else 'A'}")
            else:
                found += torch_differences(a[key], b[key], norm_a, norm_b, f"{path}/{key}")
        return found
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path} length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in torch_differences(x, y, norm_a, norm_b, f"{path}[{i}]")]
    return json_differences(norm_a.json(a), norm_b.json(b), path)


def load_torch(path: Path) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)  # our own capture's files


def png_difference(a: Path, b: Path) -> str | None:
    from matplotlib import image

    return array_difference(image.imread(a), image.imread(b))


def keras_differences(a: Path, b: Path, norm_a: Normalizer, norm_b: Normalizer) -> list[str]:
    found = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names_a, names_b = set(za.namelist()), set(zb.namelist())
        found += [f"{n} only in {'A' if n in names_a else 'B'}" for n in sorted(names_a ^ names_b)]
        for member in sorted(names_a & names_b):
            x, y = za.read(member), zb.read(member)
            if x == y:
                continue
            if member.endswith(".h5"):
                found += [f"{member}:{d}" for d in h5_differences(io.BytesIO(x), io.BytesIO(y), norm_a, norm_b)]
            elif member.endswith(".json"):
                found += [f"{member}{d}" for d in json_differences(norm_a.json(json.loads(x)),
                                                                    norm_b.json(json.loads(y)))]
            else:
                found.append(f"{member}: bytes differ")
    return found


def npz_differences(a: Path, b: Path) -> list[str]:
    import numpy as np

    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        found = [f"{k} only in {'A' if k in x.files else 'B'}" for k in sorted(set(x.files) ^ set(y.files))]
        for key in sorted(set(x.files) & set(y.files)):
            detail = array_difference(x[key], y[key])
            if detail:
                found.append(f"{key}: {detail}")
    return found


def text_differences(a: str, b: str) -> list[str]:
    lines_a, lines_b = a.splitlines(), b.splitlines()
    found = [f"line {i + 1}: {short(x)} vs {short(y)}" for i, (x, y) in enumerate(zip(lines_a, lines_b, strict=False))
             if x != y]
    if len(lines_a) != len(lines_b):
        found.append(f"{len(lines_a)} vs {len(lines_b)} lines")
    return found


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def compare_file(relative: str, a: Path, b: Path, norm_a: Normalizer, norm_b: Normalizer) -> list[str]:
    """The differences between two versions of one captured file (empty: the same)."""
    suffix = a.suffix
    if a.read_bytes() == b.read_bytes():
        return []
    if suffix in (".h5", ".hdf5"):
        return h5_differences(a, b, norm_a, norm_b)
    if suffix == ".json" or relative.endswith(".stdout.json"):
        x, y = parse_json(a.read_text()), parse_json(b.read_text())
        if x is not None and y is not None:
            return json_differences(norm_a.json(x), norm_b.json(y))
        return text_differences(norm_a.text(a.read_text()), norm_b.text(b.read_text()))
    if suffix in (".txt", ".csv", ".md"):
        return text_differences(norm_a.text(a.read_text()), norm_b.text(b.read_text()))
    if suffix == ".pt":
        return torch_differences(load_torch(a), load_torch(b), norm_a, norm_b)
    if suffix == ".keras":
        return keras_differences(a, b, norm_a, norm_b)
    if suffix == ".npz":
        return npz_differences(a, b)
    if suffix == ".png":
        detail = png_difference(a, b)
        return [f"pixels: {detail}"] if detail else []
    return ["bytes differ"]


def captured_files(root: Path) -> set[str]:
    files = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not any(relative == p or relative.startswith(p) for p in IGNORED_FILES if p):
            files.add(relative)
    return files


def compare(a: Path, b: Path) -> int:
    meta_a, meta_b = (json.loads((root / "capture.json").read_text()) for root in (a, b))
    for label, meta in (("A", meta_a), ("B", meta_b)):
        dirty = f", {len(meta['modified_tracked_files'])} modified tracked files" if meta["modified_tracked_files"] \
            else ""
        unfinished = "" if meta.get("seconds") is not None else ", UNFINISHED"
        unfinished += ", THE CODE CHANGED DURING THE CAPTURE" if meta.get("code_changed_during_capture") else ""
        print(f"{label}: {meta['capture_dir']}  ({meta['ldpfl']}, HEAD {meta['head'][:10]}{dirty}, "
              f"{meta['started_utc']}{unfinished})")
    print("ignored keys: " + "; ".join(f"{k} ({v})" for k, v in VOLATILE_KEYS.items()))
    print("ignored files: " + "; ".join(f"{k} ({v})" for k, v in IGNORED_FILES.items()))
    print("normalized in strings: each capture's own directory, venv and package checkout; in text outputs "
          "(inspect's table, metrics.csv), ISO UTC times. JSON key order is not compared.")
    norm_a, norm_b = Normalizer(meta_a), Normalizer(meta_b)
    files_a, files_b = captured_files(a), captured_files(b)
    same = different = 0
    for relative in sorted(files_a | files_b):
        if relative not in files_a or relative not in files_b:
            found = [f"only in {'A' if relative in files_a else 'B'}"]
        else:
            try:
                found = compare_file(relative, a / relative, b / relative, norm_a, norm_b)
            except Exception as error:  # a file one side cannot read is a difference, not a crash
                found = [f"could not compare: {type(error).__name__}: {error}"]
        if found:
            different += 1
            print(f"{relative}: DIFFERENT: {summary(found)}")
        else:
            same += 1
            print(f"{relative}: same")
    print(f"{same + different} items: {same} same, {different} different")
    return 1 if different else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("capture", help="run the seeded matrix into a fresh directory")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--ldpfl", type=Path, default=Path(sys.executable).with_name("ldpfl"),
                     help="the ldpfl executable whose code is captured (default: this interpreter's)")
    check = commands.add_parser("compare", help="compare two captures, item by item")
    check.add_argument("a", type=Path)
    check.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "capture":
        sys.exit(capture(args.out, args.ldpfl.absolute()))
    sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
