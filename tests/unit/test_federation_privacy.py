"""A federation's privacy records: one writer and one reader each, and the guarantee made from typed records.

``ClientPrivacy`` (stage 2), ``LedgerSection`` and ``FederationGuarantee`` (``ldpfl.contract.federation_privacy``)
round-trip through their JSON forms unchanged; the readers refuse malformed sections with the messages
``ldpfl inspect`` shows; relabelling a plan's records makes new ones and never changes a record in place.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ldpfl import mechanisms as mech
from ldpfl.contract.federation_privacy import (
    DpSgdLedgerRow,
    FederationGuarantee,
    LedgerRow,
    LedgerSection,
    SiloGuarantee,
)
from ldpfl.contract.release_guarantee import (
    CLEAR_EVALUATION_NOTE,
    DP_SGD_SCOPE,
    FEDERATION_SCOPE,
    GuaranteePart,
    ReleaseGuarantee,
)
from ldpfl.stage2_federate import ledger as lg
from ldpfl.stage2_federate.client_privacy import ClientPrivacy
from ldpfl.stage2_federate.guarantee import federation_guarantee
from ldpfl.stage2_federate.round_record import RoundRecord
from ldpfl.stage2_federate.schedule import evaluations, is_evaluated
from ldpfl.stage2_federate.silo_training import PLAIN
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import DpSgdClient
from ldpfl.stage2_federate.silo_training.evaluation_noise import EvaluationNoise


def file_guarantee(epsilon: float) -> ReleaseGuarantee:
    return ReleaseGuarantee(epsilon, 0.0, (GuaranteePart("features", "the values", "uer", epsilon),), "a file")


def client(index: int, *, perturbation: str = "gaussian", file_epsilon: float = 50.0,
           dp_sgd: DpSgdClient | None = None, local_only: bool = False) -> ClientPrivacy:
    params = {"epsilon": 1.0, "dim": 10} if perturbation != "none" else {}
    upload = mech.create_mechanism(perturbation, **params).report().with_randomness("seeded", "PCG64")
    feature = mech.create_mechanism("uer", epsilon=0.5, alpha=10.0).report().with_randomness("seeded", "PCG64")
    return ClientPrivacy(index, upload, "parameters", upload.sigma, f"client_{index:03d}.h5", "uer", feature,
                         file_guarantee(file_epsilon), dp_sgd or PLAIN, local_only)


def round_of(number: int, selected: tuple[int, ...], dropped: tuple[int, ...] = ()) -> RoundRecord:
    return RoundRecord(number, 0.1, 0.9, 0.1, 0.9, selected, dropped, (), selected, (), (), False, (), 0.0)


NOISE = EvaluationNoise(50.0, 20, 1e-5, "replace-one", 3.0)


def dp(index: int, evaluation: EvaluationNoise | None = NOISE) -> DpSgdClient:
    return DpSgdClient(index, 1.2, 0.1, 0.1, 2, 1e-5, "replace-one", 500, 3.0, 20, evaluation)


def test_client_privacy_round_trips_and_relabels_into_a_new_record() -> None:
    record = client(0, dp_sgd=dp(0), local_only=True)
    written = record.to_dict()
    assert ClientPrivacy.from_dict(json.loads(json.dumps(written))) == record
    assert written["feature_privacy"] == json.loads(record.feature_privacy.to_json())  # as the file stores it
    assert list(written)[-3:] == ["release_guarantee", "dp_sgd", "local_only"]
    other = record.with_randomness("csprng", "AES-CTR")
    assert record.upload.randomness == "seeded" and other.upload.randomness == "csprng"  # never in place
    assert other.to_dict()["randomness_description"] != written["randomness_description"]


def test_the_ledger_section_round_trips_through_its_json() -> None:
    privacy = [client(0), client(1), client(2, perturbation="none")]
    rounds = [round_of(1, (0, 1)), round_of(2, (0, 2), dropped=(2,))]
    section = lg.ledger_section(rounds, privacy)
    assert [r.rounds for r in section.clients] == [2, 1, 0]
    assert all(isinstance(r, LedgerRow) for r in section.clients)
    assert section.clients[2].epsilon is None and section.clients[2].method == lg.METHOD_NONE
    written = section.to_dict()
    assert list(written) == ["rounds", "counted", "accountant", "adds_privacy_loss", "clients", "notes"]
    assert LedgerSection.from_dict(json.loads(json.dumps(written))) == section
    assert lg.ledger_caption(section).startswith("stage-2 privacy ledger: epsilon per client")


def test_the_ledger_has_one_display_with_an_optional_range() -> None:
    rows = (LedgerRow(0, 2, 1.5, 0.0, "basic composition"), LedgerRow(1, 1, math.inf, 0.0, "basic composition"),
            LedgerRow(2, 0, None, None, "none"))
    section = LedgerSection(2, "counted", "rdp", True, rows)
    assert section.lines() == ["  privacy ledger  stage 2, each client over its uploads (rdp):",
                               "    client 0: eps 1.5 over 2 uploads (basic composition)",
                               "    client 1: eps inf (not private) over 1 uploads (basic composition)",
                               "    client 2: eps n/a over 0 uploads (none)"]
    assert section.lines(max_clients=3) == section.lines()
    assert section.lines(max_clients=2)[1:] == ["    3 clients: eps from 1.5 to 1.5 over 0 to 2 uploads",
                                                "    1 clients: eps inf (not private)"]


def test_a_dp_sgd_section_and_the_guarantee_of_local_only_and_shared_silos() -> None:
    privacy = [client(0, dp_sgd=dp(0), local_only=True), client(1, dp_sgd=dp(1), file_epsilon=80.0)]
    section = lg.ledger_section([round_of(1, (0, 1)), round_of(2, (0,))], privacy)
    assert section.dp_sgd and section.as_of_round == 2
    assert all(isinstance(r, DpSgdLedgerRow) for r in section.clients)
    assert [r.steps for r in section.clients] == [4, 2]
    assert LedgerSection.from_dict(json.loads(json.dumps(section.to_dict()))) == section
    guarantee = federation_guarantee(privacy, section)
    local, shared = guarantee.clients
    row = section.clients[0]
    assert isinstance(row, DpSgdLedgerRow) and row.evaluation_releases == 2
    assert row.evaluation_epsilon == pytest.approx(NOISE.epsilon(2))  # sigma 50: far below the DP-SGD figure
    assert local.local_only_files and local.epsilon == max(row.epsilon_replace_one, row.evaluation_epsilon)
    assert local.evaluation_epsilon == row.evaluation_epsilon
    assert shared.epsilon == 80.0 and shared.epsilon_add_remove is None and shared.updates_only is not None
    assert shared.note is not None and "client 1's file is shareable" in shared.note
    assert guarantee.epsilon == 80.0 and guarantee.scope == FEDERATION_SCOPE and guarantee.epsilon_add_remove is None
    written = guarantee.to_dict()
    assert written["epsilon_replace_one"] == written["epsilon"] and written["neighbours"].startswith("replace-one")
    assert list(written["clients"][1]) == ["client", "epsilon", "delta", "epsilon_replace_one", "epsilon_add_remove",
                                           "local_only_files", "updates_only", "note"]
    assert FederationGuarantee.from_dict(json.loads(json.dumps(written))) == guarantee
    alone = federation_guarantee(privacy[:1], section)
    assert alone.scope == DP_SGD_SCOPE and alone.epsilon_add_remove == section.clients[0].epsilon_add_remove
    assert [p.kind for p in alone.parts] == ["extractor", "evaluation"]


def test_a_dp_sgd_ledger_counts_only_the_evaluated_rounds_releases() -> None:
    """``--eval-every 3`` over 7 rounds: the silos' evaluation replies are those of rounds 3, 6 and 7 alone."""
    # σ 4: the DP-SGD figures (not checked here) take dp-accounting a fraction of a second
    privacy = [client(0, dp_sgd=dataclasses.replace(dp(0), noise_multiplier=4.0), local_only=True)]
    rounds = [round_of(t, (0,)) if is_evaluated(t, every=3, rounds=7) else round_of(t, (0,)).unevaluated(0.0)
              for t in range(1, 8)]
    for done, releases in ((2, 0), (5, 1), (6, 2), (7, 3)):
        row = lg.ledger_section(rounds[:done], privacy).clients[0]
        assert isinstance(row, DpSgdLedgerRow) and row.rounds == done
        assert row.evaluation_releases == releases == evaluations(done, every=3, rounds=7)
        assert row.evaluation_epsilon == NOISE.epsilon(releases)
    assert "one per evaluated round so far (3 of the 7 rounds" in lg.ledger_section(rounds, privacy).notes[1]
    assert "one per round so far;" in lg.ledger_section([round_of(1, (0,))], privacy).notes[1]  # as before


def test_the_test_records_bound_a_silo_by_parallel_composition() -> None:
    """The larger of the training and test records' figures; replies sent in clear make the silo's figure ∞."""
    noisy = EvaluationNoise(0.5, 20, 1e-5, "replace-one", 3.0)  # little noise: the test records dominate
    for evaluation, expected in ((noisy, noisy.epsilon(2)), (None, math.inf)):
        privacy = [client(0, dp_sgd=dp(0, evaluation), local_only=True)]
        section = lg.ledger_section([round_of(1, (0,)), round_of(2, (0,))], privacy)
        guarantee = federation_guarantee(privacy, section)
        row = section.clients[0]
        assert isinstance(row, DpSgdLedgerRow) and expected > row.epsilon_add_remove
        assert guarantee.epsilon == guarantee.epsilon_add_remove == pytest.approx(expected)
        assert (CLEAR_EVALUATION_NOTE in guarantee.notes) == (evaluation is None)
        assert FederationGuarantee.from_dict(json.loads(json.dumps(guarantee.to_dict()))) == guarantee


def test_the_ledger_bounds_a_silo_only_where_it_is_smaller() -> None:
    privacy = [client(0, file_epsilon=1e6), client(1, file_epsilon=0.5)]
    section = lg.ledger_section([round_of(1, (0, 1))], privacy)
    guarantee = federation_guarantee(privacy, section)
    assert guarantee.clients[0].updates_only is not None and guarantee.clients[1].updates_only is None
    assert guarantee.epsilon == 1e6 and guarantee.private and guarantee.neighbours is None
    assert "neighbours" not in guarantee.to_dict()
    infinite = FederationGuarantee(math.inf, 0.0, "s", (), (SiloGuarantee(0, math.inf, 0.0),), ())
    assert infinite.to_dict()["epsilon"] == "inf" and not infinite.private
    assert FederationGuarantee.from_dict(infinite.to_dict()) == infinite


@pytest.mark.parametrize(("section", "message"), [
    ([], "privacy_ledger is not an object with a 'clients' list"),
    ({"clients": [{"client": 0}]}, "privacy_ledger rows need the keys client, rounds, epsilon, delta, method"),
    ({"clients": [{"client": 0, "rounds": 1, "epsilon": "x", "delta": 0, "method": "m"}]},
     "privacy_ledger: epsilon of client 0 is not a number"),
    ({"clients": [{"client": 0, "rounds": 1, "epsilon": 1.0, "delta": 0, "method": "m", "mechanism": "dp-sgd"}]},
     "privacy_ledger: the row of client 0 is malformed"),
])
def test_the_ledger_reader_names_what_is_malformed(section: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LedgerSection.from_dict(section)


def test_the_guarantee_reader_refuses_a_malformed_section() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        FederationGuarantee.from_dict({"epsilon": "high", "clients": [], "parts": []})
    with pytest.raises(ValueError, match="must be lists"):
        FederationGuarantee.from_dict({"epsilon": 1.0, "clients": {}, "parts": []})
    with pytest.raises(ValueError, match="needs at least one client"):
        federation_guarantee([], None)
