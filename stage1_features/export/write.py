"""Streaming feature release: encode → randomize → pack → write, one row batch at a time.

Algorithm 1 lines 7-10 (LDPFL III-B): each flatten-feature value becomes l = m + n + 1 bits (eq. 14,
``ldpfl.mechanisms.FixedPointEncoding``), the r·l bits of a record are merged and randomized by the chosen
bit mechanism (UER: Theorem 2, eq. 17), and the result is packed 8 bits a byte. Real-valued mechanisms
(PDPM, Gaussian, ...) randomize the float32 features directly.

Memory is O(batch): only one batch of features (float32), its bits (uint8) and its packed output are
alive at a time. The authors' code instead holds every feature of the dataset as float64 in RAM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_writer import ClientFileWriter
from ldpfl.mechanisms.base import FLOAT32, PACKED_BITS

BATCH_ROWS = 1024  # rows per CNN prediction batch
RELEASE_ROWS = 256  # rows per encode / randomize / pack / write step: ~22 MiB of temporaries at r = 1,152
# (the encoding's (rows, r, m+n) uint32 shift temporary dominates; 1,024-row steps peak near 90 MiB and are
# ~15 % slower on a 2-core VM, see bench/RESULTS.md)


@dataclass(frozen=True)
class ReleasePipeline:
    """What happens to one batch of float features before it is stored.

    ``mechanism`` is a built mechanism (bit, real, or ``none``); ``encoding`` is the fixed-point
    encoding for packed formats (``None`` for float32 files).
    """

    mechanism: Any
    encoding: mechanisms.FixedPointEncoding | None
    feature_format: str

    def __post_init__(self) -> None:
        if self.feature_format not in (PACKED_BITS, FLOAT32):
            raise ValueError(f"feature_format must be {PACKED_BITS!r} or {FLOAT32!r}, got {self.feature_format!r}")
        if self.feature_format == PACKED_BITS and self.encoding is None:
            raise ValueError("a packed-bits release needs a fixed-point encoding")

    @classmethod
    def for_spec(cls, spec: mechanisms.MechanismSpec) -> ReleasePipeline:
        """Return the release of a resolved mechanism: its instance, encoding and feature format."""
        return cls(spec.build(), spec.encoding, spec.feature_format)

    @property
    def randomizes(self) -> bool:
        """Return whether the mechanism randomizes (False for the non-private ``none``)."""
        return bool(self.mechanism.RANDOMIZES)

    def release(self, features: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """Return (stored rows, unrandomized bits or None) for a batch of float32 features (b, r)."""
        features = np.asarray(features, dtype=np.float32)
        if self.feature_format == FLOAT32:
            out = self.mechanism.randomize(features, rng=rng) if self.randomizes else features
            return np.asarray(out, dtype=np.float32), None
        assert self.encoding is not None  # checked at construction for packed bits
        bits = self.encoding.encode(features)  # eq. 14 / Algorithm 1 lines 7-8: (b, r·l) uint8, saturating
        out = self.mechanism.randomize(bits, rng=rng) if self.randomizes else bits  # lines 9-10
        return mechanisms.pack_bits(out), bits


class BitDensity:
    """Running count of 1s per bit position of the *unrandomized* encoding (``--store-input-density``)."""

    def __init__(self, width: int):
        self.ones = np.zeros(width, dtype=np.int64)
        self.rows = 0

    def add(self, bits: np.ndarray) -> None:
        """Count the 1s of ``bits`` (rows of the unrandomized encoding) per position."""
        self.ones += bits.sum(axis=0, dtype=np.int64)
        self.rows += len(bits)

    def density(self) -> np.ndarray:
        """float32 share of 1s per position (zeros when no row was seen)."""
        return (self.ones / max(self.rows, 1)).astype(np.float32)


def write_split(writer: ClientFileWriter, split: str, batches: Iterable[tuple[np.ndarray, np.ndarray]],
                pipeline: ReleasePipeline, rng: np.random.Generator, *, density: BitDensity | None = None,
                progress: Any = None, clamps: Any = None) -> int:
    """Release and write ``batches`` into ``split`` of an open client file (Algorithm 1 lines 7-10).

    Parameters
    ----------
    writer : ClientFileWriter
        The client's file, still under its temporary name.
    split : str
        ``train`` or ``test``.
    batches : iterable of (np.ndarray, np.ndarray)
        float32 features (b, r) and labels (b,), in row order.
    pipeline : ReleasePipeline
        Encoding and mechanism.
    rng : np.random.Generator
        The client's randomization stream, consumed step after step in row order. Each batch is
        released in steps of ``RELEASE_ROWS`` rows; the output depends on the step size only through the
        mechanism's own chunking (not at all for bit mechanisms with an even r·l).
    density : BitDensity, optional
        Accumulates the unrandomized bits (``--store-input-density``).
    progress : tqdm, optional
        Updated with the rows written.
    clamps : ClampCounter, optional
        Counts the values the release clamps, per column (``ldpfl.stage1_features.export.clamping``).

    Returns
    -------
    int
        Rows written.
    """
    start = 0
    for features, labels in batches:
        if clamps is not None:
            clamps.add(features)
        # released in small steps (bounded temporaries), written once per batch (whole HDF5 chunks)
        parts = []
        for offset in range(0, len(features), RELEASE_ROWS):
            stored, bits = pipeline.release(features[offset:offset + RELEASE_ROWS], rng)
            if density is not None and bits is not None:
                density.add(bits)
            parts.append(stored)
        stored = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if stored.dtype.kind == "f" and not np.all(np.isfinite(stored)):  # never release infinities (issue 13)
            raise ParameterError(f"mechanism {pipeline.mechanism.NAME!r} released values that are not finite "
                                 f"(rows {start}:{start + len(stored)} of split {split!r}); nothing was kept. "
                                 "Its noise overflows float32: choose a larger `epsilon`")
        writer.write_rows(split, start, stored, np.asarray(labels, dtype=np.int32))
        start += len(stored)
        if progress is not None:
            progress.update(len(stored))
    return start


def raw_feature_batches(source: Any, indices: np.ndarray, labels: np.ndarray,
                        batch_rows: int = BATCH_ROWS) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """Batches of flattened raw inputs (``--extractor none``) from ``source.features(indices)``."""
    for start in range(0, len(indices), batch_rows):
        rows = indices[start:start + batch_rows]
        x = np.asarray(source.features(rows), dtype=np.float32)
        yield x.reshape(len(rows), -1), labels[start:start + batch_rows]
