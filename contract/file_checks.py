"""What makes a structurally valid client file unusable: the checks that ``inspect`` and ``federate`` share.

``ldpfl.contract.client_reader`` checks that a file *is* a client file (schema, attributes, objects, shapes).
These checks say whether its contents contradict themselves, and both ``ldpfl inspect`` (which flags
the file) and the run-directory validator (``ldpfl.contract.run_dir.check_client_file``, behind ``ldpfl
federate`` and a resumed ``ldpfl export``, which refuse it) call them, so a file that inspect calls bad
is refused by federate:

* the attributes ``mechanism`` / ``mechanism_parameters`` must build a registered mechanism (a
  ``MechanismSpec``) whose feature format, m, n and r are the file's;
* the stored privacy report's ε values must be the ones that mechanism's parameters give (a report
  claiming ε = -1, or 0.1 for an ε = 8 release, is refused);
* every dataset must carry a Fletcher-32 checksum (without it, flipped data bytes go unnoticed);
* (one streamed read of the features, ``feature_value_problem``, behind ``gather`` and ``federate`` only) every
  value must be one the mechanism outputs: finite, inside its declared ``output_range`` or one of its
  ``output_values`` for a float32 file, and the padding bits after the r·l bits of a packed row 0.

Statistical checks of the data (bit densities) stay with inspect: they are evidence, not contradictions.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ldpfl.contract import released_statistics
from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.schema import SPLITS, ClientMetadata
from ldpfl.mechanisms.base import FLOAT32, PACKED_BITS, Mechanism
from ldpfl.mechanisms.report import PrivacyReport
from ldpfl.mechanisms.spec import MechanismSpec

EPS_KEYS = ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record")
NOISE_TAIL = 64.0
"""A Gaussian or Laplace draw beyond 64 scales has probability below 10^-27: noise of scale s fits float32
when 64 s does."""
FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32_overflow(scale: float | None) -> str | None:
    """Say why noise of ``scale`` (σ, or a Laplace b) overflows float32 values, or return ``None`` when it fits.

    Float features (stage 1) and model uploads (stage 2) are float32: noise whose draws reach ±inf
    would release nothing but infinities, so both stages refuse such a scale before writing anything.
    """
    if scale is None or (math.isfinite(scale) and scale * NOISE_TAIL <= FLOAT32_MAX):
        return None
    return (f"its noise scale {scale:.3g} puts draws at {NOISE_TAIL:g} times that, beyond float32's largest "
            f"value {FLOAT32_MAX:.3g}: the values would overflow to inf")


def as_float(value: Any) -> float | None:
    """Return ``value`` as a float (``"inf"`` as infinity), or ``None`` when it is not a number."""
    if value is None:
        return None
    if value == "inf":
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def same_number(a: float | None, b: float | None) -> bool:
    """Return whether two report values agree (both absent, or equal to 1e-9 relative)."""
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def mechanism_problems(metadata: ClientMetadata) -> tuple[MechanismSpec | None, Any | None, list[str]]:
    """Return the file's mechanism spec, the built mechanism, and how the attributes contradict them.

    ``mechanism_parameters`` holds the mechanism's own parameters, plus the encoding's ``integer_bits``
    and ``fraction_bits`` when the mechanism does not take them (``none`` over packed bits); the
    resolved m, n and r must equal the file's; ``none`` may also store float32 values (a release other
    than ``flatten``, or a local-only clean file). The mechanism is ``None`` when the attributes do not
    build one, or build one that contradicts the file.
    """
    try:
        spec = metadata.mechanism_spec()
    except (ValueError, TypeError, OverflowError) as error:
        problem = " ".join(str(error).split())[:300]
        return None, None, [f"attributes 'mechanism'/'mechanism_parameters' do not build a mechanism ({problem})"]
    problems: list[str] = []
    if not spec.randomizes and metadata.feature_format == FLOAT32:
        # ``none`` of a low-dimensional release (or of a clean local-only file) stores float32 values as they are
        return spec, spec.build(), problems
    if spec.feature_format != metadata.feature_format:
        problems.append(f"mechanism {spec.name!r} writes {spec.feature_format} features but the file's "
                        f"feature_format is {metadata.feature_format!r}")
    resolved: dict[str, int | None] = {"features": spec.features}
    if spec.encoding is not None:  # float files carry no encoding: their m and n say nothing
        resolved = {"integer_bits": spec.integer_bits, "fraction_bits": spec.fraction_bits, **resolved}
    for key, value in resolved.items():
        if value is not None and value != getattr(metadata, key):
            problems.append(f"mechanism parameter {key} = {value} differs from the file's {key} = "
                            f"{getattr(metadata, key)}")
    return spec, (None if problems else _built(spec)), problems


@functools.lru_cache(maxsize=64)
def _built(spec: MechanismSpec) -> Any:
    """Build the mechanism of ``spec`` once (the clients of a run share one)."""
    return spec.build()


_REPORTS: dict[int, tuple[Mechanism, PrivacyReport]] = {}


def _report_of(mechanism: Mechanism) -> PrivacyReport:
    """Return ``mechanism.report()``, remembered per mechanism object (exact reports can take a second)."""
    key = id(mechanism)
    if key not in _REPORTS or _REPORTS[key][0] is not mechanism:
        if len(_REPORTS) >= 64:
            _REPORTS.clear()
        _REPORTS[key] = (mechanism, mechanism.report())  # holds the object: its id is not reused meanwhile
    return _REPORTS[key][1]


def privacy_problems(metadata: ClientMetadata, mechanism: Mechanism | None
                     ) -> tuple[dict[str, float | None], dict[str, float | None] | None, list[str]]:
    """Compare the stored report's ε values with the report of ``mechanism`` (when it could be built).

    Returns
    -------
    tuple
        The stored values, the recomputed ones (``None`` without a mechanism), and the disagreements.
    """
    stored = metadata.privacy()
    values = {k: as_float(getattr(stored, k)) for k in EPS_KEYS}
    if mechanism is None:
        return values, None, [f"privacy report: stored {key} = {value} is negative" for key, value in values.items()
                              if value is not None and value < 0]
    fresh = _report_of(mechanism)
    recomputed = {k: as_float(getattr(fresh, k)) for k in EPS_KEYS}
    problems = [f"privacy report: stored {key} = {values[key]} but the mechanism's parameters give "
                f"{recomputed[key]}" for key in EPS_KEYS if not same_number(values[key], recomputed[key])]
    return values, recomputed, problems


def unprotected_datasets(handle: h5py.File) -> list[str]:
    """Return the datasets of an open client file that carry no Fletcher-32 checksum."""
    names = [f"{s}/{n}" for s in SPLITS for n in ("labels", "features")]
    for group in ("stats", released_statistics.GROUP):
        if group in handle:
            names += [f"{group}/{n}" for n in handle[group]]
    return [name for name in names if not handle[name].fletcher32]


def checksum_problems(handle: h5py.File) -> list[str]:
    """Return the problem of datasets without a Fletcher-32 checksum, if any."""
    unprotected = unprotected_datasets(handle)
    if not unprotected:
        return []
    return [f"datasets {unprotected} carry no Fletcher-32 checksum: their data cannot be verified"]


def file_problems(handle: h5py.File, metadata: ClientMetadata) -> list[str]:
    """Return every contradiction of an open, structurally valid client file (empty: usable).

    The checks of this module: mechanism, privacy report, checksums; and a ``stats:K`` release's own
    (``released_statistics.statistics_problems``: its noise against its ε, its synthetic rows against its
    statistics and key).
    """
    _, mechanism, problems = mechanism_problems(metadata)
    problems += privacy_problems(metadata, mechanism)[2]
    problems += checksum_problems(handle)
    if not problems:
        problems += released_statistics.statistics_problems(handle, metadata)
    return problems


def float_value_problem(block: np.ndarray, mechanism: Any | None) -> tuple[int, int, str] | None:
    """Return (row, column, why) of the first value of a float32 ``block`` the mechanism cannot output; None if none.

    A value must be finite and, when the mechanism declares them, one of its ``output_values`` (exactly, as the
    float32 the writer stores) or inside its ``output_range``. Vectorized over the block.
    """
    bad = ~np.isfinite(block)
    why = "is not finite; a float feature file must hold finite values only"
    if not bad.any() and mechanism is not None:
        values = mechanism.output_values()
        if values is not None:
            allowed = np.asarray(values, dtype=np.float32)
            bad = ~np.isin(block, allowed)
            why = (f"is not one of the values {[float(v) for v in allowed]} that mechanism {mechanism.NAME!r} "
                   f"outputs")
        else:
            bounds = mechanism.output_range()
            if bounds is not None:
                low, high = np.float32(bounds[0]), np.float32(bounds[1])
                bad = (block < low) | (block > high)
                why = (f"lies outside [{float(low):.6g}, {float(high):.6g}], the output range of mechanism "
                       f"{mechanism.NAME!r}")
    if not bad.any():
        return None
    row, column = (int(i) for i in np.argwhere(bad.reshape(bad.shape[0], -1))[0])
    return row, column, why


def padding_problem(block: np.ndarray, width: int) -> int | None:
    """Return the first row of a packed ``block`` with a padding bit set after its ``width`` bits, or None.

    Rows are ``np.packbits`` bytes; the writer pads them with 0, so a set padding bit is no mechanism's output.
    """
    pad = block.shape[1] * 8 - width
    if pad <= 0 or not block.shape[0]:
        return None
    bad = (block[:, -1] & np.uint8((1 << pad) - 1)) != 0
    return int(np.argmax(bad)) if bad.any() else None


def feature_value_problem(path: str | os.PathLike[str], block_bytes: int = 16 << 20) -> str | None:
    """Say where a client file holds a feature value its mechanism cannot output; None when every value is one.

    Float32 files: :func:`float_value_problem` (finite; in the mechanism's output set or range). Packed-bit files:
    :func:`padding_problem`. Reads the features in row blocks of about ``block_bytes`` (memory O(block)).
    """
    with open_client_file(Path(path)) as (handle, metadata, rows):
        packed = metadata.feature_format == PACKED_BITS
        mechanism = None if packed else mechanism_problems(metadata)[1]
        for split in SPLITS:
            features = handle[split]["features"]
            row_bytes = max(1, int(np.prod(features.shape[1:], dtype=np.int64)) * features.dtype.itemsize)
            step = max(1, block_bytes // row_bytes)
            for start in range(0, rows[split], step):
                block = np.asarray(features[start:start + step])
                if packed:
                    row = padding_problem(block, metadata.feature_width)
                    if row is not None:
                        return (f"split {split!r} row {start + row}: padding bits after the {metadata.feature_width} "
                                f"feature bits are set; a packed row holds only the mechanism's bits, padded with 0")
                    continue
                found = float_value_problem(block, mechanism)
                if found is not None:
                    row, column, why = found
                    value = block.reshape(block.shape[0], -1)[row, column]  # as stored: float32's shortest repr
                    return f"split {split!r} row {start + row}, feature {column}: the value {value!s} {why}"
    return None
