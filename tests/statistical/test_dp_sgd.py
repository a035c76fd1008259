"""Stage 2's DP-SGD step (stage2_federate.dp_sgd): the clipped sum and the noise the accountant assumes.

One step from zero weights with q = 1 (every record drawn) makes the clipped sum a known function of the data:
the logits are 0, so record i's gradient of the cross-entropy is ((p − e_y) x_iᵀ, p − e_y) with p uniform. The
update of plain SGD (lr 1) is −(Σ clip_C(g_i) + N(0, σ²C²·I)) / (q·n), so (−update·q·n − Σ clip_C(g_i)) must be
N(0, σ²C²) per coordinate: its mean within 5 standard errors σC/√N of 0, its variance within 5 standard errors
σ²C²·√(2/(N−1)) of σ²C² (normal sampling theory). The Poisson batch sizes are Binomial(n, q).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import FederatedMLP, get_vector, make_optimizer, set_vector
from ldpfl.stage2_federate.silo_training.dp_sgd import train_dp_sgd
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import DpSgdClient

WIDTH, CLASSES, ROWS = 30, 3, 40
SIGMA, CLIP = 2.0, 0.5


def _split(rows: int, seed: int = 3) -> ClientSplit:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, size=(rows, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=rows)
    return ClientSplit(torch.from_numpy(x), torch.from_numpy(y), WIDTH, False)


def _clipped_sum(split: ClientSplit) -> np.ndarray:
    """Σ_i clip_C(g_i) at zero weights, by hand (Opacus clips by C / (‖g_i‖ + 1e-6), capped at 1)."""
    x = split.features.numpy().astype(np.float64)
    residual = np.full((len(x), CLASSES), 1.0 / CLASSES) - np.eye(CLASSES)[split.labels.numpy()]
    per_record = np.concatenate([(residual[:, :, None] * x[:, None, :]).reshape(len(x), -1), residual], axis=1)
    factor = np.minimum(1.0, CLIP / (np.linalg.norm(per_record, axis=1) + 1e-6))
    return (factor[:, None] * per_record).sum(axis=0)


def _step(split: ClientSplit, dp: DpSgdClient, seed: int) -> tuple[np.ndarray, int]:
    model = FederatedMLP(WIDTH, (), CLASSES, dropout=0.0)
    set_vector(model, torch.zeros(WIDTH * CLASSES + CLASSES))
    stats = train_dp_sgd(model, split, dp, optimizer=make_optimizer("sgd", model.parameters(), 1.0),
                         generator=torch.Generator().manual_seed(seed), rng=np.random.default_rng(seed))
    return get_vector(model).numpy().astype(np.float64), stats.samples


def _client(q: float, steps: int = 1) -> DpSgdClient:
    return DpSgdClient(0, SIGMA, CLIP, q, steps, 1e-5, "replace-one", ROWS)


def test_noise_has_the_variance_the_accountant_assumes():
    split = _split(ROWS)
    expected = _clipped_sum(split)
    noise = np.concatenate([-_step(split, _client(1.0), seed)[0] * ROWS - expected for seed in range(60)])
    n, std = noise.size, SIGMA * CLIP
    assert abs(noise.mean()) < 5 * std / math.sqrt(n)
    assert abs(noise.var(ddof=1) - std**2) < 5 * std**2 * math.sqrt(2 / (n - 1))


def test_clipping_bounds_each_record():
    """Without noise the step is exactly the clipped mean (σ tiny), so no record moves it by more than C/(q·n)."""
    split = _split(ROWS)
    dp = DpSgdClient(0, 1e-9, CLIP, 1.0, 1, 1e-5, "replace-one", ROWS)
    update, _ = _step(split, dp, 0)
    np.testing.assert_allclose(-update * ROWS, _clipped_sum(split), rtol=1e-4, atol=1e-6)


def test_poisson_batches_are_binomial():
    q, steps, rows = 0.3, 20, 500
    _, drawn = _step(_split(rows), DpSgdClient(0, SIGMA, CLIP, q, steps, 1e-5, "replace-one", rows), 11)
    mean, sd = steps * rows * q, math.sqrt(steps * rows * q * (1 - q))
    assert abs(drawn - mean) < 5 * sd


def test_same_stream_same_step_and_another_stream_another():
    split = _split(ROWS)
    a, b, c = (_step(split, _client(0.5), seed)[0] for seed in (5, 5, 6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_noise_refuses_global_state():
    split = _split(ROWS)
    model = FederatedMLP(WIDTH, (), CLASSES, dropout=0.0)
    with pytest.raises(TypeError, match="Generator"):
        train_dp_sgd(model, split, _client(1.0), optimizer=make_optimizer("sgd", model.parameters(), 1.0),
                     generator=torch.Generator(), rng=7)  # type: ignore[arg-type]
