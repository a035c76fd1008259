"""Federation options are registered once (``stage2_federate.options``): config, API, CLI and help agree."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from cli_checks import assert_usage_error, command, ok

from ldpfl import mechanisms as mech
from ldpfl.api.fields import FederationFields
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.options import FEDERATION_OPTIONS
from ldpfl.stage2_federate.perturbation import build_client_perturbations, option_help

federate = command("federate")


@pytest.mark.parametrize("option", sorted(FEDERATION_OPTIONS))
def test_each_option_is_a_config_field_an_api_field_and_a_flag_with_generated_help(option) -> None:
    assert option in {f.name for f in dataclasses.fields(FederationConfig)}
    assert option in typing.get_type_hints(FederationFields)
    flag = "--" + option.replace("_", "-")
    text = " ".join(ok(federate("--help")).output.split())
    assert flag in text
    takers = [n for n in mech.federation_names() if option in mech.mechanism_class(n).FEDERATION.options]
    assert takers  # every registered option is taken by some mechanism
    assert all(f"{name}:" in option_help(option) for name in takers)
    assert option_help(option).startswith(FEDERATION_OPTIONS[option].help)


def test_the_flags_check_the_registered_kind(tmp_path) -> None:
    assert_usage_error(federate(tmp_path, "--clip", "0"), "--clip")  # positive
    assert_usage_error(federate(tmp_path, "--sample-rate", "1"), "--sample-rate")  # probability in (0, 1)
    assert_usage_error(federate(tmp_path, "--delta", "2"), "delta")  # (0, 1) or 1/n


def test_an_unregistered_option_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="unknown federation options noise_multiplier"):
        build_client_perturbations("gaussian", dim=4, epsilons=[1.0], target="parameters", noise_multiplier=1.0)


def test_a_registered_option_reaches_the_mechanism() -> None:
    (perturbation,) = build_client_perturbations("gaussian", dim=4, epsilons=[1.0], target="parameters", clip=0.5)
    assert perturbation.mechanism.parameters()["clip"] == 0.5
