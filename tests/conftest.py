"""Shared test helpers: small mechanisms and inputs that fit their domain."""

from __future__ import annotations

import numpy as np
import pytest
from federate_files import write_run
from flower_helpers import flower_fixture, marked_fixture  # noqa: F401 - the fixtures `flower`, `marked`, for every test

from ldpfl import mechanisms as mech

SMALL_FEATURES = 8  # bit mechanisms: r = 8 values, r·l = 80 bits per record


@pytest.fixture
def small_mechanism():
    """Build mechanism ``name`` with its defaults (bit mechanisms with r = 8 features)."""

    def build(name: str, **params):
        if mech.mechanism_class(name).DOMAIN == "bits":
            params.setdefault("features", SMALL_FEATURES)
        return mech.create_mechanism(name, **params)

    return build


@pytest.fixture
def sample_input():
    """A seeded batch for mechanism ``m``: uint8 bits for bit mechanisms, one-hot float32 rows for categorical
    ones, float32 values otherwise."""

    def build(m, rows: int = 32) -> np.ndarray:
        rng = mech.default_rng(12345)
        if m.DOMAIN == "bits":
            return rng.integers(0, 2, size=(rows, m.width), dtype=np.uint8)
        if m.DOMAIN == "category":  # one-hot rows of width k (krr, oue-label)
            return np.eye(m.categories, dtype=np.float32)[rng.integers(0, m.categories, size=rows)]
        if m.DOMAIN == "bounded":  # rows of d values, partly outside the box to exercise the clipping
            return rng.normal(0.0, 2.0, size=(rows, m.dim)).astype(np.float32)
        return rng.normal(0.0, 2.0, size=(rows, 24)).astype(np.float32)

    return build


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory):
    """A run directory of 4 clients' packed-bit files (64 training rows, 8 features each; tests/federate_files.py)."""
    return write_run(tmp_path_factory.mktemp("packed"), clients=4, rows=64, features=8)
