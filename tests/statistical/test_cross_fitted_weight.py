"""The interpolation weight is chosen by cross-fitting: no record is scored by an alone model that trained on it.

On labels independent of the features an alone model that memorizes its records is right on nearly all of them
in sample, but out of fold it can only guess: its accuracy is Binomial(n, 1/10)/n. A weight chosen in sample would
see the first and pick the alone model; cross-fitting sees the second.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ldpfl.stage2_federate.model import FederatedMLP
from ldpfl.stage2_federate.personalize.base_model import BaseModel
from ldpfl.stage2_federate.personalize.records import PersonalizeError, fold_assignment
from ldpfl.stage2_federate.personalize.settings import PersonalizeSettings
from ldpfl.stage2_federate.personalize.training import (
    as_split,
    choose_weight,
    cross_fitted_weight,
    interpolate,
    logits,
    train_alone,
)

CLASSES, WIDTH, RECORDS = 10, 200, 150


def _base(model: FederatedMLP) -> BaseModel:
    return BaseModel(Path("global.pt"), model.state_dict(), {}, WIDTH, (), CLASSES, 0.0, "0" * 64)


def test_the_folds_deal_every_record_once_in_near_equal_parts():
    fold = fold_assignment(103, 5, np.random.default_rng(1))
    assert sorted(np.bincount(fold).tolist()) == [20, 20, 21, 21, 21]
    assert fold_assignment(3, 5, np.random.default_rng(1)).tolist().count(0) == 1  # at most one fold per record
    with pytest.raises(PersonalizeError, match="folds must be an integer >= 2"):
        fold_assignment(10, 1, np.random.default_rng(1))
    with pytest.raises(PersonalizeError, match="at least 2 training records"):
        fold_assignment(1, 5, np.random.default_rng(1))


def test_mixing_the_logits_is_scoring_the_interpolated_model():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, 50)
    first, second = FederatedMLP(WIDTH, [], CLASSES, 0.0), FederatedMLP(WIDTH, [], CLASSES, 0.0)
    split = as_split(x, y, WIDTH, False)
    _, table = choose_weight(logits(first, split), logits(second, split), split.labels, [0.0, 0.3, 1.0])
    for row in table:
        direct = logits(interpolate(first, second, row["weight"]), split)
        assert row["accuracy"] == float((direct.argmax(dim=1) == split.labels).double().mean())


def test_no_record_is_scored_by_an_alone_model_that_saw_it():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(RECORDS, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, RECORDS)  # independent of x: nothing to learn, much to memorize
    settings = PersonalizeSettings("interpolate", epochs=20, lr=1e-2, batch_size=64)
    generator = torch.Generator().manual_seed(4)
    global_model = FederatedMLP(WIDTH, [], CLASSES, 0.0)  # zero weights after this: a constant guess
    torch.nn.init.zeros_(global_model.net[0].weight)
    torch.nn.init.zeros_(global_model.net[0].bias)
    base = _base(global_model)
    in_sample = logits(train_alone(base, as_split(x, y, WIDTH, False), settings, generator=generator),
                       as_split(x, y, WIDTH, False))
    assert float((in_sample.argmax(dim=1) == torch.from_numpy(y)).double().mean()) > 0.9  # it memorizes
    fold = fold_assignment(RECORDS, 5, np.random.default_rng(5))
    weight, table = cross_fitted_weight(global_model, base, x, y, fold, settings, width=WIDTH, packed=False,
                                        generator=generator)
    out_of_fold = next(row for row in table if row["weight"] == 0.0)["accuracy"]
    standard_error = math.sqrt(0.1 * 0.9 / RECORDS)
    assert abs(out_of_fold - 0.1) < 4 * standard_error  # chance, Binomial(150, 0.1) / 150


def test_the_global_model_is_mixed_in_only_past_one_standard_error():
    labels = torch.tensor([0, 1] * 50)
    right = torch.nn.functional.one_hot(labels, 2).double() * 5  # logits that classify every record right
    wrong = right.flip(1)
    # the global model wins 3 more of 100 records than the alone one: gain 0.03 against SE √(0.03·0.97/100) ≈ 0.017
    alone, better = wrong.clone(), wrong.clone()
    alone[:60], better[:63] = right[:60], right[:63]
    weight, table = choose_weight(better, alone, labels, [0.0, 1.0])
    assert weight == 1.0 and table[1]["accuracy"] == pytest.approx(0.63)
    # a net gain of one record of 20, won on two and lost on one: 0.05 against SE √((3/20 − 0.05²)/20) ≈ 0.086
    few, mixed = wrong[:20].clone(), wrong[:20].clone()
    few[:10], mixed[1:12] = right[:10], right[1:12]
    weight, small = choose_weight(mixed, few, labels[:20], [0.0, 1.0])
    assert small[1]["accuracy"] - small[0]["accuracy"] == pytest.approx(0.05)
    assert weight == 0.0  # the silo keeps its own model
