"""FEMNIST with its writers as clients: the FedGMM paper's real federated data.

``femnist/femnist.npz`` (see :func:`~fednovelty.datasets.loaders.load_femnist`) holds LEAF's
handwritten digits and letters grouped by writer; every writer is a natural client, so no
artificial partition is drawn. :func:`make_femnist_federated` picks writers and splits each
writer's images into train / validation / test (the FedGMM paper's 60 / 20 / 20);
:func:`split_writers` holds writers out as unseen clients (the paper's Table 5);
:func:`shift_writers` applies the paper's "Real datasets" protocol (Sec. 4.1), which makes
clients differ in both ``p(x)`` and ``p(y | x)``.

Images come in MNIST's convention (ink bright on a dark background: ``255 - raw``), the
convention of :mod:`~fednovelty.datasets.mnist` and :mod:`~fednovelty.datasets.shifts`, so
the same transforms and novelty protocols apply to both.

Randomness: one ``numpy.random.Generator`` from ``random_state`` (None, int or Generator;
never the global state); the same int gives the same split on any machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from fednovelty.datasets.loaders import FEMNIST_CLASSES, load_femnist
from fednovelty.datasets.partition._common import _rng
from fednovelty.datasets.shifts import hflip, invert, rotate90

__all__ = [
    "FederatedWriters",
    "make_femnist_federated",
    "shift_writers",
    "split_writers",
    "transform_writer_images",
]

_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class FederatedWriters:
    """Writers as clients, each writer's images split three ways; rows grouped by client
    (client 0 first) within every split.

    Attributes:
        X_train: shape (n_train, 784), float64 pixels in [0, 1], ink bright;
            ``images_train[i].ravel() / 255``.
        images_train: shape (n_train, 28, 28), uint8, MNIST's convention (``255 - raw``).
        y_train: shape (n_train,), int64 classes 0..61 (0-9 digits, 10-35 upper-case, 36-61
            lower-case letters).
        groups_train: shape (n_train,), int64 client index in ``range(n_writers)``;
            non-decreasing. Pass as ``fit(X, y, groups=...)``.
        X_val, images_val, y_val, groups_val: the same for the validation rows.
        X_test, images_test, y_test, groups_test: the same for the test rows.
        writer_ids: shape (n_writers,), LEAF's id of each client index's writer.
        classes: shape (n_classes,), int64 class values the rows may hold (all 62, or the
            digits 0-9).
        shifted: ``{"train": bool (n_train,), "val": ..., "test": ...}``, the rows
            :func:`shift_writers` transformed and relabelled (all False otherwise).
    """

    X_train: np.ndarray
    images_train: np.ndarray
    y_train: np.ndarray
    groups_train: np.ndarray
    X_val: np.ndarray
    images_val: np.ndarray
    y_val: np.ndarray
    groups_val: np.ndarray
    X_test: np.ndarray
    images_test: np.ndarray
    y_test: np.ndarray
    groups_test: np.ndarray
    writer_ids: np.ndarray
    classes: np.ndarray
    shifted: dict

    @property
    def n_writers(self) -> int:
        return int(self.writer_ids.shape[0])


def _split_sizes(n: int, train: float, val: float) -> tuple[int, int, int]:
    """Rows of one writer's train / val / test parts: ``round(train n)`` and ``round(val n)``,
    the rest test, each moved to at least one row (taken from the largest part)."""
    sizes = [round(train * n), round(val * n)]
    sizes.append(n - sum(sizes))
    for i in range(3):
        while sizes[i] < 1:
            sizes[int(np.argmax(sizes))] -= 1
            sizes[i] += 1
    return sizes[0], sizes[1], sizes[2]


def _check_fraction(value, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1); got {value!r}.")
    return float(value)


def _assemble(images: dict, labels: dict, groups: dict, writer_ids, classes, shifted=None):
    """A :class:`FederatedWriters` from per-split arrays (images in MNIST's convention)."""
    fields = {}
    for split in _SPLITS:
        img = images[split]
        fields[f"X_{split}"] = img.reshape(img.shape[0], -1).astype(np.float64) / 255.0
        fields[f"images_{split}"] = img
        fields[f"y_{split}"] = labels[split]
        fields[f"groups_{split}"] = groups[split]
    if shifted is None:
        shifted = {split: np.zeros(labels[split].shape[0], dtype=bool) for split in _SPLITS}
    return FederatedWriters(
        **fields, writer_ids=np.asarray(writer_ids), classes=classes, shifted=shifted
    )


def make_femnist_federated(
    n_writers: int | None = None,
    *,
    digits_only: bool = False,
    train: float = 0.6,
    val: float = 0.2,
    min_rows: int = 10,
    random_state=0,
    data_dir: str | os.PathLike[str] | None = None,
) -> FederatedWriters:
    """FEMNIST writers as clients, each writer's images split train / validation / test.

    Writers: a seeded permutation of the file's writers, those with at least ``min_rows``
    images (after ``digits_only``) kept, the first ``n_writers`` of them taken (None: all);
    client ``c`` is the ``c``-th. Inside each writer a seeded permutation of its images is cut
    into ``round(train n)`` training, ``round(val n)`` validation and the remaining test
    images, every part at least one image.

    Args:
        n_writers: number of writers (clients); None for every eligible writer.
        digits_only: keep only the digit images (classes 0-9) of each writer.
        train, val: shares of each writer's images for training and validation; the rest is
            test. Both in (0, 1) with ``train + val < 1``.
        min_rows: fewest images a writer needs to be taken (>= 3).
        random_state: None, int or ``numpy.random.Generator``.
        data_dir: data folder; see :func:`~fednovelty.datasets.loaders.data_dir`.

    Returns:
        A :class:`FederatedWriters`.

    Raises:
        ValueError: bad shares, ``min_rows`` < 3, or more writers asked for than are eligible.
    """
    train, val = _check_fraction(train, "train"), _check_fraction(val, "val")
    if train + val >= 1:
        raise ValueError(f"train + val must be below 1 (the rest is test); got {train + val}.")
    if not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 3:
        raise ValueError(f"min_rows must be an int >= 3 (one image per split); got {min_rows!r}.")
    rng = _rng(random_state)
    raw = load_femnist(data_dir)
    keep = raw["y"] < 10 if digits_only else np.ones(raw["y"].shape[0], dtype=bool)
    rows_of = np.flatnonzero(keep)
    writer = raw["writer"][rows_of]
    order = np.argsort(writer, kind="stable")
    bounds = np.searchsorted(writer[order], np.arange(raw["writer_ids"].shape[0] + 1))
    members = [rows_of[order[bounds[w] : bounds[w + 1]]] for w in range(bounds.size - 1)]
    eligible = [w for w in rng.permutation(len(members)) if members[w].size >= min_rows]
    if n_writers is not None:
        if not isinstance(n_writers, int) or isinstance(n_writers, bool) or n_writers < 1:
            raise ValueError(f"n_writers must be a positive int or None; got {n_writers!r}.")
        if n_writers > len(eligible):
            raise ValueError(
                f"n_writers={n_writers} but only {len(eligible)} writers have at least "
                f"min_rows={min_rows} images{' of digits' if digits_only else ''}; ask for "
                "fewer writers or lower min_rows."
            )
        eligible = eligible[:n_writers]
    parts: dict[str, list] = {split: [] for split in _SPLITS}
    groups: dict[str, list] = {split: [] for split in _SPLITS}
    for client, w in enumerate(eligible):
        rows = members[w][rng.permutation(members[w].size)]
        n_train, n_val, _ = _split_sizes(rows.size, train, val)
        for split, chunk in zip(_SPLITS, np.split(rows, [n_train, n_train + n_val]), strict=True):
            parts[split].append(chunk)
            groups[split].append(np.full(chunk.size, client, dtype=np.int64))
    index = {split: np.concatenate(parts[split]) for split in _SPLITS}
    return _assemble(
        {split: 255 - raw["X"][index[split]] for split in _SPLITS},
        {split: raw["y"][index[split]] for split in _SPLITS},
        {split: np.concatenate(groups[split]) for split in _SPLITS},
        raw["writer_ids"][np.asarray(eligible, dtype=np.int64)],
        np.arange(10 if digits_only else FEMNIST_CLASSES, dtype=np.int64),
    )


def _select_writers(data: FederatedWriters, writers: np.ndarray) -> FederatedWriters:
    """The rows of ``writers`` (client indices, in that order), renumbered 0..len-1."""
    renumber = np.full(data.n_writers, -1, dtype=np.int64)
    renumber[writers] = np.arange(writers.size)
    images, labels, groups, shifted = {}, {}, {}, {}
    for split in _SPLITS:
        new = renumber[getattr(data, f"groups_{split}")]
        order = np.argsort(np.where(new < 0, writers.size, new), kind="stable")
        order = order[new[order] >= 0]
        images[split] = getattr(data, f"images_{split}")[order]
        labels[split] = getattr(data, f"y_{split}")[order]
        groups[split] = new[order]
        shifted[split] = data.shifted[split][order]
    return _assemble(images, labels, groups, data.writer_ids[writers], data.classes, shifted)


def split_writers(
    data: FederatedWriters, unseen: float = 0.2, random_state=0
) -> tuple[FederatedWriters, FederatedWriters]:
    """Writers held out as clients unseen in training (the FedGMM paper's Table 5 trains on
    80 % of the clients).

    A seeded ``round(unseen * n_writers)`` writers (at least one, and one left to train)
    form the second result; both results keep their writers in the original order,
    renumbered from 0, with all three splits of each writer.

    Returns:
        ``(seen, unseen)``.
    """
    share = _check_fraction(unseen, "unseen")
    if data.n_writers < 2:
        raise ValueError("split_writers needs at least 2 writers.")
    n_unseen = min(max(1, round(share * data.n_writers)), data.n_writers - 1)
    held = np.zeros(data.n_writers, dtype=bool)
    held[_rng(random_state).permutation(data.n_writers)[:n_unseen]] = True
    return (
        _select_writers(data, np.flatnonzero(~held)),
        _select_writers(data, np.flatnonzero(held)),
    )


def transform_writer_images(images: np.ndarray) -> np.ndarray:
    """The FedGMM paper's image transform ``T`` for its real-data rows: inversion, then a
    horizontal flip, then a 90-degree counter-clockwise rotation; (n, h, w) -> (n, w, h)."""
    return rotate90(hflip(invert(images)))


def shift_writers(
    data: FederatedWriters, share: float | str = "beta", random_state=0
) -> FederatedWriters:
    """The FedGMM paper's "Real datasets" protocol (Sec. 4.1): some images are transformed by
    ``T`` (:func:`transform_writer_images`) and their labels mapped by one random
    permutation ``P_A`` of the classes, so the clients differ in ``p(x)`` and ``p(y | x)``.

    Which images: each writer ``c`` draws its share ``s_c`` (``share="beta"``:
    ``s_c ~ Beta(2, 2)``, mean one half, as the paper's reference code does; a number: the
    same share for every writer), then each of its images, in every split, is shifted with
    probability ``s_c``, independently. The paper shifts the data before splitting it, so
    train, validation and test rows of a writer share its ``s_c``. ``P_A`` is one permutation
    of ``classes`` for all writers.

    Returns:
        A new :class:`FederatedWriters`; ``shifted`` marks the rows moved.
    """
    if share != "beta" and (
        not isinstance(share, int | float) or isinstance(share, bool) or not 0 <= share <= 1
    ):
        raise ValueError(f"share must be 'beta' or a number in [0, 1]; got {share!r}.")
    rng = _rng(random_state)
    mapping = np.arange(int(data.classes.max()) + 1)
    mapping[data.classes] = data.classes[rng.permutation(data.classes.size)]
    shares = (
        rng.beta(2.0, 2.0, size=data.n_writers)
        if share == "beta"
        else np.full(data.n_writers, share)
    )
    images, labels, groups, moved = {}, {}, {}, {}
    for split in _SPLITS:
        group = getattr(data, f"groups_{split}")
        picked = rng.random(group.size) < shares[group]
        img = getattr(data, f"images_{split}").copy()
        img[picked] = transform_writer_images(img[picked])
        y = getattr(data, f"y_{split}").copy()
        y[picked] = mapping[y[picked]]
        images[split], labels[split], groups[split] = img, y, group
        moved[split] = data.shifted[split] | picked
    return _assemble(images, labels, groups, data.writer_ids, data.classes, moved)
