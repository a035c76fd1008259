"""``ldpfl.contract.plan``: the shared federation plan: round trip, fingerprint, strict reading, checks."""

from __future__ import annotations

import json

import pytest
from plan_files import UER, make_plan

from ldpfl.contract.plan import (
    PLAN_SCHEMA,
    PlanError,
    PlanMismatch,
    check_against_plan,
    fingerprint_of,
    read_plan,
    write_plan,
)
from ldpfl.contract.schema import SCHEMA_VERSION
from ldpfl.mechanisms import MechanismSpec


def test_round_trip_through_a_file(tmp_path):
    plan = make_plan()
    path = write_plan(plan, tmp_path / "plan.json")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    data = json.loads(path.read_text())
    assert data["schema"] == PLAN_SCHEMA and data["schema_version"] == 1
    assert data["encoding"] == {"integer_bits": 4, "fraction_bits": 5}
    assert data["feature_format"] == "packed-bits" and data["feature_width"] == 64 * 10
    assert data["feature_schema_version"] == SCHEMA_VERSION and data["release"] == "flatten"
    assert data["classes"] == ["benign", "malignant", "unclear"]
    back = read_plan(path)
    assert back == plan and back.fingerprint == plan.fingerprint == data["fingerprint"]
    assert back.mechanism.to_dict() == plan.mechanism.to_dict()


def test_float_mechanism_has_no_encoding(tmp_path):
    spec = MechanismSpec.resolve("pdpm", {"epsilon": 1.0, "safe_range_length": 2.0}, features=16)
    plan = make_plan(features=16, mechanism=spec, extractor="none", input_shape=(16,))
    data = plan.to_dict()
    assert data["encoding"] is None and data["feature_format"] == "float32" and data["feature_width"] == 16
    assert read_plan(write_plan(plan, tmp_path / "p.json")) == plan


def test_fingerprint_is_stable_and_content_sensitive(tmp_path):
    plan = make_plan()
    # the same content built twice, or written with another key order and spacing, has the same fingerprint
    assert make_plan().fingerprint == plan.fingerprint
    data = plan.to_dict()
    reordered = dict(reversed(list(data.items())))
    (tmp_path / "compact.json").write_text(json.dumps(reordered, separators=(",", ":")))
    assert read_plan(tmp_path / "compact.json").fingerprint == plan.fingerprint
    # nor does the writer's package version count
    assert fingerprint_of(data | {"package_version": "9.9"}) == plan.fingerprint
    assert plan.fingerprint.startswith("sha256:") and len(plan.fingerprint) == len("sha256:") + 64
    # a golden value pins the canonical form: a change to it changes every fingerprint
    assert fingerprint_of({"a": 1, "b": [1.5, "é"]}) == \
        "sha256:" + __import__("hashlib").sha256('{"a":1,"b":[1.5,"é"]}'.encode()).hexdigest()
    others = [make_plan(classes=("malignant", "benign", "unclear")),  # order matters
              make_plan(dataset="other"), make_plan(release="bottleneck:8"), make_plan(input_shape=(21, 20, 1)),
              make_plan(mechanism=MechanismSpec.resolve("uer", UER | {"epsilon": 0.6}, features=64)),
              make_plan(mechanism=MechanismSpec.resolve("uer", UER | {"fraction_bits": 4}, features=64)),
              make_plan(feature_schema_version=1)]
    prints = {p.fingerprint for p in others}
    assert len(prints) == len(others) and plan.fingerprint not in prints


def test_construction_names_the_bad_field():
    with pytest.raises(ValueError, match="plan classes must name at least two distinct"):
        make_plan(classes=("a", "a"))
    with pytest.raises(ValueError, match="plan input_shape"):
        make_plan(input_shape=(0, 3))
    with pytest.raises(ValueError, match="resolved for 64 features, but features .r. = 32"):
        make_plan(features=32, mechanism=MechanismSpec.resolve("uer", UER, features=64))
    with pytest.raises(ValueError, match="plan dataset"):
        make_plan(dataset="")


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.pop("classes"), "missing key 'classes'"),
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d.update(schema="ldpfl-features"), "key 'schema'"),
    (lambda d: d.update(schema_version=2), "key 'schema_version' is 2"),
    (lambda d: d.update(features="64"), "key 'features' must be an integer"),
    (lambda d: d.update(input_shape="20x20"), "key 'input_shape' must be a list"),
    (lambda d: d.update(feature_width=641), "key 'feature_width' = 641 disagrees"),
    (lambda d: d.update(encoding=None), "key 'encoding' = null disagrees"),
    (lambda d: d["mechanism"].update(name="rr"), "key 'mechanism'"),
    (lambda d: d["mechanism"]["parameters"].update(epsilon=0.7), "key 'fingerprint'"),
    (lambda d: d["mechanism"]["parameters"].update(colour=1), "takes no parameter 'colour'"),
    (lambda d: d.update(classes=["a"]), "at least two"),
])
def test_strict_reading_names_the_key(tmp_path, edit, fragment):
    data = make_plan().to_dict()
    edit(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError) as error:
        read_plan(path)
    message = str(error.value)
    assert fragment in message and str(path) in message and "\n" not in message


def test_a_hand_edit_is_accepted_without_the_fingerprint(tmp_path):
    data = make_plan().to_dict()
    data["mechanism"]["parameters"]["epsilon"] = 0.7
    del data["fingerprint"]
    (tmp_path / "p.json").write_text(json.dumps(data))
    plan = read_plan(tmp_path / "p.json")
    assert plan.mechanism.parameters["epsilon"] == 0.7 and plan.fingerprint != make_plan().fingerprint


def test_unreadable_files(tmp_path):
    with pytest.raises(PlanError, match="plan file not found"):
        read_plan(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlanError, match=r"is not valid JSON \(.* line 1"):
        read_plan(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(PlanError, match="must be a JSON object, got list"):
        read_plan(tmp_path / "list.json")
    (tmp_path / "nan.json").write_text(json.dumps(make_plan().to_dict()).replace('"features": 64', '"features": NaN'))
    with pytest.raises(PlanError, match="NaN"):
        read_plan(tmp_path / "nan.json")


def test_check_against_plan_lists_each_contradiction():
    plan = make_plan()
    agreeing = {"dataset": "clinics", "extractor": "mnist-cnn", "input_shape": (20, 20, 1), "features": 64,
                "mechanism": "uer", "integer_bits": 4, "fraction_bits": 5, "feature_format": "packed-bits",
                "feature_width": 640, "classes": ["unclear", "benign"], "release": "flatten", "num_classes": 3,
                "mechanism_parameters": {"epsilon": 0.5, "alpha": 10}, "plan_fingerprint": plan.fingerprint,
                "feature_schema_version": SCHEMA_VERSION}
    assert check_against_plan(plan, agreeing) == []
    assert check_against_plan(plan, {"extractor": None}) == []  # None: not set here, nothing to check
    found = check_against_plan(plan, {"extractor": "cifar-cnn", "input_shape": [28, 28, 1],
                                      "classes": ["benign", "cyst"],
                                      "mechanism_parameters": {"epsilon": 1.0, "clip": 2.0},
                                      "plan_fingerprint": "sha256:00"})
    assert found == [
        "extractor = \"cifar-cnn\" contradicts the plan (\"mnist-cnn\")",
        "input_shape = [28, 28, 1] contradicts the plan ([20, 20, 1])",
        "classes 'cyst' not among the plan's classes (benign, malignant, unclear)",
        "epsilon = 1.0 contradicts the plan (0.5)",
        "clip = 2.0, but the plan's mechanism 'uer' takes no clip",
        f"plan_fingerprint = \"sha256:00\" contradicts the plan (\"{plan.fingerprint}\")",
    ]
    with pytest.raises(ValueError, match="unknown plan setting"):
        check_against_plan(plan, {"colour": "red"})


def test_require_agreement_raises_with_settings_marked():
    plan = make_plan()
    plan.require_agreement({"extractor": "mnist-cnn"})
    with pytest.raises(PlanMismatch) as error:
        plan.require_agreement({"mechanism": "rr", "mechanism_parameters": {"epsilon": 2.0}}, "plan.json")
    assert str(error.value) == ("settings contradict plan.json: mechanism = \"rr\" contradicts the plan (\"uer\"); "
                                "epsilon = 2.0 contradicts the plan (0.5)")
    assert error.value.parameters == ("mechanism", "epsilon")
    assert "--epsilon = 2.0" in error.value.render(lambda n: "--" + n)
    assert len(error.value.contradictions) == 2
