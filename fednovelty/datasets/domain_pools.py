"""The rows a two-domain novelty stream draws from, and where they come from.

A :class:`DomainPools` holds two domains' (A and B) training and test inliers and a pool of
novel rows that belong to neither, raw (before features);
:func:`~fednovelty.datasets.streams.domain_stream` draws a stream's windows from it. Three
sources make one:

- :func:`adbench_pools`: two ADBench sets of one width, e.g. the ResNet-18 embeddings
  ``CIFAR10_0`` (A) and ``SVHN_0`` (B); each set's inliers are split into training and test
  pools (``test_share``, seeded) and the novel pool is both sets' own anomalies.
- :func:`femnist_pools`: FEMNIST writers (clients), digits = A, letters = B (the pFedEM
  paper's two populations); the training pools are the writers' training images (each row
  keeps its writer); the writers' test images are halved into test inliers and novel images
  made by an OOD transform (``ood``: the cycle scale / rotate / hflip of ``make_task``'s
  ``"transforms"``, one of them, ``"invert"`` or the FedGMM paper's ``"inv-flip-rot"``).
- :func:`stream_pools`: by name: ``"cifar10-svhn"``, ``"femnist"`` (``"femnist:rotate"``
  picks the OOD transform) or ``"A+B"`` for two ADBench names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "STREAM_DATASETS",
    "DomainPools",
    "adbench_pools",
    "femnist_pools",
    "parse_stream_dataset",
    "stream_pools",
]

#: Named two-domain novelty streams (:func:`stream_pools`); ``"A+B"`` pairs two ADBench names.
STREAM_DATASETS = ("cifar10-svhn", "femnist")
#: ``cifar10-svhn``'s two ADBench sets (ResNet-18 embeddings, 512 features each).
CIFAR10_SVHN = ("CIFAR10_0", "SVHN_0")
#: OOD transforms of FEMNIST's novel rows (``make_task``'s image OOD sets).
FEMNIST_OODS = ("transforms", "scale", "rotate", "hflip", "invert", "inv-flip-rot")


@dataclass(frozen=True)
class DomainPools:
    """Raw rows of two domains, A and B, and novel rows: what
    :func:`~fednovelty.datasets.streams.domain_stream` draws from (module docstring). All
    arrays have the same width ``n_features``.

    Attributes:
        name: the stream's name in results (``"cifar10-svhn"``, ``"femnist"``, ...).
        train_a, train_b: (n, n_features) training inliers of A and of B.
        test_a, test_b: (m, n_features) held-out inliers of A and of B (never trained on).
        novel: (k, n_features) rows of neither domain (positive class when scored).
        clients_a, clients_b: (n,) int client of each training row (FEMNIST: its writer,
            ``0..n_writers - 1``); None: any client draws from the whole pool.
        features: the default feature map (``STREAM_FEATURES`` of
            :mod:`fednovelty.datasets.streams`).
        n_axes: the default principal axes of that map (None: the map's own default).
    """

    name: str
    train_a: np.ndarray
    train_b: np.ndarray
    test_a: np.ndarray
    test_b: np.ndarray
    novel: np.ndarray
    clients_a: np.ndarray | None = None
    clients_b: np.ndarray | None = None
    features: str = "none"
    n_axes: int | None = None

    @property
    def n_features(self) -> int:
        return int(self.train_a.shape[1])

    @property
    def n_writers(self) -> int | None:
        """Clients that own rows (writer pools), or None (any client draws from the pool)."""
        if self.clients_a is None:
            return None
        ids = np.r_[self.clients_a, self.clients_b]
        return int(ids.max()) + 1 if ids.size else 0


def positive_int(value, name: str) -> int:
    """``value`` as an int, or a ``ValueError`` naming ``name`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
    return int(value)


def adbench_pools(
    name_a: str,
    name_b: str,
    *,
    test_share: float = 0.3,
    random_state=0,
    data_dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
) -> DomainPools:
    """Two ADBench sets of one width as domains A and B (module docstring): each set's
    inliers split into training and test pools (``test_share`` held out, seeded), both
    sets' anomalies as the novel pool; default features ``"pca"`` (16 axes).

    Raises:
        ValueError: an unknown name (with close matches), sets of different widths, a bad
            ``test_share``. FileNotFoundError: no data folder.
    """
    from fednovelty.datasets.loaders import load_adbench

    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must be in (0, 1); got {test_share!r}.")
    rng = np.random.default_rng(random_state)
    loaded = [load_adbench(n, data_dir) for n in (name_a, name_b)]
    widths = [X.shape[1] for X, _ in loaded]
    if widths[0] != widths[1]:
        raise ValueError(
            f"{name_a} has {widths[0]} features and {name_b} {widths[1]}: a stream's two "
            f"domains need one width (e.g. CIFAR10_0+SVHN_0, or two MVTec-AD categories)."
        )
    train, test, novel = [], [], []
    for X, y in loaded:
        inliers = rng.permutation(np.flatnonzero(y == 0))
        cut = int((1.0 - test_share) * inliers.size)
        if cut < 1 or cut == inliers.size or not (y == 1).any():
            raise ValueError("each set needs inliers to train and test on, and anomalies.")
        train.append(X[inliers[:cut]])
        test.append(X[inliers[cut:]])
        novel.append(X[y == 1])
    return DomainPools(
        name=name or f"{name_a}+{name_b}",
        train_a=train[0],
        train_b=train[1],
        test_a=test[0],
        test_b=test[1],
        novel=np.concatenate(novel),
        features="pca",
    )


def femnist_pools(
    n_writers: int = 40,
    *,
    ood: str = "transforms",
    random_state=0,
    data_dir: str | os.PathLike[str] | None = None,
) -> DomainPools:
    """FEMNIST writers as clients, digits = A and letters = B (module docstring): each
    writer's training images (pixels / 255) in its own pools; the writers' test images
    halved (seeded) into test inliers and novel images transformed by ``ood``; default
    features ``"polar"`` (24 axes and the log norm, as ``make_task("femnist")``).

    Raises:
        ValueError: an unknown ``ood``, or more writers than the file holds.
    """
    from fednovelty.datasets.femnist import make_femnist_federated
    from fednovelty.datasets.protocols import _novel_images

    if ood not in FEMNIST_OODS:
        raise ValueError(f"ood must be one of {FEMNIST_OODS}; got {ood!r}.")
    n_writers = positive_int(n_writers, "n_writers")
    rng = np.random.default_rng(random_state)
    writers = make_femnist_federated(n_writers, random_state=rng, data_dir=data_dir)
    digits = writers.y_train < 10
    order = rng.permutation(writers.y_test.shape[0])
    is_novel = np.zeros(order.size, dtype=np.int64)
    is_novel[order.size // 2 :] = 1
    test = _novel_images(writers.images_test[order], is_novel, ood)
    test_digits = writers.y_test[order] < 10
    inlier = is_novel == 0
    return DomainPools(
        name="femnist" if ood == "transforms" else f"femnist:{ood}",
        train_a=writers.X_train[digits],
        train_b=writers.X_train[~digits],
        test_a=test[inlier & test_digits],
        test_b=test[inlier & ~test_digits],
        novel=test[~inlier],
        clients_a=writers.groups_train[digits].astype(np.int64),
        clients_b=writers.groups_train[~digits].astype(np.int64),
        features="polar",
    )


def parse_stream_dataset(name: str) -> tuple[str, tuple[str, ...]]:
    """``(source, parts)`` of a stream name: ``("adbench", (A, B))`` for ``"cifar10-svhn"``
    and ``"A+B"``; ``("femnist", (ood,))`` for ``"femnist"`` and ``"femnist:<ood>"``.

    Raises:
        ValueError: a name of neither form (existence is checked when loading).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a stream dataset is a non-empty name; got {name!r}.")
    base, _, ood = name.partition(":")
    if base == "femnist":
        return "femnist", (ood or "transforms",)
    if ood:
        raise ValueError(f"{name!r}: only femnist takes an OOD suffix (femnist:rotate).")
    if base == "cifar10-svhn":
        return "adbench", CIFAR10_SVHN
    parts = tuple(base.split("+"))
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"{name!r} is not a stream dataset: use {', '.join(STREAM_DATASETS)} or two "
            "ADBench names of one width joined by '+' (CIFAR10_0+SVHN_0)."
        )
    return "adbench", parts


def stream_pools(
    dataset: str,
    *,
    n_writers: int = 40,
    random_state=0,
    data_dir: str | os.PathLike[str] | None = None,
) -> DomainPools:
    """The pools of a named stream (:func:`parse_stream_dataset`): ``"cifar10-svhn"``,
    ``"A+B"`` (:func:`adbench_pools`) or ``"femnist[:ood]"`` (:func:`femnist_pools` with
    ``n_writers`` writers)."""
    source, parts = parse_stream_dataset(dataset)
    if source == "femnist":
        return femnist_pools(n_writers, ood=parts[0], random_state=random_state, data_dir=data_dir)
    return adbench_pools(*parts, random_state=random_state, data_dir=data_dir, name=dataset)
