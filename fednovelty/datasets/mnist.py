"""Federated MNIST with Dirichlet label skew, and held-out digits for novelty experiments.

The FedGMM paper's MNIST setting (following Marfoq et al., 2021) gives 50 clients 500 training
images each, with label skew from a Dirichlet(0.4) distribution; those are the defaults here.
Construction, per client ``c`` in order ``0, 1, ...``:

1. class proportions ``p_c ~ Dir(alpha * 1)`` over the allowed digits (all ten digits minus
   ``exclude_digits``);
2. exact class counts ``n_c ~ Multinomial(samples_per_client, p_c)``;
3. that many images of each class are taken from the MNIST *training* split, without
   replacement across all clients (each class's images are shuffled once and handed out in
   turn, so no image is used twice);
4. likewise ``test_per_client`` images (default ``samples_per_client // 5``) with the same
   ``p_c`` from the MNIST *test* split, again without replacement.

Pool exhaustion: when a class has fewer images left than a client's count asks for, the
client takes what is left and the shortfall is redrawn from ``p_c`` restricted to the classes
that still have images (or, if those have zero proportion, in proportion to the images left),
repeating until the client has exactly its quota. Every client therefore gets the same number of
rows; only clients late in the order can see a mixture that departs from their ``p_c``, and only
when a class runs out (rare at the defaults: 25 000 of 60 000 training images are used).

This is the per-client form of Dirichlet label skew: every client has the same size and its
own mixture. The per-class form (each class's rows cut among clients by ``Dir(alpha)`` shares,
so client sizes vary) is :func:`~fednovelty.datasets.partition.dirichlet_partition`.

Novelty: digits in ``exclude_digits`` appear in no client's train or test rows; all their MNIST
*test* images are returned in ``excluded`` as the novel class. Image-level shifts (rotation,
scaling, ...) are in :mod:`~fednovelty.datasets.shifts`.

Randomness: one ``numpy.random.Generator`` from ``random_state`` (None, int or Generator;
never the global state); the same int gives the same split on any machine.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fednovelty.datasets.loaders import load_mnist
from fednovelty.datasets.partition._common import _check_alpha, _check_int, _rng

__all__ = ["FederatedImages", "make_mnist_federated"]

N_DIGITS = 10


@dataclass(frozen=True)
class FederatedImages:
    """A federated image dataset as flat arrays, rows grouped by client (client 0 first).

    Attributes:
        X_train: shape (n_train, height * width), float64 pixels scaled to [0, 1]; row ``i``
            is ``images_train[i].ravel() / 255``.
        images_train: shape (n_train, height, width), uint8 raw pixels.
        y_train: shape (n_train,), int64 digit labels (original digit values, so with
            exclusions they need not be ``0..n_classes-1``).
        groups_train: shape (n_train,), int64 client id per row in ``range(n_clients)``;
            non-decreasing. Pass as ``fit(X, y, groups=...)``.
        indices_train: shape (n_train,), int64 row of each image in the MNIST training split;
            all distinct.
        X_test, images_test, y_test, groups_test: the same for each client's test rows.
        indices_test: shape (n_test,), int64 rows in the MNIST test split; all distinct.
        excluded: the novel digits, all drawn from the MNIST test split and disjoint from
            ``indices_test``: ``{"images": uint8 (n_excluded, height, width), "y": int64
            (n_excluded,), "indices": int64 (n_excluded,)}``, in MNIST order; empty arrays
            when no digit is excluded.
        classes: shape (n_classes,), int64 allowed digits in increasing order.
        proportions: shape (n_clients, n_classes), float64 drawn class proportions ``p_c``;
            column ``k`` belongs to digit ``classes[k]``.
    """

    X_train: np.ndarray
    images_train: np.ndarray
    y_train: np.ndarray
    groups_train: np.ndarray
    indices_train: np.ndarray
    X_test: np.ndarray
    images_test: np.ndarray
    y_test: np.ndarray
    groups_test: np.ndarray
    indices_test: np.ndarray
    excluded: dict[str, np.ndarray]
    classes: np.ndarray
    proportions: np.ndarray


def _check_digits(exclude_digits) -> list[int]:
    values = [exclude_digits] if isinstance(exclude_digits, numbers.Integral) else exclude_digits
    if not isinstance(values, Iterable) or isinstance(values, str):
        raise ValueError(
            f"exclude_digits must be a sequence of digits in 0..9; got {exclude_digits!r}."
        )
    values = list(values)
    bad = [
        d
        for d in values
        if not isinstance(d, numbers.Integral) or isinstance(d, bool) or not 0 <= d < N_DIGITS
    ]
    if bad:
        raise ValueError(f"exclude_digits must hold digits in 0..9; got {bad!r}.")
    excluded = sorted({int(d) for d in values})
    if len(excluded) == N_DIGITS:
        raise ValueError("exclude_digits excludes all ten digits; keep at least one for clients.")
    return excluded


def _take_counts(
    want: np.ndarray, left: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Per-class counts to take: ``want`` where the pool allows, the shortfall redrawn.

    ``want``, ``left`` and ``p`` have shape (n_classes,); ``left.sum() >= want.sum()`` is
    guaranteed by the caller. Each loop either finishes or fills at least one more class, so it
    runs at most ``n_classes`` times.
    """
    take = np.minimum(want, left)
    short = int(want.sum() - take.sum())
    while short > 0:
        room = left - take
        weights = np.where(room > 0, p, 0.0)
        if weights.sum() <= 0:  # the client's classes are all used up: follow what is left
            weights = room.astype(np.float64)
        extra = np.minimum(rng.multinomial(short, weights / weights.sum()), room)
        take += extra
        short -= int(extra.sum())
    return take


def _draw_clients(
    pools: list[np.ndarray],
    proportions: np.ndarray,
    per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Hand out rows of the shuffled per-class ``pools`` to each client; no row twice."""
    n_classes = len(pools)
    next_row = np.zeros(n_classes, dtype=np.int64)
    left = np.array([pool.shape[0] for pool in pools], dtype=np.int64)
    out = []
    for p in proportions:
        want = rng.multinomial(per_client, p / p.sum())
        take = _take_counts(want, left, p, rng)
        rows = np.concatenate(
            [pools[k][next_row[k] : next_row[k] + take[k]] for k in range(n_classes)]
        )
        next_row += take
        left -= take
        out.append(rng.permutation(rows).astype(np.int64))
    return out


def make_mnist_federated(
    n_clients: int = 50,
    samples_per_client: int = 500,
    alpha: float = 0.4,
    *,
    exclude_digits: Iterable[int] | int = (),
    test_per_client: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    random_state: int | np.random.Generator | None = None,
) -> FederatedImages:
    """Split MNIST among clients with Dirichlet label skew (see the module doc).

    Args:
        n_clients: number of clients, >= 1 (the paper: 50).
        samples_per_client: training images per client, >= 1 (the paper: 500).
            ``n_clients * samples_per_client`` must not exceed the MNIST training images of
            the allowed digits (60 000 with none excluded).
        alpha: Dirichlet concentration of each client's class proportions, > 0; 0.4 is the
            paper's skew, 1000 is close to IID.
        exclude_digits: digits (0..9) kept out of every client, e.g. ``(8, 9)``; their MNIST
            test images are returned in ``excluded``. A single int is one digit.
        test_per_client: test images per client, >= 0; default ``samples_per_client // 5``.
            ``n_clients * test_per_client`` must not exceed the MNIST test images of the
            allowed digits (10 000 with none excluded).
        data_dir: data folder holding ``mnist/mnist.npz``; see
            :func:`~fednovelty.datasets.loaders.data_dir` for the default.
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        A :class:`FederatedImages` with ``n_clients * samples_per_client`` training rows and
        ``n_clients * test_per_client`` test rows; each client's rows are contiguous and in
        random order.

    Raises:
        ValueError: a bad argument (named in the message), or more images asked for than the
            allowed digits have.
        FileNotFoundError: no ``mnist/mnist.npz`` in the data folder.

    Example:
        >>> data = make_mnist_federated(5, 100, exclude_digits=(9,), random_state=0)
        >>> data.X_train.shape, data.images_test.shape, sorted(set(data.excluded["y"].tolist()))
        ((500, 784), (100, 28, 28), [9])
    """
    n_clients = _check_int(n_clients, "n_clients", 1)
    samples_per_client = _check_int(samples_per_client, "samples_per_client", 1)
    alpha = _check_alpha(alpha)
    excluded_digits = _check_digits(exclude_digits)
    if test_per_client is None:
        test_per_client = samples_per_client // 5
    test_per_client = _check_int(test_per_client, "test_per_client", 0)
    rng = _rng(random_state)

    mnist = load_mnist(data_dir)
    classes = np.array([d for d in range(N_DIGITS) if d not in excluded_digits], dtype=np.int64)
    for split, per_client, name in (
        ("train", samples_per_client, "samples_per_client"),
        ("test", test_per_client, "test_per_client"),
    ):
        available = int(np.isin(mnist[f"y_{split}"], classes).sum())
        if n_clients * per_client > available:
            raise ValueError(
                f"n_clients={n_clients} x {name}={per_client} = {n_clients * per_client} "
                f"images, but the MNIST {split} split has only {available} of the allowed "
                f"digits {classes.tolist()}; use fewer clients or fewer images per client."
            )

    pools = {
        split: [rng.permutation(np.flatnonzero(mnist[f"y_{split}"] == d)) for d in classes]
        for split in ("train", "test")
    }
    proportions = rng.dirichlet(np.full(classes.shape[0], alpha), size=n_clients)
    train_rows = _draw_clients(pools["train"], proportions, samples_per_client, rng)
    test_rows = _draw_clients(pools["test"], proportions, test_per_client, rng)

    def _assemble(split: str, rows: list[np.ndarray]):
        index = np.concatenate(rows).astype(np.int64)
        images = mnist[f"x_{split}"][index]
        n_pixels = images.shape[1] * images.shape[2]
        X = images.reshape(index.shape[0], n_pixels).astype(np.float64) / 255.0
        y = mnist[f"y_{split}"][index]
        groups = np.repeat(np.arange(n_clients, dtype=np.int64), [r.shape[0] for r in rows])
        return X, images, y, groups, index

    X_train, images_train, y_train, groups_train, indices_train = _assemble("train", train_rows)
    X_test, images_test, y_test, groups_test, indices_test = _assemble("test", test_rows)
    novel = np.flatnonzero(np.isin(mnist["y_test"], excluded_digits)).astype(np.int64)
    excluded = {
        "images": mnist["x_test"][novel],
        "y": mnist["y_test"][novel],
        "indices": novel,
    }
    return FederatedImages(
        X_train=X_train,
        images_train=images_train,
        y_train=y_train,
        groups_train=groups_train,
        indices_train=indices_train,
        X_test=X_test,
        images_test=images_test,
        y_test=y_test,
        groups_test=groups_test,
        indices_test=indices_test,
        excluded=excluded,
        classes=classes,
        proportions=proportions,
    )
