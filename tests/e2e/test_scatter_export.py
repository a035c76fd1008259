"""``ldpfl export --extractor scatter`` and ``--local-only``: files, guarantee, plan, refusals, stage-2 reading.

Small data throughout (MNIST-5k with ``--limit 300``, random images): each test takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import one_error_line
from cli_checks import run as invoke

import ldpfl
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.label_release import CLEAR_LABELS
from ldpfl.contract.release_guarantee import FIXED_TEXT, LOCAL_ONLY_SCOPE, ReleaseGuarantee
from ldpfl.contract.run_dir import validate_run
from ldpfl.stage1_features.datasets.loaders import load_dataset

SMALL = ["--dataset", "mnist5k", "--limit", "300", "--clients", "2", "--quiet", "--seed", "3"]


def guarantee_of(path: Path) -> ReleaseGuarantee:
    with h5py.File(path, "r") as handle:
        return ReleaseGuarantee.from_dict(json.loads(handle.attrs["release_guarantee"]))


def test_scatter_files_are_3969_wide_and_their_extractor_part_is_zero(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = invoke("export", *SMALL, "--extractor", "scatter", "--scatter-j", "2", "--scatter-l", "8", "--out", out,
                    "--json")
    assert result.exit_code == 0, result.output
    for name in ("client_000.h5", "client_001.h5"):
        meta = read_client_file(out / name).metadata
        assert (meta.extractor, meta.features, meta.feature_width) == ("scatter", 3969, 39690)  # UER over m=4, n=5
        assert meta.extractor_training is not None and meta.extractor_training["training"] == "none"
        fixed = meta.extractor_training["fixed"]
        assert (fixed["kind"], fixed["J"], fixed["L"], fixed["normalization"]["groups"]) == ("scattering2d", 2, 8, 27)
        (part,) = [p for p in guarantee_of(out / name).parts if p.kind == "extractor"]
        assert part.epsilon == 0.0 and FIXED_TEXT in part.covers
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extractor_options"] == {"scatter_j": 2, "scatter_l": 8}
    shown = invoke("inspect", out / "client_000.h5")
    assert shown.exit_code == 0 and FIXED_TEXT in shown.output and "scattering2d J=2 L=8" in shown.output


def test_the_api_with_other_j_and_l_and_a_real_mechanism(tmp_path: Path) -> None:
    result = ldpfl.export(dataset="mnist5k", clients=2, extractor="scatter", scatter_j=1, scatter_l=4, limit=200,
                          mechanism="pdpm", mechanism_params={"epsilon": 2.0, "safe_range_length": 2}, seed=1,
                          out=tmp_path / "api")
    # K = 1 + J·L = 5 maps of 14×14
    assert (result.extractor, result.features, result.feature_format) == ("scatter", 5 * 14 * 14, "float32")
    assert result.release_guarantee is not None and result.release_guarantee.epsilon == np.inf  # clear labels
    with pytest.raises(ldpfl.ParameterError, match="scatter_l"):
        ldpfl.export(dataset="mnist5k", extractor="none", scatter_l=4, out=tmp_path / "bad")


@pytest.mark.parametrize(("args", "fragments"), [
    (["--extractor", "scatter", "--scatter-j", "3"], ["--scatter-j = 3", "2^J = 8", "28×28"]),
    (["--extractor", "scatter", "--scatter-j", "0"], ["--scatter-j must be an integer in [1, 8]"]),
    (["--extractor", "scatter", "--scatter-l", "99"], ["--scatter-l"]),
    (["--extractor", "cifar-cnn", "--scatter-j", "1"], ["--scatter-j applies to --extractor scatter"]),
    (["--extractor", "scatter", "--local-only", "--mechanism", "uer"], ["--local-only", "--mechanism must be 'none'"]),
    (["--local-only", "--label-epsilon", "1"], ["--local-only", "--label-epsilon"]),
])
def test_bad_scatter_settings_are_refused_in_one_line(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    line = one_error_line(invoke("export", *SMALL, *args, "--out", tmp_path / "x"))
    assert all(f in line for f in fragments), line
    assert not (tmp_path / "x").exists()


def test_own_images_grayscale_and_rgb_and_refused_tables(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "rgb.npz", x=rng.integers(0, 256, (60, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 3, 60))
    np.savez(tmp_path / "odd.npz", x=rng.integers(0, 256, (60, 30, 30, 1), dtype=np.uint8), y=rng.integers(0, 3, 60))
    np.savez(tmp_path / "table.npz", x=rng.random((60, 5)), y=rng.integers(0, 3, 60))
    result = invoke("export", "--data", tmp_path / "rgb.npz", "--extractor", "scatter", "--mechanism", "gaussian",
                    "--param", "delta=1e-5", "--epsilon", "2", "--quiet", "--seed", "1", "--out", tmp_path / "rgb")
    assert result.exit_code == 0, result.output
    meta = read_client_file(tmp_path / "rgb" / "client_000.h5").metadata
    assert (meta.features, tuple(meta.input_shape)) == (243 * 8 * 8, (32, 32, 3))
    odd = one_error_line(invoke("export", "--data", tmp_path / "odd.npz", "--extractor", "scatter", "--out",
                                tmp_path / "o"))
    assert "--scatter-j = 2 needs image sides divisible by 2^J = 4, got 30×30" in odd
    table = one_error_line(invoke("export", "--data", tmp_path / "table.npz", "--extractor", "scatter", "--out",
                                  tmp_path / "t"))
    assert "needs images of shape (height, width, channels)" in table and "--extractor 'none'" in table


def test_a_plan_fixes_j_and_l_for_every_silo(tmp_path: Path) -> None:
    digits = load_dataset("mnist5k")
    for i in range(2):
        np.savez(tmp_path / f"silo_{i}.npz", x=digits.x[i::40], y=digits.y[i::40])
    plan = ldpfl.plan(tmp_path / "silo_0.npz", dataset="digits", extractor="scatter", scatter_l=6,
                      mechanism="pdpm", mechanism_params={"safe_range_length": 2}, out=tmp_path / "plan.json")
    assert plan.plan.extractor_options == {"scatter_j": 2, "scatter_l": 6} and plan.plan.features == 49 * 49
    assert json.loads((tmp_path / "plan.json").read_text())["extractor_options"] == {"scatter_j": 2, "scatter_l": 6}
    export = ldpfl.export(data=str(tmp_path / "silo_1.npz"), plan=tmp_path / "plan.json", client_index=1, clients=2,
                          seed=1, out=tmp_path / "silo_1")
    assert export.features == 49 * 49
    line = one_error_line(invoke("export", "--plan", tmp_path / "plan.json", "--data", tmp_path / "silo_0.npz",
                                 "--client-index", "0", "--clients", "2", "--scatter-l", "8", "--out", tmp_path / "x"))
    assert "--scatter-l = 8 contradicts the plan (6)" in line


def test_local_only_files_are_marked_said_so_and_still_read_by_stage_2(tmp_path: Path) -> None:
    out = tmp_path / "local"
    result = invoke("export", *SMALL, "--extractor", "scatter", "--local-only", "--out", out)
    assert result.exit_code == 0, result.output
    for name in ("client_000.h5", "client_001.h5"):
        meta = read_client_file(out / name).metadata
        assert meta.local_only and meta.mechanism == "none" and meta.feature_format == "float32"
        assert meta.label_release == CLEAR_LABELS and meta.features == 3969
        guarantee = guarantee_of(out / name)
        assert guarantee.epsilon == np.inf and guarantee.scope == LOCAL_ONLY_SCOPE
        with h5py.File(out / name, "r") as handle:  # the clean features, as the extractor computed them
            assert handle["train/features"].dtype == np.float32
            assert abs(float(np.mean(handle["train/features"][:]))) < 0.05  # GroupNorm: mean 0 per record
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["local_only"] is True and "never leave the silo" in manifest["local_only_note"]
    shown = invoke("inspect", out)
    assert shown.exit_code == 0 and "LOCAL ONLY  2 of 2 files are local-only" in shown.output
    assert "LOCAL ONLY" in invoke("inspect", out / "client_000.h5").output
    _, checked = validate_run(out)  # what stage 2 (load_run) and gather validate with
    assert [meta.local_only for _, meta in checked] == [True, True]
    from ldpfl.stage2_federate.data import load_run

    data = load_run(out)
    assert data.input_width == 3969 and len(data.clients) == 2
    gathered = ldpfl.gather([out], out=tmp_path / "gathered")
    assert len(gathered.files) == 2


def test_predict_rebuilds_the_scatter_extractor_from_the_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ldpfl.export(dataset="mnist5k", clients=2, extractor="scatter", scatter_l=6, limit=200, local_only=True, seed=2,
                 out=out)
    ldpfl.federate(out, rounds=1, hidden=(8,), seed=1)
    digits = load_dataset("mnist5k")
    np.savez(tmp_path / "new.npz", x=digits.x[::125], y=digits.y[::125])  # 40 records of every class
    prediction = ldpfl.predict(out, client_index=0, data=tmp_path / "new.npz")
    assert len(prediction.predicted) == 40 and 0.0 <= prediction.accuracy <= 1.0
