"""Shared federation plans for the tests: one valid plan, changed field by field."""

from __future__ import annotations

from ldpfl.contract.plan import SharedPlan
from ldpfl.mechanisms import MechanismSpec

UER = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5}


def make_plan(**changes) -> SharedPlan:
    """A valid plan (3 classes of 20×20 images, mnist-cnn, UER over 64 features) with ``changes`` applied."""
    features = changes.pop("features", 64)
    mechanism = changes.pop("mechanism", None) or MechanismSpec.resolve("uer", UER, features=features)
    fields = dict(dataset="clinics", classes=("benign", "malignant", "unclear"), extractor="mnist-cnn",
                  input_shape=(20, 20, 1), features=features, mechanism=mechanism)
    fields.update(changes)
    return SharedPlan(**fields)
