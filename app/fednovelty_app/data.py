"""Data sources of the dashboard, each turned into one :class:`DataBundle`.

A bundle holds what every page needs: the training rows with the client of each row, a test
set with the novel rows marked (1 = novel, the positive class), class labels when there are
any (for FedGMM's joint model), clients held out of training (the Unseen client page) and
the grouping the partition was drawn over (the Clients page's dot plot).

Sources:

- :func:`synthetic_bundle`: the FedGMM paper's synthetic clients
  (``fednovelty.datasets.make_fedgmm_synthetic``) with one extra component that no client
  trains on: its rows are the novel inputs. Labelled, so FedGMM fits its joint model.
- :func:`adbench_bundle`: a benchmark task (``fednovelty.datasets.protocols.make_task``),
  named by :func:`adbench_names`:

  - ``BUNDLED_DIGITS``: scikit-learn's bundled 8x8 handwritten digits (shipped with
    scikit-learn, so always there): digit 0 is novel, clients by Dirichlet over the other
    digits. The default source when the data folder is missing (:func:`default_source`).
  - an ADBench dataset from ``../shared/data``: novelty or outlier protocol, Dirichlet,
    quantity or IID clients over k-means clusters, min-max scaled.
  - ``FEMNIST`` ("FEMNIST writers"): LEAF's handwriting, each writer a client; the held-out
    clients are whole writers the federation never saw; half of the writers' test images are
    made novel by rotation, mirroring or scaling; pixels on 24 federated principal axes.

  No class labels (the tasks carry novelty labels only).
- :func:`upload_bundle`: a table the user uploads, checked by ``fednovelty_app.uploads``
  (a client column, an optional class-label column and an optional novelty column).

Choices, and why:

- Held-out ("unseen") clients never contribute a training row. Half of an unseen client's
  normal rows may be used for adaptation, the other half is evaluated together with the
  test set's novel rows, so adaptation is judged on rows it never saw.
- Uploaded features are not rescaled: the model then scores new rows in the units the user
  has. ADBench tasks are min-max scaled by ``make_task`` (the benchmark protocol).

The upload checks (``UploadError``, ``read_table``, ``check_table``, ``check_score_table``,
``digest``) live in ``fednovelty_app.uploads`` and are importable from here too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from fednovelty_app.holdout import OneTrainingClientWarning, one_client_message, split_clients
from fednovelty_app.uploads import (
    MIN_ROWS_PER_CLIENT,
    TEST_SHARE,
    UploadError,
    check_score_table,
    check_table,
    digest,
    read_table,
)

__all__ = [
    "BUNDLED_DIGITS",
    "FEMNIST",
    "FEMNIST_WRITERS",
    "MIN_ROWS_PER_CLIENT",
    "SYNTHETIC",
    "TEST_SHARE",
    "DataBundle",
    "UnseenClient",
    "UploadError",
    "adbench_bundle",
    "adbench_names",
    "check_score_table",
    "check_table",
    "default_source",
    "digest",
    "read_table",
    "source_label",
    "synthetic_bundle",
    "tested_words",
    "upload_bundle",
]

SYNTHETIC = "FedGMM synthetic (labelled)"
#: Task names of scikit-learn's bundled digits and of FEMNIST (``make_task``'s names).
BUNDLED_DIGITS = "digits"
FEMNIST = "femnist"
#: FEMNIST writers trained on by default (plus the held-out ones): trains in seconds.
FEMNIST_WRITERS = 20
_LABELS = {
    BUNDLED_DIGITS: "scikit-learn digits (bundled, real)",
    FEMNIST: "FEMNIST writers",
}
#: Fewest novel test rows of the synthetic data (else the clients' novel training rows join).
MIN_NOVEL_ROWS = 10


@dataclass(frozen=True, eq=False)
class UnseenClient:
    """A client held out of training, for the Unseen client page.

    Attributes:
        client_id: its id, as in the source's client column.
        X_adapt: (n_adapt, n_features) normal rows that adaptation may use.
        y_adapt: (n_adapt,) their class labels, or None (unlabelled source).
        X_eval: (n_eval, n_features) its other normal rows followed by novel rows.
        y_eval: (n_eval,) class labels of ``X_eval``, or None.
        novel_eval: (n_eval,) int64, 1 = novel.
    """

    client_id: object
    X_adapt: np.ndarray
    y_adapt: np.ndarray | None
    X_eval: np.ndarray
    y_eval: np.ndarray | None
    novel_eval: np.ndarray


@dataclass(frozen=True, eq=False)
class DataBundle:
    """Training clients, a test set with novel rows marked, unseen clients and the partition.

    Attributes:
        name: shown in the app, e.g. ``"4_breastw (novelty)"``.
        feature_names: (n_features,) column names the detectors are fitted with.
        X_train: (n_train, n_features) float64; groups_train: (n_train,) client id per row.
        y_train: (n_train,) class labels, or None when the source has none.
        X_test: (n_test, n_features) float64.
        novel_test: (n_test,) int64, 1 = novel (positive), or None when unknown (an upload
            without a novelty column).
        y_test: (n_test,) class labels, or None.
        groups_test: (n_test,) client of each test row, or None (a pooled test set).
        unseen: clients held out of training.
        partition_clients: (n_rows,) client id of the rows the dot plot counts (training
            clients and unseen clients); partition_labels: (n_rows,) the group of each.
        partition_label_name: what the groups are ("component", "k-means cluster", "class").
        description: one line on where the data came from.
        one_client: ``holdout.one_client_message`` when fewer than two clients train (the
            Train page shows it with ``st.warning``), else None.
    """

    name: str
    feature_names: tuple[str, ...]
    X_train: np.ndarray
    groups_train: np.ndarray
    y_train: np.ndarray | None
    X_test: np.ndarray
    novel_test: np.ndarray | None
    y_test: np.ndarray | None
    groups_test: np.ndarray | None
    unseen: tuple[UnseenClient, ...]
    partition_clients: np.ndarray
    partition_labels: np.ndarray
    partition_label_name: str
    description: str
    one_client: str | None = None

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def labelled(self) -> bool:
        """Whether the rows have class labels (FedGMM can fit its joint model)."""
        return self.y_train is not None

    @property
    def client_ids(self) -> np.ndarray:
        """Training clients' ids, sorted (the order of ``client_weights_`` rows)."""
        return np.unique(self.groups_train)

    @property
    def unseen_ids(self) -> list:
        """Held-out clients' ids, in the order of ``unseen``."""
        return [client.client_id for client in self.unseen]

    def frame(self, X: np.ndarray) -> pd.DataFrame:
        """Rows (n, n_features) as a DataFrame with the bundle's column names."""
        return pd.DataFrame(X, columns=list(self.feature_names))

    def unseen_client(self, client_id) -> UnseenClient:
        """The held-out client with this id (ValueError if there is none)."""
        for client in self.unseen:
            if client.client_id == client_id:
                return client
        raise ValueError(f"client {client_id!r} is not held out of training.")


def tested_words(novel, n_test: int | None = None) -> str:
    """How many rows are tested and how many of them are novel, as the pages say it.

    The Train page's caption (a bundle's ``description``), the pages' model line and the
    Scores page's pooled view all count with this function, on the same rows (the bundle's
    ``novel_test``), so their numbers agree.

    Args:
        novel: (n_test,) 1 = novel, 0 = normal, -1 = unknown; or None (no novelty labels:
            ``n_test`` rows, all unknown).
        n_test: the number of test rows when ``novel`` is None.

    Returns:
        ``"13 novel of 25 test rows"``, or ``"25 test rows (novelty unknown)"`` when
        ``novel`` is None or any entry is -1.

    Raises:
        ValueError: ``novel`` None without ``n_test``.
    """
    if novel is None:
        if n_test is None:
            raise ValueError("tested_words: novel is None, so pass n_test (the test rows).")
        novel = np.full(n_test, -1)
    novel = np.asarray(novel)
    if (novel < 0).any():
        return f"{novel.size:,} test rows (novelty unknown)"
    return f"{int((novel == 1).sum()):,} novel of {novel.size:,} test rows"


def _warn_one_client(bundle: DataBundle, remedy: str | None = None) -> DataBundle:
    """The bundle with ``one_client`` set, and :class:`OneTrainingClientWarning` issued, when
    it trains fewer than two clients; else the bundle as it is."""
    message = one_client_message(bundle.client_ids, bundle.unseen_ids, remedy)
    if message is None:
        return bundle
    warnings.warn(message, OneTrainingClientWarning, stacklevel=3)
    return replace(bundle, one_client=message)


def _count(n: int, noun: str) -> str:
    """``"1 training client"``, ``"2 training clients"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _names(n_features: int) -> tuple[str, ...]:
    return tuple(f"x{j}" for j in range(n_features))


def _split_unseen(
    client_id, X: np.ndarray, y: np.ndarray | None, X_novel, y_novel, rng: np.random.Generator
) -> UnseenClient:
    """Half of a held-out client's normal rows for adaptation, the rest + novel rows to
    evaluate on."""
    order = rng.permutation(X.shape[0])
    half = X.shape[0] // 2
    adapt, held = order[:half], order[half:]
    labelled = y is not None and y_novel is not None
    return UnseenClient(
        client_id=client_id,
        X_adapt=X[adapt],
        y_adapt=y[adapt] if labelled else None,
        X_eval=np.vstack([X[held], X_novel]),
        y_eval=np.concatenate([y[held], y_novel]) if labelled else None,
        novel_eval=np.r_[np.zeros(held.size, np.int64), np.ones(X_novel.shape[0], np.int64)],
    )


# ----------------------------------------------------------------------------- synthetic
def synthetic_bundle(
    n_clients: int = 10,
    alpha: float = 0.4,
    n_unseen: int = 2,
    n_features: int = 8,
    seed: int = 0,
) -> DataBundle:
    """The FedGMM paper's synthetic clients plus a component no client trains on.

    ``make_fedgmm_synthetic`` draws ``n_clients + n_unseen`` clients over 4 components; rows
    of the last component never reach training and are the novel inputs of the test set
    (the training clients' test rows; if fewer than ``MIN_NOVEL_ROWS`` of them are novel,
    the clients' novel training rows are added). The last ``n_unseen`` clients are held out.
    With a small ``alpha`` a client may draw only novel-component rows: it then has no
    training row, and the description counts the clients that train.

    Args:
        n_clients: training clients, >= 1; alpha: Dirichlet concentration of each client's
            component weights; n_unseen: clients held out, >= 0; n_features: d; seed: int.

    Returns:
        A :class:`DataBundle` with labels (binary classes) and ``groups_test``.

    Warns:
        OneTrainingClientWarning: a single client has training rows (its message names it
            and the held-out clients).

    Raises:
        ValueError: no client has a training row (every row of the novel component).
    """
    from fednovelty.datasets import make_fedgmm_synthetic

    n_components = 4
    novel_k = n_components - 1
    data = make_fedgmm_synthetic(
        n_clients + n_unseen,
        n_components=n_components,
        n_features=n_features,
        alpha=alpha,
        random_state=seed,
    )
    normal_tr = data.components_train != novel_k
    fed_tr = data.groups_train < n_clients
    fed_te = data.groups_test < n_clients
    train = fed_tr & normal_tr
    spare_novel = fed_tr & ~normal_tr  # the clients' novel training rows: tested if needed
    if np.sum(fed_te & (data.components_test == novel_k)) >= MIN_NOVEL_ROWS:
        spare_novel[:] = False
    X_test = np.vstack([data.X_test[fed_te], data.X_train[spare_novel]])
    y_test = np.concatenate([data.y_test[fed_te], data.y_train[spare_novel]])
    novel_test = np.concatenate(
        [data.components_test[fed_te] == novel_k, np.ones(int(spare_novel.sum()), bool)]
    ).astype(np.int64)
    groups_test = np.concatenate([data.groups_test[fed_te], data.groups_train[spare_novel]])
    rng = np.random.default_rng(seed)
    novel = novel_test == 1
    unseen = []
    for h in range(n_clients, n_clients + n_unseen):
        rows = (data.groups_train == h) & normal_tr
        held_test = (data.groups_test == h) & (data.components_test != novel_k)
        X_h = np.vstack([data.X_train[rows], data.X_test[held_test]])
        y_h = np.concatenate([data.y_train[rows], data.y_test[held_test]])
        unseen.append(_split_unseen(h, X_h, y_h, X_test[novel], y_test[novel], rng))
    counted = normal_tr  # every client's rows that training or adaptation may see
    labels = np.array([f"component {k}" for k in data.components_train[counted]])
    remedy = "raise alpha or the number of training clients, or try another seed"
    n_training = np.unique(data.groups_train[train]).size
    if n_training == 0:
        raise ValueError(
            f"synthetic data: none of the {n_clients} training clients drew a normal row "
            f"(alpha={alpha}, seed={seed}); {remedy}."
        )
    training = (
        _count(n_clients, "training client")
        if n_training == n_clients
        else f"{_count(n_training, 'training client')} ({n_clients - n_training} of "
        f"{n_clients} drew only novel rows)"
    )
    bundle = DataBundle(
        name=f"synthetic ({n_clients} clients, d={n_features})",
        feature_names=_names(n_features),
        X_train=data.X_train[train],
        groups_train=data.groups_train[train],
        y_train=data.y_train[train],
        X_test=X_test,
        novel_test=novel_test,
        y_test=y_test,
        groups_test=groups_test,
        unseen=tuple(unseen),
        partition_clients=data.groups_train[counted],
        partition_labels=labels,
        partition_label_name="component",
        description=(
            f"FedGMM paper's synthetic data: {training} + {n_unseen} unseen, "
            f"Dir({alpha}) weights over 3 components; a 4th component is never trained on "
            f"and gives the novel inputs ({tested_words(novel_test)}, all of the training "
            "clients). Binary labels, one linear rule per component."
        ),
    )
    return _warn_one_client(bundle, remedy)


# ----------------------------------------------------------------------------- tasks
def adbench_names(data_dir=None) -> list[str]:
    """The benchmark tasks the app can train on: scikit-learn's bundled digits (always there,
    shipped with scikit-learn), then, when the data folder holds them, ``FEMNIST`` and the
    ADBench tabular datasets (none when the data folder is missing)."""
    from fednovelty.datasets import data_dir as find_data_dir
    from fednovelty.datasets import list_adbench

    try:
        root = find_data_dir(data_dir)
        femnist = [FEMNIST] if (root / "femnist" / "femnist.npz").is_file() else []
        return [BUNDLED_DIGITS, *femnist, *list_adbench(root)]
    except (FileNotFoundError, ValueError):
        return [BUNDLED_DIGITS]


def default_source(data_dir=None) -> str:
    """The Train page's first choice: ``SYNTHETIC`` (labelled, so every page works) when the
    data folder is there, else scikit-learn's bundled digits, real data that needs no folder."""
    from fednovelty.datasets import data_dir as find_data_dir

    try:
        find_data_dir(data_dir)
    except FileNotFoundError:
        return BUNDLED_DIGITS
    return SYNTHETIC


def source_label(source: str) -> str:
    """How the Train page names a source: ``"femnist"`` -> ``"FEMNIST writers"``, ...; any
    other source (ADBench names, ``SYNTHETIC``) as it is."""
    return _LABELS.get(source, source)


def adbench_bundle(
    name: str,
    protocol: str = "novelty",
    partition: str = "dirichlet",
    n_clients: int = 10,
    alpha: float = 0.5,
    n_unseen: int = 2,
    seed: int = 0,
    max_train: int | None = 20_000,
    max_test: int | None = 5_000,
    data_dir=None,
) -> DataBundle:
    """A benchmark task (``make_task``: an ADBench name, ``BUNDLED_DIGITS`` or ``FEMNIST``)
    with its last ``n_unseen`` clients held out: the task's training rows, clients, test rows
    and novelty labels as they are; an unseen client adapts on its inliers (the task's
    ``y_train`` marks the outlier protocol's anomalous training rows).

    For ``FEMNIST`` the clients are ``n_clients + n_unseen`` writers (``partition`` and
    ``alpha`` do not apply), so the held-out clients are writers the federation never saw; the
    test set is the writers' test images (the held-out writers' too), half of them
    transformed, and an unseen writer adapts on its training images.

    Raises:
        ValueError: from ``make_task`` (unknown name, a partition that cannot be drawn, ...).
        FileNotFoundError: the data folder or the dataset's file is missing.
    """
    from fednovelty.datasets.protocols import make_task

    task = make_task(
        name,
        protocol,
        n_clients=n_clients + n_unseen,
        alpha=alpha,
        partition=partition,
        seed=seed,
        max_train=max_train,
        max_test=max_test,
        data_dir=data_dir,
    )
    anomalous, groups = task.y_train == 1, task.partition_labels
    train = task.groups_train < n_clients
    novel = task.y_test == 1
    rng = np.random.default_rng(seed)
    unseen = [
        _split_unseen(
            h,
            task.X_train[(task.groups_train == h) & ~anomalous],
            None,
            task.X_test[novel],
            None,
            rng,
        )
        for h in range(n_clients, n_clients + n_unseen)
    ]
    group_name, description = _task_words(task, n_clients, n_unseen)
    return DataBundle(
        name=f"{task.name} ({task.protocol})",
        feature_names=_names(task.n_features),
        X_train=task.X_train[train],
        groups_train=task.groups_train[train],
        y_train=None,
        X_test=task.X_test,
        novel_test=task.y_test,
        y_test=None,
        groups_test=None,
        unseen=tuple(unseen),
        partition_clients=task.groups_train,
        partition_labels=np.array([f"{group_name.split()[-1]} {g}" for g in groups]),
        partition_label_name=group_name,
        description=description,
    )


def _task_words(task, n_clients: int, n_unseen: int) -> tuple[str, str]:
    """What a task's partition groups are, and one line on where its data came from."""
    clients = f"{n_clients} training clients + {n_unseen} unseen"
    tested = f"({tested_words(task.y_test)})"
    if task.dataset == FEMNIST:
        return "writer", (
            f"FEMNIST writers (LEAF): {clients} writers, each writer a client; novelty "
            f"protocol: test = the writers' held-out images, half of them transformed "
            f"({task.ood}) {tested}; each image's direction (pixels over their L2 norm) on "
            f"{task.n_features - 1} federated principal axes plus the log of its norm (the "
            "ink), min-max scaled."
        )
    if task.dataset == BUNDLED_DIGITS:
        return "digit", (
            f"scikit-learn's bundled handwritten digits (real data shipped with scikit-learn; "
            f"no data folder needed), {task.protocol} protocol, {task.partition} partition "
            f"over the digits into {clients}; digit 0 is novel {tested}; pixels on "
            f"{task.n_features} federated principal axes, min-max scaled."
        )
    return "k-means cluster", (
        f"ADBench {task.name}, {task.protocol} protocol, {task.partition} partition into "
        f"{clients}; features min-max scaled; test = held-out inliers + anomalies {tested}."
    )


# ----------------------------------------------------------------------------- uploads
def upload_bundle(
    frame: pd.DataFrame,
    client_column,
    label_column=None,
    novel_column=None,
    *,
    n_unseen: int = 0,
    seed: int = 0,
    name: str = "upload",
) -> DataBundle:
    """An uploaded table as a bundle: every training client keeps ``TEST_SHARE`` of its
    normal rows back for the test set, the training clients' novel rows are only tested, and
    the clients with the last ``n_unseen`` ids (sorted; ``holdout.split_clients``) are held
    out with their rows (their novel rows are evaluated on the Unseen client page, not in the
    test set). The description counts the test set with :func:`tested_words`.

    Warns:
        OneTrainingClientWarning: a single client trains (the table has one client, or
            ``n_unseen`` leaves one); the message names the clients trained on and held out.

    Raises:
        UploadError: see :func:`check_table`; also ``n_unseen`` leaving no training client.
    """
    features, X, groups, labels, novel = check_table(
        frame, client_column, label_column, novel_column
    )
    try:
        ids = np.unique(groups)
    except TypeError:  # ids that do not compare (numbers and text): as text, as the page
        groups = groups.astype(str)
        ids = np.unique(groups)
    try:
        train_ids, unseen_ids = split_clients(ids, n_unseen)
    except ValueError as error:
        raise UploadError(str(error).replace("the data have", "the file has")) from None
    is_novel = np.zeros(len(groups), bool) if novel is None else novel == 1
    rng = np.random.default_rng(seed)
    train_rows, test_rows = [], []
    for client in train_ids:
        rows = rng.permutation(np.flatnonzero((groups == client) & ~is_novel))
        n_test = max(1, round(TEST_SHARE * rows.size))
        test_rows.append(rows[:n_test])
        train_rows.append(np.sort(rows[n_test:]))
    train = np.concatenate(train_rows)
    fed_novel = np.flatnonzero(is_novel & ~np.isin(groups, unseen_ids))
    test = np.concatenate([*test_rows, fed_novel])
    novel_test = None if novel is None else is_novel[test].astype(np.int64)
    tested_novel = np.zeros(len(groups), bool)
    tested_novel[fed_novel] = True
    unseen = []
    for client in unseen_ids:
        own = groups == client
        novel_rows = (own & is_novel) | tested_novel  # its own novel rows and the test set's
        normal = own & ~is_novel
        y_own = None if labels is None else labels[normal]
        y_novel = None if labels is None else labels[novel_rows]
        unseen.append(_split_unseen(client, X[normal], y_own, X[novel_rows], y_novel, rng))
    counted = ~is_novel
    if labels is not None:
        part_labels, label_name = labels[counted].astype(str), "class"
    else:
        from fednovelty.datasets import MinMaxScaling, kmeans_groups

        scaled = MinMaxScaling.from_clients([X[counted]]).transform(X[counted])
        clusters = kmeans_groups(scaled, min(10, int(counted.sum())), random_state=seed)
        part_labels = np.array([f"cluster {g}" for g in clusters])
        label_name = "k-means cluster"
    held_novel = int((is_novel & np.isin(groups, unseen_ids)).sum())
    bundle = DataBundle(
        name=name,
        feature_names=tuple(str(c) for c in features),
        X_train=X[train],
        groups_train=groups[train],
        y_train=None if labels is None else labels[train],
        X_test=X[test],
        novel_test=novel_test,
        y_test=None if labels is None else labels[test],
        groups_test=groups[test],
        unseen=tuple(unseen),
        partition_clients=groups[counted],
        partition_labels=part_labels,
        partition_label_name=label_name,
        description=(
            f"uploaded {name}: {_count(train_ids.size, 'training client')} + "
            f"{unseen_ids.size} unseen "
            f"from column {client_column!r}; {len(features)} features; test = "
            f"{TEST_SHARE:.0%} of each training client's normal rows and its novel rows: "
            f"{tested_words(novel_test, test.size)}"
            + (
                f"; the held-out clients' {held_novel} novel rows are evaluated on the Unseen "
                "client page instead"
                if held_novel
                else ""
            )
            + ("" if labels is None else f"; labels from {label_column!r}")
            + "."
        ),
    )
    return _warn_one_client(bundle)
