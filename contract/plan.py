"""The shared federation plan (``ldpfl-plan``): what every silo's export must agree on.

Silos that never see each other's data (issue 16) make their client files on separate machines. For the
files to federate, all of them must share the extractor and its input shape, the release point, the
encoding (m, n), the mechanism and its parameters, the class list (names and order) and the feature
file schema. One silo (or a coordinator) writes these into a small JSON file, ``plan.json``; every
silo exports with it (``ldpfl export --plan plan.json``), and the files carry its fingerprint.

The file::

    {
      "schema": "ldpfl-plan", "schema_version": 1,
      "dataset": "clinics",                     # the dataset name every file records
      "classes": ["benign", "malignant"],       # class k of every file is classes[k]
      "extractor": "mnist-cnn", "input_shape": [28, 28, 1],
      "release": "flatten",                     # where the features are taken (issue 17 adds others)
      "features": 1024,                         # r: values per record at the release point
      "mechanism": {"name": "uer", "parameters": {...}},   # as MechanismSpec.to_dict, with m and n
      "encoding": {"integer_bits": 4, "fraction_bits": 5}, # null for float32 mechanisms
      "feature_format": "packed-bits", "feature_width": 10240,
      "feature_schema_version": 2,
      "label_epsilon": 2.0,                     # optional: every silo releases its labels by k-RR at this ε
      "extractor_options": {"scatter_j": 2, "scatter_l": 8},  # optional: a weight-free extractor's options
      "fingerprint": "sha256:...",              # of everything above (optional on reading)
      "package_version": "0.1.0"                # who wrote it (optional, not fingerprinted)
    }

``encoding``, ``feature_format`` and ``feature_width`` follow from the mechanism and ``features``; they
are written for readers and checked on reading. The **fingerprint** is the sha256 of the canonical
JSON (sorted keys, no spaces, UTF-8) of every key but ``fingerprint`` and ``package_version``, so it
does not depend on formatting, key order or the writer's version, and two silos agree on it exactly
when they agree on the content. ``label_epsilon`` (issue 22) is written only when set, so plans with clear
labels keep their fingerprints; a silo must export with exactly the plan's value (or its absence). So is
``extractor_options`` (the ``scatter`` extractor's J and L), written only for an extractor that takes options.
Reading is strict: a missing, unknown or mistyped key is an error that
names the key (:class:`PlanError`, one line).

Imports mechanisms and contract only (no TensorFlow, no torch).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ldpfl.common.errors import ParameterError
from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.names import name_problem
from ldpfl.contract.schema import SCHEMA_VERSION, FormatError
from ldpfl.contract.small_files import MAX_SMALL_FILE_BYTES, SmallFileError, read_small_file
from ldpfl.contract.version import package_version
from ldpfl.mechanisms.spec import MechanismSpec

PLAN_SCHEMA = "ldpfl-plan"
PLAN_VERSION = 1
SUPPORTED_PLAN_VERSIONS = (1,)
PLAN_FILE = "plan.json"
"""The plan's usual file name (and its name inside a run directory)."""
DEFAULT_RELEASE = "flatten"
"""LDPFL Algorithm 1 line 6: the flatten-layer output is released."""
FINGERPRINT_PREFIX = "sha256:"
MAX_PLAN_BYTES = MAX_SMALL_FILE_BYTES

_REQUIRED_KEYS = ("schema", "schema_version", "dataset", "classes", "extractor", "input_shape", "release",
                  "features", "mechanism", "encoding", "feature_format", "feature_width", "feature_schema_version")
_OPTIONAL_KEYS = ("fingerprint", "package_version", "label_epsilon", "extractor_options")
_UNFINGERPRINTED = frozenset(("fingerprint", "package_version"))

SETTINGS = ("dataset", "classes", "num_classes", "extractor", "input_shape", "release", "features", "mechanism",
            "mechanism_parameters", "integer_bits", "fraction_bits", "feature_format", "feature_width",
            "feature_schema_version", "plan_fingerprint", "label_epsilon", "extractor_options")
"""The settings :func:`check_against_plan` compares. ``classes`` are the classes a silo holds (they must
all be among the plan's); ``mechanism_parameters`` is compared key by key (each key given must agree)."""


class PlanError(FormatError):
    """A plan file that cannot be read or does not match the ``ldpfl-plan`` schema; names the file and the key."""


class PlanMismatch(ParameterError):
    """Settings that contradict a plan; the message lists every contradiction, naming each setting.

    Settings are marked as ```epsilon``` (``ParameterError``), so the CLI can show them as its flags.

    Parameters
    ----------
    template : str
        The message with the setting names marked.
    contradictions : sequence of str
        One plain-text entry per contradiction.
    """

    def __init__(self, template: str, contradictions: Sequence[str] = ()) -> None:
        self.contradictions = tuple(contradictions)
        super().__init__(template)


@dataclass(frozen=True)
class SharedPlan:
    """What every silo of one federation must share (module docstring).

    Parameters
    ----------
    dataset : str
        The dataset name every client file records.
    classes : tuple of str
        The class names; label k of every file is ``classes[k]``.
    extractor : str
        A resolved extractor name (never ``auto``).
    input_shape : tuple of int
        One record's shape at the extractor's input.
    features : int
        r, the values per record at the release point.
    mechanism : MechanismSpec
        The mechanism with every parameter (and m, n) resolved; its ``features`` must be r (or unset).
    release : str
        The release point (``flatten``; issue 17 adds ``bottleneck:K``, ``scores``, ``label``).
    feature_schema_version : int
        The ``ldpfl-features`` schema version of the client files.
    label_epsilon : float, optional
        The nominal ε of every silo's k-RR of its labels (``ldpfl export --label-epsilon``); ``None``: clear.
    extractor_options : mapping
        A weight-free extractor's options (``scatter``: ``scatter_j``, ``scatter_l``); empty for the others.

    Raises
    ------
    ValueError
        A field of the wrong type or value; the message names it.
    """

    dataset: str
    classes: tuple[str, ...]
    extractor: str
    input_shape: tuple[int, ...]
    features: int
    mechanism: MechanismSpec
    release: str = DEFAULT_RELEASE
    feature_schema_version: int = SCHEMA_VERSION
    label_epsilon: float | None = None
    extractor_options: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Validate every field, naming the one that is wrong."""
        options = self.extractor_options
        if not isinstance(options, Mapping) or not all(isinstance(k, str) and _positive_int(v)
                                                       for k, v in options.items()):
            raise ValueError(f"plan extractor_options must map option names to integers >= 1, got {options!r}")
        object.__setattr__(self, "extractor_options", {k: int(v) for k, v in sorted(options.items())})
        for key in ("dataset", "extractor", "release"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value or value != value.strip() or "\n" in value:
                raise ValueError(f"plan {key} must be a non-empty one-line string, got {value!r}")
        problem = name_problem(self.dataset)  # it names the default run directory, runs/<dataset> (issue 24)
        if problem is not None:
            raise ValueError(f"plan dataset {self.dataset[:80]!r} {problem}")
        classes = self.classes
        if isinstance(classes, str) or not isinstance(classes, Sequence) \
                or not all(isinstance(c, str) and c for c in classes):
            raise ValueError(f"plan classes must be a list of non-empty strings, got {classes!r}")
        if len(set(classes)) != len(classes) or len(classes) < 2:
            raise ValueError(f"plan classes must name at least two distinct classes, got {list(classes)}")
        object.__setattr__(self, "classes", tuple(classes))
        shape = self.input_shape
        if not isinstance(shape, Sequence) or not shape or not all(_positive_int(s) for s in shape):
            raise ValueError(f"plan input_shape must be a non-empty list of integers >= 1, got {shape!r}")
        object.__setattr__(self, "input_shape", tuple(int(s) for s in shape))
        if not _positive_int(self.features):
            raise ValueError(f"plan features (r) must be an integer >= 1, got {self.features!r}")
        if not isinstance(self.mechanism, MechanismSpec):
            raise ValueError(f"plan mechanism must be a MechanismSpec, got {type(self.mechanism).__name__}")
        if self.mechanism.features is not None and self.mechanism.features != self.features:
            raise ValueError(f"plan mechanism {self.mechanism.name!r} is resolved for {self.mechanism.features} "
                             f"features, but features (r) = {self.features}")
        if self.label_epsilon is not None:
            if isinstance(self.label_epsilon, bool) or not isinstance(self.label_epsilon, int | float) \
                    or not math.isfinite(self.label_epsilon) or self.label_epsilon <= 0:
                raise ValueError(f"plan label_epsilon must be a finite number > 0, got {self.label_epsilon!r}")
            object.__setattr__(self, "label_epsilon", float(self.label_epsilon))
        if not _positive_int(self.feature_schema_version):
            raise ValueError(f"plan feature_schema_version must be an integer >= 1, got "
                             f"{self.feature_schema_version!r}")

    # -- what it implies --------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Return the number of classes."""
        return len(self.classes)

    @property
    def integer_bits(self) -> int:
        """Return m (0 for float32 mechanisms)."""
        return self.mechanism.integer_bits

    @property
    def fraction_bits(self) -> int:
        """Return n (0 for float32 mechanisms)."""
        return self.mechanism.fraction_bits

    @property
    def feature_format(self) -> str:
        """Return ``packed-bits`` or ``float32``."""
        return self.mechanism.feature_format

    @property
    def feature_width(self) -> int:
        """Return the model's input width: r·l bits (packed) or r floats."""
        if self.mechanism.encoding is not None:
            return self.features * self.mechanism.encoding.bits_per_value
        return self.features

    @property
    def fingerprint(self) -> str:
        """Return ``sha256:<hex>`` of the canonical JSON of the plan's content (module docstring)."""
        return fingerprint_of(self.content())

    # -- serialization ----------------------------------------------------------------------------------
    def content(self) -> dict[str, Any]:
        """Return every fingerprinted key as JSON-ready values."""
        encoding = self.mechanism.encoding
        return {
            "schema": PLAN_SCHEMA,
            "schema_version": PLAN_VERSION,
            "dataset": self.dataset,
            "classes": list(self.classes),
            "extractor": self.extractor,
            "input_shape": list(self.input_shape),
            "release": self.release,
            "features": self.features,
            "mechanism": {"name": self.mechanism.name,
                          "parameters": _json_values(self.mechanism.recorded_parameters())},
            "encoding": None if encoding is None else {"integer_bits": encoding.integer_bits,
                                                       "fraction_bits": encoding.fraction_bits},
            "feature_format": self.feature_format,
            "feature_width": self.feature_width,
            "feature_schema_version": self.feature_schema_version,
        } | ({} if self.label_epsilon is None else {"label_epsilon": self.label_epsilon}) \
            | ({"extractor_options": dict(self.extractor_options)} if self.extractor_options else {})

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object written to ``plan.json``: the content, its fingerprint and the writer's version."""
        content = self.content()
        return content | {"fingerprint": fingerprint_of(content), "package_version": package_version()}

    @classmethod
    def from_dict(cls, data: Any, source: str | os.PathLike[str] = "plan") -> SharedPlan:
        """Rebuild a plan from :meth:`to_dict`'s output, strictly.

        Parameters
        ----------
        data : Any
            The parsed JSON.
        source : path or str
            The file it came from, named in errors.

        Raises
        ------
        PlanError
            Not an object, another schema or version, a missing, unknown or mistyped key, derived keys
            that disagree with the rest, or a fingerprint that does not match the content.
        """
        if not isinstance(data, Mapping):
            raise PlanError(source, f"a plan must be a JSON object, got {type(data).__name__}")
        if data.get("schema") != PLAN_SCHEMA:
            raise PlanError(source, f"is not an ldpfl plan (key 'schema' is {data.get('schema')!r}, expected "
                                    f"{PLAN_SCHEMA!r})")
        version = data.get("schema_version")
        if version not in SUPPORTED_PLAN_VERSIONS or isinstance(version, bool):
            raise PlanError(source, f"key 'schema_version' is {version!r}; this ldpfl reads plan versions "
                                    f"{', '.join(map(str, SUPPORTED_PLAN_VERSIONS))}")
        unknown = sorted(str(k) for k in data if k not in _REQUIRED_KEYS and k not in _OPTIONAL_KEYS)
        if unknown:
            raise PlanError(source, f"unknown key {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)"
                                                                    if len(unknown) > 1 else ""))
        missing = [k for k in _REQUIRED_KEYS if k not in data]
        if missing:
            raise PlanError(source, f"missing key {missing[0]!r}")
        for key in ("dataset", "extractor", "release", "feature_format"):
            if not isinstance(data[key], str):
                raise PlanError(source, f"key {key!r} must be a string, got {data[key]!r}")
        for key in ("classes", "input_shape"):
            if not isinstance(data[key], list):
                raise PlanError(source, f"key {key!r} must be a list, got {data[key]!r}")
        for key in ("features", "feature_width", "feature_schema_version"):
            if not _positive_int(data[key]):
                raise PlanError(source, f"key {key!r} must be an integer >= 1, got {data[key]!r}")
        mechanism = data["mechanism"]
        if not isinstance(mechanism, Mapping) or set(mechanism) != {"name", "parameters"}:
            raise PlanError(source, f"key 'mechanism' must be an object with 'name' and 'parameters', got "
                                    f"{mechanism!r}")
        try:
            spec = MechanismSpec.from_dict({"name": mechanism["name"], "parameters": mechanism["parameters"],
                                            "features": data["features"]})
        except ValueError as error:
            raise PlanError(source, f"key 'mechanism': {error}") from None
        try:
            plan = cls(dataset=data["dataset"], classes=tuple(data["classes"]), extractor=data["extractor"],
                       input_shape=tuple(data["input_shape"]), features=data["features"], mechanism=spec,
                       release=data["release"], feature_schema_version=data["feature_schema_version"],
                       label_epsilon=data.get("label_epsilon"), extractor_options=data.get("extractor_options", {}))
        except ValueError as error:
            raise PlanError(source, str(error)) from None
        content = plan.content()
        for key in ("encoding", "feature_format", "feature_width", "mechanism"):
            if not _equal(data[key], content[key]):
                raise PlanError(source, f"key {key!r} = {json.dumps(data[key])} disagrees with the plan's other "
                                        f"keys, which give {json.dumps(content[key])}")
        if "package_version" in data and not isinstance(data["package_version"], str):
            raise PlanError(source, f"key 'package_version' must be a string, got {data['package_version']!r}")
        stated = data.get("fingerprint")
        if stated is not None and stated != plan.fingerprint:
            raise PlanError(source, f"key 'fingerprint' {stated!r} does not match the content "
                                    f"({plan.fingerprint}); the plan was changed after it was written: restore "
                                    "it, or delete the fingerprint key to accept the change")
        return plan

    # -- comparisons ------------------------------------------------------------------------------------
    def contradictions(self, settings: Mapping[str, Any]) -> list[str]:
        """Return one message per setting that contradicts the plan (see :func:`check_against_plan`)."""
        return [ParameterError(t).args[0] for t in self._templates(settings)]

    def require_agreement(self, settings: Mapping[str, Any], source: str | os.PathLike[str] = "the plan") -> None:
        """Raise :class:`PlanMismatch` listing every contradiction of ``settings`` with the plan.

        Parameters
        ----------
        settings : mapping
            As for :func:`check_against_plan`.
        source : path or str
            The plan file, named in the message.
        """
        templates = self._templates(settings)
        if templates:
            plain = [ParameterError(t).args[0] for t in templates]
            raise PlanMismatch(f"settings contradict {source}: " + "; ".join(templates), plain)

    def _templates(self, settings: Mapping[str, Any]) -> list[str]:
        unknown = [k for k in settings if k not in SETTINGS]
        if unknown:
            raise ValueError(f"unknown plan setting(s) {', '.join(map(repr, unknown))}; known: {', '.join(SETTINGS)}")
        expected: dict[str, Any] = {
            "dataset": self.dataset, "num_classes": self.num_classes, "extractor": self.extractor,
            "input_shape": list(self.input_shape), "release": self.release, "features": self.features,
            "mechanism": self.mechanism.name, "integer_bits": self.integer_bits,
            "fraction_bits": self.fraction_bits, "feature_format": self.feature_format,
            "feature_width": self.feature_width, "feature_schema_version": self.feature_schema_version,
            "plan_fingerprint": self.fingerprint, "label_epsilon": self.label_epsilon,
            "extractor_options": dict(self.extractor_options),
        }
        found = []
        for key, value in settings.items():
            if value is None:
                continue
            if key == "classes":
                if isinstance(value, str) or not isinstance(value, Sequence):
                    found.append(f"`classes` must be a list of names, got {value!r}")
                    continue
                extra = [str(c) for c in value if str(c) not in self.classes]
                if extra:
                    found.append(f"`classes` {', '.join(map(repr, extra))} not among the plan's classes "
                                 f"({', '.join(self.classes)})")
            elif key == "mechanism_parameters":
                if not isinstance(value, Mapping):
                    found.append(f"`mechanism_parameters` must be a mapping, got {value!r}")
                    continue
                planned = _json_values(self.mechanism.recorded_parameters())
                for name, given in value.items():
                    if name not in planned:
                        found.append(f"`{name}` = {given!r}, but the plan's mechanism {self.mechanism.name!r} "
                                     f"takes no {name}")
                    elif not _equal(given, planned[name]):
                        found.append(f"`{name}` = {given!r} contradicts the plan ({planned[name]!r})")
            elif not _equal(value, expected[key]):
                found.append(f"`{key}` = {_shown(value)} contradicts the plan ({_shown(expected[key])})")
        return found


def check_against_plan(plan: SharedPlan, settings: Mapping[str, Any]) -> list[str]:
    """Return the contradictions between ``settings`` and ``plan``, one message each, naming the setting.

    Parameters
    ----------
    plan : SharedPlan
        The shared plan.
    settings : mapping
        Setting name (one of ``SETTINGS``) to this silo's value; ``None`` values and absent keys are not
        checked. ``classes`` must all be among the plan's; ``mechanism_parameters`` (a mapping) is
        compared key by key; every other value must equal the plan's (lists and tuples alike).

    Returns
    -------
    list of str
        Empty when the settings agree with the plan.

    Raises
    ------
    ValueError
        A setting name that is not in ``SETTINGS`` (a programming error).
    """
    return plan.contradictions(settings)


def fingerprint_of(content: Mapping[str, Any]) -> str:
    """Return ``sha256:<hex>`` of the canonical JSON of ``content`` (without the unfingerprinted keys)."""
    kept = {k: v for k, v in content.items() if k not in _UNFINGERPRINTED}
    return FINGERPRINT_PREFIX + hashlib.sha256(_canonical(kept).encode("utf-8")).hexdigest()


def write_plan(plan: SharedPlan, path: str | os.PathLike[str]) -> Path:
    """Write ``plan`` to ``path`` as indented JSON, atomically and durably; return ``path``."""
    return atomic_write_text(path, json.dumps(plan.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_plan(path: str | os.PathLike[str]) -> SharedPlan:
    """Read and validate a plan file (strict, see :meth:`SharedPlan.from_dict`).

    Raises
    ------
    PlanError
        A missing, unreadable, oversized or invalid file; the one-line message names it and the key.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise PlanError(path, "plan file not found")
    try:
        raw = read_small_file(path, "plan", MAX_PLAN_BYTES)
    except SmallFileError as error:
        raise PlanError(path, str(error).removeprefix(f"{path}: ")) from None
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise PlanError(path, "is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise PlanError(path, f"is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except ValueError as error:
        raise PlanError(path, str(error)) from None
    return SharedPlan.from_dict(data, path)


# ---------------------------------------------------------------------------------------------------
# Helpers


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"holds {name}, which is not JSON")


def _json_values(value: Any) -> Any:
    """Return ``value`` with tuples as lists, numpy scalars as Python numbers and ±inf as ``"inf"``/``"-inf"``."""
    if isinstance(value, Mapping):
        return {str(k): _json_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_values(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalar
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _equal(a: Any, b: Any) -> bool:
    """Return whether two JSON-like values agree: numbers by value (4 == 4.0, never a bool), lists as tuples."""
    a, b = _json_values(a), _json_values(b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _canonical(value: Any) -> str:
    """Return the canonical JSON text: sorted keys, no spaces, UTF-8 kept, NaN refused."""
    return json.dumps(_json_values(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _shown(value: Any) -> str:
    return json.dumps(_json_values(value), ensure_ascii=False)


__all__ = ["DEFAULT_RELEASE", "PLAN_FILE", "PLAN_SCHEMA", "PLAN_VERSION",
           "SETTINGS", "PlanError", "PlanMismatch", "SharedPlan", "check_against_plan", "fingerprint_of",
           "read_plan", "write_plan"]
