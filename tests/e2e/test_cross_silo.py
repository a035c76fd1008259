"""Issue 16 end to end from the CLI: three silos, three source formats, one plan, gather, federate, inspect.

The data is generated here: 8×8 grey "shapes" of 3 classes (a bright block at a class-specific place plus
noise), stored by silo A as an image folder of PNGs, by silo B as an ``.npz`` and by silo C as a CSV table
of 64 pixel columns in [0, 1]. A table has no image shape, so the plan uses ``--extractor none`` (the
flattened raw inputs are the features, as for ``covtype``): every silo gives r = 64 values per record.
Also: each bad-input case is one ``Error:`` line, exit code 2, and nothing created.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_checks import assert_usage_error, ok, run
from PIL import Image
from silo_files import CLASSES, SIDE, write_silos

from ldpfl.contract.layout import client_file_name
from ldpfl.contract.plan import PLAN_FILE, read_plan
from ldpfl.contract.run_dir import validate_run


@pytest.mark.slow
def test_three_silos_three_formats_one_plan(tmp_path):
    silos = write_silos(tmp_path, np.random.default_rng(16))
    plan_path = tmp_path / PLAN_FILE
    ok(run("plan", "--data", silos["a"], "--name", "shapes", "--extractor", "none", "--mechanism", "uer",
           "--epsilon", "8", "-m", "1", "-n", "3", "--out", plan_path))
    plan = read_plan(plan_path)
    assert plan.classes == CLASSES and plan.features == SIDE * SIDE and plan.extractor == "none"
    assert plan.input_shape == (SIDE * SIDE,)

    exports = {
        "a": ("--data", silos["a"]),
        "b": ("--data", silos["b"]),
        "c": ("--data", silos["c"], "--label-column", "diagnosis", "--scale", "none"),
    }
    outs = {}
    for index, (silo, options) in enumerate(exports.items()):
        out = tmp_path / f"export_{silo}"
        ok(run("export", "--plan", plan_path, *options, "--client-index", index, "--clients", 3, "--seed", 40 + index,
               "--quiet", "--out", out))
        outs[silo] = out
        files = sorted(p.name for p in out.iterdir() if p.suffix == ".h5")
        assert files == [client_file_name(index)]  # one silo, one file
        manifest, listed = validate_run(out)
        assert [r.client_index for r in manifest.files] == [index]
        metadata = listed[0][1]
        assert metadata.class_names == CLASSES and metadata.plan_fingerprint == plan.fingerprint
        assert read_plan(out / PLAN_FILE).fingerprint == plan.fingerprint
        assert sum(manifest.files[0].rows.values()) == 60  # the whole input is this silo's: no partitioning

    run_dir = tmp_path / "run"
    ok(run("gather", *outs.values(), "--out", run_dir))
    manifest, listed = validate_run(run_dir)
    assert [r.client_index for r in manifest.files] == [0, 1, 2]

    result = ok(run("federate", run_dir, "--rounds", "3", "--local-epochs", "2", "--hidden", "32", "--seed", "5",
                    "--threads", "1", "--quiet", "--json"))
    metrics = json.loads((run_dir / "federation" / "metrics.json").read_text())
    assert len(metrics["rounds"]) == 3  # federation ran over the three silos' files
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in metrics["rounds"])
    assert json.loads(result.stdout)["final_test_accuracy"] == metrics["rounds"][-1]["test_accuracy"]

    shown = ok(run("inspect", run_dir, "--json"))
    report = json.loads(shown.output)  # inspect reads the gathered run: three files, each verified
    assert [f["file"] for f in report["files"]] == [client_file_name(i) for i in range(3)]
    assert all(f["status"] == "ok" and f["checksums"] == "ok" for f in report["files"])

    # a run directory whose files were not all exported with its plan: federate and inspect name the file
    tampered = tmp_path / "tampered"
    shutil.copytree(run_dir, tampered)
    data = json.loads((tampered / PLAN_FILE).read_text())
    data["mechanism"]["parameters"]["epsilon"] = 4.0
    del data["fingerprint"]
    (tampered / PLAN_FILE).write_text(json.dumps(data))
    assert_usage_error(run("federate", tampered, "--rounds", "1", "--quiet", "--out", tmp_path / "fed"),
                       "client_000.h5 was not exported with plan.json")
    inspected = run("inspect", tampered)
    assert inspected.exit_code == 1 and "client_001.h5 was not exported with plan.json" in inspected.output

    # a silo exported with another plan cannot be gathered: the error names its file
    other_plan = tmp_path / "other.json"
    ok(run("plan", "--data", silos["b"], "--name", "shapes", "--extractor", "none", "--epsilon", "4", "-m", "1",
           "-n", "3", "--out", other_plan))
    ok(run("export", "--plan", other_plan, "--data", silos["b"], "--client-index", 1, "--clients", 3, "--quiet",
           "--out", tmp_path / "other_b"))
    assert_usage_error(run("gather", outs["a"], tmp_path / "other_b", "--out", tmp_path / "run2"),
                       str(tmp_path / "other_b" / PLAN_FILE), "is not the plan of")
    assert not (tmp_path / "run2").exists()


@pytest.mark.slow
def test_two_image_silos_train_their_own_cnn(tmp_path):
    """The CNN path: an image folder and an .npz of images, auto extractor (cifar-cnn on 8×8), one epoch each."""
    silos = write_silos(tmp_path, np.random.default_rng(19), n=24)
    plan_path = tmp_path / PLAN_FILE
    ok(run("plan", "--data", silos["b"], "--mechanism", "uer", "--epsilon", "4", "--out", plan_path))
    plan = read_plan(plan_path)
    assert plan.extractor == "cifar-cnn" and plan.input_shape == (SIDE, SIDE, 1) and plan.features == 128
    for index, silo in enumerate(("a", "b")):
        ok(run("export", "--plan", plan_path, "--data", silos[silo], "--client-index", index, "--clients", 2,
               "--epochs", 1, "--batch-size", 8, "--seed", 7 + index, "--quiet", "--out", tmp_path / silo))
    ok(run("gather", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "run"))
    manifest, listed = validate_run(tmp_path / "run")
    assert [m.extractor for _, m in listed] == ["cifar-cnn", "cifar-cnn"]
    assert all(m.local_accuracy is None for _, m in listed)  # accuracy on clear records stays on the silo
    assert all(m.release_guarantee is not None and not m.release_guarantee.private for _, m in listed)
    # an image silo of another size contradicts the plan: nothing is written
    assert_usage_error(run("export", "--plan", plan_path, "--data", silos["a"], "--image-size", 9, 9,
                           "--client-index", 0, "--clients", 2, "--out", tmp_path / "c"),
                       f"{silos['a']} does not fit the plan",
                       "input_shape = [9, 9, 1] contradicts the plan ([8, 8, 1])")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_export_refuses_settings_that_contradict_the_plan(tmp_path):
    silos = write_silos(tmp_path, np.random.default_rng(17), n=12)
    plan_path = tmp_path / PLAN_FILE
    ok(run("plan", "--data", silos["a"], "--extractor", "none", "--mechanism", "uer", "--epsilon", "8",
           "--out", plan_path))
    out = tmp_path / "out"
    assert_usage_error(run("export", "--plan", plan_path, "--data", silos["b"], "--epsilon", "2", "--client-index",
                           1, "--clients", 3, "--out", out), "--epsilon", "contradicts", str(plan_path))
    assert not out.exists()
    assert_usage_error(run("export", "--plan", plan_path, "--data", silos["b"], "--mechanism", "rr",
                           "--client-index", 1, "--clients", 3, "--out", out), "--mechanism", "contradicts")
    assert not out.exists()


def bad_inputs(root: Path) -> dict[str, tuple[list, tuple[str, ...]]]:
    rng = np.random.default_rng(18)
    cases = {}
    broken = root / "broken"
    for label in ("a", "b"):
        (broken / label).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(broken / label / "ok.png")
    (broken / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\ntruncated")
    cases["unreadable image"] = (["--data", broken], ("bad.png", "unreadable image"))
    mixed = root / "mixed"
    for label, side in (("a", 8), ("b", 9)):
        (mixed / label).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (side, side), dtype=np.uint8)).save(mixed / label / "x.png")
    cases["mixed sizes"] = (["--data", mixed], ("different sizes", "--image-size"))
    nan = root / "nan.npz"
    x = rng.random((6, 4))
    x[3, 2] = np.nan
    np.savez(nan, x=x, y=[0, 1] * 3)
    cases["NaN"] = (["--data", nan], (str(nan), "NaN or infinite"))
    table = root / "table.csv"
    pd.DataFrame({"f": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}).to_csv(table, index=False)
    cases["missing label column"] = (["--data", table, "--label-column", "diagnosis"],
                                     (str(table), "no label column 'diagnosis'"))
    one = root / "one.npz"
    np.savez(one, x=rng.random((4, 3)), y=[5, 5, 5, 5])
    cases["one class"] = (["--data", one], (str(one), "one class only"))
    empty = root / "empty"
    empty.mkdir()
    cases["empty folder"] = (["--data", empty], (str(empty), "no class subfolders"))
    return cases


@pytest.mark.parametrize("case", ["unreadable image", "mixed sizes", "NaN", "missing label column", "one class",
                                  "empty folder"])
@pytest.mark.parametrize("command", ["export", "plan"])
def test_bad_input_is_one_line_exit_2_nothing_created(tmp_path, case, command):
    options, fragments = bad_inputs(tmp_path / "in")[case]
    out = tmp_path / ("out" if command == "export" else "plan.json")
    result = run(command, *options, "--extractor", "none", "--out", out)
    assert_usage_error(result, *fragments)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name not in ("in",)]


@pytest.mark.slow
def test_a_plan_with_the_label_release_and_krr_exports(tmp_path):
    """A plan's mechanism is checked against ITS release: label + krr (a category mechanism) is accepted.

    ``--release label`` is a layer of the client CNN, so this trains one (1 epoch on 12 8×8 images).
    """
    silos = write_silos(tmp_path, np.random.default_rng(23), n=12)
    plan_path = tmp_path / PLAN_FILE
    ok(run("plan", "--data", silos["b"], "--release", "label", "--mechanism", "krr", "--epsilon", "2",
           "--out", plan_path))
    plan = read_plan(plan_path)
    assert (plan.release, plan.mechanism.name, plan.features) == ("label", "krr", len(CLASSES))
    ok(run("export", "--plan", plan_path, "--data", silos["b"], "--client-index", 0, "--clients", 2,
           "--epochs", 1, "--batch-size", 8, "--seed", 7, "--quiet", "--out", tmp_path / "b"))
    _manifest, listed = validate_run(tmp_path / "b")
    meta = listed[0][1]
    assert (meta.release, meta.mechanism, meta.features, meta.plan_fingerprint) == (
        "label", "krr", len(CLASSES), plan.fingerprint)
    # the plan's release still refuses a mechanism it does not take, naming the options
    assert_usage_error(run("plan", "--data", silos["b"], "--release", "label", "--mechanism", "uer",
                           "--out", tmp_path / "bad.json"), "--mechanism", "--release")
