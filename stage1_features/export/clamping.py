"""Counting the values a release clamps, per column, while the rows stream (issue 42 item 6; ``contract.clamped``).

Which interval each release clamps to is read from the release's own parts, never from a mechanism's name:

* a packed-bits release (every bit mechanism, and ``none`` over the encoding): the fixed-point encoding's
  [-(2^m - 2^-n), 2^m - 2^-n] (LDPFL eq. 14, saturating);
* a bounded mechanism (``duchi``, ``piecewise``, ``hybrid``, ``laplace``): [-bound, bound];
* ``pdpm``: its safe range τ (PLDP-FL Algorithm 2 lines 1-6);
* element-wise clipping (``gaussian``, ``gaussian-wu``: WU 3.1; ``ldpsign``): [-c, c].

Others clamp nothing per value: an L2 clip (``fedaw-gaussian``) scales a whole record, categorical mechanisms take
classes, and ``none`` over float32 writes the values as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.clamped import MAX_CLAMPED_SHARE, ClampedValues
from ldpfl.mechanisms.ldp_common import BoundedMechanism
from ldpfl.mechanisms.ldpsign import LDPSign
from ldpfl.mechanisms.pdpm import PDPM
from ldpfl.mechanisms.real import ElementwiseClippedGaussian
from ldpfl.stage1_features.export.write import ReleasePipeline


def clamp_interval(pipeline: ReleasePipeline) -> tuple[float, float] | None:
    """Return the interval ``pipeline`` clamps each value to, or None when it clamps nothing per value."""
    if pipeline.encoding is not None:
        top = float(pipeline.encoding.max_magnitude)
        return -top, top
    mechanism = pipeline.mechanism
    if not pipeline.randomizes:
        return None
    if isinstance(mechanism, BoundedMechanism):
        return -float(mechanism.bound), float(mechanism.bound)
    if isinstance(mechanism, PDPM):
        low, high = mechanism.safe_range
        return float(low), float(high)
    if isinstance(mechanism, ElementwiseClippedGaussian | LDPSign):
        return -float(mechanism.clip), float(mechanism.clip)
    return None


def where_to_widen(pipeline: ReleasePipeline) -> str:
    """Return the parameters that widen the clamped interval, marked for the front end (```integer_bits```)."""
    if pipeline.encoding is not None:
        return "`integer_bits`"
    mechanism = pipeline.mechanism
    if isinstance(mechanism, PDPM):
        return "`safe_range_length` or `center`"
    if isinstance(mechanism, ElementwiseClippedGaussian | LDPSign) or hasattr(mechanism, "clip"):
        return "`clip`"
    return "the inputs' scale (this mechanism takes values in [-1, 1])"


@dataclass
class ClampCounter:
    """Clamped values per column over every batch of a client's rows (train and test), before the release."""

    pipeline: ReleasePipeline
    interval: tuple[float, float]
    per_column: np.ndarray = field(init=False)
    rows: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.per_column = np.zeros(0, dtype=np.int64)

    @classmethod
    def for_pipeline(cls, pipeline: ReleasePipeline) -> ClampCounter | None:
        """Return a counter for ``pipeline``, or None when it clamps nothing per value."""
        interval = clamp_interval(pipeline)
        return None if interval is None else cls(pipeline, interval)

    def add(self, features: np.ndarray) -> None:
        """Count the values of ``features`` (b, r), as they enter the release, that lie outside the interval."""
        x = np.asarray(features)
        if not x.size:
            return
        low, high = self.interval
        outside = np.count_nonzero((x < low) | (x > high), axis=0)  # NaN is neither: the encoding refuses it
        if not self.per_column.size:
            self.per_column = np.zeros(x.shape[1], dtype=np.int64)
        self.per_column += outside
        self.rows += len(x)

    def record(self) -> ClampedValues:
        """Return what was counted, as the file's attribute records it."""
        counts = self.per_column
        worst = int(np.argmax(counts)) if counts.size and counts.any() else 0
        return ClampedValues(float(self.interval[0]), float(self.interval[1]), self.rows, int(counts.sum()),
                             int(np.count_nonzero(counts)), worst, int(counts[worst]) if counts.size else 0)

    def refuse_past_bound(self, client: int) -> ClampedValues:
        """Return the record, or raise ``ParameterError`` naming the column when one is past ``MAX_CLAMPED_SHARE``.

        Only the fixed-point encoding's saturation is refused (issue 42 item 6: values an *encoding* must clamp, a
        sign of inputs on the wrong scale). A mechanism's own interval (a bounded mechanism's [-1, 1], PDPM's safe
        range, an element-wise clip) is part of its design: its clamped values are counted, never refused.
        """
        record = self.record()
        if record.past_bound and self.pipeline.encoding is not None:
            low, high = self.interval
            raise ParameterError(
                f"client {client}: column {record.worst_column} has {record.worst_count} of its {record.rows} values "
                f"({record.worst_share:.1%}) outside [{low:.6g}, {high:.6g}], which the release clamps; more than "
                f"{MAX_CLAMPED_SHARE:.0%} of a column (MAX_CLAMPED_SHARE) is refused and nothing of this client is "
                f"kept: check its inputs, or widen the interval with {where_to_widen(self.pipeline)}")
        return record


__all__ = ["ClampCounter", "clamp_interval", "where_to_widen"]
