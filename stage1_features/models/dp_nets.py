"""Extractors for DP-SGD training (issue 22 item 3), registered in ``ldpfl.stage1_features.models.cnn``'s registry.

BatchNormalization normalizes each record by its batch's statistics, so one record's gradient depends on
the other records of the batch and per-example clipping no longer bounds a record's influence: DP-SGD
needs a per-example normalization. Each net here is a **labelled deviation** from the paper:

* ``mnist-cnn-gn``: Fig. 3 with every BatchNormalization replaced by GroupNormalization (
  gcd(8, channels) groups); same layers otherwise, same r = 1,024 on 28×28.
* ``cifar-cnn-gn``: Fig. 4 with GroupNormalization instead of BatchNormalization; same r.
* ``dp-cnn``: the small DP-SGD net of the literature's FMNIST/MNIST experiments (Papernot et al. 2020,
  "Tempered sigmoid activations for deep learning with differential privacy": two strided convs, 16 8×8
  stride 2 and 32 4×4 stride 2, tanh, a 32-unit tanh layer), with GroupNormalization after each conv and
  no max-pooling (the strides downsample). r = 6·6·32 = 1,152 on 28×28 and 7·7·32 = 1,568 on 32×32.
  Bounded activations and few parameters suit DP-SGD: the clipped, noised gradient has fewer coordinates
  to spread its noise over. ``--extractor auto`` picks it under ``--cnn-epsilon``.
"""

from __future__ import annotations

import math
from typing import Any

from ldpfl.stage1_features.models.cnn import (
    FLATTEN_LAYER,
    WEIGHT_DECAY,
    Architecture,
    _bottleneck,
    _cifar_width,
    _image_shape,
    _mnist_width,
    register,
)

MNIST_CNN_GN = "mnist-cnn-gn"
CIFAR_CNN_GN = "cifar-cnn-gn"
DP_CNN = "dp-cnn"
GROUPS = 8
DEVIATION = "DEVIATION from the paper: GroupNormalization instead of BatchNormalization (DP-SGD)"


def _norm(keras: Any, channels: int) -> Any:
    """GroupNormalization over the last axis: per-example, so DP-SGD's clipping bounds each record."""
    return keras.layers.GroupNormalization(groups=math.gcd(GROUPS, int(channels)), axis=-1)


def _build_mnist_gn(keras: Any, input_shape: tuple[int, ...], num_classes: int, bottleneck: int | None = None) -> Any:
    """Fig. 3 (IV-A1) with GroupNorm at the BN positions 5, 9, 12, 17, 20."""
    layers, l2 = keras.layers, keras.regularizers.L2(WEIGHT_DECAY)

    def conv(filters: int) -> Any:
        return layers.Conv2D(filters, (3, 3), strides=1, padding="valid", kernel_regularizer=l2)

    inputs = keras.Input(shape=input_shape)
    x = _norm(keras, 32)(layers.Activation("relu")(conv(32)(inputs)))                              # 3-5
    x = _norm(keras, 32)(layers.MaxPooling2D((2, 2))(layers.Activation("relu")(conv(32)(x))))      # 6-9
    x = _norm(keras, 64)(layers.Activation("relu")(conv(64)(x)))                                  # 10-12
    x = layers.MaxPooling2D((2, 2))(layers.Activation("relu")(conv(64)(x)))                        # 13-15
    x = layers.Flatten(name=FLATTEN_LAYER)(x)                                                      # 16
    x = _bottleneck(keras, x, bottleneck)
    x = _norm(keras, int(x.shape[-1]))(x)                                                          # 17
    x = _norm(keras, 512)(layers.Activation("relu")(layers.Dense(512)(x)))                         # 18-20
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=MNIST_CNN_GN.replace("-", "_"))


def _build_cifar_gn(keras: Any, input_shape: tuple[int, ...], num_classes: int, bottleneck: int | None = None) -> Any:
    """Fig. 4 (IV-A1) with GroupNorm after each conv's ELU."""
    layers, l2 = keras.layers, keras.regularizers.L2(WEIGHT_DECAY)
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for filters, dropout in ((32, 0.2), (64, 0.3), (128, 0.4)):
        for _ in range(2):
            x = layers.Conv2D(filters, (3, 3), strides=1, padding="same", kernel_regularizer=l2)(x)
            x = _norm(keras, filters)(layers.Activation("elu")(x))
        x = layers.Dropout(dropout)(layers.MaxPooling2D(pool_size=(2, 2))(x))
    x = layers.Flatten(name=FLATTEN_LAYER)(x)
    x = _bottleneck(keras, x, bottleneck)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=CIFAR_CNN_GN.replace("-", "_"))


def _dp_sides(input_shape: tuple[int, ...]) -> tuple[int, int]:
    h, w, _ = _image_shape(DP_CNN, input_shape)
    sides = [((s + 1) // 2 - 4) // 2 + 1 for s in (h, w)]  # conv 8×8/2 "same": ⌈s/2⌉; conv 4×4/2 "valid"
    if min(h, w) < 7:
        raise ValueError(f"extractor {DP_CNN!r} needs images of at least 7×7, got {h}×{w}")
    return sides[0], sides[1]


def _dp_width(input_shape: tuple[int, ...]) -> int:
    """Two strided convs, 32 channels: 6·6·32 = 1,152 on 28×28."""
    h, w = _dp_sides(input_shape)
    return h * w * 32


def _build_dp(keras: Any, input_shape: tuple[int, ...], num_classes: int, bottleneck: int | None = None) -> Any:
    """Papernot et al. 2020's tanh net, strided, with GroupNorm after each conv."""
    layers = keras.layers
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(16, (8, 8), strides=2, padding="same")(inputs)
    x = layers.Activation("tanh")(_norm(keras, 16)(x))
    x = layers.Conv2D(32, (4, 4), strides=2, padding="valid")(x)
    x = layers.Activation("tanh")(_norm(keras, 32)(x))
    x = layers.Flatten(name=FLATTEN_LAYER)(x)
    x = _bottleneck(keras, x, bottleneck)
    x = layers.Dense(32, activation="tanh")(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=DP_CNN.replace("-", "_"))


register(Architecture(MNIST_CNN_GN, "LDPFL Fig. 3 with GroupNorm", f"Fig. 3 for DP-SGD; {DEVIATION}",
                      _mnist_width, _build_mnist_gn))
register(Architecture(CIFAR_CNN_GN, "LDPFL Fig. 4 with GroupNorm", f"Fig. 4 for DP-SGD; {DEVIATION}",
                      _cifar_width, _build_cifar_gn))
register(Architecture(DP_CNN, "Papernot et al. 2020 (tempered sigmoid), strided, GroupNorm",
                      "small tanh DP-SGD net: 2 strided convs; DEVIATION from the paper's Fig. 3/4", _dp_width,
                      _build_dp))
