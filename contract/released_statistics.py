"""The ``/released_statistics`` group of a ``stats:K`` client file (issue 40): its layout, reading and checks.

A ``stats:K`` file (``release`` attribute ``stats:K``, mechanism ``gaussian-stats``) holds what its silo released
once, beside the synthetic rows of ``/train``:

```
/released_statistics/sums           float64 (c, K)   noisy per-class sums of the clipped projected records
/released_statistics/counts         float64 (c,)     noisy class counts
/released_statistics/moments        float64 (K, K)   noisy second moments (symmetric): about the release's own
                                                       class means (``moments_about`` class-means), or the origin
/released_statistics/synthetic_key  int64 (1,)       the public key the synthetic records were drawn with
```

The noise scales are not stored twice: they follow from the mechanism's recorded parameters (ε, δ, C, the
shares), which the privacy report also records (``sigma_*``). :func:`statistics_problems` is what ``inspect``
flags and what ``federate``/``gather`` refuse:

* the noise the parameters imply gives back the recorded ε under both relations (eq. 1 of
  ``sufficient_statistics`` inverted: μ² = C²/σ_S² + 1/σ_N² + C_M⁴/σ_M², C_M being C_r for moments about the
  class means, C about the origin);
* the synthetic rows and labels are those the recorded statistics and key give (float32 rows within a relative
  1e-4 of the recomputation: the Cholesky factor and the products go through BLAS, whose rounding may differ
  between machines).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from ldpfl.contract.release_point import STATS, parse_release
from ldpfl.contract.schema import ClientMetadata, FormatError
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import sufficient_statistics as stats
from ldpfl.mechanisms.gaussian_statistics import ORIGIN, GaussianStatistics, Released

GROUP = "released_statistics"
DATASETS = ("sums", "counts", "moments", "synthetic_key")
ROW_TOLERANCE = 1e-4
"""Relative tolerance of a synthetic row against its recomputation (BLAS rounding; float32 storage: 6e-8)."""


def is_statistics_file(metadata: ClientMetadata) -> bool:
    """Return whether the file is a shareable ``stats:K`` release (rows synthetic, statistics in the group).

    The silo's local-only clean test file of such a release (``keep_clean_test``) has the release's width but
    no statistics.
    """
    return parse_release(metadata.release).kind == STATS and not metadata.local_only


def mechanism_of(metadata: ClientMetadata) -> GaussianStatistics:
    """Return the file's ``gaussian-stats`` mechanism, built from its recorded parameters.

    A file written before ``moments_about`` existed released its moments about the origin.
    """
    mechanism = metadata.mechanism_spec().build()
    if not isinstance(mechanism, GaussianStatistics):
        raise ValueError(f"a stats release names mechanism {metadata.mechanism!r}, expected 'gaussian-stats'")
    if "moments_about" not in metadata.mechanism_parameters:
        mechanism = dataclasses.replace(mechanism, moments_about=ORIGIN)
    return mechanism


def expected_shapes(metadata: ClientMetadata) -> dict[str, tuple[int, ...]]:
    """Return each dataset's shape for c = ``num_classes`` and K = ``features``."""
    c, k = metadata.num_classes, metadata.features
    return {"sums": (c, k), "counts": (c,), "moments": (k, k), "synthetic_key": (1,)}


def check_group(path: Path, handle: h5py.File, metadata: ClientMetadata) -> None:
    """Refuse (``FormatError``) a group that a stats file lacks, another file holds, or that has other shapes."""
    present = GROUP in handle
    if not is_statistics_file(metadata):
        if present:
            raise FormatError(path, f"group {GROUP!r} in a file that is not a shared stats:K release")
        return
    if not present or not isinstance(handle[GROUP], h5py.Group):
        raise FormatError(path, f"a {metadata.release} file needs the group {GROUP!r}")
    group = handle[GROUP]
    if set(group) != set(DATASETS):
        raise FormatError(path, f"group {GROUP!r} holds {sorted(group)}, expected {sorted(DATASETS)}")
    for name, shape in expected_shapes(metadata).items():
        dset = group[name]
        if not isinstance(dset, h5py.Dataset) or dset.shape != shape:
            raise FormatError(path, f"dataset '{GROUP}/{name}' has shape {getattr(dset, 'shape', None)}, expected "
                                    f"{shape}")
        kind = "iu" if name == "synthetic_key" else "f"
        if dset.dtype.kind not in kind:
            raise FormatError(path, f"dataset '{GROUP}/{name}' has dtype {dset.dtype}")


def read_release(handle: h5py.File, metadata: ClientMetadata) -> Released:
    """Return the file's release: its statistics, the noise its parameters imply, and the synthetic key."""
    group = handle[GROUP]
    mechanism = mechanism_of(metadata)
    released = stats.Statistics(np.asarray(group["sums"][...], dtype=np.float64),
                                np.asarray(group["counts"][...], dtype=np.float64),
                                np.asarray(group["moments"][...], dtype=np.float64), centered=mechanism.centered)
    return Released(released, mechanism.scales(metadata.features), int(group["synthetic_key"][0]))


def write_release(file: h5py.File, released: Released) -> None:
    """Write ``released`` into a new group of an open (temporary) file, Fletcher-32 checksummed."""
    group = file.create_group(GROUP)
    values = {"sums": released.statistics.sums, "counts": released.statistics.counts,
              "moments": released.statistics.moments}
    for name, data in values.items():
        array = np.asarray(data, dtype=np.float64)
        group.create_dataset(name, data=array, fletcher32=True, chunks=array.shape)
    group.create_dataset("synthetic_key", data=np.array([released.synthetic_key], dtype=np.int64),
                         fletcher32=True, chunks=(1,))


def feature_map(metadata: ClientMetadata) -> Callable[[np.ndarray], np.ndarray] | None:
    """Return the map a ``stats:K`` release applies to extractor outputs (project on K, clip to C; float32).

    None for other releases. ``predict`` and the local clean test file use it, so a model fitted on the file
    reads new records in the same space.
    """
    if parse_release(metadata.release).kind != STATS:
        return None
    mechanism = mechanism_of(metadata) if not metadata.local_only else None
    if mechanism is None:
        raise ValueError("the projection of a stats:K release is recorded in its shared file, not the local one")
    basis: list[np.ndarray] = []

    def project(values: np.ndarray) -> np.ndarray:
        if not basis:
            basis.append(stats.projection(int(values.shape[1]), metadata.features, mechanism.projection_key))
        return mechanism.clipped(np.asarray(values, dtype=np.float64) @ basis[0]).astype(np.float32)

    return project


def epsilon_from_noise(scales: stats.NoiseScales, clip: float, delta: float, *, moments_clip: float | None = None,
                       centered: bool = False) -> dict[str, float]:
    """Return ε under each relation of the noise ``scales``: μ from eq. 1 (1'), replace-one from eq. 2 (3).

    ``clip`` is C; ``moments_clip`` C_M, what bounds a record's term in the moments (C_r centered; default C).
    """
    moments_clip = clip if moments_clip is None else moments_clip
    parts = (clip**2 / scales.sums**2, 1 / scales.counts**2, moments_clip**4 / scales.moments**2)
    mu = math.sqrt(sum(parts))
    total = sum(parts)
    return stats.epsilons(mu, delta, (parts[0] / total, parts[1] / total, parts[2] / total), centered=centered)


def noise_problems(metadata: ClientMetadata, released: Released, mechanism: GaussianStatistics) -> list[str]:
    """Return how the noise the parameters give disagrees with the recorded ε (target and report), one line each."""
    recomputed = epsilon_from_noise(released.scales, mechanism.clip_for(metadata.features), mechanism.delta,
                                    moments_clip=mechanism.moments_clip_for(metadata.features),
                                    centered=mechanism.centered)
    problems = []
    target = recomputed[mechanism.neighbours]
    if not math.isclose(target, mechanism.epsilon, rel_tol=1e-6, abs_tol=1e-6):
        problems.append(f"the noise the parameters give spends epsilon {target:.6g} ({mechanism.neighbours}), "
                        f"not the recorded {mechanism.epsilon:g}")
    report = metadata.privacy_report
    if report.exact_epsilon_per_record is not None and not math.isclose(
            recomputed[accounting.REPLACE_ONE], report.exact_epsilon_per_record, rel_tol=1e-6):
        problems.append(f"the noise gives epsilon {recomputed[accounting.REPLACE_ONE]:.6g} replace-one, the report "
                        f"records {report.exact_epsilon_per_record:.6g}")
    return problems


def row_problems(handle: h5py.File, released: Released, mechanism: GaussianStatistics) -> list[str]:
    """Return how the stored synthetic rows and labels differ from those the statistics and key give.

    The statistics are checked finite and their counts against the stored rows before any row is drawn (a crafted
    count of 1e12 would ask for terabytes).
    """
    values = released.statistics
    bad = [name for name in ("sums", "counts", "moments") if not np.all(np.isfinite(getattr(values, name)))]
    if bad:
        return [f"the released {', '.join(bad)} hold NaN or infinite values: no synthetic record follows from them"]
    stored_rows = handle["train/features"]
    expected = int(np.sum(np.rint(np.maximum(values.counts, 1.0))))
    if stored_rows.shape[0] != expected:
        return [f"train holds {stored_rows.shape[0]} rows; the recorded statistics and synthetic key give {expected}"]
    rows, labels = mechanism.synthetic(released)
    problems = []
    if not np.array_equal(np.asarray(handle["train/labels"][...]), labels):
        problems.append("train/labels differ from the labels the recorded statistics and synthetic key give")
    difference = np.abs(np.asarray(stored_rows[...], dtype=np.float64) - rows)
    worst = float(np.max(difference, initial=0.0)) / max(float(np.max(np.abs(rows), initial=0.0)), 1e-30)
    if worst > ROW_TOLERANCE:
        bad_row = int(np.argmax(np.max(difference, axis=1)))
        problems.append(f"train/features row {bad_row} differs from the synthetic record the recorded statistics "
                        f"and key give (by {worst:.2g} of the largest value)")
    return problems


def statistics_problems(handle: h5py.File, metadata: ClientMetadata) -> list[str]:
    """Return one line per disagreement of a stats file with itself (none: an empty list): noise, then rows."""
    if not is_statistics_file(metadata):
        return []
    mechanism = mechanism_of(metadata)
    released = read_release(handle, metadata)
    return noise_problems(metadata, released, mechanism) + row_problems(handle, released, mechanism)


__all__ = ["DATASETS", "GROUP", "ROW_TOLERANCE", "check_group", "epsilon_from_noise", "expected_shapes", "feature_map",
           "is_statistics_file", "mechanism_of", "noise_problems", "read_release", "row_problems",
           "statistics_problems", "write_release"]
