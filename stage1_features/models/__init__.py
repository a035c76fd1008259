"""The client CNNs of stage 1: their architectures, how they train, and the Keras backend they run on.

* ``cnn``           - the extractor registry, the paper's CNNs (LDPFL Figs. 3 and 4) and their IV-C training;
* ``dp_nets``       - the extractors for DP-SGD training (GroupNorm variants, the small tanh net);
* ``scatter``       - the weight-free ScatterNet extractor (Tramèr and Boneh 2021), computed on torch;
* ``dp_training``   - DP-SGD training of an extractor with jax-privacy (``--cnn-epsilon``);
* ``cnn_release``   - the CNN's release side: saved models, the bottleneck, noise-aware training;
* ``keras_backend`` - the Keras backend (TensorFlow, torch or jax) and device, and importing Keras on it.

Importing the package registers every extractor (``dp_nets`` and ``scatter`` register into ``cnn``'s registry), so
``cnn.extractor_names()`` lists them all whichever module is imported first. Keras and its backend load only
inside the functions that build, train, predict or save.
"""

from ldpfl.stage1_features.models import cnn, dp_nets, scatter  # noqa: F401 - registers every extractor
