"""Stage-2 personalized budgets: presets, list parsing, and per-client perturbation wiring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms.calibration import pdpm_output_values, pdpm_probabilities, pdpm_variance_bound
from ldpfl.stage2_federate import budgets
from ldpfl.stage2_federate.perturbation import (
    PARAMETERS,
    UPDATE,
    build_client_perturbations,
    resolve_target,
)

# --------------------------------------------------------------------------------------------------
# Presets and parsing.


def test_wu_presets_are_the_papers_sets() -> None:
    assert budgets.get_preset("wu-fmnist-LH").for_clients(10) == (5.0,) * 5 + (15.0,) * 5
    assert budgets.get_preset("wu-forest-LMH").for_clients(10) == (1.0,) * 3 + (5.0,) * 4 + (10.0,) * 3
    assert budgets.get_preset("wu-mnist-iid-LMH").for_clients(3) == (1.0, 5.0, 10.0)
    assert budgets.get_preset("wu-fmnist-iid-LLH").for_clients(3) == (0.05, 0.05, 1.0)


def test_fixed_size_preset_refuses_another_client_count() -> None:
    with pytest.raises(ValueError, match=r"'wu-fmnist-LH' is defined for 10 clients .* this run has 4"):
        budgets.get_preset("wu-fmnist-LH").for_clients(4)


def test_pldp_modes_cycle_over_any_n() -> None:
    assert budgets.get_preset("pldp-eps1").for_clients(5) == (0.1, 0.2, 0.1, 0.2, 0.1)
    eps2 = budgets.get_preset("pldp-eps2").for_clients(12)
    assert eps2 == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.1, 0.2))
    assert budgets.get_preset("pldp-eps3").for_clients(3) == (0.9, 1.0, 0.9)
    assert budgets.get_preset("pldp-tau1").for_clients(3) == (0.2, 0.4, 0.2)
    assert budgets.get_preset("pldp-tau2").for_clients(11)[-2:] == pytest.approx((2.0, 0.2))
    assert budgets.get_preset("pldp-tau3").for_clients(2) == (1.8, 2.0)


def test_unknown_preset_lists_the_names() -> None:
    with pytest.raises(ValueError, match="unknown budget preset 'wu-xyz'; valid names: wu-mnist-iid-LLH"):
        budgets.get_preset("wu-xyz")


def test_parse_list_file_and_preset(tmp_path) -> None:
    assert budgets.parse_value_list("1, 1,10") == (1.0, 1.0, 10.0)
    assert budgets.parse_value_list("wu-mnist-LH") == "wu-mnist-LH"
    (tmp_path / "e.json").write_text("[0.5, 2]")
    assert budgets.parse_value_list(f"@{tmp_path / 'e.json'}") == (0.5, 2.0)
    (tmp_path / "o.json").write_text('{"epsilons": [3, 4]}')
    assert budgets.parse_value_list(f"@{tmp_path / 'o.json'}") == (3.0, 4.0)
    (tmp_path / "e.csv").write_text("epsilon\n1\n5\n10\n")
    assert budgets.parse_value_list(f"@{tmp_path / 'e.csv'}") == (1.0, 5.0, 10.0)
    (tmp_path / "row.csv").write_text("1,2,3\n")
    assert budgets.parse_value_list(f"@{tmp_path / 'row.csv'}") == (1.0, 2.0, 3.0)
    assert budgets.parse_numbers("-0.5,0,1", what="centres", positive=False) == (-0.5, 0.0, 1.0)


@pytest.mark.parametrize(("text", "message"), [
    ("1,0,2", "must be finite numbers > 0, got 0.0"),
    ("1,x", "'x' is not a number"),
    ("1,inf", "must be finite numbers > 0, got inf"),
    ("pldp-tau1", "sets range values, not client epsilons"),
    ("@/nonexistent/eps.json", "cannot read client epsilons file"),
])
def test_parse_errors_quote_the_value(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        budgets.parse_value_list(text)


def test_bad_files(tmp_path) -> None:
    (tmp_path / "e.txt").write_text("1,2")
    with pytest.raises(ValueError, match="use a .json or .csv file"):
        budgets.parse_value_list(f"@{tmp_path / 'e.txt'}")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        budgets.parse_value_list(f"@{tmp_path / 'bad.json'}")
    (tmp_path / "bad.csv").write_text("eps\n1\nten\n")
    with pytest.raises(ValueError, match="row 3 holds a non-number"):
        budgets.parse_value_list(f"@{tmp_path / 'bad.csv'}")


def test_resolve_values_length_must_match() -> None:
    assert budgets.resolve_values(None, 2.0, 3, what="client epsilons") == (2.0, 2.0, 2.0)
    assert budgets.resolve_values("pldp-eps1", 2.0, 3, what="client epsilons") == (0.1, 0.2, 0.1)
    with pytest.raises(ValueError, match="client epsilons list has 2 values but the run has 3 clients"):
        budgets.resolve_values((1.0, 2.0), 1.0, 3, what="client epsilons")


# --------------------------------------------------------------------------------------------------
# Perturbation wiring: one mechanism per client, each with its own budget.

EPS = (1.0, 1.0, 10.0)
DIM = 7


@pytest.mark.parametrize("name", ["gaussian-wu", "gaussian", "ldpsign", "fedaw-gaussian"])
def test_each_client_gets_its_own_epsilon_and_sigma(name) -> None:
    built = build_client_perturbations(name, dim=DIM, epsilons=EPS, target=UPDATE if name != "gaussian" else
                                       PARAMETERS)
    for p, epsilon in zip(built, EPS, strict=True):
        alone = mech.create_mechanism(name, epsilon=epsilon, dim=DIM)
        assert p.epsilon == epsilon
        assert p.mechanism.dim == DIM
        assert p.noise_scale == pytest.approx(alone.sigma)
        report = p.report("seeded")
        assert report.nominal_epsilon == epsilon and report.mechanism == name
        assert report.randomness == "seeded"
    assert built[0].noise_scale == built[1].noise_scale > built[2].noise_scale


def test_pdpm_clients_get_their_own_range_and_epsilon() -> None:
    built = build_client_perturbations("pdpm", dim=DIM, epsilons=(0.1, 0.5, 1.0), target=PARAMETERS,
                                       ranges=(0.2, 0.4, 2.0), centres=(0.0, 0.1, -0.5))
    assert [p.mechanism.safe_range_length for p in built] == [0.2, 0.4, 2.0]
    assert [p.mechanism.center for p in built] == [0.0, 0.1, -0.5]
    assert [p.epsilon for p in built] == [0.1, 0.5, 1.0]
    for p in built:
        assert p.noise_scale == pytest.approx(math.sqrt(pdpm_variance_bound(p.epsilon,
                                                                            p.mechanism.safe_range_length)))
        assert list(p.report("csprng").probabilities["safe_range"]) == list(p.mechanism.safe_range)


def test_delta_one_over_n_is_per_client() -> None:
    built = build_client_perturbations("gaussian-wu", dim=DIM, epsilons=(1.0, 1.0), target=PARAMETERS,
                                       delta="1/n", train_sizes=(100, 1000), rounds=5)
    assert [p.mechanism.delta for p in built] == [0.01, 0.001]
    assert [p.mechanism.rounds for p in built] == [5, 5]
    assert built[0].noise_scale < built[1].noise_scale  # smaller δ → larger σ (Wu eq. 4)


def test_options_a_mechanism_does_not_take_are_refused() -> None:
    with pytest.raises(ParameterError, match="perturbation 'pdpm' takes no clip; it takes client_ranges, "
                                             "client_centres$") as error:
        build_client_perturbations("pdpm", dim=DIM, epsilons=EPS, target=PARAMETERS, clip=1.0)
    assert error.value.parameters == ("clip", "client_ranges", "client_centres")
    assert error.value.render(lambda n: "--" + n.replace("_", "-")).startswith("perturbation 'pdpm' takes no --clip;")
    with pytest.raises(ValueError, match="perturbation 'gaussian' takes no client_ranges/client_centres; it takes "
                                         "clip, delta, sensitivity$"):
        build_client_perturbations("gaussian", dim=DIM, epsilons=EPS, target=PARAMETERS, ranges=(1, 1, 1))
    with pytest.raises(ValueError, match="perturbation 'none' takes no delta; it takes none of these options"):
        build_client_perturbations("none", dim=DIM, epsilons=EPS, target=PARAMETERS, delta=0.1)
    with pytest.raises(ValueError, match="ranges list has 2 values but there are 3 clients"):
        build_client_perturbations("pdpm", dim=DIM, epsilons=EPS, target=PARAMETERS, ranges=(1, 1))


def test_none_has_no_noise_scale_and_says_not_private() -> None:
    built = build_client_perturbations("none", dim=DIM, epsilons=(1.0, 1.0), target=PARAMETERS)
    assert [p.noise_scale for p in built] == [None, None]
    assert built[0].report("csprng").exact_epsilon_per_record == math.inf


def test_targets_per_mechanism() -> None:
    assert resolve_target("gaussian-wu") == PARAMETERS
    assert resolve_target("pdpm") == PARAMETERS
    assert resolve_target("fedaw-gaussian") == UPDATE
    assert resolve_target("ldpsign") == UPDATE
    assert resolve_target("ldpsign", sign_mode="literal") == PARAMETERS
    assert resolve_target("gaussian", "update") == UPDATE
    with pytest.raises(ValueError, match="ldpsign with sign_mode 'update' perturbs the update; perturb_target "
                                         "'parameters' contradicts it"):
        resolve_target("ldpsign", "parameters", "update")


def test_perturb_uses_the_target_and_the_clients_generator() -> None:
    local = np.array([0.5, -0.25, 1.0], dtype=np.float32)
    glob = np.array([0.25, 0.25, 0.25], dtype=np.float32)
    [p] = build_client_perturbations("gaussian", dim=3, epsilons=(1.0,), target=UPDATE, clip=4.0)
    out = p.perturb(local, glob, rng=mech.default_rng(4))
    noise = mech.create_mechanism("gaussian", epsilon=1.0, dim=3, clip=4.0).randomize(local - glob,
                                                                                   rng=mech.default_rng(4))
    np.testing.assert_array_equal(out, noise)
    assert out.dtype == np.float32
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        p.perturb(local, glob, rng=4)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 5.0])
@pytest.mark.parametrize("length", [0.2, 1.0, 2.0])
def test_pdpm_variance_bound_holds_for_eq10(epsilon, length) -> None:
    """L²(e^ε+1)(e^ε+3)/(e^ε-1)² bounds the exact variance of eq. 10 over the whole safe range."""
    v = np.linspace(-length / 2, length / 2, 201)
    p_high, p_low = pdpm_probabilities(v, epsilon, length)
    high, low = pdpm_output_values(epsilon, length)
    mean = p_high * high + p_low * low
    np.testing.assert_allclose(mean, v, atol=1e-12)  # unbiased (eq. 12)
    variance = p_high * high**2 + p_low * low**2 - mean**2
    assert variance.max() <= pdpm_variance_bound(epsilon, length)


def test_pdpm_literal_eq14_is_not_a_bound() -> None:
    """Why L² and not the printed L: for ε = 0.1, L = 2 the printed bound is below the true variance."""
    e = math.exp(0.1)
    printed = (e + 1) * (e + 3) / (2.0 * (e - 1) ** 2)
    p_high, p_low = pdpm_probabilities(np.array([0.0]), 0.1, 2.0)
    high, low = pdpm_output_values(0.1, 2.0)
    assert float(p_high[0] * high**2 + p_low[0] * low**2) > printed
