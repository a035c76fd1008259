"""``ldpfl export`` (LDPFL Algorithm 1 lines 1-10): files, attributes, flip rates, resume, CLI errors."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_checks import command, one_error_line
from click.testing import CliRunner
from heavy_imports import heavy_modules_after
from repository import ROOT

from ldpfl import mechanisms
from ldpfl.cli import cli
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import PARTITION_FILE
from ldpfl.contract.manifest import read_manifest, record_for, write_manifest
from ldpfl.contract.run_dir import verify_file_record
from ldpfl.mechanisms import FLOAT32, PACKED_BITS
from ldpfl.mechanisms.randomness import secure_generator_name
from ldpfl.stage1_features.export.config import DEFAULT_MECHANISM_PARAMS, ExportConfig
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.run import run_export

SEED = 987_654_321  # distinctive, so that a leak into any output would be found
QUICK = {"dataset": "mnist5k", "extractor": "none", "limit": 300}  # raw 28×28 pixels: r = 784, r·l = 7,840


def quick_config(**overrides) -> ExportConfig:
    return ExportConfig(**{**QUICK, "clients": 2, "seed": SEED, **overrides})


invoke = command("export")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    result = run_export(quick_config(store_input_density=True), out, progress=False)
    return out, result


# ----------------------------------------------------------------------------------------------------
# Mechanism resolution


def resolve(name: str, params: dict, features: int) -> mechanisms.MechanismSpec:
    return ExportConfig(mechanism=name, mechanism_params=params).mechanism_spec(features)


def test_resolve_uer_takes_the_iv_d_defaults_and_r() -> None:
    spec = resolve("uer", DEFAULT_MECHANISM_PARAMS, 1152)
    assert spec.feature_format == PACKED_BITS
    params = spec.build().parameters()
    assert (params["epsilon"], params["alpha"], params["features"]) == (0.5, 10.0, 1152)
    assert (spec.integer_bits, spec.fraction_bits, spec.build().width) == (4, 5, 11_520)


def test_resolve_drops_unused_defaults_and_refuses_unused_values() -> None:
    rr = resolve("rr", DEFAULT_MECHANISM_PARAMS, 10)  # rr has no alpha: default dropped
    assert "alpha" not in rr.build().parameters()
    with pytest.raises(ValueError, match="mechanism 'rr' takes no parameter 'alpha'"):
        resolve("rr", {**DEFAULT_MECHANISM_PARAMS, "alpha": 3.0}, 10)
    with pytest.raises(ValueError, match="set from the feature count"):
        resolve("uer", {"features": 5}, 10)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0, got 0"):
        resolve("uer", {"epsilon": 0}, 10)


def test_resolve_float_and_none_mechanisms() -> None:
    pdpm = resolve("pdpm", {**DEFAULT_MECHANISM_PARAMS, "safe_range_length": 2}, 784)
    assert pdpm.feature_format == FLOAT32 and pdpm.encoding is None and pdpm.build().dim == 784
    assert (pdpm.integer_bits, pdpm.fraction_bits) == (0, 0)  # no fixed-point encoding
    with pytest.raises(ValueError, match="takes no parameter 'integer_bits'"):
        resolve("pdpm", {"integer_bits": 6}, 784)
    none = resolve("none", {**DEFAULT_MECHANISM_PARAMS, "integer_bits": 3}, 784)
    assert none.feature_format == PACKED_BITS and none.encoding.integer_bits == 3
    assert none.recorded_parameters() == {"integer_bits": 3, "fraction_bits": 5}
    with pytest.raises(ValueError, match="mechanism 'none' takes no parameter 'epsilon'"):
        resolve("none", {"epsilon": 2.0}, 784)


# ----------------------------------------------------------------------------------------------------
# A tiny end-to-end export


def test_tiny_export_files_shapes_attributes_and_manifest(tiny_run) -> None:
    out, result = tiny_run
    assert [c.status for c in result.clients] == ["new", "new"]
    manifest = read_manifest(out)
    assert [f.path for f in manifest.files] == ["client_000.h5", "client_001.h5"]
    assert manifest.info["client_count"] == 2 and manifest.info["dataset"] == "mnist5k"
    assert manifest.info["randomness"] == "seeded" and "seed" not in manifest.info["config"]
    all_rows = []
    for record, summary in zip(manifest.files, result.clients, strict=True):
        meta = verify_file_record(out, record)  # sha256 and structure
        assert record.sha256 == sha256_file(out / record.path) == summary.sha256
        data = read_client_file(out / record.path)
        assert (meta.features, meta.bits_per_value, meta.feature_width) == (784, 10, 7840)
        assert (meta.integer_bits, meta.fraction_bits, meta.feature_format) == (4, 5, PACKED_BITS)
        assert meta.mechanism == "uer" and meta.mechanism_parameters["alpha"] == 10.0
        assert meta.privacy_report.nominal_epsilon == 0.5
        assert meta.privacy_report.exact_epsilon_per_record > 1000  # eq. 17 is far from its nominal ε
        assert meta.privacy_report.randomness == "seeded" and meta.randomness == "seeded"
        assert meta.private and meta.local_accuracy is None  # no CNN with --extractor none
        assert meta.client_count == 2 and meta.dataset == "mnist5k" and meta.input_shape == (28, 28, 1)
        assert meta.partition["kind"] == "iid" and meta.partition["test_fraction"] == 0.1
        assert meta.package_version and meta.package_version != "unknown"
        rows = {s: data.features[s].shape[0] for s in ("train", "test")}
        assert rows == dict(record.rows) == {"train": 135, "test": 15}  # 300 records / 2, 10 % held out
        assert data.features["train"].shape[1] == 980 and data.features["train"].dtype == np.uint8
        for split in ("train", "test"):
            assert meta.label_histograms[split] == np.bincount(data.labels[split], minlength=10).tolist()
        assert data.input_bit_density is not None and data.input_bit_density.shape == (7840,)
        all_rows.append(rows)
    # the stored partition: disjoint clients drawn from the 5,000-record pool
    with np.load(out / PARTITION_FILE) as partition:
        a, b = partition["client_000"], partition["client_001"]
    assert len(a) == len(b) == 150 and not set(a) & set(b) and max(a.max(), b.max()) < 5000
    assert manifest.info["partition_file"]["sha256"] == sha256_file(out / PARTITION_FILE)


def test_seed_never_appears_in_any_output(tiny_run) -> None:
    out, _ = tiny_run
    needles = [str(SEED).encode(), struct.pack("<I", SEED), struct.pack("<Q", SEED), struct.pack(">Q", SEED)]
    files = [p for p in out.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"client_000.h5", "client_001.h5", "manifest.json", "partition.npz"}
    for path in files:
        blob = path.read_bytes()
        for needle in needles:
            assert needle not in blob, f"seed found in {path.name}"
    manifest_text = (out / "manifest.json").read_text()
    assert '"seed"' not in manifest_text


def test_input_density_is_the_density_of_the_unrandomized_encoding(tiny_run, tmp_path) -> None:
    out, _ = tiny_run
    plain = run_export(quick_config(mechanism="none"), tmp_path, progress=False)
    for summary in plain.clients:  # same seed: same partition and hold-out, so the same input bits
        bits = mechanisms.unpack_bits(read_client_file(tmp_path / summary.file).features["train"], 7840)
        stored = read_client_file(out / summary.file).input_bit_density
        np.testing.assert_allclose(stored, bits.mean(axis=0), atol=1e-6)


def test_none_mechanism_is_marked_non_private(tmp_path) -> None:
    result = run_export(quick_config(mechanism="none", clients=1), tmp_path, progress=False)
    meta = read_client_file(tmp_path / result.clients[0].file).metadata
    assert not meta.private and meta.mechanism == "none"
    assert meta.privacy_report.exact_epsilon_per_record == math.inf
    assert result.to_dict()["private"] is False
    assert any("NOT private" in note for note in result.notes)


def test_float_mechanism_writes_float32_features(tmp_path) -> None:
    config = quick_config(mechanism="pdpm", clients=1, mechanism_params={
        **DEFAULT_MECHANISM_PARAMS, "safe_range_length": 2.0, "center": 0.5})
    result = run_export(config, tmp_path, progress=False)
    data = read_client_file(tmp_path / result.clients[0].file)
    meta = data.metadata
    assert meta.feature_format == FLOAT32 and meta.feature_width == 784 and meta.mechanism_parameters["dim"] == 784
    train = data.features["train"]
    assert train.dtype == np.float32 and train.shape == (270, 784)
    mech = mechanisms.create_mechanism("pdpm", **meta.mechanism_parameters)
    assert set(np.unique(train)) <= {np.float32(v) for v in mech.output_values()}


def test_exported_uer_flip_rates_match_the_mechanism(tmp_path) -> None:
    """Same seed: `none` and `uer` exports hold the same input bits, so P(out=1 | in) is observable."""
    outs = {}
    for name in ("none", "uer"):
        outs[name] = tmp_path / name
        run_export(quick_config(mechanism=name, clients=1, limit=400), outs[name], progress=False)
    plain, noisy = (read_client_file(outs[n] / "client_000.h5") for n in ("none", "uer"))
    np.testing.assert_array_equal(plain.labels["train"], noisy.labels["train"])
    width = noisy.metadata.feature_width
    bits_in = np.concatenate([mechanisms.unpack_bits(plain.features[s], width) for s in ("train", "test")])
    bits_out = np.concatenate([mechanisms.unpack_bits(noisy.features[s], width) for s in ("train", "test")])
    mech = mechanisms.create_mechanism("uer", **noisy.metadata.mechanism_parameters)
    classes = mech.position_classes()  # even / odd positions of the merged r·l bits (eq. 17)
    for c, bit_class in enumerate(mech.effective_bit_classes()):
        for value, target in ((1, bit_class.p_one_given_one), (0, bit_class.p_one_given_zero)):
            mask = (bits_in == value) & (classes == c)[None, :]
            n = int(mask.sum())
            assert n > 5000, (bit_class.name, value, n)
            observed = bits_out[mask].mean()
            se = math.sqrt(target * (1 - target) / n)
            assert abs(observed - target) <= 5 * se, (bit_class.name, value, observed, target, se)


def test_parallel_clients_give_the_same_files_as_sequential(tmp_path) -> None:
    seq = run_export(quick_config(clients=3), tmp_path / "seq", progress=False)
    par = run_export(quick_config(clients=3, clients_parallel=2), tmp_path / "par", progress=False)
    assert [c.status for c in par.clients] == ["new"] * 3
    for a, b in zip(seq.clients, par.clients, strict=True):
        da, db = read_client_file(tmp_path / "seq" / a.file), read_client_file(tmp_path / "par" / b.file)
        for split in ("train", "test"):
            np.testing.assert_array_equal(da.features[split], db.features[split])
            np.testing.assert_array_equal(da.labels[split], db.labels[split])
    run_export(quick_config(clients=1, seed=SEED + 1), tmp_path / "other", progress=False)
    assert not np.array_equal(read_client_file(tmp_path / "other" / "client_000.h5").features["train"],
                              read_client_file(tmp_path / "seq" / "client_000.h5").features["train"])


# ----------------------------------------------------------------------------------------------------
# Resuming


def test_rerun_reuses_verified_clients_and_removes_stale_temp_files(tmp_path) -> None:
    first = run_export(quick_config(), tmp_path, progress=False)
    stale = [tmp_path / ".client_001.h5.424242.tmp", tmp_path / ".client_000.4242.tmp.keras",
             tmp_path / ".manifest.json.4242.tmp"]
    for path in stale:
        path.write_bytes(b"half written")
    second = run_export(quick_config(), tmp_path, progress=False)
    assert [c.status for c in second.clients] == ["reused", "reused"]
    assert [c.sha256 for c in second.clients] == [c.sha256 for c in first.clients]
    assert not any(path.exists() for path in stale)


def test_rerun_adopts_a_finished_file_missing_from_the_manifest_and_redoes_only_missing(tmp_path) -> None:
    first = run_export(quick_config(clients=3), tmp_path, progress=False)
    manifest = read_manifest(tmp_path)
    write_manifest(tmp_path, manifest.files[:1], manifest.info)  # crash between rename and manifest write
    (tmp_path / "client_002.h5").unlink()  # and client 2 never finished
    again = run_export(quick_config(clients=3), tmp_path, progress=False)
    assert [c.status for c in again.clients] == ["reused", "adopted", "new"]
    assert [c.sha256 for c in again.clients[:2]] == [c.sha256 for c in first.clients[:2]]
    assert [f.client_index for f in read_manifest(tmp_path).files] == [0, 1, 2]
    for record in read_manifest(tmp_path).files:
        verify_file_record(tmp_path, record)


def test_a_finished_client_that_fails_verification_is_never_randomized_again(tmp_path) -> None:
    run_export(quick_config(), tmp_path, progress=False)
    path = tmp_path / "client_001.h5"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    before = sha256_file(path)
    with pytest.raises(ExportError, match=r"run with overwrite"):
        run_export(quick_config(), tmp_path, progress=False)
    assert sha256_file(path) == before  # untouched
    redone = run_export(quick_config(overwrite=True), tmp_path, progress=False)
    assert [c.status for c in redone.clients] == ["new", "new"]


def test_a_listed_file_that_disappeared_is_an_error_not_a_redo(tmp_path) -> None:
    run_export(quick_config(), tmp_path, progress=False)
    (tmp_path / "client_000.h5").unlink()
    with pytest.raises(ExportError, match=r"missing.*with overwrite"):
        run_export(quick_config(), tmp_path, progress=False)


@pytest.mark.parametrize("change", [{"mechanism": "rr"}, {"clients": 3}, {"mechanism_params": {"epsilon": 1.0}},
                                    {"seed": None}, {"limit": 250}, {"test_fraction": 0.2}])
def test_a_config_mismatch_with_the_existing_run_is_refused(tmp_path, change) -> None:
    run_export(quick_config(), tmp_path, progress=False)
    before = sha256_file(tmp_path / "manifest.json")
    with pytest.raises(ExportError, match="other settings"):
        run_export(quick_config(**change), tmp_path, progress=False)
    assert sha256_file(tmp_path / "manifest.json") == before


def test_client_files_without_a_manifest_are_refused(tmp_path) -> None:
    run_export(quick_config(), tmp_path, progress=False)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ExportError, match="no manifest.json"):
        run_export(quick_config(), tmp_path, progress=False)


@pytest.mark.slow
def test_killed_export_resumes_with_only_the_missing_clients(tmp_path) -> None:
    args = ["export", "--dataset", "mnist5k", "--clients", "3", "--epochs", "1", "--limit", "600", "--seed", "5",
            "--out", str(tmp_path), "--quiet"]  # auto: the MNIST net of Fig. 3
    process = subprocess.Popen([sys.executable, "-m", "ldpfl.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    first = tmp_path / "client_000.h5"
    deadline = time.monotonic() + 180
    try:
        while not first.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert first.exists(), process.stderr.read().decode()
    assert not (tmp_path / "client_002.h5").exists()  # really killed mid-run
    digest = sha256_file(first)
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    status = {c["index"]: c["status"] for c in summary["clients"]}
    assert status[0] in ("reused", "adopted") and status[2] == "new"
    assert sha256_file(first) == digest == summary["clients"][0]["sha256"]
    assert summary["feature_width"] == 10_240 and summary["extractor"] == "mnist-cnn"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".tmp.keras", ".tmp.npz"))]
    for record in read_manifest(tmp_path).files:
        verify_file_record(tmp_path, record)
    assert len(read_manifest(tmp_path).files) == 3


@pytest.mark.slow
def test_fmnist_shaped_export_with_the_fig4_net_and_saved_model(tmp_path) -> None:
    from dataset_files import write_idx_dataset

    write_idx_dataset(tmp_path / "data", 60, 20, rng=np.random.default_rng(3))
    result = run_export(ExportConfig(dataset="fashion-mnist", data_dir=str(tmp_path / "data"), clients=1, epochs=1,
                                     save_models=True, seed=1), tmp_path / "run", progress=False)
    summary = result.clients[0]
    assert (result.extractor, result.features, result.feature_width) == ("cifar-cnn", 1152, 11_520)
    data = read_client_file(tmp_path / "run" / summary.file)
    assert data.features["train"].shape == (72, 1440) and data.features["test"].shape == (8, 1440)
    assert summary.local_accuracy is not None and 0.0 <= summary.local_accuracy <= 1.0  # reported on the silo
    assert data.metadata.local_accuracy is None  # a statistic of clear records: never in a shareable file
    assert summary.model_file == "client_000.keras" and (tmp_path / "run" / "client_000.keras").is_file()
    assert any("NOT covered" in note for note in result.notes)


# ----------------------------------------------------------------------------------------------------
# CLI


def test_cli_json_summary_parses(tmp_path) -> None:
    result = invoke("--extractor", "none", "--limit", "200", "--clients", "2", "--seed", "1", "--out",
                    str(tmp_path), "--json", "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["nominal_epsilon"] == 0.5 and summary["exact_epsilon_per_record"] > 1000
    assert [c["status"] for c in summary["clients"]] == ["new", "new"]
    assert summary["feature_width"] == 7840 and summary["randomness"] == "seeded"


def test_cli_table_names_clients_and_both_epsilons(tmp_path) -> None:
    result = invoke("--extractor", "none", "--limit", "200", "--out", str(tmp_path), "--quiet")
    assert result.exit_code == 0, result.output
    assert "client_001.h5" in result.stdout and "nominal ε = 0.5" in result.stdout
    secure = secure_generator_name()  # AES-CTR with AES-NI, else ChaCha20
    assert "exact ε" in result.stdout and f"randomness: csprng ({secure})" in result.stdout


def test_an_unseeded_export_says_its_noise_came_from_the_secure_generator(tmp_path) -> None:
    """Issue 23: files, reports, the manifest and inspect name the generator; a seeded run names PCG64."""
    secure = secure_generator_name()
    for seed, mode, generator in ((None, "csprng", secure), (3, "seeded", "PCG64")):
        out = tmp_path / mode
        result = run_export(quick_config(seed=seed, clients=1), out, progress=False)
        assert (result.privacy.randomness, result.privacy.generator) == (mode, generator)
        metadata = read_client_file(out / "client_000.h5").metadata
        assert (metadata.randomness, metadata.generator) == (mode, generator)
        report = metadata.privacy()
        assert (report.randomness, report.generator) == (mode, generator)
        assert read_manifest(out).info["generator"] == generator
        shown = CliRunner().invoke(cli, ["inspect", str(out / "client_000.h5")])
        assert shown.exit_code == 0, shown.output
        assert f"randomness  {mode} ({generator}): " in shown.stdout
        assert ("cryptographically secure" in shown.stdout) == (mode == "csprng")


@pytest.mark.parametrize("args", [
    ["--dataset", "imagenet"],
    ["--mechanism", "laplace"],
    ["--extractor", "resnet"],
    ["--epsilon", "0"],
    ["--epsilon", "-1"],
    ["--epsilon", "nan"],
    ["--alpha", "0"],
    ["--mechanism", "rr", "--alpha", "3"],
    ["--param", "garbage"],
    ["--param", "features=10"],
    ["--param", "sensitivity_rule=half"],
    ["--mechanism", "pdpm", "--store-input-density"],
    ["--clients", "0"],
    ["--limit", "999999"],
    ["--test-fraction", "1.5"],
    ["--partition", "dirichlet", "--beta", "-1"],
    ["--clients", "3", "--max-clients", "2"],
    ["-m", "40"],
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args) -> None:
    out = tmp_path / "run"
    result = invoke("--extractor", "none", "--limit", "100", "--quiet", "--out", str(out), *args)
    one_error_line(result)
    assert not out.exists() or not any(p.name.startswith("client_") for p in out.iterdir())


def test_cli_missing_dataset_files(tmp_path) -> None:
    line = one_error_line(invoke("--dataset", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")))
    assert "mnist" in line and "not found" in line


def test_cli_unwritable_output_path_is_one_line_exit_2(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker, blocker / "run"):
        line = one_error_line(invoke("--extractor", "none", "--limit", "100", "--out", str(out)))
        assert str(blocker) in line


def test_cli_help_does_not_import_tensorflow() -> None:
    stdout, heavy = heavy_modules_after(["--help"], ["export", "--help"])
    assert "--store-input-density" in stdout and "UNRANDOMIZED" in stdout
    assert heavy == []


def test_record_for_matches_manifest_entries(tiny_run) -> None:
    out, _ = tiny_run
    for record in read_manifest(out).files:
        assert record_for(out / record.path, record.client_index, record.sha256, record.rows) == record
        # the exporter lists each file's label counts, as its attribute holds them (issue 42 item 3)
        assert record.label_histograms == verify_file_record(out, record).label_histograms


def test_library_errors_name_parameters_and_the_cli_names_flags(tmp_path) -> None:
    run_export(quick_config(), tmp_path, progress=False)
    (tmp_path / "client_000.h5").unlink()
    with pytest.raises(ExportError) as error:
        run_export(quick_config(), tmp_path, progress=False)
    assert "with overwrite" in str(error.value) and "--" not in str(error.value)
    line = one_error_line(invoke("--extractor", "none", "--limit", "300", "--clients", "2", "--seed", str(SEED),
                                 "--out", str(tmp_path), "--quiet"))
    assert line.endswith("redo the whole run with --overwrite") and "`" not in line
    line = one_error_line(invoke("--mechanism", "pdpm", "--store-input-density", "--out", str(tmp_path / "x")))
    assert line.startswith("Error: --store-input-density applies to bit encodings only")


def test_top_level_help_lists_every_command_without_importing_one() -> None:
    """`ldpfl --help` is click's lazy group: the commands' one-line help comes from ldpfl.cli.SHORT_HELP."""
    import json
    import subprocess
    import sys

    from ldpfl.cli import LAZY_COMMANDS, SHORT_HELP

    code = ("import json, sys\nfrom ldpfl.cli import cli\ntry:\n    cli.main(['--help'], prog_name='ldpfl')\n"
            "except SystemExit:\n    pass\n"
            f"print(json.dumps(sorted(m for m in {sorted({t.split(':')[0] for t in LAZY_COMMANDS.values()})!r} "
            "if m in sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    assert set(SHORT_HELP) == set(LAZY_COMMANDS)
    for name in LAZY_COMMANDS:
        assert f"  {name} " in done.stdout
