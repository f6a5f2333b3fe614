"""The Clusters page's federation: synthetic clients in true clusters (and optional rogue
clients) fitted with ``ClusteredFedGMMDetector``; pure functions the page and the tests call.

Every client's rows are half from a population that all clients share (at the origin) and
half from its own population: its true cluster's, one of ``n_true`` places on a circle of
radius ``radius`` (2-D), or, for a rogue client, a place half-way round the circle between
two clusters' places, which no cluster holds (each rogue a place of its own). Client ids are
integers: the clients of true cluster 0 first, then cluster 1's, ..., the rogue ones last, so
``client_ids_`` (sorted) keeps that order.

The adjusted Rand index compares the found clusters with the true ones over the non-rogue
clients only (a rogue client has no true cluster).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score

from fednovelty import ClusteredFedGMMDetector

__all__ = [
    "ClusterRun",
    "ClusterSpec",
    "assignment_table",
    "client_frame",
    "cluster_ari",
    "clustered_rounds",
    "component_frame",
    "new_client_rows",
    "rogue_places",
    "row_frame",
    "run_clusters",
    "sizes_frame",
    "synthetic_clients",
    "true_cluster_name",
    "true_places",
]

#: The true clusters' names ("A", "B", ...); rogue clients' true cluster is ROGUE.
CLUSTER_NAMES = "ABCDEFGH"
ROGUE = "rogue"


@dataclass(frozen=True)
class ClusterSpec:
    """What the page fits.

    Attributes:
        n_true: true clusters (1-8); per_cluster: clients in each (>= 1).
        n_rogue: rogue clients, whose own half of the rows comes from a place no cluster holds.
        rows: rows per client; share: the share of a client's rows from its own population
            (the rest from the population every client shares); radius: of the circle the
            populations' places sit on (each population has unit variance).
        n_components, n_clusters, cluster_components, assignment, warmup, max_iter: the
            detector's (``n_components``: the global components).
        seed: of the draws and the detector.
    """

    n_true: int = 3
    per_cluster: int = 4
    n_rogue: int = 1
    rows: int = 120
    share: float = 0.5
    radius: float = 6.0
    n_components: int = 1
    n_clusters: int = 3
    cluster_components: int = 1
    assignment: str = "likelihood"
    warmup: int = 10
    max_iter: int = 50
    seed: int = 0

    @property
    def n_clients(self) -> int:
        return self.n_true * self.per_cluster + self.n_rogue


@dataclass(frozen=True)
class ClusterRun:
    """A fitted federation.

    Attributes:
        spec: what was fitted.
        detector: the fitted ``ClusteredFedGMMDetector``.
        X: (n_samples, 2) every client's rows; groups: (n_samples,) their client ids.
        clients: :func:`client_frame` (one row per client).
        ari: :func:`cluster_ari` of the found clusters.
    """

    spec: ClusterSpec
    detector: ClusteredFedGMMDetector
    X: np.ndarray
    groups: np.ndarray
    clients: pd.DataFrame
    ari: float


def true_cluster_name(cluster: int) -> str:
    """``"A"``, ``"B"``, ... for true cluster 0, 1, ...; ``"rogue"`` for -1."""
    return ROGUE if cluster < 0 else CLUSTER_NAMES[cluster]


def true_places(n_true: int, radius: float = 6.0) -> np.ndarray:
    """(n_true, 2) the true clusters' own populations' centres: evenly round a circle of
    ``radius``, the first at the top."""
    angles = np.pi / 2 + 2 * np.pi * np.arange(n_true) / n_true
    return radius * np.c_[np.cos(angles), np.sin(angles)]


def rogue_places(n_true: int, n_rogue: int, radius: float = 6.0) -> np.ndarray:
    """(n_rogue, 2) the rogue clients' own populations' centres on the same circle, each
    half-way between two neighbouring clusters' places (in turn; evenly round the circle
    when there are more rogues than clusters), so no cluster holds them."""
    slots = max(n_true, n_rogue, 1)
    angles = np.pi / 2 + 2 * np.pi * (np.arange(n_rogue) + 0.5) / slots
    return radius * np.c_[np.cos(angles), np.sin(angles)]


def _client_rows(rng: np.random.Generator, spec: ClusterSpec, place: np.ndarray) -> np.ndarray:
    own = round(spec.rows * spec.share)
    shared = rng.normal(0.0, 1.0, size=(spec.rows - own, 2))
    return np.concatenate([shared, rng.normal(place, 1.0, size=(own, 2))])


def synthetic_clients(spec: ClusterSpec):
    """Every client's rows (n_samples, 2), their client ids (n_samples,) and each client's
    true cluster (n_clients,) in client-id order (-1: rogue)."""
    if spec.n_true > len(CLUSTER_NAMES):
        raise ValueError(f"n_true={spec.n_true}: at most {len(CLUSTER_NAMES)} true clusters.")
    rng = np.random.default_rng(spec.seed)
    places = true_places(spec.n_true, spec.radius)
    truth = np.r_[np.repeat(np.arange(spec.n_true), spec.per_cluster), -np.ones(spec.n_rogue)]
    truth = truth.astype(np.int64)
    rogues = rogue_places(spec.n_true, spec.n_rogue, spec.radius)
    rows = [
        _client_rows(rng, spec, places[t] if t >= 0 else rogues[i - spec.n_true * spec.per_cluster])
        for i, t in enumerate(truth)
    ]
    groups = np.repeat(np.arange(len(truth)), spec.rows)
    return np.concatenate(rows), groups, truth


def new_client_rows(spec: ClusterSpec, source: int, seed: int = 1) -> np.ndarray:
    """(rows, 2) the rows of a client that did not train: from true cluster ``source``'s
    population, or (``source=-1``) from the first rogue place, with the spec's share."""
    rng = np.random.default_rng([spec.seed, seed])
    if source >= 0:
        place = true_places(spec.n_true, spec.radius)[source]
    else:
        place = rogue_places(spec.n_true, 1, spec.radius)[0]
    return _client_rows(rng, spec, place)


def cluster_ari(truth: np.ndarray, found: np.ndarray) -> float:
    """Adjusted Rand index of the found clusters against the true ones over the non-rogue
    clients (``truth >= 0``); 1.0 when fewer than two such clients."""
    kept = np.asarray(truth) >= 0
    if kept.sum() < 2:
        return 1.0
    return float(adjusted_rand_score(np.asarray(truth)[kept], np.asarray(found)[kept]))


def client_frame(detector: ClusteredFedGMMDetector, truth: np.ndarray) -> pd.DataFrame:
    """One row per client (``client_ids_`` order): ``client``, ``true_cluster`` (name),
    ``rogue``, ``found_cluster`` (-1: never replied) and ``score`` (``client_scores_``)."""
    truth = np.asarray(truth)
    return pd.DataFrame(
        {
            "client": [int(c) for c in detector.client_ids_],
            "true_cluster": [true_cluster_name(int(t)) for t in truth],
            "rogue": truth < 0,
            "found_cluster": detector.client_clusters_.astype(np.int64),
            "score": detector.client_scores_.astype(np.float64),
        }
    )


def clustered_rounds(detector: ClusteredFedGMMDetector) -> list[int]:
    """The communication rounds (``history_``'s numbers) of the clustered rounds, one per
    entry of ``cluster_sizes_history_``; 1, 2, ... if the history does not tell them."""
    rounds = [int(h["round"]) for h in detector.history_ if h.get("kind") == "cluster_em"]
    n = len(detector.cluster_sizes_history_)
    return rounds if len(rounds) == n else list(range(1, n + 1))


def sizes_frame(history, rounds=None) -> pd.DataFrame:
    """``cluster_sizes_history_`` as long rows: ``round`` (``rounds``, default 1, 2, ...),
    ``cluster`` (as text, for colours) and ``clients``."""
    rounds = list(range(1, len(history) + 1)) if rounds is None else list(rounds)
    if len(rounds) != len(history):
        raise ValueError(f"{len(rounds)} round numbers for {len(history)} rounds of sizes.")
    cells = [
        {"round": r, "cluster": str(j), "clients": int(n)}
        for r, sizes in zip(rounds, history, strict=True)
        for j, n in enumerate(sizes)
    ]
    return pd.DataFrame(cells, columns=["round", "cluster", "clients"])


def assignment_table(clients: pd.DataFrame, n_clusters: int) -> pd.DataFrame:
    """Clients per true cluster (rows: ``A``, ``B``, ..., ``rogue``) and found cluster
    (columns ``0`` .. ``n_clusters - 1``, and ``-1`` when some client never replied)."""
    columns = list(range(n_clusters)) + ([-1] if (clients.found_cluster < 0).any() else [])
    order = [n for n in CLUSTER_NAMES if n in set(clients.true_cluster)]
    order += [ROGUE] if clients.rogue.any() else []
    table = pd.crosstab(clients.true_cluster, clients.found_cluster)
    table = table.reindex(index=order, columns=columns, fill_value=0)
    table.index.name, table.columns.name = "true cluster", "found cluster"
    return table


def component_frame(detector: ClusteredFedGMMDetector) -> pd.DataFrame:
    """One row per component: ``component``, ``owner`` (-1: global, else its cluster),
    ``kind`` (``"global"`` or ``"cluster j"``), ``weight`` (pooled) and ``x``, ``y`` (its
    mean's first two coordinates)."""
    owners = np.asarray(detector.component_clusters_, dtype=np.int64)
    means = np.asarray(detector.means_)
    return pd.DataFrame(
        {
            "component": np.arange(len(owners)),
            "owner": owners,
            "kind": ["global" if o < 0 else f"cluster {o}" for o in owners],
            "weight": np.asarray(detector.weights_, dtype=np.float64),
            "x": means[:, 0],
            "y": means[:, 1],
        }
    )


def row_frame(run: ClusterRun) -> pd.DataFrame:
    """One row per data row: ``x``, ``y``, ``client``, its ``found_cluster`` (text) and
    whether its client is ``rogue``."""
    by_client = run.clients.set_index("client")
    found = by_client.found_cluster.reindex(run.groups).to_numpy()
    rogue = by_client.rogue.reindex(run.groups).to_numpy()
    return pd.DataFrame(
        {
            "x": run.X[:, 0],
            "y": run.X[:, 1],
            "client": run.groups,
            "found_cluster": [str(int(f)) for f in found],
            "rogue": rogue.astype(bool),
        }
    )


def run_clusters(spec: ClusterSpec) -> ClusterRun:
    """Draw ``spec``'s clients and fit a ``ClusteredFedGMMDetector`` on them."""
    X, groups, truth = synthetic_clients(spec)
    detector = ClusteredFedGMMDetector(
        spec.n_components,
        n_clusters=spec.n_clusters,
        cluster_components=spec.cluster_components,
        assignment=spec.assignment,
        warmup=spec.warmup,
        max_iter=spec.max_iter,
        random_state=spec.seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a run that stops at max_iter is fine here
        detector.fit(X, groups=groups)
    clients = client_frame(detector, truth)
    return ClusterRun(spec, detector, X, groups, clients, cluster_ari(truth, clients.found_cluster))
