"""What every mechanism shares: declared parameters, validation at construction, a report.

A mechanism is a frozen dataclass. Its fields are its parameters; each field's metadata carries the
help text and CLI flags, so the registry and the CLI are built from one source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .report import PrivacyReport


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
        return "--" + self.name.replace("_", "-")


_TYPES = {"float": float, "int": int, "str": str, "float | None": float, "int | None": int}


@dataclass(frozen=True)
class Mechanism:
    """Base class. Subclasses set NAME, SOURCE and DOMAIN ('bits', 'real' or 'any')."""

    NAME: ClassVar[str] = ""
    SOURCE: ClassVar[str] = ""
    DOMAIN: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""

    @classmethod
    def parameter_specs(cls) -> list[ParamSpec]:
        return [
            ParamSpec(f.name, _TYPES.get(str(f.type), str), f.default, f.metadata.get("help", ""),
                      tuple(f.metadata.get("flags", ())))
            for f in dataclasses.fields(cls)
        ]

    def parameters(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def report(self) -> PrivacyReport:  # pragma: no cover
        raise NotImplementedError


def require_generator(rng: Any) -> np.random.Generator:
    """Every draw needs an explicit Generator; refuse global state and bare seeds."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (see mechanisms.make_randomness), got {type(rng).__name__}"
        )
    return rng
