"""Issue 42 item 6: values a release must clamp are counted per column; past MAX_CLAMPED_SHARE the export is
refused in one line naming the column, below it the count is written into a non-randomized file and shown by
inspect."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import ldpfl
from ldpfl import mechanisms as mech
from ldpfl.cli import cli
from ldpfl.common.errors import ParameterError
from ldpfl.contract.clamped import MAX_CLAMPED_SHARE, ClampedValues
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.schema import FormatError
from ldpfl.stage1_features.export.clamping import ClampCounter, clamp_interval
from ldpfl.stage1_features.export.write import ReleasePipeline

ROWS, COLUMNS = 40, 6


def pipeline(name: str, **params: object) -> ReleasePipeline:
    return ReleasePipeline.for_spec(mech.MechanismSpec.resolve(name, dict(params), features=COLUMNS))


@pytest.mark.parametrize(("name", "params", "interval"), [
    ("none", {"integer_bits": 1, "fraction_bits": 3}, (-1.875, 1.875)),  # 2^m - 2^-n, saturating
    ("uer", {"epsilon": 2.0, "integer_bits": 2, "fraction_bits": 2}, (-3.75, 3.75)),
    ("gaussian", {"epsilon": 1.0, "clip": 2.0}, (-2.0, 2.0)),
    ("pdpm", {"epsilon": 1.0, "safe_range_length": 2.0, "center": 0.5}, (-0.5, 1.5)),
    ("piecewise", {"epsilon": 1.0}, (-1.0, 1.0)),
    ("laplace", {"epsilon": 1.0, "clip": 3.0}, (-3.0, 3.0)),
])
def test_each_clamping_release_declares_its_interval(name, params, interval):
    assert clamp_interval(pipeline(name, **params)) == pytest.approx(interval)


def test_counts_per_column_and_the_refusal_names_the_column():
    counter = ClampCounter.for_pipeline(pipeline("none", integer_bits=1, fraction_bits=3))
    assert counter is not None
    x = np.zeros((ROWS, COLUMNS), dtype=np.float32)
    x[:3, 1] = -5.0  # 3 clamped values in column 1
    x[:, 4] = 1e30  # a whole column at 1e30
    x[0, 2] = 1.875  # the end itself is not clamped
    counter.add(x[:25])
    counter.add(x[25:])
    record = counter.record()
    assert (record.values, record.columns, record.worst_column, record.worst_count, record.rows) == (43, 2, 4, 40, 40)
    with pytest.raises(ParameterError) as error:
        counter.refuse_past_bound(client=3)
    message = str(error.value)
    assert "client 3: column 4 has 40 of its 40 values (100.0%) outside [-1.875, 1.875]" in message
    assert "integer_bits" in message and "\n" not in message
    below = ClampCounter.for_pipeline(pipeline("none", integer_bits=1, fraction_bits=3))
    assert below is not None
    x[: int(ROWS * MAX_CLAMPED_SHARE) + 1, 4] = 0.0  # just under the bound
    below.add(x)
    assert below.refuse_past_bound(client=3).worst_share <= MAX_CLAMPED_SHARE


def test_a_mechanisms_own_interval_is_counted_never_refused():
    counter = ClampCounter.for_pipeline(pipeline("piecewise", epsilon=1.0))
    assert counter is not None and counter.interval == (-1.0, 1.0)
    x = np.full((ROWS, COLUMNS), 3.0, dtype=np.float32)  # every value outside [-1, 1]
    counter.add(x)
    assert counter.refuse_past_bound(client=0).worst_share == 1.0


def test_the_record_reads_back_and_refuses_contradictions():
    record = ClampedValues(-1.0, 1.0, rows=10, values=4, columns=2, worst_column=5, worst_count=3)
    assert ClampedValues.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    for bad in ({**record.to_dict(), "worst_count": 11}, {**record.to_dict(), "columns": 0},
                {**record.to_dict(), "values": True}, {k: v for k, v in record.to_dict().items() if k != "low"}):
        with pytest.raises(ValueError, match="clamped_values"):
            ClampedValues.from_dict(bad)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A silo's CSV table of ROWS records, COLUMNS values in [0, 1] and a label; column 2 has 4 values at 9."""
    rng = np.random.default_rng(42)
    frame = pd.DataFrame(rng.random((ROWS, COLUMNS)), columns=[f"p{i}" for i in range(COLUMNS)])
    frame.loc[:3, "p2"] = 9.0
    frame["diagnosis"] = np.arange(ROWS) % 2
    path = tmp_path_factory.mktemp("silo") / "silo.csv"
    frame.to_csv(path, index=False)
    return path


def export_table(data: Path, out: Path, mechanism: str = "none", **params: object) -> object:
    return ldpfl.export(data=str(data), data_options={"label_column": "diagnosis", "scale": "none"}, extractor="none",
                        mechanism=mechanism, mechanism_params={"integer_bits": 1, "fraction_bits": 3, **params},
                        clients=1, seed=1, out=out)


def test_below_the_bound_the_count_is_in_the_file_and_inspect_shows_it(table, tmp_path):
    export_table(table, tmp_path / "run")
    path = tmp_path / "run" / client_file_name(0)
    clamped = read_client_file(path).metadata.clamped_values
    assert clamped == ClampedValues(-1.875, 1.875, ROWS, 4, 1, 2, 4)
    runner = CliRunner()
    shown = runner.invoke(cli, ["inspect", str(path)])
    assert "clamped     4 values in 1 columns clamped into [-1.875, 1.875]; worst column 2: 4 of 40 rows" in \
        shown.output
    found = json.loads(runner.invoke(cli, ["inspect", str(path), "--json"]).output)
    assert found["files"][0]["metadata"]["clamped_values"]["worst_count"] == 4
    assert not [f for f in found["files"][0]["flags"] if "clamp" in f]


def test_a_randomized_file_does_not_carry_the_count(table, tmp_path):
    export_table(table, tmp_path / "run", mechanism="uer", epsilon=4.0)
    assert read_client_file(tmp_path / "run" / client_file_name(0)).metadata.clamped_values is None


def test_past_the_bound_the_export_is_refused_in_one_line(table, tmp_path):
    poisoned = pd.read_csv(table)
    poisoned["p5"] = 1e30
    data = tmp_path / "poisoned.csv"
    poisoned.to_csv(data, index=False)
    result = CliRunner().invoke(cli, ["export", "--data", str(data), "--label-column", "diagnosis", "--scale", "none",
                                      "--extractor", "none", "--mechanism", "none", "-m", "1", "-n", "3",
                                      "--clients", "1", "--quiet", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("Error: client 0: column 5 has 40 of its 40 values")
    assert "--integer-bits" in lines[-1] and "Traceback" not in result.output
    assert not list((tmp_path / "run").glob("*.h5"))


def test_inspect_flags_a_forged_count_and_a_private_file_that_carries_one(table, tmp_path):
    export_table(table, tmp_path / "run")
    path = tmp_path / "run" / client_file_name(0)
    forged = ClampedValues(-1.875, 1.875, ROWS, 40, 1, 0, 40)
    with h5py.File(path, "r+") as handle:
        handle.attrs["clamped_values"] = json.dumps(forged.to_dict())
    flags = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output)["files"][0]["flags"]
    assert any("clamped_values" in f and "past the bound" in f for f in flags)
    with h5py.File(path, "r+") as handle:
        handle.attrs["clamped_values"] = json.dumps({**forged.to_dict(), "worst_count": 41})
    with pytest.raises(FormatError, match="attribute 'clamped_values' is malformed"):
        read_client_file(path)

    export_table(table, tmp_path / "private", mechanism="uer", epsilon=4.0)
    private = tmp_path / "private" / client_file_name(0)
    with h5py.File(private, "r+") as handle:
        handle.attrs["clamped_values"] = json.dumps(ClampedValues(-1.875, 1.875, ROWS, 4, 1, 2, 4).to_dict())
    flags = json.loads(CliRunner().invoke(cli, ["inspect", str(private), "--json"]).output)["files"][0]["flags"]
    assert any("clamped_values" in f and "guarantee" in f for f in flags)
