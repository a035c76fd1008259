"""One vocabulary of privacy events (issue 43 item 1): defined in mechanisms/privacy_events.py, used by every maker of
a privacy figure, and composed by the one accountant."""

from __future__ import annotations

import ast
import math

import pytest
from repository import ROOT

from ldpfl.contract import release_guarantee as rg
from ldpfl.contract.label_release import CLEAR_LABELS, SYNTHETIC_LABELS, LabelRelease
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import privacy_events as ev
from ldpfl.stage2_federate.silo_training import evaluation_noise

#: the file attribute ``label_release`` (contract): a record of the file, whose release is its ``event()``
FILE_RECORDS = {"LabelRelease"}


def test_event_and_release_types_are_defined_only_in_mechanisms() -> None:
    found = []
    for folder in ("contract", "stage1_features", "stage2_federate", "ldpfl"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Event", "Release")) \
                        and node.name not in FILE_RECORDS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not found, "event or release types outside mechanisms/:\n" + "\n".join(found)


@pytest.mark.parametrize("event", [ev.PureEvent(3.0), ev.PureEvent(0.0), ev.PureEvent(math.inf),
                                   ev.RandomizedResponseEvent(1.5, 4), ev.DpSgdEvent(1.1, 0.02, 800)])
def test_each_part_event_has_one_json_form(event: ev.PartEvent) -> None:
    assert event is not None
    assert ev.event_from_json(event.to_json()) == event


def test_pure_events_at_zero_and_infinity() -> None:
    assert accounting.epsilon([ev.PureEvent(0.0)], 1e-5) == 0.0
    assert accounting.epsilon([ev.PureEvent(math.inf), ev.PureEvent(1.0)], 1e-5) == math.inf
    assert accounting.delta([ev.PureEvent(math.inf)], 5.0) == 1.0
    # a part at 0 adds nothing to a composition
    assert accounting.epsilon([ev.PureEvent(0.5), ev.PureEvent(0.0)], 0.0) == accounting.epsilon(
        [ev.PureEvent(0.5)], 0.0)
    for bad in (-1.0, math.nan, True):
        with pytest.raises(ValueError, match="epsilon"):
            ev.PureEvent(bad)


def test_one_spelling_of_each_method() -> None:
    assert rg.METHOD_PLD == accounting.method_name(accounting.PLD, neighbours=accounting.REPLACE_ONE) \
        == "dp-accounting PLD (REPLACE_ONE)"
    assert accounting.METHOD == accounting.method_name(accounting.PLD) == "dp-accounting PLD"
    assert accounting.method_name(accounting.RDP) == "dp-accounting RDP"
    assert rg.METHOD_BASIC == accounting.METHOD_BASIC
    with pytest.raises(ValueError, match="method"):
        accounting.method_name("moments")


def test_the_label_release_and_the_evaluation_noise_describe_what_they_release() -> None:
    krr = LabelRelease.for_epsilon(2.0, 10)
    assert krr.event() == ev.RandomizedResponseEvent(krr.epsilon, 10)
    assert rg.labels_part(krr).event == krr.event()
    assert CLEAR_LABELS.event() is None and SYNTHETIC_LABELS.event() == ev.PureEvent(0.0)
    noise = evaluation_noise.calibrate(3.0, 1e-5, 20, neighbours=accounting.REPLACE_ONE)
    assert noise.event(20) == ev.GaussianEvent(noise.sigma / evaluation_noise.SENSITIVITY, 20)
    assert accounting.epsilon([noise.event(20)], 1e-5, neighbours=accounting.ADD_REMOVE) == noise.epsilon(20)
