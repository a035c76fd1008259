"""The one registry of mechanisms: each name comes from exactly one module.

Later stages pick mechanisms with ``--mechanism NAME``; the CLI's choices are these keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

M = TypeVar("M", bound=type)

_MECHANISMS: dict[str, type] = {}


def register(cls: M) -> M:
    """Class decorator: add a mechanism under its ``NAME``; a second registration of a name fails."""
    name = cls.NAME
    if not name:
        raise ValueError(f"{cls.__name__} has no NAME")
    if name in _MECHANISMS:
        raise ValueError(f"mechanism name {name!r} is already registered by {_MECHANISMS[name].__name__}")
    _MECHANISMS[name] = cls
    return cls


def mechanism_names(domain: str | None = None) -> list[str]:
    """Registered names, optionally only those whose DOMAIN is ``domain`` (or 'any')."""
    return sorted(n for n, c in _MECHANISMS.items() if domain is None or c.DOMAIN in (domain, "any"))


def mechanism_class(name: str) -> type:
    """The class registered as ``name``; an unknown name lists the valid ones."""
    try:
        return _MECHANISMS[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; valid names: {', '.join(mechanism_names())}") from None


def create_mechanism(name: str, **parameters: Any) -> Any:
    """Build mechanism ``name`` with ``parameters``; unknown parameters raise ``ValueError``."""
    cls = mechanism_class(name)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ValueError(
            f"mechanism {name!r} takes no parameter {', '.join(unknown)}; its parameters: {', '.join(known) or 'none'}"
        )
    return cls(**parameters)
