"""The contract every registered mechanism keeps, and validation of parameters at construction."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.registry import register

NAMES = mech.mechanism_names()
WITH_EPSILON = [
    n for n in NAMES if "epsilon" in {f.name for f in dataclasses.fields(mech.mechanism_class(n))}
]
WITH_DELTA = ["gaussian", "gaussian-wu", "ldpsign", "fedaw-gaussian"]
BIT_NAMES = mech.mechanism_names("bits")


def test_the_registry_holds_every_mechanism_of_the_papers() -> None:
    bits = {"uer", "moue", "oue", "rr"}
    real = {"gaussian", "gaussian-wu", "ldpsign", "pdpm", "fedaw-gaussian"}
    assert bits | real | {"none"} <= set(NAMES)
    assert NAMES == sorted(NAMES)
    assert bits | {"none"} <= set(BIT_NAMES)  # 'none' takes any domain
    assert not real & set(BIT_NAMES)
    assert real | {"none"} <= set(mech.mechanism_names("real"))
    assert not bits & set(mech.mechanism_names("real"))
    assert bits | real <= set(WITH_EPSILON)
    assert "none" not in WITH_EPSILON


@pytest.mark.parametrize("name", NAMES)
def test_contract(name: str, small_mechanism, sample_input) -> None:
    m = small_mechanism(name)
    cls = mech.mechanism_class(name)
    assert type(m) is cls and m.NAME == name and cls.SOURCE and cls.SUMMARY
    assert cls.DOMAIN in ("bits", "real", "category", "bounded", "statistics", "any")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.epsilon = 3.0  # frozen, whatever the fields are

    # Shape and dtype kept; the RNG is respected.
    x = sample_input(m)
    y = m.randomize(x, rng=mech.default_rng(1))
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, m.randomize(x, rng=mech.default_rng(1)))
    if m.DOMAIN == "bits":
        assert y.dtype == np.uint8 and set(np.unique(y)) <= {0, 1}
    else:
        assert y.dtype == np.float32
        y64 = m.randomize(x.astype(np.float64), rng=mech.default_rng(1))
        assert y64.dtype == np.float64 and y64.shape == x.shape
    # A single record (no batch axis) and an empty batch work too.
    assert m.randomize(x[0], rng=mech.default_rng(1)).shape == x[0].shape
    assert m.randomize(x[:0], rng=mech.default_rng(1)).shape == x[:0].shape

    # The report is valid.
    report = m.report()
    assert isinstance(report, mech.PrivacyReport)
    assert report.mechanism == name
    assert report.source == cls.SOURCE
    assert report.exact_epsilon_per_coordinate >= 0.0
    assert report.exact_epsilon_per_record is None or report.exact_epsilon_per_record >= 0.0
    assert report.parameters == m.parameters()
    if name != "none":
        assert report.nominal_epsilon == m.epsilon
    text = json.dumps(report.to_dict())  # JSON-serializable as is
    back = mech.PrivacyReport.from_dict(json.loads(text))
    assert back == report
    assert json.loads(report.to_json()) == json.loads(text)
    labelled = report.with_randomness("seeded")
    assert labelled.randomness == "seeded"
    assert mech.PrivacyReport.from_dict(json.loads(json.dumps(labelled.to_dict()))).randomness == "seeded"
    assert name in report.format_text()


@pytest.mark.parametrize("name", NAMES)
def test_parameter_specs_match_the_fields(name: str) -> None:
    cls = mech.mechanism_class(name)
    specs = cls.parameter_specs()
    assert [s.name for s in specs] == [f.name for f in dataclasses.fields(cls)]
    for spec in specs:
        assert spec.help, spec.name
        assert spec.option == "--" + spec.name.replace("_", "-")
        assert spec.type in (float, int, str)


def test_none_is_not_private() -> None:
    report = mech.create_mechanism("none").report()
    assert report.exact_epsilon_per_record == math.inf
    assert not report.private
    assert report.to_dict()["exact_epsilon_per_record"] == "inf"
    assert mech.PrivacyReport.from_dict(report.to_dict()).exact_epsilon_per_record == math.inf
    x = np.arange(6, dtype=np.float32)
    y = mech.create_mechanism("none").randomize(x, rng=mech.default_rng(0))
    np.testing.assert_array_equal(x, y)
    assert y is not x


# --------------------------------------------------------------------------------------------------
# Validation: ValueError, quoting the bad value.


@pytest.mark.parametrize("name", WITH_EPSILON)
@pytest.mark.parametrize(
    ("bad", "quoted"),
    [(0.0, "0.0"), (-1.0, "-1.0"), (-0.5, "-0.5"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
)
def test_bad_epsilon(name: str, bad: float, quoted: str, small_mechanism) -> None:
    with pytest.raises(ValueError, match=rf"epsilon must be a finite number > 0, got {re.escape(quoted)}$"):
        small_mechanism(name, epsilon=bad)


@pytest.mark.parametrize("name", ["uer", "moue"])
@pytest.mark.parametrize("bad", [0.0, -10.0, math.nan, math.inf])
def test_bad_alpha(name: str, bad: float, small_mechanism) -> None:
    with pytest.raises(ValueError, match=rf"alpha must be a finite number > 0, got {re.escape(repr(bad))}$"):
        small_mechanism(name, alpha=bad)


@pytest.mark.parametrize("name", ["uer", "moue", "oue", "rr"])
@pytest.mark.parametrize(("field", "label"), [("integer_bits", "m"), ("fraction_bits", "n")])
@pytest.mark.parametrize("bad", [-1, -5])
def test_bad_encoding_widths(name: str, field: str, label: str, bad: int, small_mechanism) -> None:
    with pytest.raises(ValueError, match=rf"^{label} \(.*got {bad}$"):
        small_mechanism(name, **{field: bad})


@pytest.mark.parametrize("name", ["uer", "rr"])
@pytest.mark.parametrize(
    ("params", "quoted"), [({"features": 0}, "got 0"), ({"sensitivity_rule": "half"}, "got 'half'")]
)
def test_bad_bit_parameters(name: str, params: dict, quoted: str, small_mechanism) -> None:
    with pytest.raises(ValueError, match=quoted):
        small_mechanism(name, **params)


@pytest.mark.parametrize("name", WITH_DELTA)
@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.1, math.nan])
def test_bad_delta(name: str, bad: float) -> None:
    with pytest.raises(
        ValueError, match=rf"delta must lie in the open interval \(0, 1\), got {re.escape(repr(bad))}"
    ):
        mech.create_mechanism(name, delta=bad)


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf, math.nan])
def test_bad_safe_range_length(bad: float) -> None:
    with pytest.raises(ValueError, match=rf"safe_range_length \(L\) must be .*got {re.escape(repr(bad))}"):
        mech.create_mechanism("pdpm", safe_range_length=bad)


@pytest.mark.parametrize(
    ("name", "params", "quoted"),
    [
        ("pdpm", {"center": math.inf}, "center must be a finite number, got inf"),
        ("gaussian", {"clip": 0.0}, "clip must be a finite number > 0, got 0.0"),
        ("gaussian", {"sensitivity": -1.0}, "sensitivity must be a finite number > 0, got -1.0"),
        ("gaussian-wu", {"sample_rate": 1.0}, "sample_rate must lie in the open interval (0, 1), got 1.0"),
        ("gaussian-wu", {"rounds": 0}, "rounds must be an integer >= 1, got 0"),
        ("ldpsign", {"l2_sensitivity": 0.0}, "l2_sensitivity must be a finite number > 0, got 0.0"),
        ("fedaw-gaussian", {"sensitivity": math.nan}, "sensitivity must be a finite number > 0, got nan"),
        ("pdpm", {"dim": 0}, "dim must be an integer >= 1, got 0"),
    ],
)
def test_other_bad_parameters(name: str, params: dict, quoted: str) -> None:
    with pytest.raises(ValueError, match=re.escape(quoted)):
        mech.create_mechanism(name, **params)


def test_unknown_mechanism_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown mechanism 'uerr'") as info:
        mech.create_mechanism("uerr")
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "params"), [("rr", {"alpha": 3.0}), ("gaussian", {"sigma": 1.0}), ("none", {"epsilon": 1.0})]
)
def test_unknown_parameter_is_refused(name: str, params: dict) -> None:
    unknown = next(iter(params))
    with pytest.raises(ValueError, match=rf"mechanism '{name}' takes no parameter {unknown}"):
        mech.create_mechanism(name, **params)


def test_a_name_cannot_be_registered_twice() -> None:
    @dataclasses.dataclass(frozen=True)
    class Impostor(mech.mechanism_class("rr")):
        NAME = "rr"

    with pytest.raises(ValueError, match="'rr' is already registered"):
        register(Impostor)
