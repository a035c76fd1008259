"""``--release stats:K`` in stage 1 (issue 40): one silo's one release of noisy sufficient statistics.

The client's training records go through the weight-free extractor (``scatter``, or the columns of a table
under ``none``) a batch at a time; each batch is projected on the plan's K public directions
(``sufficient_statistics.projection`` at the plan's ``projection_key``), clipped to C and summed into the
per-class sums and counts (they add across batches). With moments about the class means (the default), the
``gaussian-stats`` mechanism releases the sums and counts first, then the second moments of the residuals about
the silo's own noisy class means, which needs the records a second time: the projected records wait in a
temporary file on the silo's machine (n × K float64, deleted when the release is done), so the extractor runs
once and memory holds a batch and K² numbers. With moments about the origin the moments are summed in the first
pass. All noise comes from the client's release stream (the CSPRNG unless seeded), then the public key of the
synthetic records is drawn. The file then holds:

* ``/train``: the synthetic records and their labels (round(noisy N_c) rows of class c), drawn from the
  release's class-conditional Gaussian (``statistics_model``), a function of the statistics and the key;
* ``/test``: no rows (a test record would be released per record); ``keep_clean_test`` keeps the clean test
  records, projected and clipped the same way, in the local-only ``client_NNN.local.h5``;
* ``/released_statistics``: the noisy statistics and the key (``contract.released_statistics``).

Only the statistics depend on the records, so the file's guarantee is the release's (labels included: the
statistics are per class); the synthetic records, and anything computed from the file, are post-processing.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.client_writer import ClientFileWriter
from ldpfl.contract.label_release import SYNTHETIC_LABELS
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import FileRecord, record_for
from ldpfl.contract.release_guarantee import file_guarantee
from ldpfl.contract.release_point import STATS, ReleasePoint
from ldpfl.contract.schema import ClientMetadata, label_histogram
from ldpfl.contract.version import package_version
from ldpfl.mechanisms import sufficient_statistics
from ldpfl.mechanisms.gaussian_statistics import GaussianStatistics
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.release import stored_layout
from ldpfl.stage1_features.export.worker_guard import require_parent

Batches = Callable[[str, Mapping[str, np.ndarray]], Iterator[tuple[np.ndarray, np.ndarray]]]
RESIDUAL_ROWS = 8192
"""Records read back at a time for the second moments about the class means."""
EMPTY_CLASS_NOTE = ("client {client}: class(es) {classes} have no training records; what is released for each is "
                    "noise alone (its sums, count and second-moment share), and its synthetic records (round of "
                    "the noisy count, usually 0) carry no information about it")


def is_statistics_release(point: ReleasePoint) -> bool:
    """Return whether ``point`` is a ``stats:K`` release."""
    return point.kind == STATS


def statistics_mechanism(spec: Any) -> GaussianStatistics:
    """Return the plan's ``gaussian-stats`` mechanism (the plan resolved it with K)."""
    mechanism = spec.build()
    if not isinstance(mechanism, GaussianStatistics):
        raise ExportError(f"`release` stats:K takes `mechanism` gaussian-stats, got {spec.name!r}")
    return mechanism


def check_clients(spec: Any, labels: np.ndarray, train_rows: Mapping[int, np.ndarray], classes: int) -> list[str]:
    """Refuse a δ of 1/n or more for any exported client's n training records; return notes on empty classes.

    δ ≥ 1/n allows a mechanism that publishes one record in clear with probability δ (Dwork & Roth 2014,
    section 2.3): refused, naming the client and the bound. A class with no records in a client is allowed
    (Dirichlet and shard silos lack classes); the note says what its release is.
    """
    mechanism = statistics_mechanism(spec)
    notes = []
    for client, rows in train_rows.items():
        if len(rows) == 0 or mechanism.delta >= 1.0 / len(rows):
            raise ExportError(f"`delta` {mechanism.delta:g} is not below 1/n for client {client}'s n = {len(rows)} "
                              f"training records: choose delta < {1.0 / max(len(rows), 1):.3g} (--delta)")
        present = np.bincount(np.asarray(labels[rows], dtype=np.int64), minlength=classes)
        empty = [str(c) for c in np.flatnonzero(present[:classes] == 0)]
        if empty:
            notes.append(EMPTY_CLASS_NOTE.format(client=client, classes=", ".join(empty)))
    return notes


def projected_batches(batches: Iterator[tuple[np.ndarray, np.ndarray]], width: int, key: int
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield each batch's records projected on the plan's ``width`` public directions (float64) and its labels."""
    basis: np.ndarray | None = None
    for values, labels in batches:
        if basis is None:
            if values.shape[1] < width:
                raise ExportError(f"`release` stats:{width} projects to more values than the extractor's "
                                  f"{values.shape[1]}: choose K <= {values.shape[1]}")
            basis = sufficient_statistics.projection(int(values.shape[1]), width, key)
        if not np.all(np.isfinite(values)):
            raise ExportError("the extractor gave a non-finite value: the records cannot be clipped")
        yield np.asarray(values, dtype=np.float64) @ basis, labels


def export_statistics(task: Any, dataset: Any, splits: Mapping[str, np.ndarray], labels: Mapping[str, np.ndarray],
                      batches: Batches, release_rng: np.random.Generator, training_record: Mapping[str, Any],
                      *, write_clean_test: Callable[..., FileRecord], progress_bar: Callable[..., Any]
                      ) -> tuple[FileRecord, FileRecord | None]:
    """Release one client's statistics once and write its file (module docstring).

    Returns the client file's manifest record and, with ``keep_clean_test``, the local-only file's.
    """
    spec = task.spec()
    mechanism = statistics_mechanism(spec)
    point = ReleasePoint(STATS, spec.features)
    width = int(spec.features)
    classes = int(dataset.num_classes)
    bar = progress_bar(total=len(splits["train"]), desc=f"client {task.index} statistics", unit="row", leave=False,
                       position=task.position, disable=not task.progress)
    with bar, tempfile.TemporaryDirectory(prefix="ldpfl-stats-") as scratch:
        records = np.lib.format.open_memmap(Path(scratch) / "projected.npy", mode="w+", dtype=np.float64,
                                            shape=(len(splits["train"]), width)) if mechanism.centered else None
        record_labels = np.empty(len(splits["train"]), dtype=np.int64)
        clean = sufficient_statistics.Statistics(np.zeros((classes, width)), np.zeros(classes),
                                                 np.zeros((width, width)))
        offset = 0
        for z, y in projected_batches(batches("train", labels), width, mechanism.projection_key):
            if records is None:  # about the origin: the second moments add up in this pass
                clean = clean + mechanism.clean_statistics(z, y, classes)
            else:
                on_clip = mechanism.clipped(z)
                records[offset:offset + len(y)] = on_clip
                record_labels[offset:offset + len(y)] = y
                clean = clean + sufficient_statistics.statistics(on_clip, y, classes, moments=False)
            offset += len(y)
            bar.update(len(y))
        if records is None:
            released = mechanism.release(clean, rng=release_rng)  # the one release: the rest is post-processing
        else:
            first = mechanism.release_first(clean, rng=release_rng)  # (a) sums and counts, then (b) about their means
            moments = np.zeros((width, width))
            for start in range(0, offset, RESIDUAL_ROWS):
                stop = min(start + RESIDUAL_ROWS, offset)
                moments += mechanism.residual_moments(records[start:stop], record_labels[start:stop], first)
            released = mechanism.release_second(first, moments, rng=release_rng)
            del records
    rows, synthetic_labels = mechanism.synthetic(released)
    layout = stored_layout(point, spec)
    row_counts = {"train": len(rows), "test": 0}
    input_shape = tuple(dataset.input_shape)
    metadata = ClientMetadata(
        dataset=dataset.name, num_classes=classes, client_index=task.index, client_count=task.client_count,
        partition=dict(task.partition), extractor=task.extractor, input_shape=input_shape,
        integer_bits=0, fraction_bits=0, features=width, feature_format=layout.feature_format,
        mechanism=spec.name, mechanism_parameters=layout.mechanism_parameters, privacy_report=task.privacy,
        randomness=task.randomness, generator=task.privacy.generator,
        label_histograms={"train": label_histogram(synthetic_labels, classes), "test": [0] * classes},
        local_accuracy=None, package_version=package_version(), class_names=getattr(dataset, "class_names", None),
        plan_fingerprint=task.plan_fingerprint, release=str(point), label_release=SYNTHETIC_LABELS,
        extractor_training=dict(training_record), local_only=False)
    guarantee = file_guarantee(metadata, records=len(splits["train"]), history=task.prior_releases, diagnostic=False)
    metadata = dataclasses.replace(metadata, release_guarantee=guarantee)
    local_record = None
    if task.keep_clean_test:  # the silo's own clean test records in the release's space: never shared
        clipped = ((mechanism.clipped(z).astype(np.float32), y)
                   for z, y in projected_batches(batches("test", labels), width, mechanism.projection_key))
        local = dataclasses.replace(metadata, release_guarantee=None)  # written with clear labels, never shared
        local_record = write_clean_test(task, local, spec, point, clipped, label_histogram(labels["test"], classes))
    path = Path(task.run_dir) / client_file_name(task.index)
    with ClientFileWriter(path, metadata, row_counts) as writer:
        writer.write_rows("train", 0, rows.astype(np.float32), synthetic_labels.astype(np.int32))
        writer.write_released_statistics(released)
        require_parent(str(path))  # a worker whose export died commits nothing (issue 13)
        digest = writer.commit()
    return record_for(path, task.index, digest, row_counts), local_record


__all__ = ["EMPTY_CLASS_NOTE", "check_clients", "export_statistics", "is_statistics_release", "projected_batches",
           "statistics_mechanism"]
