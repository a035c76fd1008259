"""``ldpfl export --from-models RUN_DIR``: release the records of an earlier run again, from its saved CNNs.

Training the client CNNs is the slow part of stage 1 (issue 15); experiments release the same records
with several mechanisms. With ``from_models`` the export reuses, from the source run directory:

* each client's trained CNN ``client_NNN.keras`` (written by ``--save-models``; when the source is itself
  a re-release, the CNNs of the run it came from, its ``from_models``);
* the partition ``partition.npz`` (which records each client holds) and each client's hold-out split
  (IV-C): stored in ``partition.npz`` by this version (``client_NNN_test``), or, for a run exported
  before, redrawn from the same client stream, which needs the source run's ``--seed``; the redrawn
  split is checked row by row against the labels of the source's client files;
* the data settings (dataset, clients, partition, extractor, training) from its manifest.

**A second release spends the records' privacy again.** The new run's manifest records every release of
each client's records (``ldpfl.contract.release_history``: the source's history, then this release) and the
export warns with the total per-record ε (basic composition: the sum). The source directory is only read,
so two re-releases made side by side from the same source do not see each other: release again from the
newest run (``--from-models NEWEST``, whose CNNs are found through its own ``from_models``) so that each
history carries every earlier release.

Release streams: release n of client i (n = 1 for the run that trained the CNN) draws from the child
``(i, 1 + n)`` of the root seed sequence, so even a re-release with the source's seed does not repeat the
first release's draws (children ``(i, 0)``, ``(i, 1)`` are the hold-out and training streams).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.label_release import CLEAR_LABELS
from ldpfl.contract.layout import MANIFEST_NAME, PARTITION_FILE, client_file_name
from ldpfl.contract.manifest import FileRecord, read_manifest
from ldpfl.contract.release_history import ReleaseEntry, history_from_manifest, total_epsilon
from ldpfl.contract.release_point import BOTTLENECK, FLATTEN, parse_release
from ldpfl.contract.schema import FormatError
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.stored import load_holdouts, load_partition, model_file_name
from ldpfl.stage1_features.export.worker import client_holdout
from ldpfl.stage1_features.models.dp_training import non_private_training

if TYPE_CHECKING:  # the plan reads the source run: it imports this module
    from ldpfl.stage1_features.export.plan import ExportPlan

SOURCE_SETTINGS = ("dataset", "clients", "max_clients", "partition", "beta", "unb", "shards_per_client",
                   "test_fraction", "extractor", "epochs", "batch_size", "augment", "limit")
"""ExportConfig fields taken from the source run (a given value must agree with it; ``data_dir`` may differ)."""

TOOL = "ldpfl export"


@dataclass(frozen=True)
class SourceRun:
    """What an earlier export offers for a re-release: its settings, files, models and release history."""

    run_dir: Path
    info: Mapping[str, Any]
    files: dict[int, FileRecord]
    history: dict[int, list[ReleaseEntry]]
    release: str  # the release the source's CNNs were trained for ("bottleneck:K" puts that layer in them)
    models_dir: Path | None = None  # where the CNNs are: run_dir, or the run a re-release took them from

    @property
    def config(self) -> Mapping[str, Any]:
        """Return the source's export settings (``config`` of its manifest)."""
        config = self.info.get("config")
        return config if isinstance(config, Mapping) else {}

    def model_path(self, index: int) -> Path:
        """Return client ``index``'s saved CNN."""
        return (self.models_dir or self.run_dir) / model_file_name(index)

    def file_path(self, index: int) -> Path:
        """Return client ``index``'s client file in the source run."""
        record = self.files.get(index)
        return self.run_dir / (record.path if record is not None else client_file_name(index))

    def training_record(self, index: int) -> dict[str, Any]:
        """Return how client ``index``'s CNN was trained: the source file's ``extractor_training``.

        A file without it (schema < 4) predates DP-SGD training: its CNN was trained without DP.
        """
        path = self.file_path(index)
        try:
            with open_client_file(path) as (_handle, meta, rows):
                record = meta.extractor_training
                return dict(record) if record is not None else non_private_training(rows["train"])
        except (FormatError, OSError) as error:
            raise ExportError(f"`from_models`: cannot read the training record of {path} ({error})") from None

    def total_epsilon(self, index: int) -> float | None:
        """Return the per-record ε of client ``index``'s releases so far (basic composition)."""
        return total_epsilon(self.history.get(index, []))


def read_source_run(path: str | Path) -> SourceRun:
    """Read an earlier export's manifest, leniently (any schema version this code reads; only reads).

    Raises
    ------
    ExportError
        Not an ``ldpfl export`` run directory, or a malformed release history.
    """
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise ExportError(f"`from_models`: {run_dir} is not a directory")
    try:
        manifest = read_manifest(run_dir)
    except FormatError as error:
        raise ExportError(f"`from_models`: {error}") from None
    info = manifest.info
    if info.get("tool") != TOOL:
        raise ExportError(f"`from_models`: {run_dir / MANIFEST_NAME} was not written by {TOOL}")
    config: Mapping[str, Any] = info["config"] if isinstance(info.get("config"), Mapping) else {}
    try:
        history = history_from_manifest(info, manifest.files, str(run_dir.resolve()))
        release = str(parse_release(str(config.get("release", FLATTEN))))
    except ValueError as error:
        raise ExportError(f"`from_models`: {run_dir / MANIFEST_NAME}: {error}") from None
    models_dir = run_dir
    if isinstance(info.get("from_models"), str):  # a re-release: its CNNs are those of the run it came from
        origin = read_source_run(info["from_models"])
        models_dir, release = origin.models_dir or origin.run_dir, origin.release
    return SourceRun(run_dir, info, {r.client_index: r for r in manifest.files}, history, release, models_dir)


def source_conflicts(source: SourceRun, given: Mapping[str, Any]) -> list[str]:
    """Return the settings in ``given`` that contradict the source's (``SOURCE_SETTINGS`` only)."""
    problems = []
    for key in SOURCE_SETTINGS:
        if key == "extractor" and given.get(key) == source.info.get("extractor"):
            continue  # the name "auto" resolved to
        if key in given and key in source.config and given[key] != source.config[key]:
            problems.append(f"{key} is {source.config[key]!r} there, {given[key]!r} here")
    return problems


def adopt_source_settings(config: ExportConfig, source: SourceRun) -> ExportConfig:
    """Return ``config`` with the source's data settings (``SOURCE_SETTINGS``, and ``data_dir`` if unset).

    A setting of ``config`` that differs from both ExportConfig's default and the source's value is
    refused (``ExportError``): the records must be the source's.
    """
    import dataclasses

    defaults = ExportConfig()
    given = {k: getattr(config, k) for k in SOURCE_SETTINGS if getattr(config, k) != getattr(defaults, k)}
    problems = source_conflicts(source, given)
    if problems:
        raise ExportError(f"`from_models` {source.run_dir} releases that run's records, so its settings apply: "
                          f"{'; '.join(problems)}; leave these options out")
    missing = [k for k in SOURCE_SETTINGS if k not in source.config]
    if missing:
        raise ExportError(f"`from_models`: the manifest of {source.run_dir} lacks the settings {', '.join(missing)}")
    if config.save_models:
        raise ExportError("`from_models` reuses the CNNs of the source run; `save_models` has nothing to save")
    changes = {k: source.config[k] for k in SOURCE_SETTINGS}
    changes["from_models"] = str(source.run_dir.resolve())  # one spelling, for the resume fingerprint
    if config.data_dir is None:
        changes["data_dir"] = source.config.get("data_dir")
    if source.info.get("extractor") is not None:
        changes["extractor"] = source.info["extractor"]  # resolved ("auto" became the paper's CNN)
    return dataclasses.replace(config, **changes)


def check_release_fits(source: SourceRun, release: str) -> None:
    """Refuse ``bottleneck:K`` from CNNs without that layer, or with another K (``ExportError``)."""
    wanted = parse_release(release)
    if wanted.kind != BOTTLENECK:
        return  # flatten, scores and label exist in every client CNN
    have = parse_release(source.release)
    if have.kind != BOTTLENECK:
        raise ExportError(f"`release` {release} needs CNNs trained with that bottleneck layer; the CNNs of "
                          f"{source.run_dir} were trained for release {source.release} (no bottleneck layer)")
    if have.units != wanted.units:
        raise ExportError(f"`release` {release} needs a {wanted.units}-unit bottleneck; the CNNs of "
                          f"{source.run_dir} have {have.units} units (release {source.release})")


def check_models(source: SourceRun, clients: list[int]) -> None:
    """Refuse a source without a saved CNN or a listed file for one of ``clients`` (``ExportError``)."""
    missing = [source.model_path(i).name for i in clients if not source.model_path(i).is_file()]
    if missing:
        raise ExportError(f"`from_models` {source.run_dir} has no saved CNN {', '.join(missing[:3])}"
                          f"{' ...' if len(missing) > 3 else ''} (export it with `save_models`, and let it finish)")
    unlisted = [i for i in clients if i not in source.files]
    if unlisted:
        raise ExportError(f"`from_models`: the manifest of {source.run_dir} lists no file of client(s) "
                          f"{', '.join(map(str, unlisted[:5]))}: that export is not finished")


def source_labels(source: SourceRun, index: int) -> tuple[dict[str, np.ndarray], bool]:
    """Return client ``index``'s labels per split in the source file, in row order, and whether they are clear.

    Labels released by k-RR (``label_release``) are randomized: only their number per split can be compared.
    """
    path = source.file_path(index)
    try:
        with open_client_file(path) as (handle, meta, _rows):
            labels = {split: np.asarray(handle[split]["labels"][()], dtype=np.int64) for split in ("train", "test")}
            return labels, (meta.label_release or CLEAR_LABELS).clear
    except (FormatError, OSError, ValueError) as error:
        raise ExportError(f"`from_models`: cannot read the labels of {path} ({error})") from None


def check_holdout(source: SourceRun, index: int, train: np.ndarray, test: np.ndarray, y: np.ndarray,
                  *, redrawn: bool) -> None:
    """Refuse a hold-out split whose labels, row by row, are not those of the source's client file.

    Where the source released its labels by k-RR, the rows per split must match (the stored partition's
    SHA-256 is checked against the manifest before this).
    """
    labels, clear = source_labels(source, index)
    if not clear and len(labels["train"]) == len(train) and len(labels["test"]) == len(test) and not redrawn:
        return
    if np.array_equal(labels["train"], y[train]) and np.array_equal(labels["test"], y[test]):
        return
    if redrawn:
        raise ExportError(f"`from_models`: {source.run_dir} was exported before hold-out splits were stored in "
                          f"{PARTITION_FILE}, and this run's `seed` does not redraw client {index}'s split (its "
                          f"labels differ from {source.file_path(index).name}); pass the `seed` of that run")
    raise ExportError(f"`from_models`: the hold-out split of client {index} stored in {PARTITION_FILE} does not "
                      f"match the labels of {source.file_path(index).name}")


def source_partition(source: SourceRun, plan: Any) -> tuple[list[np.ndarray], dict[str, Any],
                                                           list[tuple[np.ndarray, np.ndarray]]]:
    """Return the source's partition, its description and every client's hold-out split, checked.

    The split is the one stored in the source's ``partition.npz``, or (older runs) redrawn from this run's
    client streams, which reproduce it only with the source's seed; either way each client's labels must
    equal, row by row, those of its file in the source run.
    """
    config = plan.config
    partition_file = source.info.get("partition_file")
    sha = partition_file.get("sha256") if isinstance(partition_file, Mapping) else None
    try:
        clients = load_partition(source.run_dir, config.clients, len(plan.dataset), sha)
        holdouts = load_holdouts(source.run_dir, config.clients)
    except ExportError as error:
        raise ExportError(f"`from_models`: {str(error).split('; start over')[0]}") from None
    redrawn = holdouts is None
    if redrawn:
        if source.info.get("randomness") != "seeded":
            raise ExportError(f"`from_models`: {source.run_dir} was exported from the OS CSPRNG before hold-out "
                              f"splits were stored in {PARTITION_FILE}: its clients' test splits cannot be recovered")
        streams = plan.randomness.child_sequences(config.clients)
        holdouts = [client_holdout(clients[i], config.test_fraction, streams[i], plan.randomness.mode)
                    for i in range(config.clients)]
    assert holdouts is not None
    for i in config.exported_clients():
        check_holdout(source, i, holdouts[i][0], holdouts[i][1], plan.dataset.y, redrawn=redrawn)
    described = source.info.get("partition")
    return clients, dict(described) if isinstance(described, Mapping) else {}, holdouts


def rerelease_warning(source: SourceRun, plan: ExportPlan) -> str:
    """Return the warning of a re-release: how often the records were released, and the total ε per record."""
    this = plan.privacy.exact_epsilon_per_record
    totals = [] if this is None else [t + this for i in plan.config.exported_clients()
                                      if (t := source.total_epsilon(i)) is not None]
    before = max((len(source.history.get(i, ())) for i in plan.config.exported_clients()), default=1)
    total = "unknown (a release without an exact epsilon)" if not totals else f"{max(totals):.6g}"
    return (f"these records were released {before} time(s) before (from {source.run_dir}); releasing them again "
            f"spends their privacy again: total exact epsilon per record across {before + 1} releases = {total} "
            "(basic composition: the sum; see `ldpfl inspect` of this run)")
