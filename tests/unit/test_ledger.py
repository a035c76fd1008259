"""The stage-2 privacy ledger (stage2_federate/ledger.py): dp-accounting called directly, basic composition
by hand, and the mapping from privacy reports."""

from __future__ import annotations

import math

import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import privacy_events as ev
from ldpfl.stage2_federate import ledger as lg


def direct_rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    return acc.get_epsilon(delta)


def direct_pld_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(("sigma", "sensitivity", "delta", "rounds"), [
    (38.758, 8.0, 1e-5, 1), (38.758, 8.0, 1e-5, 80), (9.69, 2.0, 1e-5, 20), (377.1, 40.0, 1e-3, 7)])
def test_gaussian_totals_match_dp_accounting(sigma: float, sensitivity: float, delta: float, rounds: int) -> None:
    release = ev.GaussianRelease(sigma, sensitivity, delta)
    entry = lg.ledger_entry(release, rounds, client=3)
    assert entry.epsilon == pytest.approx(direct_rdp_epsilon(sigma / sensitivity, rounds, delta), rel=1e-12)
    assert (entry.client, entry.rounds, entry.delta, entry.method) == (3, rounds, delta,
                                                                       accounting.METHOD_NAMES[accounting.RDP])
    continuous = ev.GaussianRelease(sigma, sensitivity, delta, discrete=False)
    pld = lg.ledger_entry(continuous, rounds, accountant=accounting.PLD)
    # the Gaussian alone is accounted exactly (the analytic Gaussian: mechanisms.accounting), within 1e-5 below
    # dp-accounting's pessimistic PLD discretization and never above it
    direct = direct_pld_epsilon(sigma / sensitivity, rounds, delta)
    assert direct * (1 - 1e-5) <= pld.epsilon <= direct + 1e-9
    # PLD is tight, RDP an upper bound: the two agree in order and PLD is never larger.
    assert pld.epsilon <= entry.epsilon + 1e-9


def test_gaussian_total_golden() -> None:
    """80 rounds of σ/Δ = 38.758/8 at δ = 1e-5 (gaussian, ε = 1 nominal per round): ε_total = 9.7321 by RDP
    (0.8220 for one round by RDP; PLD gives 9.0625 for the continuous Gaussian), far below 80 x one round."""
    entry = lg.ledger_entry(ev.GaussianRelease(38.758442100843, 8.0, 1e-5), 80)
    assert entry.epsilon == pytest.approx(9.732111197, rel=1e-8)
    one = lg.ledger_entry(ev.GaussianRelease(38.758442100843, 8.0, 1e-5), 1)
    assert one.epsilon == pytest.approx(0.82196887, rel=1e-7)
    pld = lg.ledger_entry(ev.GaussianRelease(38.758442100843, 8.0, 1e-5, discrete=False), 80, accountant=accounting.PLD)
    assert pld.epsilon == pytest.approx(9.062516, rel=1e-5)


def test_pure_basic_composition_by_hand() -> None:
    entry = lg.ledger_entry(ev.PureEvent(0.25), 12)
    assert entry.epsilon == 3.0 and entry.delta == 0.0 and entry.method == accounting.METHOD_BASIC
    assert lg.ledger_entry(ev.PureEvent(math.inf), 2).epsilon == math.inf
    assert lg.ledger_entry(ev.PureEvent(0.25), 0).epsilon == 0.0


def test_none_adds_nothing() -> None:
    entry = lg.ledger_entry(ev.NoRelease(), 5)
    assert entry.epsilon is None and entry.delta is None and entry.method == lg.METHOD_NONE
    assert "adds no noise" in entry.notes[0]
    assert entry.to_dict()["epsilon"] is None


def test_privacy_ledger_per_client() -> None:
    participation = lg.participation_counts([[0, 1], [1, 2], [1]], clients=[0, 1, 2, 3])
    assert participation == {0: 1, 1: 3, 2: 1, 3: 0}
    releases = {0: ev.PureEvent(1.5), 1: ev.PureEvent(0.5), 2: ev.GaussianRelease(10.0, 2.0, 1e-5),
                3: ev.GaussianRelease(10.0, 2.0, 1e-5)}
    ledger = lg.privacy_ledger(participation, releases)
    assert ledger[0].epsilon == 1.5 and ledger[1].epsilon == 1.5
    assert ledger[2].epsilon == pytest.approx(direct_rdp_epsilon(5.0, 1, 1e-5), rel=1e-12)
    assert ledger[3].epsilon == 0.0 and ledger[3].method == lg.METHOD_NO_UPLOADS
    shared = lg.privacy_ledger(participation, ev.NoRelease())
    assert all(e.method == lg.METHOD_NONE for e in shared.values())
    assert ledger[1].to_dict() == {"client": 1, "rounds": 3, "epsilon": 1.5, "delta": 0.0,
                                   "method": accounting.METHOD_BASIC, "notes": list(ledger[1].notes)}


def test_refusals() -> None:
    with pytest.raises(ValueError, match="releases must cover"):
        lg.privacy_ledger({0: 1, 1: 1}, {0: ev.PureEvent(1.0)})
    with pytest.raises(ValueError, match="rounds"):
        lg.ledger_entry(ev.PureEvent(1.0), -1)
    with pytest.raises(ValueError, match="accountant"):
        lg.ledger_entry(ev.PureEvent(1.0), 1, accountant="moments")
    with pytest.raises(ValueError, match="accountant='rdp'"):
        lg.ledger_entry(ev.GaussianRelease(1.0, 1.0, 1e-5), 1, accountant=accounting.PLD)
    with pytest.raises(ValueError, match="delta"):
        ev.GaussianRelease(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="sigma"):
        ev.GaussianRelease(0.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        ev.PureEvent(-1.0)
    with pytest.raises(ValueError, match="twice"):
        lg.participation_counts([[0, 0]], clients=[0])
    with pytest.raises(ValueError, match="not one of"):
        lg.participation_counts([[7]], clients=[0])


def test_release_from_report() -> None:
    """Reports map to releases per record (one upload = one record of dim coordinates)."""
    none = mech.create_mechanism("none").report()
    assert ev.release_from_report(none) == ev.NoRelease()
    pdpm = mech.create_mechanism("pdpm", epsilon=1.0, dim=10).report()
    pure = ev.release_from_report(pdpm)
    assert isinstance(pure, ev.PureEvent) and pure.epsilon == pytest.approx(10.0)
    fedaw = mech.create_mechanism("fedaw-gaussian", epsilon=1.0, delta=1e-5, sensitivity=2.0, dim=10).report()
    release = ev.release_from_report(fedaw)
    assert isinstance(release, ev.GaussianRelease)
    assert release.sigma == pytest.approx(fedaw.sigma) and release.delta == 1e-5
    assert release.l2_sensitivity == pytest.approx(fedaw.sensitivity)
    with pytest.raises(ValueError, match="dim"):
        ev.release_from_report(mech.create_mechanism("gaussian").report())


@pytest.mark.parametrize(("name", "params"), [("gaussian", {"epsilon": 0.5, "delta": 1e-5, "clip": 4.0, "dim": 16}),
                                              ("gaussian", {"epsilon": 2.0, "delta": 1e-6, "clip": 1.0, "dim": 784}),
                                              ("fedaw-gaussian", {"epsilon": 1.0, "delta": 1e-5, "dim": 10})])
def test_one_round_of_the_ledger_is_the_reports_per_record_epsilon(name: str, params: dict) -> None:
    """The same discrete Gaussian noise gets one ε: stage 1's report (ρ-zCDP through dp-accounting) and
    stage 2's ledger for one upload (dp-accounting's Gaussian event) agree up to float rounding of σ/Δ₂."""
    report = mech.create_mechanism(name, **params).report()
    entry = lg.ledger_entry(ev.release_from_report(report), 1)
    assert entry.epsilon == pytest.approx(report.exact_epsilon_per_record, rel=1e-9)
