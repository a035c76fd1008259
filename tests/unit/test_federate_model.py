"""Stage-2 model: explicit generators, parameter vectors, optimizer choice, local training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import (
    FederatedMLP,
    GeneratorDropout,
    build_model,
    evaluate,
    get_vector,
    make_optimizer,
    parameter_count,
    resolve_optimizer,
    set_vector,
    train_local,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_default_architecture_and_parameter_count() -> None:
    model = FederatedMLP(11520, (2048,), 10)
    assert parameter_count(model) == 11520 * 2048 + 2048 + 2048 * 10 + 10
    assert [type(m).__name__ for m in model.net] == ["Linear", "ReLU", "GeneratorDropout", "Linear"]
    assert parameter_count(FederatedMLP(80, (), 4)) == 80 * 4 + 4  # logistic regression


def test_initialization_comes_from_the_generator_only() -> None:
    a = build_model(20, (8,), 3, generator=gen(1))
    torch.manual_seed(999)  # the global generator must not matter
    b = build_model(20, (8,), 3, generator=gen(1))
    c = build_model(20, (8,), 3, generator=gen(2))
    assert torch.equal(get_vector(a), get_vector(b)) and not torch.equal(get_vector(a), get_vector(c))
    bound = 1 / np.sqrt(20)
    assert a.net[0].weight.abs().max() <= bound
    logistic = build_model(20, (), 3, generator=gen(1))
    assert torch.count_nonzero(get_vector(logistic)) == 0  # Wu et al.: W(0) = 0


def test_dropout_needs_and_follows_its_generator() -> None:
    drop = GeneratorDropout(0.5)
    x = torch.ones(4, 1000)
    with pytest.raises(RuntimeError, match="needs a generator"):
        drop(x)
    drop.generator = gen(3)
    first = drop(x)
    assert set(first.unique().tolist()) == {0.0, 2.0}
    assert abs(first.mean().item() - 1.0) < 0.05
    drop.generator = gen(3)
    assert torch.equal(first, drop(x))
    drop.eval()
    assert torch.equal(drop(x), x)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        GeneratorDropout(1.0)


def test_set_vector_copies_instead_of_aliasing() -> None:
    model = build_model(6, (3,), 2, generator=gen(0))
    vector = torch.arange(parameter_count(model), dtype=torch.float32)
    set_vector(model, vector)
    assert torch.equal(get_vector(model), vector)
    with torch.no_grad():
        model.net[0].weight.add_(1.0)
    assert torch.equal(vector, torch.arange(parameter_count(model), dtype=torch.float32))  # untouched
    with pytest.raises(ValueError, match="1-D with"):
        set_vector(model, vector[:-1])


@pytest.mark.parametrize(("dataset", "expected"), [("mnist", "adam"), ("mnist5k", "adam"), ("MNIST", "adam"),
                                                   ("fashion-mnist", "sgd"), ("cifar10", "sgd"), ("svhn", "sgd")])
def test_auto_optimizer_follows_ldpfl_iv_e(dataset, expected) -> None:
    assert resolve_optimizer("auto", dataset) == expected
    assert resolve_optimizer("sgd", "mnist") == "sgd"


def test_adam_has_the_papers_settings() -> None:
    opt = make_optimizer("adam", build_model(4, (), 2, generator=gen(0)).parameters(), 1e-3)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.Adam) and group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8
    assert isinstance(make_optimizer("sgd", [torch.nn.Parameter(torch.zeros(2))], 1e-3), torch.optim.SGD)
    with pytest.raises(ValueError, match="learning rate must be a finite number > 0"):
        make_optimizer("sgd", [torch.nn.Parameter(torch.zeros(2))], 0.0)


def test_local_training_fits_a_separable_split_and_is_reproducible() -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(128, 16), dtype=np.uint8)
    labels = torch.from_numpy(bits[:, 0].astype(np.int64))  # the label is the first bit
    split = ClientSplit(torch.from_numpy(np.packbits(bits, axis=1)), labels, 16, packed=True)

    def trained(seed):
        model = build_model(16, (8,), 2, generator=gen(seed))
        opt = make_optimizer("adam", model.parameters(), 0.05)
        stats = train_local(model, split, epochs=5, batch_size=16, optimizer=opt, generator=gen(seed))
        return model, stats

    model, stats = trained(1)
    again, _ = trained(1)
    assert torch.equal(get_vector(model), get_vector(again))
    assert stats.samples == 128 and stats.accuracy > 0.9
    loss, accuracy = evaluate(model, [split], batch_size=50)
    assert accuracy > 0.95 and loss < stats.loss + 0.5
    assert np.isnan(evaluate(model, [])[1])
