"""``ldpfl.api.mechanism_reports``: the registered mechanisms and the privacy report of one (``ldpfl mechanisms``).

:func:`mechanism_listing` describes every registered mechanism and its parameters; :func:`mechanism_report`
builds one with the parameters given and returns its privacy report, refusing a parameter it does not take.
Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

from typing import Any

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError


def mechanism_listing() -> list[dict[str, Any]]:
    """Return each registered mechanism (name, domain, source, summary) with its parameters, JSON-ready."""
    rows = []
    for name in mech.mechanism_names():
        cls = mech.mechanism_class(name)
        rows.append({
            "name": name, "domain": cls.DOMAIN, "source": cls.SOURCE, "summary": cls.SUMMARY,
            "parameters": [
                {"name": s.name, "option": s.option, "flags": list(s.flags), "type": s.type.__name__,
                 "default": s.default, "help": s.help}
                for s in cls.parameter_specs()
            ],
        })
    return rows


def check_parameters(name: str, parameters: dict[str, object]) -> None:
    """Refuse the parameters that mechanism ``name`` does not take, naming them and those it takes.

    Raises
    ------
    ParameterError
        An unknown mechanism (``ValueError``), or parameters it does not take.
    """
    accepted = mech.mechanism_class(name).parameter_names()
    refused = [k for k in parameters if k not in accepted]
    if refused:
        raise ParameterError(f"{', '.join(f'`{k}`' for k in refused)} does not apply to mechanism {name!r}; it "
                             f"takes: {', '.join(f'`{k}`' for k in accepted) or 'no options'}")


def mechanism_report(name: str, **parameters: object) -> mech.PrivacyReport:
    """Return the privacy report of mechanism ``name`` built with ``parameters`` (its defaults for the rest).

    Raises
    ------
    ParameterError
        A parameter the mechanism does not take (:func:`check_parameters`), or values whose report overflows.
    ValueError
        A value the mechanism refuses (its message quotes the value and the range).
    """
    check_parameters(name, parameters)
    try:
        return mech.create_mechanism(name, **parameters).report()
    except OverflowError:  # e.g. e^epsilon for epsilon > 709: a usage error, not a crash
        raise ParameterError(f"numeric overflow computing the report of {name!r} with {parameters}; "
                             "use smaller values") from None


__all__ = ["check_parameters", "mechanism_listing", "mechanism_report"]
