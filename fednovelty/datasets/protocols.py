"""Benchmark tasks: one dataset, one protocol, one federated split, ready to fit and score.

:func:`make_task` turns a dataset name into a :class:`Task`: scaled training rows with the
client id of each row, and a labelled test set (1 = novel, the positive class).

Protocols (both named in every benchmark output):

- ``"novelty"`` (the FedGenGMM paper): the anomalies never reach training. The inliers are
  shuffled; ``test_share`` (30 %) of them are held out and tested together with *all* the
  anomalies; the remaining inliers are split among the clients.
- ``"outlier"`` (ADBench's unsupervised setting): a 70/30 split of *all* rows, stratified by
  label; the clients train on the contaminated 70 %, the test set is the other 30 %.

Out-of-distribution sets (``ood``; also written as a suffix of the name, ``"10_cover:noise"``):

- ``"anomalies"`` (the default for ADBench): the dataset's own anomalies are the novel rows.
- ``"noise"`` (the FedGenGMM paper's Covertype): the held-out inliers are halved; one half stays
  as test inliers, the other half gets ``N(0, noise_variance)`` noise (0.005) *after* scaling and
  is the novel set. The dataset's own anomalies are not used. Novelty protocol only.
- MNIST (``"mnist"``): the clients hold the 60 000 training images; the 10 000 test images are
  halved into test inliers and images that become novel by a transform from
  :func:`~fednovelty.datasets.transform_images`: ``"transforms"`` (default) cycles through
  scale (0.5), rotate (90 degrees) and horizontal flip; ``"scale"``, ``"rotate"``, ``"hflip"``
  or ``"invert"`` uses one; ``"inv-flip-rot"`` applies the FedGMM paper's real-data transform
  ``T`` (invert, flip, rotate: :func:`~fednovelty.datasets.femnist.transform_writer_images`).
  Pixels are divided by 255 and projected on ``pca_components`` (24) principal axes found
  by federated PCA over the training clients (the two-pass algorithm of
  :class:`~fednovelty.federated.mixtures.pca.FederatedPCA`: summed rows, then summed scatter
  about the pooled mean), so every method sees the same 24 features. Novelty protocol only.

- FEMNIST (``"femnist"``): the clients are the first ``n_clients`` writers of
  :func:`~fednovelty.datasets.make_femnist_federated` (seeded; ``partition`` and ``alpha``
  do not apply and the task records ``partition="writers"``) and hold their writers' training
  images; the writers' test images are halved into inliers and novel images, transformed as
  MNIST's (``groups_test`` records each test row's writer). Features are ``"polar"`` by
  default: each image's direction (pixels over their L2 norm) on 24 federated principal axes
  plus the log of its norm, the amount of ink. FEMNIST's strokes are thin, so an image shrunk
  by 0.5 keeps little ink and lies next to the pixel mean, where a density on pixel axes is
  highest; the norm feature is what lets a density see it (``image_features="pixels"`` gives
  the MNIST features). Novelty protocol only.
- Bundled digits (``"digits"``): scikit-learn's handwritten digits
  (:func:`~fednovelty.datasets.digits.load_bundled_digits`: 1,797 8x8 images with 64 pixel
  features, shipped inside scikit-learn, so they need no data folder): the images of
  digit ``DIGITS_NOVEL`` (0) are the anomalies, the other digits the inliers; both protocols.
  Pixels are projected on 16 federated principal axes, as MNIST's on 24 (many of the 64 pixels
  are constant in training, which a density cannot score).

Clients (``partition``), drawn over a grouping of the training rows: the digit labels for
MNIST and the bundled digits; for ADBench, which has no class column, ``n_groups`` (10)
k-means clusters of the min-max scaled training rows (the FedGenGMM paper's
feature-distribution skew):

- ``"dirichlet"``: Dirichlet(``alpha``) shares of every group per client, redrawn until every
  client has ``min_size`` rows (default: 10, lowered to ``n_train // (2 * n_clients)`` for small
  data so that a draw can succeed);
- ``"quantity"``: each client holds rows of ``alpha`` groups (an integer, ``1..n_groups``);
- ``"iid"``: uniformly random, sizes within one (``alpha`` is ignored).

Scaling: min-max with the range merged from the clients' own per-feature minima and maxima
(:meth:`~fednovelty.datasets.MinMaxScaling.from_clients`), a quantity a federation can compute;
the test rows are transformed with it and never inform it (test values may leave [0, 1]).

Randomness: ``seed`` drives the split, subsampling, k-means, the partition and the OOD
transforms, through one ``numpy.random.Generator``; the same seed gives the same task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

import fednovelty.datasets as _datasets
from fednovelty.datasets import (
    TRANSFORMS,
    MinMaxScaling,
    add_gaussian_noise,
    dirichlet_partition,
    groups_from_partition,
    iid_partition,
    kmeans_groups,
    load_adbench,
    load_mnist,
    make_femnist_federated,
    transform_images,
)
from fednovelty.datasets.digits import (
    BUNDLED_DIGITS,
    DIGITS_NOVEL,
    DIGITS_PCA_COMPONENTS,
    load_bundled_digits,
)
from fednovelty.datasets.femnist import transform_writer_images

__all__ = [
    "BUNDLED_DIGITS",
    "DIGITS_NOVEL",
    "IMAGE_FEATURES",
    "MNIST_PCA_COMPONENTS",
    "NOISE_VARIANCE",
    "OOD_KINDS",
    "PARTITIONS",
    "PROTOCOLS",
    "Task",
    "make_task",
    "parse_dataset",
    "polar_rows",
]

PROTOCOLS = ("novelty", "outlier")
PARTITIONS = ("dirichlet", "quantity", "iid")
#: The FedGMM paper's real-data transform ``T`` as an OOD set (invert, hflip, rotate 90).
PAPER_TRANSFORM = "inv-flip-rot"
OOD_KINDS = ("anomalies", "noise", "transforms", *TRANSFORMS, PAPER_TRANSFORM)
#: How image rows become features before the federated PCA (see the module doc).
IMAGE_FEATURES = ("pixels", "polar")
#: Default of ``image_features`` per image set.
DEFAULT_IMAGE_FEATURES = {"mnist": "pixels", "femnist": "polar"}
NOISE_VARIANCE = 0.005  # the FedGenGMM paper's Covertype noise, on min-max scaled features
MNIST_PCA_COMPONENTS = 24  # the FedGenGMM paper's MNIST features
#: Image datasets whose pixels are projected on federated principal axes (count by default).
PCA_COMPONENTS = {
    "mnist": MNIST_PCA_COMPONENTS,
    "femnist": MNIST_PCA_COMPONENTS,
    BUNDLED_DIGITS: DIGITS_PCA_COMPONENTS,
}
#: Image sets whose novel test rows are transformed images.
IMAGE_SETS = ("mnist", "femnist")
#: The partition of FEMNIST: its writers are the clients.
WRITERS = "writers"
_MNIST_OOD_CYCLE = ("scale", "rotate", "hflip")


@dataclass(frozen=True, eq=False)
class Task:
    """One benchmark task: federated training rows and a labelled test set.

    Attributes:
        name: the dataset as written in results, e.g. ``"4_breastw"``, ``"10_cover:noise"``,
            ``"mnist"``.
        dataset: the file it was read from (``"10_cover"``, ``"mnist"``).
        protocol: ``"novelty"`` or ``"outlier"``; ood: what the novel test rows are.
        X_train: (n_train, n_features) float64, scaled; in novelty tasks inliers only.
        y_train: (n_train,) int64, 1 = a training row that is one of the dataset's anomalies
            (only the outlier protocol trains on any), else 0.
        groups_train: (n_train,) int64 client id of each training row, in ``range(n_clients)``.
        partition_labels: (n_train,) int64 group of each training row that the clients were
            drawn over (the digit for MNIST and the bundled digits, the k-means cluster for
            ADBench).
        X_test: (n_test, n_features) float64, scaled with the training clients' range.
        y_test: (n_test,) int64, 1 = novel/anomalous (the positive class), 0 = inlier.
        train_index: (n_train,) rows of the source array used for training (MNIST: of
            ``x_train``).
        test_index: (n_test,) source row of each test row (MNIST: of ``x_test``; a
            noise/transform OOD row points at the inlier it was made from).
        scaling: the federated min-max scaling applied to both sets.
        n_clients, alpha, partition, seed: how the clients were drawn.
        groups_test: (n_test,) int64 client of each test row where the test rows belong to
            the clients (FEMNIST: the writer), else None.
    """

    name: str
    dataset: str
    protocol: str
    ood: str
    X_train: np.ndarray
    y_train: np.ndarray
    groups_train: np.ndarray
    partition_labels: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    train_index: np.ndarray
    test_index: np.ndarray
    scaling: MinMaxScaling
    n_clients: int
    alpha: float | None
    partition: str
    seed: int
    groups_test: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])


def parse_dataset(name: str) -> tuple[str, str | None]:
    """Split ``"10_cover:noise"`` into ``("10_cover", "noise")``; no suffix gives ``None``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset must be a non-empty string such as '4_breastw'; got {name!r}.")
    base, _, ood = name.partition(":")
    return base, (ood or None)


def make_task(
    dataset: str,
    protocol: str = "novelty",
    *,
    n_clients: int,
    alpha: float | None,
    partition: str = "dirichlet",
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
    ood: str | None = None,
    noise_variance: float = NOISE_VARIANCE,
    test_share: float = 0.3,
    n_groups: int = 10,
    min_size: int | None = None,
    pca_components: int | None = None,
    image_features: str | None = None,
) -> Task:
    """Build one task (see the module doc for the protocols, OOD sets and partitions).

    Args:
        dataset: an ADBench name from :func:`~fednovelty.datasets.list_adbench` (tabular or,
            with ``include_cv``, embeddings), ``"mnist"``, ``"femnist"`` (its writers are the
            clients) or ``"digits"`` (scikit-learn's bundled digits, no data folder needed),
            optionally with ``":<ood>"``.
        protocol: ``"novelty"`` or ``"outlier"``.
        n_clients: number of clients, >= 1 (FEMNIST: writers).
        alpha: Dirichlet concentration (``"dirichlet"``), groups per client (``"quantity"``,
            an integer) or ignored (``"iid"``; may be None).
        partition: ``"dirichlet"``, ``"quantity"`` or ``"iid"``.
        seed: int >= 0.
        data_dir: data folder; see :func:`~fednovelty.datasets.data_dir`.
        max_train: keep at most this many training rows (a uniform subsample), for speed.
        max_test: keep at most this many test rows (stratified: the novel share is kept).
        ood: ``"anomalies"``, ``"noise"``, ``"transforms"``, ``"scale"``, ``"rotate"``,
            ``"hflip"``, ``"invert"``; default ``"anomalies"`` (ADBench), ``"transforms"``
            (MNIST). Must agree with a suffix in ``dataset``.
        noise_variance: variance of the ``"noise"`` OOD, on scaled features.
        test_share: share of the inliers (novelty) or of all rows (outlier) held out, in (0, 1).
        n_groups: k-means clusters to skew over (ADBench).
        min_size: rows every Dirichlet client must hold; default see the module doc.
        pca_components: image sets and the bundled digits only: principal axes kept
            (default 24 and 16).
        image_features: MNIST and FEMNIST only: ``"pixels"`` (pixels / 255 on the principal
            axes) or ``"polar"`` (each row's direction, the row over its L2 norm, on the
            principal axes, and the log of its norm as one more feature); default
            ``"pixels"`` for MNIST, ``"polar"`` for FEMNIST.

    Returns:
        A :class:`Task`.

    Raises:
        ValueError: an unknown name or option, a protocol the OOD set does not support, or a
            partition that cannot be drawn (the message says which).
        FileNotFoundError: the data folder or file is missing.

    Example:
        >>> task = make_task("4_breastw", "novelty", n_clients=3, alpha=0.5, seed=0)
        >>> task.X_train.shape[1] == task.X_test.shape[1], sorted(set(task.y_test.tolist()))
        (True, [0, 1])
    """
    base, suffix = parse_dataset(dataset)
    if suffix is not None and ood is not None and suffix != ood:
        raise ValueError(f"dataset {dataset!r} names ood={suffix!r} but ood={ood!r} was passed.")
    default_ood = "transforms" if base in IMAGE_SETS else "anomalies"
    ood = ood or suffix or default_ood
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}; got {protocol!r}.")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}; got {partition!r}.")
    if ood not in OOD_KINDS:
        raise ValueError(f"ood must be one of {OOD_KINDS}; got {ood!r}.")
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must be in (0, 1); got {test_share!r}.")
    if protocol == "outlier" and ood != "anomalies":
        raise ValueError(
            f"the outlier protocol trains on a dataset's own anomalies; ood={ood!r} is for the "
            "novelty protocol only."
        )
    features = _image_features(base, image_features)
    rng = np.random.default_rng(seed)
    groups_test = None
    if base in IMAGE_SETS:
        if ood == "anomalies":
            raise ValueError(f"{base} has no anomaly labels; use ood='transforms' or a transform.")
        if base == "mnist":
            X_raw, labels, train_idx, X_test_raw, y_test, test_idx = _mnist_split(
                ood, max_train, max_test, data_dir, rng
            )
        else:
            X_raw, labels, train_idx, X_test_raw, y_test, test_idx, groups_test = _femnist_split(
                ood, n_clients, max_train, max_test, data_dir, rng
            )
            partition, alpha = WRITERS, None
        y_train = np.zeros(train_idx.shape[0], dtype=np.int64)
    elif base == BUNDLED_DIGITS:
        if ood not in ("anomalies", "noise"):
            raise ValueError(f"ood={ood!r}: the bundled digits take 'anomalies' or 'noise'.")
        X, digits = load_bundled_digits()
        train_idx, test_idx, y_test = _tabular_split(
            (digits == DIGITS_NOVEL).astype(np.int64),
            protocol,
            ood,
            test_share,
            max_train,
            max_test,
            rng,
        )
        X_raw, X_test_raw, labels = X[train_idx], X[test_idx], digits[train_idx]
        y_train = (labels == DIGITS_NOVEL).astype(np.int64)
    else:
        if ood not in ("anomalies", "noise"):
            raise ValueError(
                f"ood={ood!r} transforms images; for the tabular dataset {base!r} use "
                "'anomalies' or 'noise'."
            )
        X, y = load_adbench(base, data_dir)
        train_idx, test_idx, y_test = _tabular_split(
            y, protocol, ood, test_share, max_train, max_test, rng
        )
        X_raw, X_test_raw, labels = X[train_idx], X[test_idx], None
        y_train = np.asarray(y[train_idx], dtype=np.int64)

    if labels is None:  # no class column: skew over k-means clusters of the scaled rows
        pooled = MinMaxScaling.from_clients([X_raw]).transform(X_raw)
        labels = kmeans_groups(pooled, min(n_groups, X_raw.shape[0]), random_state=rng)
    if partition == WRITERS:  # each writer is a client: no partition to draw
        parts = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    else:
        parts = _partition(labels, n_clients, alpha, partition, min_size, rng)
    if features == "polar":
        (X_raw, norm_raw), (X_test_raw, norm_test) = polar_rows(X_raw), polar_rows(X_test_raw)
    if base in PCA_COMPONENTS:
        X_raw, X_test_raw = _federated_pca(
            X_raw, X_test_raw, parts, pca_components or PCA_COMPONENTS[base]
        )
    if features == "polar":
        X_raw, X_test_raw = np.c_[X_raw, norm_raw], np.c_[X_test_raw, norm_test]
    scaling = MinMaxScaling.from_clients([X_raw[p] for p in parts])
    X_train, X_test = scaling.transform(X_raw), scaling.transform(X_test_raw)
    if ood == "noise":
        novel = y_test == 1
        X_test[novel] = add_gaussian_noise(X_test[novel], noise_variance, random_state=rng)
    return Task(
        name=base if ood == default_ood else f"{base}:{ood}",
        dataset=base,
        protocol=protocol,
        ood=ood,
        X_train=X_train,
        y_train=y_train,
        groups_train=groups_from_partition(parts, X_train.shape[0]),
        partition_labels=np.asarray(labels, dtype=np.int64),
        X_test=X_test,
        y_test=y_test,
        train_index=train_idx,
        test_index=test_idx,
        scaling=scaling,
        n_clients=int(n_clients),
        alpha=None if alpha is None else float(alpha),
        partition=partition,
        seed=int(seed),
        groups_test=groups_test,
    )


def _image_features(base: str, image_features: str | None) -> str | None:
    """The feature map of an image set (None for other datasets); validates the argument."""
    if image_features is None:
        return DEFAULT_IMAGE_FEATURES.get(base)
    if base not in IMAGE_SETS:
        raise ValueError(
            f"image_features applies to the image sets {IMAGE_SETS}; {base!r} is not one."
        )
    if image_features not in IMAGE_FEATURES:
        raise ValueError(f"image_features must be one of {IMAGE_FEATURES}; got {image_features!r}.")
    return image_features


def polar_rows(X: np.ndarray, floor: float = 1.0 / 255.0) -> tuple[np.ndarray, np.ndarray]:
    """Each row as its direction and the log of its length: (n, d) -> ((n, d), (n,)).

    Directions are ``x / ||x||``; lengths below ``floor`` count as ``floor`` (a blank row keeps
    a zero direction and ``log(floor)``). For images the length is the amount of ink, which a
    density on the directions' principal axes alone would not see.

    Example:
        >>> unit, log_norm = polar_rows(np.array([[3.0, 4.0]]))
        >>> unit.tolist(), round(float(np.exp(log_norm[0])), 6)
        ([[0.6, 0.8]], 5.0)
    """
    norm = np.maximum(np.linalg.norm(X, axis=1), floor)
    return X / norm[:, None], np.log(norm)


def _subsample(index: np.ndarray, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    if limit is None or index.shape[0] <= limit:
        return index
    if limit < 1:
        raise ValueError(f"max_train and max_test must be >= 1 (or None); got {limit}.")
    return np.sort(rng.choice(index, size=limit, replace=False))


def _stratified_cap(
    index: np.ndarray, y: np.ndarray, limit: int | None, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``limit`` of ``index`` (labels ``y``), keeping each label's share (>= 1 each)."""
    if limit is None or index.shape[0] <= limit:
        return index, y
    keep = []
    for label in (0, 1):
        rows = np.flatnonzero(y == label)
        n = max(1, round(limit * rows.shape[0] / index.shape[0]))
        keep.append(rng.choice(rows, size=min(n, rows.shape[0]), replace=False))
    chosen = np.sort(np.concatenate(keep))
    return index[chosen], y[chosen]


def _tabular_split(y, protocol, ood, test_share, max_train, max_test, rng):
    """Row indices ``(train, test)`` into the dataset and the test labels (1 = novel)."""
    inliers = rng.permutation(np.flatnonzero(y == 0))
    anomalies = rng.permutation(np.flatnonzero(y == 1))
    if inliers.size < 2:
        raise ValueError("the dataset has fewer than 2 inliers; nothing to train on.")
    n_in = round(test_share * inliers.size)
    if protocol == "outlier":
        n_out = round(test_share * anomalies.size)
        train = np.concatenate([inliers[n_in:], anomalies[n_out:]])
        test = np.concatenate([inliers[:n_in], anomalies[:n_out]])
        y_test = np.concatenate([np.zeros(n_in, np.int64), np.ones(n_out, np.int64)])
    elif ood == "noise":  # halves of the held-out inliers: clean (0) and, later, noisy (1)
        held = inliers[:n_in]
        half = held.size // 2
        train, test = inliers[n_in:], held
        y_test = np.concatenate([np.zeros(half, np.int64), np.ones(held.size - half, np.int64)])
    else:
        train = inliers[n_in:]
        test = np.concatenate([inliers[:n_in], anomalies])
        y_test = np.concatenate([np.zeros(n_in, np.int64), np.ones(anomalies.size, np.int64)])
    if y_test.min(initial=1) == 1 or y_test.max(initial=0) == 0:
        raise ValueError(
            "the test set would hold only one class (too few rows or no anomalies); use a "
            "larger dataset or test_share."
        )
    train = _subsample(train, max_train, rng)
    test, y_test = _stratified_cap(test, y_test, max_test, rng)
    return train, test, y_test


def _mnist_split(ood, max_train, max_test, data_dir, rng):
    """Flattened pixels / 255: train rows, digit labels, test rows (half turned OOD)."""
    mnist = load_mnist(data_dir)
    train_idx = _subsample(np.arange(mnist["x_train"].shape[0]), max_train, rng)
    test_idx = rng.permutation(mnist["x_test"].shape[0])
    y_test = np.zeros(test_idx.size, np.int64)
    y_test[test_idx.size // 2 :] = 1
    test_idx, y_test = _stratified_cap(test_idx, y_test, max_test, rng)
    flat = _novel_images(mnist["x_test"][test_idx], y_test, ood)
    X_train = mnist["x_train"][train_idx].reshape(train_idx.size, -1).astype(np.float64) / 255.0
    return X_train, mnist["y_train"][train_idx], train_idx, flat, y_test, test_idx


def _novel_images(images: np.ndarray, y_test: np.ndarray, ood: str) -> np.ndarray:
    """Test images (n, h, w) uint8 with the rows where ``y_test == 1`` made novel by ``ood``
    (``"transforms"`` cycles through ``_MNIST_OOD_CYCLE``; ``"noise"`` is added later, after
    scaling), flattened and divided by 255: (n, h * w) float64."""
    images = images.copy()
    novel = np.flatnonzero(y_test == 1)
    if ood == "transforms":
        for j, name in enumerate(_MNIST_OOD_CYCLE):
            rows = novel[j :: len(_MNIST_OOD_CYCLE)]
            images[rows] = transform_images(images[rows], name)
    elif ood == PAPER_TRANSFORM:
        images[novel] = transform_writer_images(images[novel])
    elif ood != "noise":
        images[novel] = transform_images(images[novel], ood)
    return images.reshape(images.shape[0], -1).astype(np.float64) / 255.0


def _femnist_split(ood, n_writers, max_train, max_test, data_dir, rng):
    """FEMNIST's writers as the clients: their training rows (pixels / 255), each row's
    writer, and their test rows with half turned OOD, as MNIST's."""
    writers = make_femnist_federated(n_writers, random_state=rng, data_dir=data_dir)
    train_idx = _subsample(np.arange(writers.y_train.shape[0]), max_train, rng)
    test_idx = rng.permutation(writers.y_test.shape[0])
    y_test = np.zeros(test_idx.size, np.int64)
    y_test[test_idx.size // 2 :] = 1
    test_idx, y_test = _stratified_cap(test_idx, y_test, max_test, rng)
    flat = _novel_images(writers.images_test[test_idx], y_test, ood)
    X_train = writers.X_train[train_idx]
    groups_test = writers.groups_test[test_idx].astype(np.int64)
    return X_train, writers.groups_train[train_idx], train_idx, flat, y_test, test_idx, groups_test


def _min_size(n_train: int, n_clients: int, min_size: int | None) -> int:
    if min_size is not None:
        return min_size
    return min(10, n_train // (2 * n_clients))


def _partition(labels, n_clients, alpha, partition, min_size, rng) -> list[np.ndarray]:
    """Client index arrays into the training rows."""
    n_train = labels.shape[0]
    if partition == "iid":
        return iid_partition(n_train, n_clients, random_state=rng)
    if partition == "quantity":
        if alpha is None or float(alpha) != int(alpha) or int(alpha) < 1:
            raise ValueError(
                f"partition='quantity' reads alpha as the number of groups per client, an "
                f"integer >= 1; got alpha={alpha!r}."
            )
        quantity_partition = _datasets.quantity_partition  # looked up late: optional scheme
        return quantity_partition(labels, n_clients, int(alpha), random_state=rng)
    if alpha is None:
        raise ValueError("partition='dirichlet' needs alpha (e.g. 0.5).")
    return dirichlet_partition(
        labels,
        n_clients,
        float(alpha),
        random_state=rng,
        min_size=_min_size(n_train, n_clients, min_size),
    )


def _federated_pca(X_train, X_test, parts, n_components):
    """Project both sets on the top principal axes of the training clients' pooled rows.

    Two rounds of summed statistics, as ``FederatedPCA``: row sums -> pooled mean; scatter
    about that mean -> pooled covariance -> ``eigh``. Shapes: (n, 784) -> (n, n_components).
    """
    n_features = X_train.shape[1]
    if not 1 <= n_components <= n_features:
        raise ValueError(f"pca_components must be in [1, {n_features}]; got {n_components}.")
    mean = sum(X_train[p].sum(axis=0) for p in parts) / X_train.shape[0]
    scatter = sum((X_train[p] - mean).T @ (X_train[p] - mean) for p in parts)
    values, vectors = np.linalg.eigh(scatter / max(X_train.shape[0] - 1, 1))
    axes = vectors[:, np.argsort(values)[::-1][:n_components]].T  # (n_components, n_features)
    signs = np.sign(axes[np.arange(axes.shape[0]), np.abs(axes).argmax(axis=1)])
    axes *= signs[:, None]
    return (X_train - mean) @ axes.T, (X_test - mean) @ axes.T
