"""What stage 1 releases of each record (issue 17 item 1): the release points and their mechanisms.

* ``flatten`` (default, LDPFL): the flatten-layer output, r values; a bit mechanism over its fixed-point
  encoding (eq. 14) or a real mechanism over the float32 values.
* ``bottleneck:K``: a K-unit tanh layer (``cnn.BOTTLENECK_LAYER``) trained as part of the client CNN right
  after the flatten layer (the head continues from it); its output in [-1, 1]^K is released.
* ``scores``: the CNN's softmax p over the k classes, mapped to [-1, 1]^k by 2p - 1.
* ``label``: the CNN's predicted class as a one-hot row of width k.

Which mechanisms a release takes follows the mechanism's declared ``DOMAIN`` (never its name): flatten
takes ``bits`` and ``real``; bottleneck and scores take ``bounded`` (their input is a vector in
[-1, 1]^d, the domain of Duchi et al. and of the Piecewise/Hybrid mechanisms) and ``real`` (which clip
any real vector to their own range); label takes ``category`` (k-ary RR, OUE). ``none`` (domain ``any``)
goes with every release and writes the values unrandomized (NOT private).

Files of a low-dimensional release are float32 (rows, K or k): the one-hot rows (``none``), the
one-hot row of the randomized class (``krr``), the k OUE bits as 0/1 (``oue-label``), or the bounded
mechanism's unbiased output.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.release_point import (
    BOTTLENECK,
    FLATTEN,
    RELEASES,
    SCORES,
    ReleasePoint,
    parse_release,
    release_kind,
)
from ldpfl.mechanisms.base import FLOAT32
from ldpfl.stage1_features.export.write import ReleasePipeline

__all__ = ["RELEASE_DOMAINS", "ReleasePoint", "check_mechanism", "exportable_mechanisms",
           "local_layout", "parse_release", "release_help", "release_mechanisms", "release_notes", "release_values",
           "stored_layout"]

RELEASE_DOMAINS: dict[str, tuple[str, ...]] = {name: kind.domains for name, kind in RELEASES.items()}
"""Mechanism domains each release takes (``any`` is ``none``), from the release points' registry."""


def domain_mechanisms(domain: str) -> list[str]:
    """Return the registered mechanisms whose ``DOMAIN`` is ``domain``, sorted."""
    return [n for n in mechanisms.mechanism_names() if mechanisms.mechanism_class(n).DOMAIN == domain]


def takes_text(domains: tuple[str, ...]) -> str:
    """Say which mechanisms a release of ``domains`` takes: ``a bounded (duchi, ...) or real mechanism``."""
    words = {"bits": "a bit", "real": "real", "bounded": f"a bounded ({', '.join(domain_mechanisms('bounded'))})"}
    kinds = [words[d] for d in domains if d in words]
    if kinds:
        return f"{' or '.join(kinds)} mechanism"
    return " or ".join(n for d in domains if d != "any" for n in domain_mechanisms(d))


def release_help() -> str:
    """Return ``--release``'s help, generated from the release points' and the mechanisms' registries."""
    parts = [f"{kind.usage}{kind.summary}, with {takes_text(kind.domains)}." for _, kind in RELEASES.items()]
    return ("What each record releases. " + " ".join(parts)
            + " none releases any of them unrandomized (NOT private).")


def release_mechanisms(point: ReleasePoint) -> list[str]:
    """Return the registered mechanisms that ``point`` takes, sorted."""
    domains = RELEASE_DOMAINS[point.kind]
    return [n for n in mechanisms.mechanism_names() if mechanisms.mechanism_class(n).DOMAIN in domains]


def exportable_mechanisms() -> list[str]:
    """Return every mechanism some release takes (``ldpfl export --mechanism`` choices), sorted."""
    domains = {d for ds in RELEASE_DOMAINS.values() for d in ds}
    return [n for n in mechanisms.mechanism_names() if mechanisms.mechanism_class(n).DOMAIN in domains]


def check_mechanism(point: ReleasePoint, mechanism: str) -> None:
    """Refuse a mechanism whose domain the release does not take (``ParameterError`` naming both options)."""
    cls = mechanisms.mechanism_class(mechanism)
    if cls.DOMAIN in RELEASE_DOMAINS[point.kind]:
        return
    what = {"bits": "bits of the fixed-point encoding", "real": "real vectors", "bounded": "vectors in [-1, 1]^d",
            "category": "one categorical value (a class)"}.get(cls.DOMAIN, f"domain {cls.DOMAIN!r}")
    raise ParameterError(f"`mechanism` {mechanism!r} randomizes {what}, which `release` {str(point)!r} does not "
                         f"give; {str(point)!r} takes {', '.join(release_mechanisms(point))}")


def release_values(point: ReleasePoint, features: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """Return the float32 rows a batch releases, from the extractor's layer output and softmax.

    Parameters
    ----------
    point : ReleasePoint
        The release.
    features : np.ndarray
        (b, r) flatten features, or (b, K) bottleneck outputs (the layer the extractor cuts at).
    probabilities : np.ndarray
        (b, k) softmax of the CNN.
    """
    if point.kind in (FLATTEN, BOTTLENECK):
        return np.asarray(features, dtype=np.float32)
    p = np.asarray(probabilities, dtype=np.float32)
    if point.kind == SCORES:
        return np.clip(2.0 * p - 1.0, -1.0, 1.0).astype(np.float32)  # [0, 1]^k -> [-1, 1]^k
    one_hot = np.zeros(p.shape, dtype=np.float32)
    one_hot[np.arange(p.shape[0]), np.argmax(p, axis=1)] = 1.0
    return one_hot


@dataclasses.dataclass(frozen=True)
class StoredLayout:
    """How a release is stored: the file's format, its encoding (m, n) and the recorded mechanism parameters."""

    feature_format: str
    integer_bits: int
    fraction_bits: int
    mechanism_parameters: dict[str, Any]
    pipeline: ReleasePipeline


def stored_layout(point: ReleasePoint, spec: mechanisms.MechanismSpec) -> StoredLayout:
    """Return how ``spec``'s output for release ``point`` is stored.

    A flatten release is stored as the mechanism says (packed bits or float32). Any other release is
    float32; ``none`` then records no encoding (m = n = 0, no parameters): it writes the values as they are.
    """
    if point.is_flatten:
        return StoredLayout(spec.feature_format, spec.integer_bits, spec.fraction_bits, spec.recorded_parameters(),
                            ReleasePipeline.for_spec(spec))
    params = spec.recorded_parameters() if spec.randomizes else {}
    return StoredLayout(FLOAT32, 0, 0, params, ReleasePipeline(spec.build(), None, FLOAT32))


def clean_layout(point: ReleasePoint, spec: mechanisms.MechanismSpec) -> StoredLayout:
    """Return the layout of the local-only clean test file: the release's values with ``none``, same width."""
    layout = stored_layout(point, spec)
    identity = mechanisms.create_mechanism("none")
    if layout.feature_format == FLOAT32:
        return StoredLayout(FLOAT32, 0, 0, {}, ReleasePipeline(identity, None, FLOAT32))
    encoding = spec.encoding
    assert encoding is not None
    return StoredLayout(layout.feature_format, layout.integer_bits, layout.fraction_bits,
                        {"integer_bits": encoding.integer_bits, "fraction_bits": encoding.fraction_bits},
                        ReleasePipeline(identity, encoding, layout.feature_format))


def local_layout() -> StoredLayout:
    """Return the layout of local-only files (``local_only``): the float32 values as they are, mechanism ``none``."""
    return StoredLayout(FLOAT32, 0, 0, {}, ReleasePipeline(mechanisms.create_mechanism("none"), None, FLOAT32))


def release_notes(point: ReleasePoint, num_classes: int) -> tuple[str, ...]:
    """Return the notes that the privacy report of a release carries (what one record is)."""
    note = release_kind(point.kind).note
    return () if note is None else (note.format(units=point.units, classes=num_classes),)


def noise_variance(spec: mechanisms.MechanismSpec) -> tuple[float, float]:
    """Return (a, b): the mechanism's output variance per coordinate at input x is a + b·x² (``--noise-aware``).

    Bounded mechanisms state it in closed form (``expected_variance``; exactly quadratic in x for Duchi et
    al., Piecewise and Hybrid, constant for Laplace), read here at x = 0 and x = 1; a real mechanism with
    a noise scale σ gives (σ², 0). ``ParameterError`` for a mechanism that adds no noise of known variance.
    """
    mechanism = spec.build()
    width = spec.features or 1
    if mechanism.DOMAIN == "bounded":
        at0 = float(np.mean(mechanism.expected_variance(np.zeros((1, width)))))
        at1 = float(np.mean(mechanism.expected_variance(np.ones((1, width)))))
        return at0, at1 - at0
    sigma = mechanism.noise_scale()
    if sigma is None or not spec.randomizes:
        raise ParameterError(f"`noise_aware` trains against the noise of the mechanism; `mechanism` {spec.name!r} "
                             "has no per-coordinate noise variance to train against")
    return float(sigma) ** 2, 0.0
