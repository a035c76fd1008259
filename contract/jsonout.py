"""JSON output: JSON-safe copies of results, the refusal of seed keys, and the CLI's ``--json`` printer.

numpy only (and click for :func:`echo_json`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def json_ready(value: Any) -> Any:
    """Return a JSON-safe copy of ``value``.

    numpy scalars and arrays become Python numbers and lists, NaN becomes ``None``, ±inf becomes
    ``"inf"``/``"-inf"``, a ``Path`` becomes its string; mappings and sequences are copied recursively.
    """
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return json_ready(value.item())
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    if isinstance(value, Path):
        return str(value)
    return value


def json_default(value: Any) -> Any:
    """Return a JSON-encodable stand-in for ``value`` (the ``default`` of ``json.dumps`` in file attributes)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def _keys(payload: Any) -> Iterator[str]:
    if isinstance(payload, Mapping):
        for key, value in payload.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(payload, list | tuple):
        for value in payload:
            yield from _keys(value)


def refuse_seed_keys(payload: Any, where: str) -> None:
    """Raise ``ValueError`` when any key of ``payload`` (at any depth) names a seed.

    Seeds are never written to outputs; only the randomness mode (``csprng`` or ``seeded``) is.

    Parameters
    ----------
    payload : Any
        Mappings and sequences to search.
    where : str
        What is being written, for the message.
    """
    for key in _keys(payload):
        if "seed" in key.lower():
            raise ValueError(f"{where} must not contain a seed (found key {key!r}): seeds are never written to "
                             "outputs, only the randomness mode")


def echo_json(payload: object) -> None:
    """Print ``payload`` as indented JSON with sorted keys (the ``--json`` output of every command)."""
    import click

    click.echo(json.dumps(payload, indent=2, sort_keys=True, default=str))
