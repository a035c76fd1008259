"""What every mechanism shares: declared parameters, declared abilities, validation at construction, a report.

A mechanism is a frozen dataclass. Its fields are its parameters; each field's metadata carries the
help text and CLI flags, so the registry and the CLI are built from one source.

Its abilities are declared on the class, not found with ``hasattr``:

* ``FEATURE_FORMAT``: how stage 1 stores its output (``packed-bits``: over the fixed-point bits of
  LDPFL eq. 14; ``float32``: over the real features);
* ``RANDOMIZES``: False for the non-private identity (``none``);
* ``RECORD_PARAMETER``: the parameter that holds the values per record (r for bit mechanisms, d for
  real ones), set by the caller rather than the user;
* ``FEDERATION``: how stage 2 perturbs a client's upload with it (a :class:`FederationWiring`), or None
  when it is not a model perturbation;
* methods with a neutral default: :meth:`Mechanism.fixed_point_encoding`, :meth:`Mechanism.noise_scale`,
  :meth:`Mechanism.expected_density`, :meth:`Mechanism.output_values`,
  :meth:`Mechanism.output_range`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from .encoding import FixedPointEncoding
from .report import PrivacyReport

PACKED_BITS = "packed-bits"
FLOAT32 = "float32"
FEATURE_FORMATS = (PACKED_BITS, FLOAT32)

PARAMETERS = "parameters"
UPDATE = "update"
FEDERATION_TARGETS = (PARAMETERS, UPDATE)


def param(default: Any, help: str, *flags: str) -> Any:
    """Declare a mechanism parameter with its help text and optional short CLI flags."""
    return field(default=default, metadata={"help": help, "flags": flags})


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter, as the CLI and ``ldpfl mechanisms`` show it."""

    name: str
    type: type
    default: Any
    help: str
    flags: tuple[str, ...]

    @property
    def option(self) -> str:
        """The long CLI flag of the parameter (``--safe-range-length``)."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class FederationWiring:
    """How stage 2 uses a real mechanism to perturb each client's upload.

    Declared by the mechanism class (``FEDERATION``) next to its registration, so a new real mechanism
    reaches federation without a change in stage 2.

    Parameters
    ----------
    target : str
        What it perturbs by default: ``parameters`` (the local model) or ``update`` (local − global).
    summary : str
        One line for ``--perturbation``'s help.
    options : mapping of str to str
        The federation options it takes (keys of stage 2's ``FEDERATION_OPTIONS``, which refuses any other name
        when it reads the wiring: ``ldpfl.stage2_federate.options``), each mapped to the constructor
        parameter that receives it, e.g. ``{"sensitivity": "l2_sensitivity"}``. ``delta`` may be given as
        ``"1/n"``: δ_i = 1/|D_i| per client (WU 3.1). Any other option given is refused.
    budget : bool
        Whether each client's ε_i reaches the constructor as ``epsilon`` and the model size d as ``dim``.
    ranges : tuple of (str, str), optional
        The constructor parameters that receive each client's safe-range length L_i and centre c_i
        (PLDP-FL's τ_i); None: per-client ranges are refused.
    rounds : str, optional
        The constructor parameter that receives R, the number of federation rounds (its σ depends on R;
        a run resumed with another R is refused).
    sign_aggregation : bool
        Uploads are signs: the server aggregates the sign of the strategy's combination (WU eqs. 10,
        13, 16) and the target follows the sign mode (``update``: W ← W + η_s·sign(·); ``literal``:
        the parameters, W ← sign(·)).
    """

    target: str
    summary: str
    options: Mapping[str, str] = field(default_factory=dict)
    budget: bool = True
    ranges: tuple[str, str] | None = None
    rounds: str | None = None
    sign_aggregation: bool = False

    def __post_init__(self) -> None:
        """Check the target; freeze the option map (stage 2 checks the option names it knows)."""
        if self.target not in FEDERATION_TARGETS:
            raise ValueError(f"federation target must be one of {', '.join(FEDERATION_TARGETS)}, got {self.target!r}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def constructor_parameters(self) -> tuple[str, ...]:
        """Return every constructor parameter the wiring fills (to check against the mechanism's fields)."""
        names = list(self.options.values())
        if self.budget:
            names += ["epsilon", "dim"]
        if self.ranges is not None:
            names += list(self.ranges)
        if self.rounds is not None:
            names.append(self.rounds)
        return tuple(names)


_TYPES = {"float": float, "int": int, "str": str, "float | None": float, "int | None": int}


@dataclass(frozen=True)
class Mechanism:
    """Base class. Subclasses set NAME, SOURCE, SUMMARY, DOMAIN ('bits', 'real' or 'any') and FEATURE_FORMAT."""

    NAME: ClassVar[str] = ""
    SOURCE: ClassVar[str] = ""
    DOMAIN: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    FEATURE_FORMAT: ClassVar[str] = ""
    RANDOMIZES: ClassVar[bool] = True
    RECORD_PARAMETER: ClassVar[str | None] = None
    FEDERATION: ClassVar[FederationWiring | None] = None

    @classmethod
    def parameter_specs(cls) -> list[ParamSpec]:
        """Describe the declared parameters, in field order."""
        return [
            ParamSpec(f.name, _TYPES.get(str(f.type), str), f.default, f.metadata.get("help", ""),
                      tuple(f.metadata.get("flags", ())))
            for f in dataclasses.fields(cls)
        ]

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        """Return the constructor parameters' names, in field order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def encodes_bits(cls) -> bool:
        """Tell whether stage 1 encodes the features into fixed-point bits before this mechanism."""
        return cls.FEATURE_FORMAT == PACKED_BITS

    def parameters(self) -> dict[str, Any]:
        """Return every parameter's value, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def record_size(self) -> int | None:
        """Return the values per record (r or d) when the mechanism knows it, else None."""
        return None if self.RECORD_PARAMETER is None else getattr(self, self.RECORD_PARAMETER)

    def fixed_point_encoding(self) -> FixedPointEncoding | None:
        """Return the encoding the mechanism fixes itself (bit mechanisms: m, n); None when the caller chooses."""
        return None

    def noise_scale(self) -> float | None:
        """Return σ_i, its noise scale for WU eqs. 11 and 14 (ρ_i = 1/σ_i); None when it adds no noise."""
        return None

    def expected_density(self, input_density: np.ndarray) -> np.ndarray | None:
        """Return the expected density of 1s per output bit given the input's; None for real-valued mechanisms."""
        return None

    def output_values(self) -> tuple[float, ...] | None:
        """Return the finite set of values it outputs (PDPM's three), or None when they are not a small set."""
        return None

    def output_range(self) -> tuple[float, float] | None:
        """Return [low, high], the interval holding every value it outputs, or None when its outputs are unbounded.

        Defaults to the extremes of :meth:`output_values`; a bounded mechanism whose outputs are not a small set
        (Piecewise, Hybrid) declares its own. ``gather`` and ``federate`` refuse a float32 file holding a value
        outside it (``contract.file_checks.feature_value_problem``).
        """
        values = self.output_values()
        return None if values is None else (float(min(values)), float(max(values)))

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        """Randomize a batch-first array ``x`` with draws from ``rng``; shape and dtype are kept."""
        raise NotImplementedError

    def report(self) -> PrivacyReport:  # pragma: no cover
        """Report what the mechanism, with these parameters, guarantees."""
        raise NotImplementedError


def require_generator(rng: Any) -> np.random.Generator:
    """Every draw needs an explicit Generator; refuse global state and bare seeds."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (see mechanisms.make_randomness), got {type(rng).__name__}"
        )
    return rng
