"""JSON-safe copies of results (shared by ``inspect`` and ``federate`` outputs; numpy only)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def json_ready(value: Any) -> Any:
    """Numbers and containers made JSON-safe: numpy to Python, NaN to null, ±inf to "inf"/"-inf"."""
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
