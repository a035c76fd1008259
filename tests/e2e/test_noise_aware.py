"""``ldpfl export --noise-aware`` (issue 17 item 3): the CNN trains against its release mechanism's noise."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from ldpfl import mechanisms
from ldpfl.cli import cli
from ldpfl.stage1_features.export.release import noise_variance


@pytest.mark.parametrize(("name", "params"), [("duchi", {}), ("piecewise", {}), ("hybrid", {}), ("laplace", {}),
                                              ("piecewise", {"sampled_dims": 3})])
def test_noise_variance_is_the_mechanisms_variance_at_every_input(name: str, params: dict) -> None:
    spec = mechanisms.MechanismSpec.resolve(name, {"epsilon": 4.0, **params}, features=12)
    a, b = noise_variance(spec)
    x = np.linspace(-1.0, 1.0, 12)[None, :]
    expected = spec.build().expected_variance(x)[0]
    assert np.allclose(a + b * x[0] ** 2, expected, rtol=1e-9, atol=1e-12)


def test_noise_variance_of_a_real_mechanism_is_its_sigma_squared_and_none_is_refused() -> None:
    spec = mechanisms.MechanismSpec.resolve("gaussian", {"epsilon": 2.0, "delta": 1e-5, "clip": 1.0}, features=8)
    assert noise_variance(spec) == (pytest.approx(spec.build().noise_scale() ** 2), 0.0)
    none = mechanisms.MechanismSpec.resolve("none", {}, features=8)
    with pytest.raises(ValueError, match="no per-coordinate noise variance"):
        noise_variance(none)


def test_noise_aware_with_none_exits_2(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["export", "--dataset", "mnist5k", "--limit", "100", "--release",
                                      "bottleneck:8", "--mechanism", "none", "--noise-aware", "--out",
                                      str(tmp_path / "run")])
    assert result.exit_code == 2 and "--noise-aware trains against the noise" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_training_model_adds_the_variance_and_shares_the_weights() -> None:
    from ldpfl.stage1_features.models import cnn, cnn_release

    keras = cnn.import_keras()
    keras.utils.set_random_seed(1)
    model = cnn.build_model(cnn.MNIST_CNN, (28, 28, 1), 10, bottleneck=6)
    a, b = 0.3, 0.5
    noisy = cnn_release.noise_aware_model(model, (a, b), seed=2)
    assert {id(w) for w in model.weights} == {id(w) for w in noisy.weights}  # training one trains the other
    assert "training_mechanism_noise" not in [layer.name for layer in model.layers]
    x = np.random.default_rng(0).random((8, 28, 28, 1)).astype(np.float32)
    assert np.allclose(noisy(x, training=False), model(x, training=False), atol=1e-6)
    clean = keras.Model(model.input, model.get_layer(cnn.BOTTLENECK_LAYER).output)
    noise_layer = noisy.get_layer("training_mechanism_noise")
    codes = clean(x, training=False)
    draws = np.stack([np.asarray(noise_layer(codes, training=True)) - np.asarray(codes) for _ in range(500)])
    n = draws.shape[0] * draws.shape[1]  # 4,000 draws per coordinate
    variance = (draws ** 2).mean(axis=(0, 1))  # the noise has mean 0
    per_row = a + b * np.asarray(codes, dtype=np.float64) ** 2  # (rows, K): each row's variance
    expected = per_row.mean(axis=0)
    se = np.sqrt((3 * (per_row ** 2).mean(axis=0) - expected ** 2) / n)  # E z^4 = 3 s^2 for each Gaussian row
    assert np.all(np.abs(variance - expected) <= 5 * se)


@pytest.mark.slow
def test_noise_aware_export_saves_a_model_without_the_noise(tmp_path) -> None:
    from ldpfl.contract.manifest import read_manifest
    from ldpfl.stage1_features.models import cnn_release

    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["export", "--dataset", "mnist5k", "--limit", "120", "--clients", "1",
                                      "--epochs", "1", "--no-augment", "--seed", "3", "--quiet", "--release",
                                      "bottleneck:8", "--mechanism", "piecewise", "--epsilon", "5", "--noise-aware",
                                      "--save-models", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert read_manifest(out).info["config"]["noise_aware"] is True
    model = cnn_release.load_model(out / "client_000.keras")
    assert cnn_release.bottleneck_units(model) == 8
    assert "training_mechanism_noise" not in [layer.name for layer in model.layers]
