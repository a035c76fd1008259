"""Accuracy of one client's DP-SGD extractor as the export trains it (issue 22), on Fashion-MNIST.

Run from the repository root:

    OMP_NUM_THREADS=1 .venv/bin/python bench/dp_cnn_accuracy.py EPSILON BATCH EPOCHS [NET]

Trains ``NET`` (default ``dp-cnn``) with ``dp_training.train_model_dp`` on 6,144 Fashion-MNIST records
(a client's share in the Table I protocol), δ = 1e-5, and prints its accuracy on 2,000 other records.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["KERAS_BACKEND"] = "jax"


def main() -> None:
    """Train once and print one line: the accuracy, σ, the accountant's ε, steps, seconds, samples/s."""
    import numpy as np

    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models import cnn, dp_training

    eps, batch, epochs = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    net = sys.argv[4] if len(sys.argv) > 4 else "dp-cnn"
    keras = cnn.import_keras(1)
    dataset = load_dataset("fashion-mnist")
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(dataset))
    train, test = rows[:6144], rows[6144:8144]
    x, y = dataset.features(train).astype(np.float32).reshape(-1, 28, 28, 1), dataset.y[train]
    xt, yt = dataset.features(test).astype(np.float32).reshape(-1, 28, 28, 1), dataset.y[test]
    keras.utils.set_random_seed(1)
    model = cnn.build_model(net, (28, 28, 1), 10)
    start = time.time()
    config = cnn.TrainingConfig(epochs=epochs, batch_size=batch, augment=False)
    result, record = dp_training.train_model_dp(model, x, y, config, dp_training.DPBudget(eps, 1e-5), rng=rng,
                                                extractor=net)
    accuracy = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    print(f"eps={eps} b={batch} epochs={epochs} net={net} acc={accuracy:.4f} sigma={record['noise_multiplier']:.3f} "
          f"eps_spent={record['epsilon']:.3f} steps={record['steps']} s={time.time() - start:.1f} "
          f"rate={result.samples_per_s:.0f}")


if __name__ == "__main__":
    main()
