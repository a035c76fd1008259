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


LONGEST_FILES = (  # measured: 1.5-6 minutes each (`--durations=0`), mostly Flower's round floor, longest first
    "e2e/test_flower_engine.py", "hardening/test_faulty_silo.py", "e2e/test_flower_superlink.py",
    "e2e/test_dp_extractor.py", "e2e/test_flower_superlink_files.py", "e2e/test_keras_backends.py",
    "e2e/test_demo.py", "e2e/test_ray_export.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the longest files first, so that ``-n 4 --dist loadfile --no-loadscope-reorder`` starts them at once
    and the short files fill in around them (longest-first scheduling). xdist's own order (files with the most
    tests first) sent these few-test files last, where one ran alone at the end."""
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((j for j, name in enumerate(LONGEST_FILES) if path.endswith(name)), len(LONGEST_FILES))

    items.sort(key=rank)  # stable: every other order is kept
