"""Issue 31, files: a silo that rewrites its own file (and its manifest digest) with values its mechanism cannot
output is refused by ``gather`` and ``federate`` with one line naming the file.

What a release declares: a float mechanism's ``output_values`` (Duchi's ±B, PDPM's three, LDPSign's ±1) or
``output_range`` (Piecewise's and Hybrid's grid extremes); packed bits leave the padding after a row's r·l bits
at 0. The contract is checked over every registered float mechanism: its own outputs pass, a value beyond what it
declares does not.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import one_error_line, run
from federate_files import write_run as write_packed_run
from inspect_files import FEATURES, write_run

from ldpfl import mechanisms as mech
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.file_checks import feature_value_problem, float_value_problem, padding_problem
from ldpfl.contract.manifest import read_manifest, write_manifest

FLOAT_MECHANISMS = [n for n in mech.mechanism_names() if mech.mechanism_class(n).FEATURE_FORMAT == mech.FLOAT32
                    and mech.mechanism_class(n).DOMAIN in ("bounded", "real")]
BOUNDED = {"piecewise": {"epsilon": 2.0}, "hybrid": {"epsilon": 2.0}, "duchi": {"epsilon": 2.0},
           "pdpm": {"epsilon": 1.0, "safe_range_length": 2.0, "center": 0.5}}


def build(name: str) -> mech.Mechanism:
    cls = mech.mechanism_class(name)
    params = dict(BOUNDED.get(name, {}))
    params[cls.RECORD_PARAMETER or "dim"] = FEATURES
    return mech.create_mechanism(name, **params)


def outputs(m: mech.Mechanism, rows: int = 400) -> np.ndarray:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.5, 1.5, size=(rows, FEATURES)).astype(np.float32)
    return np.asarray(m.randomize(x, rng=rng)).astype(np.float32)


@pytest.mark.parametrize("name", FLOAT_MECHANISMS)
def test_every_float_mechanisms_own_outputs_pass_and_a_forged_value_does_not(name) -> None:
    m = build(name)
    out = outputs(m)
    assert float_value_problem(out, m) is None
    nan = out.copy()
    nan[7, 3] = np.nan
    assert float_value_problem(nan, m) == (7, 3, "is not finite; a float feature file must hold finite values only")
    if m.output_range() is None:  # unbounded noise (Gaussian): any finite value is a possible output
        assert m.output_values() is None
        return
    low, high = (np.float32(v) for v in m.output_range())
    assert out.min() >= low and out.max() <= high
    for forged in (np.float32(1e30), np.nextafter(high, np.float32(np.inf)), np.nextafter(low, np.float32(-np.inf))):
        spoiled = out.copy()
        spoiled[11, 5] = forged
        row, column, why = float_value_problem(spoiled, m)
        assert (row, column) == (11, 5) and repr(m.NAME) in why


@pytest.mark.parametrize("name", ["duchi", "pdpm", "ldpsign"])
def test_a_value_inside_the_range_but_not_in_the_alphabet_is_refused(name) -> None:
    m = build(name)
    values = np.asarray(m.output_values(), dtype=np.float32)
    spoiled = outputs(m)
    spoiled[2, 1] = np.float32((values.min() + values.max()) / 2 + 1e-3)  # between the outputs
    row, column, why = float_value_problem(spoiled, m)
    assert (row, column) == (2, 1) and "is not one of the values" in why


def test_the_declared_ranges_are_the_mechanisms_own_extremes() -> None:
    piecewise, hybrid = build("piecewise"), build("hybrid")
    assert piecewise.output_range() == (-piecewise.grid.half_range * piecewise.output_step,
                                        piecewise.grid.half_range * piecewise.output_step)
    assert hybrid.output_range()[1] >= hybrid.duchi_bound * hybrid.scale
    duchi = build("duchi")
    assert duchi.output_range() == (-duchi.output_bound, duchi.output_bound)
    assert build("gaussian").output_range() is None


def test_padding_bits_of_a_packed_row() -> None:
    block = np.packbits(np.ones((3, 42), dtype=np.uint8), axis=1)  # 42 bits: 6 bytes, 6 padding bits at 0
    assert padding_problem(block, 42) is None and padding_problem(block, 48) is None
    block[2, -1] |= 1
    assert padding_problem(block, 42) == 2
    assert padding_problem(block, 47) == 2 and padding_problem(block, 48) is None


def tamper(run_dir: Path, client: int, change) -> None:
    """Rewrite client ``client``'s train features with ``change`` (in place, checksums recomputed by h5py) and its
    manifest digest, as a silo controlling its own file would."""
    path = run_dir / f"client_{client:03d}.h5"
    with h5py.File(path, "r+") as handle:
        features = handle["train"]["features"]
        values = features[()]
        change(values)
        features[...] = values
    manifest = read_manifest(run_dir)
    files = [dataclasses.replace(r, sha256=sha256_file(path), bytes=path.stat().st_size)
             if r.client_index == client else r for r in manifest.files]
    write_manifest(run_dir, files, manifest.info)


def refusals(run_dir: Path, tmp_path: Path) -> list[str]:
    """The one error line of ``federate`` and of ``gather`` on ``run_dir``."""
    return [one_error_line(run("federate", run_dir, "--out", tmp_path / "f", "--rounds", "1")),
            one_error_line(run("gather", run_dir, "--out", tmp_path / "g"))]


@pytest.fixture(scope="module")
def piecewise_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("pw") / "run"
    write_run(run_dir, mechanism="piecewise", clients=2, params={"epsilon": 2.0, "dim": FEATURES},
              feature_format=mech.FLOAT32, rows=(40, 20))
    return run_dir


def test_an_honest_float_release_passes_the_value_check(piecewise_run) -> None:
    for path in sorted(piecewise_run.glob("client_*.h5")):
        assert feature_value_problem(path) is None


def test_a_float_column_rewritten_to_1e30_is_refused_naming_the_file(piecewise_run, tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for path in piecewise_run.iterdir():
        (run_dir / path.name).write_bytes(path.read_bytes())

    def column_at_1e30(values: np.ndarray) -> None:
        values[:, 4] = np.float32(1e30)

    tamper(run_dir, 1, column_at_1e30)
    for line in refusals(run_dir, tmp_path):
        assert "client_001.h5" in line and "1e+30" in line and "output range" in line and "'piecewise'" in line
        assert "row 0, feature 4" in line


def test_a_pdpm_value_off_its_three_outputs_is_refused(tmp_path) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, mechanism="pdpm", clients=2, rows=(40, 20))

    def off_alphabet(values: np.ndarray) -> None:
        values[3, 0] = np.float32(0.123)

    tamper(run_dir, 0, off_alphabet)
    for line in refusals(run_dir, tmp_path):
        assert "client_000.h5" in line and "0.123" in line and "is not one of the values" in line


def test_a_packed_file_with_padding_bits_set_is_refused(tmp_path) -> None:
    run_dir = write_packed_run(tmp_path / "run", clients=2, rows=16, features=7)  # 42 bits: 6 padding bits

    def set_padding(values: np.ndarray) -> None:
        values[5, -1] |= 1

    tamper(run_dir, 1, set_padding)
    for line in refusals(run_dir, tmp_path):
        assert "client_001.h5" in line and "row 5" in line and "padding bits" in line
