"""The one registry of mechanisms: each name comes from exactly one module.

Later stages pick mechanisms with ``--mechanism NAME`` (stage 1) and ``--perturbation NAME`` (stage 2,
the mechanisms that declare ``FEDERATION``); the CLI's choices are these keys.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ldpfl.common.registry import Registry

from .base import FEATURE_FORMATS, Mechanism

M = TypeVar("M", bound=type[Mechanism])

MECHANISMS: Registry[type[Mechanism]] = Registry("mechanism")


def register(cls: M) -> M:
    """Class decorator: add a mechanism under its ``NAME``; a second registration of a name fails.

    The class's declarations are checked here: a known ``FEATURE_FORMAT``, and a ``FEDERATION`` wiring
    whose constructor parameters are fields of the class.
    """
    if not cls.NAME:
        raise ValueError(f"{cls.__name__} has no NAME")
    if cls.FEATURE_FORMAT not in FEATURE_FORMATS:
        raise ValueError(f"mechanism {cls.NAME!r} declares FEATURE_FORMAT {cls.FEATURE_FORMAT!r}; "
                         f"it must be one of {', '.join(FEATURE_FORMATS)}")
    if cls.RECORD_PARAMETER is not None and cls.RECORD_PARAMETER not in cls.parameter_names():
        raise ValueError(f"mechanism {cls.NAME!r} declares RECORD_PARAMETER {cls.RECORD_PARAMETER!r}, "
                         "which is not one of its parameters")
    if cls.FEDERATION is not None:
        missing = sorted(set(cls.FEDERATION.constructor_parameters()) - set(cls.parameter_names()))
        if missing:
            raise ValueError(f"mechanism {cls.NAME!r}: its FEDERATION wiring fills {', '.join(missing)}, "
                             "which are not among its parameters")
    MECHANISMS.add(cls.NAME, cls)
    return cls


def unregister(name: str) -> type[Mechanism]:
    """Remove mechanism ``name`` (for tests that register a mechanism of their own) and return its class."""
    return MECHANISMS.remove(name)


def mechanism_names(domain: str | None = None) -> list[str]:
    """Return the registered names, sorted, optionally only those whose DOMAIN is ``domain`` (or 'any')."""
    return sorted(n for n, c in MECHANISMS.items() if domain is None or c.DOMAIN in (domain, "any"))


def federation_names() -> list[str]:
    """Return the mechanisms that declare a federation wiring (stage 2's perturbation choices), sorted.

    Those without a budget (``none``, the default: no model perturbation) come first.
    """
    wired = {n: c.FEDERATION for n, c in MECHANISMS.items() if c.FEDERATION is not None}
    return sorted(wired, key=lambda n: (wired[n].budget, n))


def mechanism_class(name: str) -> type[Mechanism]:
    """Return the class registered as ``name``; an unknown name lists the valid ones."""
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; valid names: {', '.join(mechanism_names())}")
    return MECHANISMS.get(name)


def create_mechanism(name: str, **parameters: Any) -> Any:
    """Build mechanism ``name`` with ``parameters``; unknown parameters raise ``ValueError``."""
    cls = mechanism_class(name)
    known = cls.parameter_names()
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ValueError(
            f"mechanism {name!r} takes no parameter {', '.join(unknown)}; its parameters: {', '.join(known) or 'none'}"
        )
    return cls(**parameters)
