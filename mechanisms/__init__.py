"""ldpfl.mechanisms: every randomization mechanism of the four papers, with honest privacy reports.

Importing this package imports numpy and scipy only (never TensorFlow or torch).
"""

from ldpfl.common.registry import Registry

from . import (  # noqa: F401  (importing a mechanism's module registers it)
    duchi,
    fedaw,
    gaussian,
    gaussian_statistics,  # issue 40: the one-shot release of noisy sufficient statistics
    gaussian_wu,
    hybrid,  # issue 17 LDP mechanisms: duchi, hybrid, krr, laplace, oue_label, piecewise
    identity,
    krr,
    laplace,
    ldpsign,
    moue,
    oue,
    oue_label,
    pdpm,
    piecewise,
    rr,
    uer,
)
from .base import (
    FEATURE_FORMATS,
    FLOAT32,
    PACKED_BITS,
    PARAMETERS,
    UPDATE,
    FederationWiring,
    Mechanism,
)
from .calibration import (
    BitClass,
    bit_epsilon,
    gaussian_exact_epsilon,
    gaussian_sigma_classic,
    gaussian_sigma_wu_eq4,
    moue_probabilities,
    oue_probabilities,
    pdpm_probabilities,
    rr_probabilities,
    uer_probabilities,
)
from .clipping import clip_elementwise, clip_l2_norm
from .encoding import FixedPointEncoding, pack_bits, unpack_bits
from .fedaw import cosine_similarity, label_distribution_weight
from .randomness import Randomness, default_rng, make_randomness
from .registry import create_mechanism, federation_names, mechanism_class, mechanism_names
from .report import PrivacyReport
from .spec import MechanismSpec

__all__ = [
    "FEATURE_FORMATS", "FLOAT32", "PACKED_BITS", "PARAMETERS", "UPDATE",
    "BitClass", "FederationWiring", "FixedPointEncoding", "Mechanism", "MechanismSpec", "PrivacyReport", "Randomness",
    "Registry", "bit_epsilon", "clip_elementwise", "clip_l2_norm", "cosine_similarity", "create_mechanism",
    "default_rng", "federation_names", "gaussian_exact_epsilon",
    "gaussian_sigma_classic", "gaussian_sigma_wu_eq4", "label_distribution_weight", "make_randomness",
    "mechanism_class", "mechanism_names", "moue_probabilities", "oue_probabilities", "pack_bits",
    "pdpm_probabilities", "rr_probabilities", "uer_probabilities", "unpack_bits",
]
