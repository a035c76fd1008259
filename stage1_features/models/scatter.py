"""The weight-free ScatterNet extractor (``--extractor scatter``): Tramèr and Boneh (ICLR 2021), Section 3.

Tramèr and Boneh, "Differentially Private Learning Needs Better Features (or Much More Data)", ICLR 2021: a
wavelet scattering transform (Bruna and Mallat 2013; kymatio's ``Scattering2D``, J = 2, L = 8, order 2) followed
by a per-record GroupNorm without learned parameters gives features on which a linear model trained with DP-SGD
reaches 89.7 % on Fashion-MNIST at ε = 3 (their Table 1). Nothing about it is learned: every silo computes the
same function, fixed by the software, so it gives all silos the same feature space at no privacy cost (the
release guarantee's extractor part is 0, ``ldpfl.contract.release_guarantee``).

The computation, for images x of shape (N, H, W, C) with values in [0, 1]:

1. per channel, the 2-D scattering transform S_J x with L orientations and two orders: K = 1 + J·L + L²·J(J−1)/2
   maps of size (H/2^J, W/2^J) (Bruna and Mallat 2013, Section 3.1; 81 maps for J = 2, L = 8);
2. the C·K maps of a record grouped into G groups, each normalized to mean 0 and variance 1 over its maps and
   positions (Wu and He 2018, GroupNorm eq. 1, with ε = 1e-5 and no affine parameters); G = 27 as Tramèr and
   Boneh use where 27 divides C·K (J = 2, L = 8: 81 and 243 maps), else the largest divisor of C·K below 27;
3. flattened to float32 rows of C·K·(H/2^J)·(W/2^J) values: 3,969 for 28×28×1, 15,552 for 32×32×3.

GroupNorm works on each record alone, so a batch's features do not depend on the other records of the batch
(only the float rounding of the FFTs may). The transform runs on torch on the CPU, a batch at a time, and the
``Scattering2D`` object of each (J, L, shape) is built once per process.

kymatio 0.3.0's ``kymatio.torch`` imports its 3-D transform, which imports ``scipy.special.sph_harm``, removed in
SciPy 1.17; :func:`scattering2d_class` imports only the 2-D torch frontend (see there). torch and kymatio load
only inside the functions that compute.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.stage1_features.models.cnn import Architecture, register

SCATTER = "scatter"
DEFAULT_J = 2  # Tramèr and Boneh, Section 3: J = 2 (maps of 7×7 on 28×28 images)
DEFAULT_L = 8  # ... and L = 8 orientations
MAX_J = 8
MAX_L = 16
MAX_ORDER = 2
GROUPS = 27  # Tramèr and Boneh's GroupNorm: 27 groups
GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm's default
BATCH_IMAGES = 64  # images per scattering call: the fastest on one thread here (bench/scatter_throughput.py --tune)
OPTIONS: dict[str, int] = {"scatter_j": DEFAULT_J, "scatter_l": DEFAULT_L}
"""The export's options of this extractor (``ExportConfig`` fields, ``--scatter-j``/``--scatter-l``), with defaults."""
SOURCE = "Tramèr and Boneh (ICLR 2021): kymatio Scattering2D + GroupNorm, no learned parameters"
KYMATIO = "kymatio"


def scattering_channels(j: int, l: int) -> int:  # noqa: E741 - L is the paper's name for the orientations
    """Return K = 1 + J·L + L²·J(J−1)/2: the maps of an order-2 scattering of one channel (81 for J = 2, L = 8)."""
    return 1 + j * l + l * l * j * (j - 1) // 2


def group_count(channels: int) -> int:
    """Return GroupNorm's G for ``channels`` maps: 27 where it divides them, else their largest divisor below 27."""
    return max(g for g in range(1, GROUPS + 1) if channels % g == 0)


def _option(options: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = options.get(name, OPTIONS[name])
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= value <= high:
        raise ParameterError(f"`{name}` must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ScatterNet:
    """The scattering extractor of one (J, L): its width, its description and the transform of a batch.

    Parameters
    ----------
    j : int
        J, the number of scales (the maps are 2^J times smaller than the image), in [1, 8].
    l : int
        L, the number of orientations, in [1, 16].
    """

    j: int = DEFAULT_J
    l: int = DEFAULT_L  # noqa: E741 - the paper's L

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ScatterNet:
        """Return the extractor of the export's options (``scatter_j``, ``scatter_l``), checked (``ParameterError``)."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ParameterError(f"extractor {SCATTER!r} takes {', '.join(OPTIONS)}, not {', '.join(unknown)}")
        return cls(_option(options, "scatter_j", 1, MAX_J), _option(options, "scatter_l", 1, MAX_L))

    def options(self) -> dict[str, int]:
        """Return the export's options that rebuild this extractor."""
        return {"scatter_j": self.j, "scatter_l": self.l}

    def image_shape(self, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Return (H, W, C) of ``input_shape``; refuse non-images and sizes that 2^J does not divide (one line)."""
        if len(input_shape) != 3 or min(input_shape) < 1:
            raise ParameterError(f"`extractor` {SCATTER!r} needs images of shape (height, width, channels), got "
                                 f"input shape {tuple(input_shape)}; use `extractor` 'none' for tabular data")
        h, w, c = (int(s) for s in input_shape)
        step = 2 ** self.j
        if h % step or w % step:
            raise ParameterError(f"`scatter_j` = {self.j} needs image sides divisible by 2^J = {step}, got {h}×{w}; "
                                 "choose a smaller `scatter_j` or resize the images")
        return h, w, c

    def channels(self, input_shape: tuple[int, ...]) -> int:
        """Return C·K, the maps of a record."""
        return self.image_shape(input_shape)[2] * scattering_channels(self.j, self.l)

    def width(self, input_shape: tuple[int, ...]) -> int:
        """Return C·K·(H/2^J)·(W/2^J): 3,969 for 28×28×1 and 15,552 for 32×32×3 at J = 2, L = 8."""
        h, w, _ = self.image_shape(input_shape)
        return self.channels(input_shape) * (h >> self.j) * (w >> self.j)

    def describe(self, input_shape: tuple[int, ...]) -> dict[str, Any]:
        """Return what produced the features, for the file's ``extractor_training`` (``fixed``)."""
        return {"kind": "scattering2d", "J": self.j, "L": self.l, "max_order": MAX_ORDER, "options": self.options(),
                "channels": self.channels(input_shape),
                "normalization": {"kind": "group_norm", "groups": group_count(self.channels(input_shape)),
                                  "affine": False, "eps": GROUP_NORM_EPS},
                "library": f"{KYMATIO} {_kymatio_version()}", "source": SOURCE}

    def transform(self, images: np.ndarray, *, batch: int = BATCH_IMAGES, threads: int | None = None) -> np.ndarray:
        """Return the float32 features (N, width) of float images (N, H, W, C) in [0, 1] (module docstring).

        Parameters
        ----------
        images : np.ndarray
            (N, H, W, C) images; any float or integer dtype, taken as float32.
        batch : int
            Images per scattering call; only one such batch and the output are alive at a time.
        threads : int, optional
            torch's intra-op threads (``torch.set_num_threads``); default: leave torch's setting.
        """
        images = np.asarray(images)
        shape = tuple(int(s) for s in images.shape[1:])
        out = np.empty((images.shape[0], self.width(shape)), dtype=np.float32)
        for rows, features in self.batches(images, batch=batch, threads=threads):
            out[rows] = features
        return out

    def batches(self, images: np.ndarray, *, batch: int = BATCH_IMAGES, threads: int | None = None
                ) -> Iterator[tuple[slice, np.ndarray]]:
        """Yield (row slice, float32 features) over ``images`` (N, H, W, C), ``batch`` images at a time."""
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))
        shape = tuple(int(s) for s in np.shape(images)[1:])
        h, w, c = self.image_shape(shape)
        scattering = _scattering(self.j, self.l, h, w)
        groups = group_count(self.channels(shape))
        with torch.inference_mode():
            for start in range(0, len(images), batch):
                chunk = np.asarray(images[start:start + batch], dtype=np.float32)
                x = torch.from_numpy(chunk).permute(0, 3, 1, 2).reshape(-1, h, w).contiguous()  # (n·C, H, W)
                s = scattering(x)  # (n·C, K, H/2^J, W/2^J)
                s = s.reshape(len(chunk), c * s.shape[1], s.shape[-2], s.shape[-1])  # (n, C·K, ., .): channel-major
                s = torch.nn.functional.group_norm(s, groups, eps=GROUP_NORM_EPS)  # no affine (T&B 2021)
                yield slice(start, start + len(chunk)), s.reshape(len(chunk), -1).numpy().astype(np.float32,
                                                                                                copy=False)


def scattering2d_class() -> Any:
    """Return kymatio's torch ``Scattering2D`` class (``ScatteringTorch2D``), importing only the 2-D torch frontend.

    kymatio's documented entry point, ``from kymatio.torch import Scattering2D``, imports the torch frontends of the
    1-D, 2-D and 3-D transforms; the 3-D one imports ``scipy.special.sph_harm``, which SciPy 1.17 removed, so it
    fails there. The top-level package imports its frontends lazily (``import kymatio`` works), so the 2-D torch
    frontend, the module that defines the class ``kymatio.torch`` re-exports, is imported directly: the same
    class, without the 3-D code (``tests/unit/test_scatter.py`` checks both imports against this SciPy).

    Raises
    ------
    ImportError
        kymatio is not installed (with the command that installs it).
    """
    try:
        from kymatio.scattering2d.frontend.torch_frontend import (
            ScatteringTorch2D,
        )
    except ModuleNotFoundError as error:
        if error.name is None or not error.name.startswith(KYMATIO):
            raise
        raise ImportError("the scatter extractor needs kymatio: pip install kymatio==0.3.0") from None
    return ScatteringTorch2D


@functools.lru_cache(maxsize=8)
def _scattering(j: int, l: int, h: int, w: int) -> BatchedScattering:  # noqa: E741 - the paper's L
    """Return the scattering of (J, L, (H, W)) on the CPU, built once per (J, L, shape) in this process."""
    return BatchedScattering(scattering2d_class()(J=j, shape=(h, w), L=l, max_order=MAX_ORDER))


class BatchedScattering:
    """kymatio's Scattering2D, evaluated with the wavelets of one scale stacked: a few large tensor operations.

    kymatio 0.3.0's torch backend applies its 1 + J·L + L²·J(J−1)/2 filter products one path at a time, on
    (real, imaginary) pairs. This evaluates the same algorithm (Bruna and Mallat 2013, Section 3.1, as kymatio's
    ``scattering2d`` orders it: S0, then the first order by path, then the second order by (n1, n2) with
    j2 > j1) with kymatio's own padding and Fourier-domain filters, on native complex tensors, all
    orientations of a scale at once, each filter product and subsampling as one batched matrix product
    (:class:`_Filters`): faster than kymatio's own call on 2 CPU cores (bench/RESULTS.md), and equal to its output
    up to float32 rounding (``tests/unit/test_scatter.py``).

    Parameters
    ----------
    kymatio_scattering : ScatteringTorch2D
        kymatio's transform, built for (J, (H, W), L, max_order 2): its ``pad``, ``phi`` and ``psi`` are used.
    """

    def __init__(self, kymatio_scattering: Any) -> None:
        import torch

        self.kymatio = kymatio_scattering
        self.j = int(kymatio_scattering.J)

        def stacked(filters: list[Any]) -> Any:  # (n, M, N) float32, from kymatio's (M, N) or (M, N, 1) arrays
            return torch.stack([torch.from_numpy(np.asarray(f, dtype=np.float32).reshape(f.shape[0], f.shape[1]))
                                for f in filters])

        # phi at resolution 2^-j is applied before a subsampling by 2^(J-j)
        self.phi = [_Filters(stacked([level]), 2 ** (self.j - j))
                    for j, level in enumerate(kymatio_scattering.phi["levels"])]
        psi = kymatio_scattering.psi
        # psi[j][level]: the L wavelets of scale j (in kymatio's order), sampled at resolution 2^-level (0, and the
        # scales j1 < j of a first-order path), applied before a subsampling by 2^(j - level)
        self.psi = []
        for scale in range(self.j):
            wavelets = [p["levels"] for p in psi if p["j"] == scale]
            self.psi.append([_Filters(stacked([w[level] for w in wavelets]), 2 ** (scale - level))
                             for level in range(len(wavelets[0]))])

    def __call__(self, x: Any) -> Any:
        """Return the scattering (n, K, H/2^J, W/2^J) of real images ``x`` (n, H, W), as kymatio's would be."""
        import torch

        fft, ifft = torch.fft.fft2, torch.fft.ifft2
        u0 = fft(self.kymatio.pad(x)[..., 0].to(torch.complex64))  # reflect-padded image, Fourier domain

        def low_pass(u: Any, scale: int) -> Any:  # S = (|...| * phi_J) subsampled by 2^J, border removed
            s = ifft(self.phi[scale].apply(u)[..., 0, :, :]).real
            return s[..., 1:-1, 1:-1]

        def modulus(u: Any, filters: _Filters) -> Any:  # U = |x * psi| at 2^-j, back in the Fourier domain
            return fft(ifft(filters.apply(u)).abs().to(torch.complex64))

        order0, order1, order2 = low_pass(u0, 0)[:, None], [], []
        for j1 in range(self.j):
            u1 = modulus(u0, self.psi[j1][0])  # (n, L, M/2^j1, N/2^j1)
            order1.append(low_pass(u1, j1))
            second = [low_pass(modulus(u1, self.psi[j2][j1]), j2)
                      for j2 in range(j1 + 1, self.j)]  # each (n, L, L, ., .): (theta1, theta2)
            if second:
                order2.append(torch.cat(second, dim=2).flatten(1, 2))  # n2 runs over (j2, theta2) for each n1
        return torch.cat([order0, *order1, *order2], dim=1)


class _Filters:
    """F filters in the Fourier domain and the subsampling k that follows them (kymatio's cdgmm, subsample_fourier).

    ``apply(u)`` is periodize(u ⊙ filter_f, k) for every filter f. Subsampling by k in space averages the k×k
    blocks of the spectrum (periodization). For k > 1 the product and the average are one batched matrix product
    over the blocks: at each of the (M/k)·(N/k) positions, the k² block values of every input times the k² values
    of every filter (divided by k²), without the full-size product.
    """

    def __init__(self, filters: Any, k: int) -> None:
        import torch

        self.filters, self.k = filters, k  # (F, M, N) float32
        f, m, n = filters.shape
        blocks = filters.reshape(f, k, m // k, k, n // k).permute(2, 4, 1, 3, 0).reshape(-1, k * k, f)
        self.blocks = (blocks / (k * k)).to(torch.complex64).contiguous()  # (positions, k², F)

    def apply(self, u: Any) -> Any:
        """Return (..., F, M/k, N/k) of the spectra ``u`` (..., M, N)."""
        import torch

        if self.k == 1:
            return u[..., None, :, :] * self.filters
        *batch, m, n = u.shape
        k, mk, nk = self.k, m // self.k, n // self.k
        rows = int(np.prod(batch))
        blocks = u.reshape(rows, k, mk, k, nk).permute(2, 4, 0, 1, 3).reshape(mk * nk, rows, k * k)
        out = torch.bmm(blocks, self.blocks)  # (positions, rows, F)
        return out.permute(1, 2, 0).reshape(*batch, self.blocks.shape[-1], mk, nk)


def _kymatio_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(KYMATIO)
    except PackageNotFoundError:
        return "not installed"


register(Architecture(SCATTER, SOURCE, "wavelet scattering (J, L) + GroupNorm, weight-free, not trained",
                      lambda shape: ScatterNet().width(shape), fixed=ScatterNet.from_options, options=OPTIONS))

__all__ = ["OPTIONS", "SCATTER", "ScatterNet", "group_count", "scattering2d_class", "scattering_channels"]
