"""ldpfl.mechanisms: every randomization mechanism of the four papers, with honest privacy reports.

Importing this package imports numpy and scipy only (never TensorFlow or torch).
"""

from . import fedaw, gaussian, gaussian_wu, identity, ldpsign, moue, oue, pdpm, rr, uer  # noqa: F401  (register)
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
from .ldpsign import sign_aggregate
from .randomness import Randomness, default_rng, make_randomness
from .registry import create_mechanism, mechanism_class, mechanism_names
from .report import PrivacyReport

__all__ = [
    "BitClass", "FixedPointEncoding", "PrivacyReport", "Randomness", "bit_epsilon", "clip_elementwise",
    "clip_l2_norm", "cosine_similarity", "create_mechanism", "default_rng", "gaussian_exact_epsilon",
    "gaussian_sigma_classic", "gaussian_sigma_wu_eq4", "label_distribution_weight", "make_randomness",
    "mechanism_class", "mechanism_names", "moue_probabilities", "oue_probabilities", "pack_bits",
    "pdpm_probabilities", "rr_probabilities", "sign_aggregate", "uer_probabilities", "unpack_bits",
]
