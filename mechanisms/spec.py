"""A mechanism and its parameters, resolved once into a frozen record that crosses the stages.

Stage 1 resolves the user's parameters into a :class:`MechanismSpec` (``MechanismSpec.resolve``), builds
the mechanism from it, writes ``to_dict()`` into every client file; stage 2 and ``ldpfl inspect`` read it
back with ``from_dict`` and get the same mechanism, encoding and report. As dp-accounting's
``dp_event.py``, the record describes the mechanism; nothing rebuilds it from loose dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .base import PACKED_BITS, Mechanism
from .encoding import FixedPointEncoding
from .registry import mechanism_class
from .report import PrivacyReport

ENCODING_KEYS = ("integer_bits", "fraction_bits")
_SPEC_KEYS = ("name", "parameters", "features")


def _int_or_none(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"mechanism spec key {key!r} must be an integer >= 1 or null, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class MechanismSpec:
    """A registered mechanism with every parameter resolved, its feature count and its encoding.

    Construction validates the whole record: the name is registered, every parameter is one of the
    mechanism's and the mechanism accepts its value, ``features`` agrees with the mechanism's record
    parameter (r or d), and ``encoding`` is present exactly when the mechanism works on fixed-point
    bits (and equals the mechanism's own m, n when it fixes them). Errors are ``ValueError`` naming
    the parameter.

    Parameters
    ----------
    name : str
        A registered mechanism (``ldpfl.mechanisms.mechanism_names()``).
    parameters : mapping
        The mechanism's own constructor parameters (all of them after construction).
    features : int, optional
        r (or d), the values per record; taken from the mechanism's record parameter when it has one.
    encoding : FixedPointEncoding, optional
        The fixed-point encoding of packed-bits formats (m, n of LDPFL eq. 14).
    """

    name: str
    parameters: Mapping[str, Any]
    features: int | None = None
    encoding: FixedPointEncoding | None = None
    _mechanism: Mechanism = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validate the record, build the mechanism once, and complete the parameters, features and encoding."""
        cls = mechanism_class(self.name)
        if not isinstance(self.parameters, Mapping):
            raise ValueError(f"mechanism parameters must be a mapping, got {type(self.parameters).__name__}")
        accepted = cls.parameter_names()
        unknown = [k for k in self.parameters if k not in accepted]
        if unknown:
            raise ValueError(f"mechanism {self.name!r} takes no parameter {unknown[0]!r}; it takes: "
                             f"{', '.join(accepted) or 'none'}")
        features = _int_or_none("features", self.features)
        try:
            mechanism = cls(**dict(self.parameters))
        except TypeError as error:  # a dataclass refusing its arguments
            raise ValueError(f"mechanism {self.name!r}: {error}") from None
        own_size = mechanism.record_size()
        if cls.RECORD_PARAMETER is not None and own_size is not None:
            if features is not None and features != own_size:
                raise ValueError(f"mechanism parameter {cls.RECORD_PARAMETER} = {own_size} differs from "
                                 f"features = {features}")
            features = own_size
        encoding = self.encoding
        own_encoding = mechanism.fixed_point_encoding()
        if not cls.encodes_bits():
            if encoding is not None:
                raise ValueError(f"mechanism {self.name!r} writes {cls.FEATURE_FORMAT} features and takes no "
                                 "fixed-point encoding (integer_bits, fraction_bits)")
        elif own_encoding is not None:
            if encoding is not None and encoding != own_encoding:
                raise ValueError(f"encoding (integer_bits, fraction_bits) = ({encoding.integer_bits}, "
                                 f"{encoding.fraction_bits}) differs from the mechanism's "
                                 f"({own_encoding.integer_bits}, {own_encoding.fraction_bits})")
            encoding = own_encoding
        elif encoding is None:
            raise ValueError(f"mechanism {self.name!r} writes {PACKED_BITS} features and needs a fixed-point "
                             "encoding (integer_bits, fraction_bits)")
        object.__setattr__(self, "parameters", MappingProxyType(mechanism.parameters()))
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "encoding", encoding)
        object.__setattr__(self, "_mechanism", mechanism)

    @classmethod
    def resolve(cls, name: str, params: Mapping[str, Any], *, features: int | None = None,
                defaults: Mapping[str, Any] | None = None) -> MechanismSpec:
        """Resolve user parameters for mechanism ``name`` over records of ``features`` values.

        Parameters
        ----------
        name : str
            A registered mechanism.
        params : mapping
            The mechanism's parameters, plus ``integer_bits`` / ``fraction_bits`` (m, n) for a
            packed-bits format. The record parameter (r or d) comes from ``features``, not from here.
        features : int, optional
            r, the values per record; set into the mechanism's record parameter.
        defaults : mapping, optional
            Shared defaults of the caller (stage 1's IV-D values). A key the mechanism does not take is
            dropped when its value equals the default here, and refused otherwise; m and n fall back to
            these for the encoding.

        Raises
        ------
        ValueError
            An unknown mechanism, a parameter it does not take (naming the parameter), a record
            parameter given in ``params``, or a value the mechanism refuses.
        """
        mech_cls = mechanism_class(name)
        defaults = dict(defaults or {})
        accepted = set(mech_cls.parameter_names())
        record = mech_cls.RECORD_PARAMETER
        if record is not None and record in params:
            raise ValueError(f"mechanism parameter {record!r} is set from the feature count"
                             f"{'' if features is None else f' (r = {features})'}; do not pass it")
        encodes = mech_cls.encodes_bits()
        kwargs: dict[str, Any] = {}
        encoding_args: dict[str, Any] = {}
        for key, value in params.items():
            if encodes and key in ENCODING_KEYS:
                encoding_args[key] = value
                if key in accepted:
                    kwargs[key] = value
            elif key in accepted:
                kwargs[key] = value
            elif key in defaults and value == defaults[key]:
                continue  # a shared default that this mechanism does not use
            else:
                takes = sorted(accepted - {record}) + ([] if not encodes or accepted >= set(ENCODING_KEYS)
                                                       else list(ENCODING_KEYS))
                raise ValueError(f"mechanism {name!r} takes no parameter {key!r} (= {value!r}); it takes: "
                                 f"{', '.join(takes) or 'none'}")
        if record is not None and features is not None:
            kwargs[record] = features
        encoding = None
        if encodes and not set(ENCODING_KEYS) <= accepted:
            m = encoding_args.get("integer_bits", defaults.get("integer_bits", FixedPointEncoding.integer_bits))
            n = encoding_args.get("fraction_bits", defaults.get("fraction_bits", FixedPointEncoding.fraction_bits))
            encoding = FixedPointEncoding(int(m), int(n))
        return cls(name, kwargs, features, encoding)

    def __hash__(self) -> int:
        """Hash the JSON form (the parameters mapping itself is not hashable)."""
        return hash(json.dumps(self.to_dict(), sort_keys=True, default=str))

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickle as :meth:`to_dict` (for export workers in other processes); unpickling validates again."""
        return (MechanismSpec.from_dict, (self.to_dict(),))

    # -- what it implies --------------------------------------------------------------------------------
    @property
    def mechanism_class(self) -> type[Mechanism]:
        """The registered class."""
        return type(self._mechanism)

    @property
    def feature_format(self) -> str:
        """``packed-bits`` or ``float32``: how stage 1 stores the mechanism's output."""
        return self._mechanism.FEATURE_FORMAT

    @property
    def encodes_bits(self) -> bool:
        """Whether the features are fixed-point encoded before the mechanism."""
        return self.encoding is not None

    @property
    def randomizes(self) -> bool:
        """False for the non-private identity."""
        return self._mechanism.RANDOMIZES

    @property
    def integer_bits(self) -> int:
        """m, or 0 without an encoding."""
        return self.encoding.integer_bits if self.encoding else 0

    @property
    def fraction_bits(self) -> int:
        """n, or 0 without an encoding."""
        return self.encoding.fraction_bits if self.encoding else 0

    @property
    def feature_width(self) -> int | None:
        """Stored values per record: r·l bits (packed) or r floats; None when r is unknown."""
        if self.features is None:
            return None
        return self.features * self.encoding.bits_per_value if self.encoding else self.features

    def recorded_parameters(self) -> dict[str, Any]:
        """Return the parameters written to the files: the mechanism's own, plus m and n with an encoding."""
        params = dict(self.parameters)
        if self.encoding is not None:
            params.update(integer_bits=self.encoding.integer_bits, fraction_bits=self.encoding.fraction_bits)
        return params

    def build(self) -> Any:
        """Return the mechanism instance (built and validated once; mechanisms are immutable)."""
        return self._mechanism

    def report(self) -> PrivacyReport:
        """Return the mechanism's privacy report."""
        return self._mechanism.report()

    # -- serialization ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return ``{"name", "parameters", "features"}``, JSON-ready; ``parameters`` as :meth:`recorded_parameters`."""
        return {"name": self.name, "parameters": self.recorded_parameters(), "features": self.features}

    @classmethod
    def from_dict(cls, data: Any) -> MechanismSpec:
        """Rebuild a spec from :meth:`to_dict`'s output, or from a file's mechanism name and parameters.

        Raises
        ------
        ValueError
            ``data`` is not a mapping, a key is missing, unknown or of the wrong type, or the parameters
            do not build the mechanism; the message names the key or the parameter.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a mechanism spec must be a JSON object, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in _SPEC_KEYS)
        if unknown:
            raise ValueError(f"mechanism spec has unknown key(s) {', '.join(map(repr, unknown))}")
        for key in ("name", "parameters"):
            if key not in data:
                raise ValueError(f"mechanism spec is missing key {key!r}")
        name, params = data["name"], data["parameters"]
        if not isinstance(name, str):
            raise ValueError(f"mechanism spec key 'name' must be a string, got {name!r}")
        if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
            raise ValueError(f"mechanism spec key 'parameters' must be an object with string keys, got {params!r}")
        features = _int_or_none("features", data.get("features"))
        mech_cls = mechanism_class(name)
        accepted = set(mech_cls.parameter_names())
        params = dict(params)
        encoding = None
        if mech_cls.encodes_bits():
            given = {k: params[k] for k in ENCODING_KEYS if k in params}
            for key in ENCODING_KEYS:
                if key not in accepted:
                    params.pop(key, None)
            if len(given) == len(ENCODING_KEYS):
                encoding = FixedPointEncoding(given["integer_bits"], given["fraction_bits"])
            elif given and not set(ENCODING_KEYS) <= accepted:
                missing = [k for k in ENCODING_KEYS if k not in given]
                raise ValueError(f"mechanism parameters give {', '.join(given)} but not {', '.join(missing)}")
        return cls(name, params, features, encoding)
