"""The fully-connected model of LDPFL stage 2 (III-C, IV-E), local training and evaluation.

Every random draw (initialization, dropout masks, shuffles) comes from a ``torch.Generator`` passed in;
nothing touches torch's global generator, which is what makes a resumed run identical to an
uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ldpfl.contract.datasets import paper_optimizer

from .config import ADAM, AUTO, DEFAULT_DROPOUT, DEFAULT_HIDDEN, DEFAULT_LR, OPTIMIZERS, SGD
from .data import ClientSplit
from .label_noise import LabelNoise, label_loss
from .streaming import StreamedSplit

__all__ = [
    "ADAM", "AUTO", "DEFAULT_DROPOUT", "DEFAULT_HIDDEN", "DEFAULT_LR", "OPTIMIZERS", "SGD", "FederatedMLP",
    "GeneratorDropout", "TrainStats", "build_model", "evaluate", "get_vector", "initialize", "make_optimizer",
    "parameter_count", "resolve_optimizer", "set_vector", "train_local",
]


class GeneratorDropout(nn.Module):
    """Inverted dropout whose masks come from an explicit ``torch.Generator``.

    ``nn.Dropout`` can only use the global one. Call ``set_generator`` before training; training
    without one is refused. A generator on another device than the batch (the run's CPU streams, a
    batch on CUDA) draws the mask on its own device, which is then copied to the batch's: the same
    masks as a CPU run of the same stream.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must lie in [0, 1), got {p!r}")
        self.p = float(p)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Zero each entry with probability p and scale the rest by 1/(1 - p) (training only)."""
        if not self.training or self.p == 0.0:
            return x
        generator = self.generator
        if generator is None:
            raise RuntimeError("GeneratorDropout needs a generator (set_generator) before training")
        if generator.device == x.device:
            keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=generator)
        else:  # a CPU stream (streams.py) for a CUDA batch: the mask is drawn there, as on the CPU, and moved
            keep = torch.empty(x.shape, dtype=x.dtype, device=generator.device,
                               pin_memory=generator.device.type == "cpu" and x.is_cuda)
            keep = keep.bernoulli_(1.0 - self.p, generator=generator).to(x.device, non_blocking=True)
        return x * keep.div_(1.0 - self.p)

    def extra_repr(self) -> str:
        """Show p in the module's repr."""
        return f"p={self.p}"


class FederatedMLP(nn.Module):
    """input → hidden layers (ReLU, dropout) → classes. No hidden layer: logistic regression (Wu et al.)."""

    def __init__(self, input_width: int, hidden: Sequence[int], num_classes: int, dropout: float = DEFAULT_DROPOUT):
        super().__init__()
        if input_width < 1 or num_classes < 2:
            raise ValueError(f"the model needs input width >= 1 and >= 2 classes, got {input_width}, {num_classes}")
        if any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
            raise ValueError(f"hidden layer sizes must be integers >= 1, got {list(hidden)!r}")
        layers: list[nn.Module] = []
        width = input_width
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(), GeneratorDropout(dropout)]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.input_width = input_width
        self.hidden = tuple(hidden)
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of a batch."""
        return self.net(x)

    def set_generator(self, generator: torch.Generator) -> None:
        """Route every dropout mask through ``generator``."""
        for module in self.modules():
            if isinstance(module, GeneratorDropout):
                module.generator = generator

    def linear_layers(self) -> list[nn.Linear]:
        """Return the linear layers, input first."""
        return [m for m in self.net if isinstance(m, nn.Linear)]


@torch.no_grad()
def initialize(model: FederatedMLP, generator: torch.Generator) -> None:
    """Server initialization (LDPFL Algorithm 1 line 13), drawn from ``generator``.

    With hidden layers: PyTorch's default for ``nn.Linear`` (weights and biases U(-1/√fan_in, 1/√fan_in)).
    Logistic regression starts at zero, as Wu et al. 3 do ("each element [of W(0)] is 0").
    """
    linears = model.linear_layers()
    if len(linears) == 1:
        linears[0].weight.zero_()
        linears[0].bias.zero_()
        return
    for layer in linears:
        bound = 1.0 / math.sqrt(layer.in_features)
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.uniform_(-bound, bound, generator=generator)


def build_model(input_width: int, hidden: Sequence[int], num_classes: int, *, dropout: float = DEFAULT_DROPOUT,
                generator: torch.Generator, device: torch.device | str = "cpu") -> FederatedMLP:
    """Build a freshly initialized model on ``device`` (initialized on the generator's device, then moved)."""
    model = FederatedMLP(input_width, hidden, num_classes, dropout)
    model.to(generator.device)
    initialize(model, generator)
    return model.to(device)


def parameter_count(model: nn.Module) -> int:
    """Count the model's parameters (d, the length of its vector)."""
    return sum(p.numel() for p in model.parameters())


def get_vector(model: nn.Module) -> torch.Tensor:
    """Return the parameters flattened in ``model.parameters()`` order (a new tensor)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@torch.no_grad()
def set_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Copy ``vector`` into the parameters in place.

    (``torch.nn.utils.vector_to_parameters`` would make the parameters *views* of ``vector``, so that
    training one client would silently rewrite the global model the next client starts from.)
    """
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if vector.ndim != 1 or vector.numel() != total:
        raise ValueError(f"vector must be 1-D with {total} entries, got shape {tuple(vector.shape)}")
    offset = 0
    for p in params:
        p.copy_(vector[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def resolve_optimizer(name: str, dataset: str) -> str:
    """LDPFL IV-E: Adam for MNIST, SGD for CIFAR-10, FMNIST and SVHN.

    ``auto`` reads the dataset name from the files and looks it up in the dataset registry
    (``ldpfl.contract.datasets``): mnist and mnist5k get Adam, the other registered sets and own data get SGD.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    if name != AUTO:
        return name
    return ADAM if paper_optimizer(dataset.lower()) == ADAM else SGD


def make_optimizer(name: str, parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam(betas=(0.9, 0.999), eps=1e-8) or plain SGD, both with learning rate ``lr`` (LDPFL IV-E)."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning rate must be a finite number > 0, got {lr!r}")
    if name not in (ADAM, SGD):
        raise ValueError(f"optimizer must be {ADAM!r} or {SGD!r}, got {name!r}")
    parameters = list(parameters)
    # The fused kernels update each parameter in place in one pass: on CPU, a fused Adam step took 15-40 ms
    # against 80-170 ms for the foreach one on the 23.6M-parameter default model (bench/RESULTS.md).
    try:
        if name == ADAM:
            return torch.optim.Adam(parameters, lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
        return torch.optim.SGD(parameters, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # pragma: no cover - a device or build without the fused kernels
        if name == ADAM:
            return torch.optim.Adam(parameters, lr=lr, betas=(0.9, 0.999), eps=1e-8)
        return torch.optim.SGD(parameters, lr=lr)


@dataclass(frozen=True)
class TrainStats:
    """Mean loss and accuracy over the last local epoch (measured while training, dropout on)."""

    loss: float
    accuracy: float
    samples: int


def train_local(model: FederatedMLP, split: ClientSplit | StreamedSplit, *, epochs: int, batch_size: int,
                optimizer: torch.optim.Optimizer, generator: torch.Generator,
                label_noise: LabelNoise | None = None) -> TrainStats:
    """LDPFL Algorithm 1 line 19: train for ``epochs`` (el) epochs over shuffled batches of the split.

    With ``label_noise`` (k-RR labels) the loss is Patrini et al.'s corrected cross-entropy (``label_noise``).
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch size must be >= 1, got {epochs}, {batch_size}")
    model.train()
    model.set_generator(generator)
    device = next(model.parameters()).device  # the split's batches come to the model's device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for _epoch in range(epochs):
        loss_sum.zero_()
        correct.zero_()
        for inputs, labels in split.batches(batch_size, generator=generator):
            logits = model(inputs)
            loss = label_loss(logits, labels, label_noise)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach().double() * labels.shape[0]
            correct += (logits.detach().argmax(dim=1) == labels).sum()
    n = len(split)
    return TrainStats(float(loss_sum) / n, float(correct) / n, n)


EVAL_BATCH_BYTES = 256 * 2**20
"""Evaluation batches hold at most this many bytes of float32 inputs (fewer rows for very wide inputs)."""


def evaluation_rows(batch_size: int, input_width: int) -> int:
    """Return the rows of an evaluation batch: ``batch_size``, fewer when its inputs exceed ``EVAL_BATCH_BYTES``."""
    return max(1, min(int(batch_size), EVAL_BATCH_BYTES // (4 * max(int(input_width), 1))))


@torch.no_grad()
def evaluation_sums(model: FederatedMLP, splits: Sequence[ClientSplit | StreamedSplit],
                    batch_size: int = 1024, *, loss_bound: float | None = None) -> tuple[float, int, int]:
    """Return the summed cross-entropy, correct predictions and rows of ``model`` over the union of ``splits``.

    Batches are ``batch_size`` rows, fewer for very wide inputs (:func:`evaluation_rows`). With ``loss_bound``
    each row's cross-entropy is clipped to it before the sum (the bounded sum of a noised evaluation).
    """
    model.eval()
    batch_size = evaluation_rows(batch_size, model.input_width)
    loss_sum = 0.0
    correct = 0
    total = 0
    for split in splits:
        for inputs, labels in split.batches(batch_size):
            logits = model(inputs)
            if loss_bound is None:
                loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            else:
                loss_sum += float(F.cross_entropy(logits, labels, reduction="none").clamp(max=loss_bound).sum())
            correct += int((logits.argmax(dim=1) == labels).sum())
            total += int(labels.shape[0])
    return loss_sum, correct, total


def evaluate(model: FederatedMLP, splits: Sequence[ClientSplit | StreamedSplit],
             batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over the union of ``splits`` (NaN when they hold no rows)."""
    loss_sum, correct, total = evaluation_sums(model, splits, batch_size)
    if total == 0:
        return math.nan, math.nan
    return loss_sum / total, correct / total
