"""Typed records across the stages: MechanismSpec, strict PrivacyReport.from_dict, declared abilities, Registry."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.common.registry import Registry
from ldpfl.stage2_federate.options import check_wiring

IV_D = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5}
NAMES = mech.mechanism_names()


# --------------------------------------------------------------------------------------------------
# Registry


def test_registry_refuses_duplicates_and_lists_valid_names() -> None:
    reg: Registry[int] = Registry("widget")
    assert reg.add("a", 1) == 1 and reg.add("b", 2) == 2
    assert reg.names() == ["a", "b"] and "a" in reg and len(reg) == 2 and list(reg) == ["a", "b"]
    with pytest.raises(ValueError, match="widget name 'a' is already registered by 1"):
        reg.add("a", 3)
    with pytest.raises(ValueError, match="unknown widget 'c'; valid names: a, b"):
        reg.get("c")
    with pytest.raises(ValueError, match="has no name"):
        reg.add("", 4)
    assert reg.remove("a") == 1 and reg.names() == ["b"]
    with pytest.raises(ValueError, match="unknown widget 'a'"):
        reg.remove("a")
    assert reg.get("b") == 2


def test_mechanism_registry_uses_it() -> None:
    from ldpfl.mechanisms.registry import MECHANISMS, register

    assert sorted(MECHANISMS.names()) == NAMES
    with pytest.raises(ValueError, match="mechanism name 'uer' is already registered by UER"):
        register(mech.mechanism_class("uer"))
    with pytest.raises(ValueError, match="unknown mechanism 'nope'; valid names: .*uer"):
        mech.mechanism_class("nope")


# --------------------------------------------------------------------------------------------------
# Declared abilities


@pytest.mark.parametrize("name", NAMES)
def test_abilities_are_declared(name: str, small_mechanism) -> None:
    cls = mech.mechanism_class(name)
    m = small_mechanism(name)
    assert cls.FEATURE_FORMAT in mech.FEATURE_FORMATS
    assert cls.encodes_bits() == (cls.FEATURE_FORMAT == mech.PACKED_BITS)
    if cls.DOMAIN in ("bits", "real"):
        assert cls.encodes_bits() == (cls.DOMAIN == "bits")
    assert cls.RANDOMIZES == (name != "none")
    if cls.DOMAIN == "bits":
        assert m.fixed_point_encoding() == m.encoding and m.record_size() == m.features
        density = m.expected_density(np.full(m.width, 0.5))
        assert density.shape == (m.width,) and np.all((density >= 0) & (density <= 1))
        assert m.noise_scale() is None and m.output_values() is None
    elif cls.DOMAIN == "real":
        assert m.fixed_point_encoding() is None and m.expected_density(np.zeros(3)) is None
        assert cls.FEDERATION is not None
        assert m.noise_scale() > 0
    if name == "pdpm":
        assert m.output_values() == pytest.approx(m.output_values())
        assert len(m.output_values()) == 3
    if name == "none":
        assert m.noise_scale() is None and m.record_size() is None
        np.testing.assert_array_equal(m.expected_density(np.array([0.0, 0.25, 1.0])), [0.0, 0.25, 1.0])


def test_federation_wiring_is_declared_by_the_real_mechanisms_and_none() -> None:
    names = mech.federation_names()
    assert names[0] == "none"
    assert set(names) == {"none", "gaussian", "gaussian-wu", "ldpsign", "pdpm", "fedaw-gaussian"}
    none = mech.mechanism_class("none").FEDERATION
    assert none.target == mech.PARAMETERS and not none.budget and not none.options
    ldpsign = mech.mechanism_class("ldpsign").FEDERATION
    assert ldpsign.sign_aggregation and ldpsign.target == mech.UPDATE
    assert ldpsign.options["sensitivity"] == "l2_sensitivity"
    assert mech.mechanism_class("pdpm").FEDERATION.ranges == ("safe_range_length", "center")
    assert mech.mechanism_class("gaussian-wu").FEDERATION.rounds == "rounds"


def test_federation_wiring_validates_its_declaration() -> None:
    with pytest.raises(ValueError, match="federation target must be one of parameters, update, got 'weights'"):
        mech.FederationWiring("weights", "x")
    wiring = mech.FederationWiring(mech.PARAMETERS, "x", options={"clipping": "clip"})  # stage 2 knows the names
    with pytest.raises(ValueError, match="unknown federation options clipping"):
        check_wiring("x", wiring)


# --------------------------------------------------------------------------------------------------
# MechanismSpec


def test_resolve_bit_mechanism_with_the_iv_d_defaults() -> None:
    spec = mech.MechanismSpec.resolve("uer", IV_D, features=1152, defaults=IV_D)
    assert spec.feature_format == mech.PACKED_BITS and spec.encodes_bits and spec.randomizes
    assert (spec.integer_bits, spec.fraction_bits, spec.features, spec.feature_width) == (4, 5, 1152, 11_520)
    built = spec.build()
    assert built is spec.build() and built.parameters() == dict(spec.parameters)
    assert spec.report() == built.report()
    assert spec.recorded_parameters()["features"] == 1152


def test_resolve_drops_shared_defaults_only() -> None:
    rr = mech.MechanismSpec.resolve("rr", IV_D, features=10, defaults=IV_D)
    assert "alpha" not in rr.parameters
    with pytest.raises(ValueError, match="mechanism 'rr' takes no parameter 'alpha' \\(= 3.0\\)"):
        mech.MechanismSpec.resolve("rr", {**IV_D, "alpha": 3.0}, features=10, defaults=IV_D)
    with pytest.raises(ValueError, match="takes no parameter 'alpha'"):
        mech.MechanismSpec.resolve("rr", IV_D, features=10)  # no shared defaults: nothing is dropped
    with pytest.raises(ValueError, match="'features' is set from the feature count \\(r = 10\\)"):
        mech.MechanismSpec.resolve("uer", {"features": 5}, features=10)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0, got 0"):
        mech.MechanismSpec.resolve("uer", {"epsilon": 0}, features=10)
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        mech.MechanismSpec.resolve("nope", {}, features=10)


def test_resolve_real_and_none() -> None:
    pdpm = mech.MechanismSpec.resolve("pdpm", {**IV_D, "safe_range_length": 2}, features=784, defaults=IV_D)
    assert pdpm.feature_format == mech.FLOAT32 and pdpm.encoding is None and pdpm.build().dim == 784
    assert (pdpm.integer_bits, pdpm.fraction_bits, pdpm.feature_width) == (0, 0, 784)
    with pytest.raises(ValueError, match="takes no parameter 'integer_bits'"):
        mech.MechanismSpec.resolve("pdpm", {"integer_bits": 6}, features=784)
    none = mech.MechanismSpec.resolve("none", {**IV_D, "integer_bits": 3}, features=784, defaults=IV_D)
    assert none.feature_format == mech.PACKED_BITS and none.encoding == mech.FixedPointEncoding(3, 5)
    assert not none.randomizes and none.recorded_parameters() == {"integer_bits": 3, "fraction_bits": 5}
    assert none.feature_width == 784 * 9
    with pytest.raises(ValueError, match="mechanism 'none' takes no parameter 'epsilon' \\(= 2.0\\); it takes: "
                                         "integer_bits, fraction_bits"):
        mech.MechanismSpec.resolve("none", {"epsilon": 2.0}, features=784, defaults=IV_D)


@pytest.mark.parametrize("name", NAMES)
def test_spec_round_trips_through_json(name: str) -> None:
    spec = mech.MechanismSpec.resolve(name, IV_D, features=12, defaults=IV_D)
    back = mech.MechanismSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec and back.report() == spec.report()
    unpickled = pickle.loads(pickle.dumps(spec))  # export workers receive the spec in another process
    assert unpickled == spec and unpickled.build() == spec.build()
    assert hash(unpickled) == hash(spec) and len({spec, back, unpickled}) == 1
    # A file's mechanism / mechanism_parameters pair, without the feature count, rebuilds it too.
    pair = mech.MechanismSpec.from_dict({"name": name, "parameters": spec.recorded_parameters()})
    assert pair.build() == spec.build() and pair.encoding == spec.encoding


def test_spec_checks_its_parts_agree() -> None:
    with pytest.raises(ValueError, match="mechanism parameter features = 8 differs from features = 9"):
        mech.MechanismSpec("uer", {"features": 8}, features=9)
    with pytest.raises(ValueError, match=r"encoding \(integer_bits, fraction_bits\) = \(3, 5\) differs"):
        mech.MechanismSpec("uer", {"features": 8}, encoding=mech.FixedPointEncoding(3, 5))
    with pytest.raises(ValueError, match="needs a fixed-point encoding"):
        mech.MechanismSpec("none", {})
    with pytest.raises(ValueError, match="takes no fixed-point encoding"):
        mech.MechanismSpec("gaussian", {}, encoding=mech.FixedPointEncoding())
    with pytest.raises(ValueError, match="mechanism 'gaussian' takes no parameter 'alpha'"):
        mech.MechanismSpec("gaussian", {"alpha": 1.0})


@pytest.mark.parametrize(("data", "message"), [
    ([], "must be a JSON object, got list"),
    ({"parameters": {}}, "missing key 'name'"),
    ({"name": "uer"}, "missing key 'parameters'"),
    ({"name": 3, "parameters": {}}, "key 'name' must be a string"),
    ({"name": "uer", "parameters": []}, "key 'parameters' must be an object"),
    ({"name": "uer", "parameters": {}, "features": "8"}, "key 'features' must be an integer >= 1 or null"),
    ({"name": "uer", "parameters": {}, "extra": 1}, "unknown key\\(s\\) 'extra'"),
    ({"name": "none", "parameters": {"integer_bits": 4}}, "give integer_bits but not fraction_bits"),
    ({"name": "uer", "parameters": {"epsilon": -1}}, "epsilon must be a finite number > 0, got -1"),
])
def test_spec_from_dict_is_strict(data, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mech.MechanismSpec.from_dict(data)


# --------------------------------------------------------------------------------------------------
# PrivacyReport.from_dict


@pytest.mark.parametrize("name", NAMES)
def test_report_round_trip(name: str, small_mechanism) -> None:
    report = small_mechanism(name).report().with_randomness("csprng")
    data = json.loads(json.dumps(report.to_dict()))
    assert mech.PrivacyReport.from_dict(data) == report
    del data["randomness_description"]  # recomputed, may be left out
    assert mech.PrivacyReport.from_dict(data) == report


def _report_dict() -> dict:
    return json.loads(json.dumps(mech.create_mechanism("gaussian", dim=4).report().to_dict()))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mechanism", 3, "key 'mechanism' must be a string"),
    ("nominal_epsilon", "1.0", "key 'nominal_epsilon' must be a number, 'inf' or null"),
    ("nominal_epsilon", True, "key 'nominal_epsilon' must be a number"),
    ("nominal_delta", None, "key 'nominal_delta' must be a number, 'inf', got None"),
    ("exact_epsilon_per_record", [1.0], "key 'exact_epsilon_per_record' must be a number"),
    ("parameters", [], "key 'parameters' must be an object with string keys"),
    ("probabilities", "x", "key 'probabilities' must be an object"),
    ("notes", "a note", "key 'notes' must be a list of strings"),
    ("notes", [1], "key 'notes' must be a list of strings"),
    ("randomness", "dice", "key 'randomness' must be one of unspecified, csprng, seeded"),
])
def test_report_from_dict_names_the_bad_key(key: str, value, message: str) -> None:
    data = _report_dict()
    data[key] = value
    with pytest.raises(ValueError, match=message):
        mech.PrivacyReport.from_dict(data)


def test_report_from_dict_refuses_lists_missing_and_unknown_keys() -> None:
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        mech.PrivacyReport.from_dict([["mechanism", "none"]])
    data = _report_dict()
    del data["exact_delta"], data["coordinate"]
    with pytest.raises(ValueError, match="missing key\\(s\\) 'exact_delta', 'coordinate'"):
        mech.PrivacyReport.from_dict(data)
    data = {**_report_dict(), "client": 3}
    with pytest.raises(ValueError, match="unknown key\\(s\\) 'client'"):
        mech.PrivacyReport.from_dict(data)
    assert mech.PrivacyReport.from_dict(data, ignore_unknown=True).mechanism == "gaussian"


def test_report_from_dict_reads_inf_and_optional_defaults() -> None:
    data = _report_dict()
    data.update(exact_epsilon_per_record="inf")
    for key in ("sigma", "sensitivity", "probabilities", "notes", "randomness"):
        data.pop(key)
    report = mech.PrivacyReport.from_dict(data)
    assert report.exact_epsilon_per_record == math.inf and not report.private
    assert report.sigma is None and report.notes == () and report.randomness == "unspecified"
