"""The schema of a client file (``ldpfl-features``): constants, limits, ``FormatError`` and ``ClientMetadata``.

A client file holds::

    /train/features   uint8 (rows, ceil(r*l/8)) packed bits  - or float32 (rows, r) for real mechanisms
    /train/labels     int32 (rows,)
    /test/features    same layout as train
    /test/labels
    /stats/input_bit_density   optional float32 (r*l,): density of 1s of the *unrandomized* encoding
                               (an aggregate NOT covered by the LDP report)

and the root attributes that :class:`ClientMetadata` describes; no seed is ever stored. The full
description, with the versioning policy, is docs/hdf5-schema.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from ldpfl.common.errors import LdpflError
from ldpfl.contract.clamped import ClampedValues
from ldpfl.contract.extractor_training import UNTRAINED_EXTRACTORS, ExtractorTraining
from ldpfl.contract.jsonout import json_default
from ldpfl.contract.label_release import LabelRelease
from ldpfl.contract.release_guarantee import ReleaseGuarantee
from ldpfl.contract.release_point import FLATTEN, parse_release
from ldpfl.contract.version import package_version
from ldpfl.mechanisms.base import FEATURE_FORMATS, FLOAT32, PACKED_BITS
from ldpfl.mechanisms.randomness import GENERATORS, PCG64, UNRECORDED, randomness_label
from ldpfl.mechanisms.registry import mechanism_class, mechanism_names
from ldpfl.mechanisms.report import PrivacyReport
from ldpfl.mechanisms.spec import ENCODING_KEYS, MechanismSpec

SCHEMA = "ldpfl-features"
SCHEMA_VERSION = 7
"""Written by this code. Version 2 stores the derived boolean ``private`` as int8 0/1 (version 1: numpy bool);
version 3 adds the attributes ``release`` and ``local_only`` (and the optional ``class_names``,
``plan_fingerprint``); version 4 adds ``label_release``, ``extractor_training`` and ``release_guarantee``
(issue 22: one per-record guarantee over everything the file releases); version 5 adds ``generator``, the bit
generator the noise came from (issue 23: ``AES-CTR`` or ``ChaCha20`` unseeded, ``PCG64`` seeded); version 6 adds the
group ``/released_statistics`` of a ``stats:K`` release (issue 40: ``ldpfl.contract.released_statistics``); version 7
adds the optional ``clamped_values``, the values the encoding clamped (issue 42: ``ldpfl.contract.clamped``)."""
SUPPORTED_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
"""Read by this code (client files and manifests)."""
SPLITS = ("train", "test")

MAX_ROWS = 50_000_000
MAX_FEATURE_WIDTH = 10_000_000
MAX_SPLIT_BYTES = 64 * 2**30
MAX_CLASSES = 100_000
MAX_ENCODING_BITS = 31

JSON_ATTRIBUTES = ("partition", "mechanism_parameters", "privacy_report", "label_histograms")
OPTIONAL_JSON_ATTRIBUTES = ("label_release", "extractor_training", "release_guarantee", "clamped_values")
"""JSON objects of version 4 (``None`` when a file of an older version does not record them):

* ``label_release``: how the labels were released: ``{"mechanism": "clear"}`` (the true labels) or
  ``{"mechanism": "krr", "epsilon": exact ε, ...}`` (k-ary randomized response of each true label);
* ``extractor_training``: how the function that computed the released values was trained:
  ``{"training": "none"}`` (no trained extractor; the weight-free ``scatter`` adds ``"fixed": {"kind":
  "scattering2d", "J": 2, "L": 8, "normalization": {...}, ...}``), ``{"training": "non-private", "records": n}`` or
  ``{"training": "dp-sgd", "epsilon": ε, "delta": δ, "noise_multiplier": σ, "sampling_probability": q,
  "steps": T, "records": n, ...}``;
* ``release_guarantee``: the per-record (ε, δ) over everything the file releases, with its parts
  (``ldpfl.contract.release_guarantee``);
* ``clamped_values`` (version 7): how many values the encoding clamped, in files whose values are not randomized
  (``ldpfl.contract.clamped``)."""
INT_ATTRIBUTES = ("num_classes", "client_index", "client_count", "integer_bits", "fraction_bits", "features",
                  "schema_version")

OPTIONAL_ATTRIBUTES = ("class_names", "plan_fingerprint", *OPTIONAL_JSON_ATTRIBUTES)
"""Attributes a file may lack (older files, benchmark exports): read as ``None``, not written when ``None``.
``class_names`` is a JSON list of the class names (class k is ``class_names[k]``, own data: issue 16);
``plan_fingerprint`` is the fingerprint of the shared plan the file was exported with (``ldpfl.contract.plan``)."""

DEFAULTED_ATTRIBUTES: dict[str, tuple[int, Any]] = {"release": (3, FLATTEN), "local_only": (3, False),
                                                    "generator": (5, PCG64)}
"""Attribute -> (the version that added it, the value older files are read with). Files of versions 1 and 2 hold
LDPFL's flatten features and are meant to be shared; every writer before version 5 drew its noise from PCG64
(seeded from the user's seed or from the OS). Files of the adding version and later must carry the attribute."""

RUN_CONSISTENT_ATTRIBUTES = ("dataset", "num_classes", "client_count", "extractor", "integer_bits", "fraction_bits",
                             "features", "feature_format", "mechanism", "class_names", "plan_fingerprint", "release")
"""Attributes that must agree across the clients of one run. ``schema_version`` may differ: a resumed
export adds files of the current version to a run that holds older ones, and readers take both. Files of
separate silos gathered into one run agree on ``plan_fingerprint`` and ``class_names`` (issue 16)."""


class FormatError(LdpflError, ValueError):
    """A file or run directory that does not match the schema; the message names the file.

    Parameters
    ----------
    path : path
        The file or directory.
    problem : str
        What is wrong, one line.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def utc_now() -> str:
    """Return the current time in ISO 8601 UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def label_histogram(labels: np.ndarray, num_classes: int) -> list[int]:
    """Return the count of each class ``0 .. num_classes-1`` among ``labels``."""
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes].tolist()


@dataclass(frozen=True)
class ClientMetadata:
    """Everything the root attributes of a client file say. ``None`` stands for "not recorded"."""

    dataset: str
    num_classes: int
    client_index: int
    client_count: int
    partition: Mapping[str, Any]
    extractor: str
    input_shape: tuple[int, ...]
    integer_bits: int
    fraction_bits: int
    features: int
    feature_format: str
    mechanism: str
    mechanism_parameters: Mapping[str, Any]
    privacy_report: PrivacyReport
    """The file's privacy report (a mapping given here is read as the attribute, unknown keys ignored)."""
    randomness: str
    label_histograms: Mapping[str, list[int]]
    local_accuracy: float | None = None
    package_version: str = field(default_factory=package_version)
    created_utc: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    class_names: tuple[str, ...] | None = None
    plan_fingerprint: str | None = None
    release: str = FLATTEN
    local_only: bool = False
    label_release: LabelRelease | None = None
    """How the labels were released (``None``: not recorded, clear); a mapping given here is read as the attribute."""
    extractor_training: Mapping[str, Any] | None = None
    release_guarantee: ReleaseGuarantee | None = None
    """Everything the file releases about one record (``None``: not recorded); a mapping given here is read."""
    generator: str = UNRECORDED
    """The bit generator of the noise (``mechanisms.randomness.GENERATORS``); ``unspecified`` if not known."""
    clamped_values: ClampedValues | None = None
    """The values the encoding clamped (``None``: not recorded); a mapping given here is read as the attribute."""

    def __post_init__(self) -> None:
        """Read the privacy records given as their JSON form (``ValueError`` when one is malformed)."""
        for name, read in _RECORD_READERS.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, read(value))

    @property
    def randomness_label(self) -> str:
        """Return ``csprng (AES-CTR)``, ``seeded (PCG64)``, ...: the mode and the generator."""
        return randomness_label(self.randomness, self.generator)

    @property
    def bits_per_value(self) -> int:
        """Return l = m + n + 1."""
        return self.integer_bits + self.fraction_bits + 1

    @property
    def feature_width(self) -> int:
        """Return the model's input width: r*l bits for packed files, r for float files."""
        return self.features * self.bits_per_value if self.feature_format == PACKED_BITS else self.features

    @property
    def stored_width(self) -> int:
        """Return the columns actually stored: ceil(r*l/8) bytes for packed files, r for float files."""
        return math.ceil(self.feature_width / 8) if self.feature_format == PACKED_BITS else self.features

    def training(self) -> ExtractorTraining:
        """Return how the extractor was trained (``ValueError`` when a DP-SGD record is malformed).

        A file that does not record it (before version 4) was trained without DP if its extractor is trained.
        """
        return ExtractorTraining.from_json(self.extractor_training, trained=self.extractor not in UNTRAINED_EXTRACTORS)

    def privacy(self) -> PrivacyReport:
        """Return the stored privacy report (:attr:`privacy_report`)."""
        return self.privacy_report

    @property
    def private(self) -> bool:
        """Return whether the file's release is private: ``PrivacyReport.private`` of the stored report."""
        return self.privacy().private

    def mechanism_spec(self) -> MechanismSpec:
        """Return the mechanism the attributes name, resolved (``ValueError`` when they do not build one).

        A mechanism over the fixed-point encoding whose parameters leave out m or n (``none`` writes
        them, but need not) takes them from the attributes ``integer_bits`` / ``fraction_bits``.
        """
        params = dict(self.mechanism_parameters)
        if self.mechanism in mechanism_names() and mechanism_class(self.mechanism).encodes_bits():
            for key in ENCODING_KEYS:
                params.setdefault(key, getattr(self, key))
        return MechanismSpec.from_dict({"name": self.mechanism, "parameters": params})

    def to_attrs(self) -> dict[str, Any]:
        """Return the root attributes that represent this metadata (plus the derived ones)."""
        attrs: dict[str, Any] = {"schema": SCHEMA}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in OPTIONAL_ATTRIBUTES and value is None:
                continue
            if f.name == "class_names":
                value = json.dumps(list(value), ensure_ascii=False)
            elif f.name in _RECORD_READERS:
                value = json.dumps(_record_json(value), sort_keys=True, default=json_default)
            elif f.name in JSON_ATTRIBUTES or f.name in OPTIONAL_JSON_ATTRIBUTES:
                value = json.dumps(value, sort_keys=True, default=json_default)
            elif f.name == "input_shape":
                value = np.asarray(value, dtype=np.int64)
            elif f.name == "local_accuracy":
                value = np.nan if value is None else float(value)
            elif f.name == "local_only":
                value = np.int8(bool(value))
            attrs[f.name] = value
        report = self.privacy_report
        attrs["nominal_epsilon"] = _float_or_nan(report.nominal_epsilon)
        attrs["exact_epsilon_per_record"] = _float_or_nan(report.exact_epsilon_per_record)
        attrs["bits_per_value"] = self.bits_per_value
        attrs["feature_width"] = self.feature_width
        attrs["private"] = np.int8(self.private)
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], path: str | os.PathLike[str] = "<file>") -> ClientMetadata:
        """Parse and range-check the root attributes of a client file.

        Parameters
        ----------
        attrs : mapping
            The attributes (``h5py`` ``AttributeManager`` or a dict).
        path : path
            Named in errors.

        Returns
        -------
        ClientMetadata

        Raises
        ------
        FormatError
            Wrong schema, unsupported version, a missing or malformed attribute, a value out of range.
        """
        if _text(attrs.get("schema")) != SCHEMA:
            raise FormatError(path, f"attribute 'schema' is {_text(attrs.get('schema'))!r}, expected {SCHEMA!r} "
                                    "(not an ldpfl feature file)")
        version = attrs.get("schema_version")
        if not _supported_version(version):
            raise FormatError(path, f"attribute 'schema_version' is {_describe(version)}, this reader supports "
                                    f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in attrs:
                if f.name in OPTIONAL_ATTRIBUTES:
                    continue
                if f.name in DEFAULTED_ATTRIBUTES and _scalar_int(version) < DEFAULTED_ATTRIBUTES[f.name][0]:
                    kwargs[f.name] = DEFAULTED_ATTRIBUTES[f.name][1]
                    continue
                raise FormatError(path, f"missing attribute {f.name!r}")
            value = attrs[f.name]
            try:
                if f.name == "class_names":
                    value = json.loads(_text(value))
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        raise ValueError("not a JSON list of strings")
                    value = tuple(value)
                elif f.name in JSON_ATTRIBUTES or f.name in OPTIONAL_JSON_ATTRIBUTES:
                    value = json.loads(_text(value))
                elif f.name == "input_shape":
                    value = tuple(int(v) for v in np.asarray(value).ravel())
                elif f.name == "local_accuracy":
                    value = None if np.isnan(value) else float(value)
                elif f.name == "local_only":
                    if _scalar_int(value) not in (0, 1):
                        raise ValueError(f"expected 0 or 1, got {value!r}")
                    value = bool(int(value))
                elif f.name in INT_ATTRIBUTES:
                    value = _scalar_int(value)
                else:
                    value = _text(value)
            except (TypeError, ValueError, OverflowError, RecursionError) as error:
                problem = " ".join(str(error).split())[:200]
                raise FormatError(path, f"attribute {f.name!r} is malformed ({problem})") from None
            if f.name in _RECORD_READERS:
                value = _read_record(f.name, value, path)
            kwargs[f.name] = value
        meta = cls(**kwargs)
        meta.check(path)
        return meta

    def check(self, path: str | os.PathLike[str] = "<file>") -> None:
        """Range-check the attribute values; raise ``FormatError`` naming every problem."""
        problems = [f"attribute {name!r} is not a JSON object" for name in (*JSON_ATTRIBUTES, *OPTIONAL_JSON_ATTRIBUTES)
                    if name not in _RECORD_READERS and getattr(self, name) is not None
                    and not isinstance(getattr(self, name), Mapping)]
        if self.generator not in (*GENERATORS, UNRECORDED):
            problems.append(f"attribute 'generator' is {self.generator!r}, expected one of {', '.join(GENERATORS)}")
        if self.feature_format not in FEATURE_FORMATS:
            problems.append(f"attribute 'feature_format' is {self.feature_format!r}, expected one of {FEATURE_FORMATS}")
        if not 0 <= self.integer_bits <= MAX_ENCODING_BITS or not 0 <= self.fraction_bits <= MAX_ENCODING_BITS:
            problems.append(f"attributes 'integer_bits'/'fraction_bits' ({self.integer_bits}, {self.fraction_bits}) "
                            f"are outside [0, {MAX_ENCODING_BITS}]")
        if not 1 <= self.features <= MAX_FEATURE_WIDTH or self.feature_width > MAX_FEATURE_WIDTH:
            problems.append(f"attribute 'features' ({self.features}) is outside [1, {MAX_FEATURE_WIDTH}]")
        if not 1 <= self.num_classes <= MAX_CLASSES:
            problems.append(f"attribute 'num_classes' ({self.num_classes}) is outside [1, {MAX_CLASSES}]")
        if self.class_names is not None and (len(self.class_names) != self.num_classes
                                             or len(set(self.class_names)) != len(self.class_names)):
            problems.append(f"attribute 'class_names' holds {len(self.class_names)} names (distinct: "
                            f"{len(set(self.class_names))}) for num_classes = {self.num_classes}")
        problems += self._release_problems()
        if not 0 <= self.client_index < max(self.client_count, 1):
            problems.append(f"attribute 'client_index' ({self.client_index}) is outside [0, client_count="
                            f"{self.client_count})")
        if problems:
            raise FormatError(path, "; ".join(problems))

    def _release_problems(self) -> list[str]:
        """Return how ``release`` contradicts itself or the width (K for bottleneck:K, k for scores/label)."""
        try:
            point = parse_release(self.release)
        except ValueError as error:
            return [f"attribute 'release' is malformed ({error})"]
        if point.is_flatten:
            return []
        width = point.width(self.features, self.num_classes)
        problems = []
        if self.features != width:
            problems.append(f"attribute 'features' ({self.features}) differs from the width {width} of release "
                            f"{self.release!r}")
        if self.feature_format != FLOAT32:
            problems.append(f"release {self.release!r} is stored as {FLOAT32!r}, not {self.feature_format!r}")
        return problems


_RECORD_READERS: dict[str, Callable[[Any], Any]] = {
    "privacy_report": lambda value: PrivacyReport.from_dict(value, ignore_unknown=True),
    "label_release": LabelRelease.from_json,
    "release_guarantee": ReleaseGuarantee.from_dict,
    "clamped_values": ClampedValues.from_dict,
}
"""The JSON attributes that are typed records: each read once, here, by its record's one reader."""


def _read_record(name: str, value: Any, path: str | os.PathLike[str]) -> Any:
    """Read the JSON object of a typed attribute into its record (``FormatError`` naming the attribute)."""
    if not isinstance(value, Mapping):
        raise FormatError(path, f"attribute {name!r} is not a JSON object")
    try:
        return _RECORD_READERS[name](value)
    except ValueError as error:
        raise FormatError(path, f"attribute {name!r} is malformed ({error})") from None


def _record_json(value: PrivacyReport | LabelRelease | ReleaseGuarantee | ClampedValues) -> dict[str, Any]:
    """Return a typed attribute's JSON form (its record's one writer)."""
    return value.to_json() if isinstance(value, LabelRelease) else value.to_dict()


def _supported_version(version: Any) -> bool:
    try:
        return _scalar_int(version) in SUPPORTED_SCHEMA_VERSIONS
    except (TypeError, ValueError, OverflowError):
        return False


def _describe(value: Any) -> str:
    """Return ``value`` on one short line: an array by its shape and dtype, anything else by its repr."""
    if isinstance(value, np.ndarray) and value.shape != ():
        return f"an array of shape {value.shape} ({value.dtype})"
    if isinstance(value, np.generic | np.ndarray):
        value = value.item()
    return " ".join(repr(value).split())[:80]


def _scalar_int(value: Any) -> int:
    """Return an integer attribute's value; an array, a boolean, a string or a non-integral number is refused.

    Raises
    ------
    TypeError
        Not a scalar integer (the message describes the value on one line).
    """
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer | float | np.floating):
        raise TypeError(f"{_describe(value)} is not an integer")
    if isinstance(value, float | np.floating) and not float(value).is_integer():
        raise TypeError(f"{_describe(value)} is not an integer")
    return int(value)


def _float_or_nan(value: Any) -> float:
    if value is None:
        return math.nan
    if value == "inf":
        return math.inf
    return float(value)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value.item())
    return "" if value is None else str(value)


def compare_metadata(items: list[tuple[str, ClientMetadata]]) -> list[str]:
    """Return human-readable mismatches among the clients of one run (empty when they agree).

    Parameters
    ----------
    items : list of (str, ClientMetadata)
        Each client's file name and metadata; the first is the reference.
    """
    problems: list[str] = []
    if not items:
        return problems
    first_name, first = items[0]
    for name, meta in items[1:]:
        for attr in RUN_CONSISTENT_ATTRIBUTES:
            a, b = getattr(first, attr), getattr(meta, attr)
            if a != b:
                problems.append(f"attribute {attr!r} differs: {first_name} has {a!r}, {name} has {b!r}")
    return problems
