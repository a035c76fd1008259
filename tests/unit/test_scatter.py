"""The weight-free ScatterNet extractor (``ldpfl.stage1_features.models.scatter``; Tramèr and Boneh, ICLR 2021).

Its batched evaluation is checked against kymatio's own ``Scattering2D`` followed by torch's ``group_norm``
(two independent evaluations of the same transform), and its import against this environment's SciPy.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ldpfl.common.errors import ParameterError
from ldpfl.contract.extractor_training import ExtractorTraining
from ldpfl.contract.release_guarantee import EXTRACTOR, FIXED_TEXT, extractor_part, features_part, guarantee_of
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.scatter import (
    SCATTER,
    ScatterNet,
    group_count,
    scattering2d_class,
    scattering_channels,
)

torch = pytest.importorskip("torch")


def kymatio_reference(images: np.ndarray, j: int, l: int) -> np.ndarray:  # noqa: E741 - the paper's L
    """kymatio's Scattering2D per channel, GroupNorm without affine (27 groups where they divide), flattened."""
    n, h, w, c = images.shape
    scattering = scattering2d_class()(J=j, shape=(h, w), L=l)
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32))
    s = scattering(x)  # (n, C, K, h/2^J, w/2^J)
    s = s.reshape(n, -1, s.shape[-2], s.shape[-1])
    groups = 27 if s.shape[1] % 27 == 0 else group_count(s.shape[1])
    return torch.nn.functional.group_norm(s, groups).reshape(n, -1).numpy()


@pytest.mark.parametrize("shape, j, l", [((28, 28, 1), 2, 8), ((32, 32, 3), 2, 8), ((32, 32, 1), 3, 4),
                                         ((28, 32, 3), 2, 8), ((16, 24, 2), 1, 6)])
def test_features_equal_kymatio_and_group_norm(shape: tuple[int, int, int], j: int, l: int) -> None:  # noqa: E741
    images = np.random.default_rng(sum(shape) + j).random((6, *shape), dtype=np.float32)
    net = ScatterNet(j, l)
    features = net.transform(images, batch=4)  # two batches
    expected = kymatio_reference(images, j, l)
    assert features.dtype == np.float32 and features.shape == (6, net.width(shape)) == expected.shape
    np.testing.assert_allclose(features, expected, atol=2e-5)  # float32 rounding of two FFT orders


def test_widths_channels_and_groups_follow_the_paper() -> None:
    assert scattering_channels(2, 8) == 81  # K = 1 + J·L + L²·J(J−1)/2
    assert scattering_channels(3, 8) == 1 + 24 + 64 * 3
    assert cnn.flatten_width(SCATTER, (28, 28, 1)) == 81 * 7 * 7 == 3969  # Fashion-MNIST
    assert cnn.flatten_width(SCATTER, (32, 32, 3)) == 243 * 8 * 8  # CIFAR-10
    assert cnn.flatten_width(SCATTER, (32, 32, 1), {"scatter_j": 3, "scatter_l": 4}) == 61 * 4 * 4
    assert group_count(81) == group_count(243) == 27 and group_count(49) == 7 and group_count(13) == 13
    assert SCATTER in cnn.extractor_names() and cnn.is_fixed(SCATTER) and not cnn.is_cnn(SCATTER)
    assert cnn.extractor_options(SCATTER) == {"scatter_j": 2, "scatter_l": 8}
    described = ScatterNet().describe((28, 28, 1))
    assert (described["J"], described["L"], described["normalization"]) == (
        2, 8, {"kind": "group_norm", "groups": 27, "affine": False, "eps": 1e-5})


def test_a_record_s_features_do_not_depend_on_its_batch() -> None:
    images = np.random.default_rng(3).random((5, 28, 28, 1), dtype=np.float32)
    one = ScatterNet().transform(images, batch=1)
    np.testing.assert_allclose(ScatterNet().transform(images, batch=5), one, atol=1e-6)
    np.testing.assert_allclose(ScatterNet().transform(images[2:3]), one[2:3], atol=1e-6)


@pytest.mark.parametrize("options, shape, named", [
    ({"scatter_j": 0}, (28, 28, 1), "scatter_j"), ({"scatter_l": 17}, (28, 28, 1), "scatter_l"),
    ({"scatter_j": 2.0}, (28, 28, 1), "scatter_j"), ({"scatter_j": 3}, (28, 28, 1), "scatter_j"),
    ({}, (30, 30, 1), "scatter_j"), ({}, (54,), "extractor"), ({"scatter_q": 1}, (28, 28, 1), "scatter")])
def test_bad_options_and_inputs_are_refused_naming_the_parameter(options: dict, shape: tuple[int, ...],
                                                                  named: str) -> None:
    with pytest.raises(ParameterError) as error:
        cnn.flatten_width(SCATTER, shape, options)
    assert named in str(error.value) and "\n" not in str(error.value)


def test_the_scattering_is_built_once_per_j_l_and_shape() -> None:
    from ldpfl.stage1_features.models.scatter import _scattering

    assert _scattering(2, 8, 28, 28) is _scattering(2, 8, 28, 28)
    assert _scattering(2, 8, 28, 28) is not _scattering(2, 8, 32, 32)


def test_the_extractor_part_is_zero_and_says_why() -> None:
    training = ExtractorTraining.from_json({"training": "none", "fixed": ScatterNet().describe((28, 28, 1))})
    part = extractor_part(training, trained=False, records=300, features_epsilon=5.0)
    assert part is not None and part.kind == EXTRACTOR and part.epsilon == 0.0 and part.delta == 0.0
    assert FIXED_TEXT in part.covers and "J=2" in part.covers and "L=8" in part.covers
    guarantee = guarantee_of([features_part("piecewise", "flatten", 2.0), part], scope="test")
    assert guarantee.epsilon == 2.0 and guarantee.private
    raw_inputs = ExtractorTraining.from_json({"training": "none"})
    assert extractor_part(raw_inputs, trained=False, records=3, features_epsilon=1.0) is None


def test_the_2d_frontend_imports_in_this_environment_whatever_scipy_says_of_3d() -> None:
    """kymatio 0.3.0's ``kymatio.torch`` needs ``scipy.special.sph_harm`` (gone in SciPy 1.17); the extractor not."""
    import scipy.special

    code = ("import numpy as np\n"
            "from ldpfl.stage1_features.models.scatter import ScatterNet, scattering2d_class\n"
            "assert scattering2d_class().__name__ == 'ScatteringTorch2D'\n"
            "print(ScatterNet().transform(np.zeros((1, 28, 28, 1), np.float32)).shape)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "(1, 3969)", done.stderr
    top = subprocess.run([sys.executable, "-c", "import kymatio.torch"], capture_output=True, text=True, timeout=120)
    # where SciPy lacks sph_harm kymatio's torch entry point fails (its 3-D code); the extractor works either way
    assert (top.returncode == 0) == hasattr(scipy.special, "sph_harm"), top.stderr[-300:]
