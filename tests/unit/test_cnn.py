"""The client CNNs (LDPFL Figs. 3-4, IV-A/C): flatten widths, registry, schedule, training, saving."""

from __future__ import annotations

import numpy as np
import pytest

from ldpfl.stage1_features.models import cnn

PAPER_WIDTHS = [  # IV-D: r = 1,024 (MNIST, Fig. 3), 1,152 (FMNIST, Fig. 4 on 28×28×1), 2,048 (CIFAR-10/SVHN)
    (cnn.MNIST_CNN, (28, 28, 1), 1024),
    (cnn.CIFAR_CNN, (28, 28, 1), 1152),
    (cnn.CIFAR_CNN, (32, 32, 3), 2048),
]


@pytest.fixture(scope="module")
def keras():
    return cnn.import_keras()


@pytest.mark.parametrize(("name", "shape", "width"), PAPER_WIDTHS)
def test_flatten_width_rule_gives_the_paper_values(name: str, shape: tuple[int, ...], width: int) -> None:
    assert cnn.flatten_width(name, shape) == width
    assert cnn.flatten_width(name, shape) * 10 == {1024: 10_240, 1152: 11_520, 2048: 20_480}[width]  # r·l, l = 10


@pytest.mark.parametrize(("name", "shape", "width"), PAPER_WIDTHS)
def test_built_models_have_the_paper_flatten_widths(keras, name: str, shape: tuple[int, ...], width: int) -> None:
    model = cnn.build_model(name, shape, 10)
    assert tuple(model.get_layer(cnn.FLATTEN_LAYER).output.shape) == (None, width)
    assert tuple(model.output.shape) == (None, 10)
    extractor = cnn.FeatureExtractor(model)
    features, probabilities = extractor.predict(np.zeros((3, *shape), dtype=np.float32))
    assert features.shape == (3, width) and features.dtype == np.float32
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_mnist_net_follows_fig3(keras) -> None:
    model = cnn.build_model(cnn.MNIST_CNN, (28, 28, 1), 10)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [c.filters for c in convs] == [32, 32, 64, 64]
    assert all(c.padding == "valid" and c.kernel_size == (3, 3) and c.strides == (1, 1) for c in convs)
    assert all(c.kernel_regularizer is not None and np.isclose(float(c.kernel_regularizer.l2), cnn.WEIGHT_DECAY)
               for c in convs)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == 5  # IV-A1: layers 5, 9, 12, 17, 20, all on the last (channel) axis
    assert all(n.axis in (-1, len(n.input.shape) - 1) for n in norms)
    assert sum(isinstance(layer, keras.layers.MaxPooling2D) for layer in model.layers) == 2


def test_cifar_net_follows_fig4(keras) -> None:
    model = cnn.build_model(cnn.CIFAR_CNN, (32, 32, 3), 10)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [c.filters for c in convs] == [32, 32, 64, 64, 128, 128]
    assert all(c.padding == "same" and c.kernel_regularizer is not None for c in convs)
    assert sum(isinstance(layer, keras.layers.MaxPooling2D) for layer in model.layers) == 3
    assert [layer.rate for layer in model.layers if isinstance(layer, keras.layers.Dropout)] == [0.2, 0.3, 0.4]


@pytest.mark.parametrize(("name", "shape"), [
    (cnn.MNIST_CNN, (8, 8, 1)),      # digits: too small for four valid convs
    (cnn.CIFAR_CNN, (4, 4, 1)),
    (cnn.CIFAR_CNN, (54,)),          # covtype: tabular
    (cnn.MNIST_CNN, (28, 28)),
])
def test_flatten_width_refuses_inputs_the_net_cannot_take(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=name):
        cnn.flatten_width(name, shape)


def test_none_extractor_flattens_the_input() -> None:
    assert cnn.flatten_width(cnn.NO_EXTRACTOR, (28, 28, 1)) == 784
    assert cnn.flatten_width(cnn.NO_EXTRACTOR, (54,)) == 54
    assert not cnn.is_cnn(cnn.NO_EXTRACTOR) and cnn.is_cnn(cnn.CIFAR_CNN)


def test_registry_and_auto_choice() -> None:
    assert cnn.extractor_names() == ["cifar-cnn", "cifar-cnn-gn", "dp-cnn", "mnist-cnn", "mnist-cnn-gn", "none",
                                     "scatter"]
    assert cnn.resolve_extractor("auto", "mnist5k") == "mnist-cnn"
    assert cnn.resolve_extractor("auto", "mnist") == "mnist-cnn"
    for name in ("fashion-mnist", "cifar10", "svhn"):
        assert cnn.resolve_extractor("auto", name) == "cifar-cnn"
    assert cnn.resolve_extractor("auto", "digits") == "none"
    assert cnn.resolve_extractor("auto", "covtype") == "none"
    assert cnn.resolve_extractor("cifar-cnn", "mnist") == "cifar-cnn"
    with pytest.raises(ValueError, match="unknown extractor 'resnet'"):
        cnn.resolve_extractor("resnet", "mnist")
    with pytest.raises(ValueError, match="already registered"):
        cnn.register(cnn.Architecture("none", "", "", lambda s: 1))


def test_learning_rate_schedule_follows_iv_c() -> None:
    config = cnn.TrainingConfig()
    assert [config.learning_rate_at(e) for e in (1, 50, 75)] == [1e-3, 1e-3, 1e-3]
    assert [config.learning_rate_at(e) for e in (76, 100)] == [5e-4, 5e-4]
    assert [config.learning_rate_at(e) for e in (101, 150)] == [3e-4, 3e-4]


def test_keras_schedule_matches_the_epoch_rule_with_decay(keras) -> None:
    config = cnn.TrainingConfig()
    schedule = cnn._schedule(keras, config, steps_per_epoch=10)
    for step in (0, 9, 749, 750, 999, 1000, 1500):
        expected = config.learning_rate_at(step // 10 + 1) / (1 + config.decay * step)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("bad", [{"epochs": 0}, {"batch_size": 0}, {"epochs": 1.5}, {"learning_rate": -1.0}])
def test_training_config_validates(bad: dict) -> None:
    with pytest.raises(ValueError):
        cnn.TrainingConfig(**bad)


def _tiny_training(keras, seed: int) -> tuple[np.ndarray, object]:
    data_rng = np.random.default_rng(0)
    x = data_rng.random((96, 28, 28, 1), dtype=np.float32)
    y = data_rng.integers(0, 10, 96)
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    model = cnn.build_model(cnn.MNIST_CNN, (28, 28, 1), 10)
    result = cnn.train_model(model, x, y, cnn.TrainingConfig(epochs=1, batch_size=32), rng=rng)
    features, _ = cnn.FeatureExtractor(model).predict(x[:16])
    return features, (model, result)


@pytest.mark.slow
def test_training_is_reproducible_for_one_stream_and_differs_across_streams(keras) -> None:
    a, (model, result) = _tiny_training(keras, 11)
    b, _ = _tiny_training(keras, 11)
    c, _ = _tiny_training(keras, 12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(result.history) >= {"loss", "accuracy"} and len(result.history["loss"]) == 1
    # augmentation lives in a training-only wrapper: the trained model holds no random layers
    assert not any("random" in layer.name for layer in model.layers)
    again, _ = cnn.FeatureExtractor(model).predict(np.random.default_rng(0).random((96, 28, 28, 1),
                                                                                   dtype=np.float32)[:16])
    np.testing.assert_array_equal(a, again)  # inference mode: no dropout, no augmentation


def test_save_model_is_atomic_and_loads_back(keras, tmp_path) -> None:
    model = cnn.build_model(cnn.CIFAR_CNN, (28, 28, 1), 10)
    path = cnn.save_model(model, tmp_path / "client_000.keras")
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["client_000.keras"]
    loaded = keras.saving.load_model(path)
    x = np.random.default_rng(1).random((4, 28, 28, 1), dtype=np.float32)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\.keras"):
        cnn.save_model(model, tmp_path / "client_000.h5")
