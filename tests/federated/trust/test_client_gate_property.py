"""The client gate against a hostile server, over every algorithm in the registry.

For every reply kind of every registered algorithm (and the init variants that add kinds:
``range``, ``count``, ``subset``, ``moments``), hypothesis crafts a well-formed broadcast from
the honest one a small in-process federation sent (mixtures with means at single rows or far
out, tiny and huge covariances, more components or cluster rows than the client's own
configuration allows, extreme weights; crafted centres, priors and learner parameters), a
small client of 7-30 rows with one far-out row answers it through
``FederatedAlgorithm.answer`` (client step, then the gate), and the test recomputes with
numpy, from the client's rows and the broadcast alone, the effective rows behind every
released nonzero value:

- a component's statistics: Kish's ``(sum_i r_ik)^2 / sum_i r_ik^2`` of its responsibilities
  (hand-written Gaussian log-densities, sklearn's Cholesky-of-precision convention; for a
  mixture of factor analysers, ``W W^T + diag(psi)`` through Woodbury's identity by hand),
  after checking that the released counts are those responsibilities' sums (and a factor
  analyser's ``E[z]`` statistics, a factor start's sketch, those of the same rows);
- hard groups (Lloyd assignment, the factor start's partition, pFedEM's partition,
  classes): the rows counted;
- a centroid: its count (the counts add up to the rows, the centres to the rows' sum);
- a feature range: the mean of ``min_rows`` extreme values;
- a local mixture's component: ``weight * n`` and its responsibilities' effective rows;
- sums of per-row values (cluster rows' log-likelihoods, the streaming drift's mean and
  variance of log p): the documented measure, the fewest effective rows of the deviations
  from the median of any contrast of the sums, searched here over the directions that equal
  the values of any pair (two sums) or two pairs (three sums) of rows;
- whole-client values: the client's row count;
- a calibration histogram: declared a whole-client value (the row count backs it; its bins
  are not floored), after checking that its counts are those of the client's scores.

Every released value must be backed by ``min_rows`` (a relative slack of 1e-6 for
round-off) and no reply may hold more grouped entries than the client's own configuration
allows.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from fednovelty.federated import registry
from fednovelty.federated.bayesian import vb_local
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.bayesian.vgm2 import VGM2
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_local import VGM2Local
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype
from fednovelty.federated.calibration.quantile import FederatedCalibration
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.federated.core.aggregate import learner_name
from fednovelty.federated.core.base import ClientContext, Message
from fednovelty.federated.core.conformal import calibration_edges
from fednovelty.federated.core.wire import unpack
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.joint_models.pfedem import PFedEM
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.mixtures.factor_em import FederatedFactorEM
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM, LocalGMMs
from fednovelty.federated.mixtures.pca import FederatedPCA
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation, simulation

F64 = torch.float64
MIN_ROWS = 5
POLICY = PrivacyPolicy(min_rows=MIN_ROWS)
FLOOR = MIN_ROWS * (1 - 1e-6)
D = 2  # the clients' width


# ----------------------------------------------------------------------------- federation
def _rows(client: int, n: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(client)
    return torch.randn(n, D, dtype=F64, generator=g) + 4.0 * (client % 2)


def _unlabelled() -> list[torch.Tensor]:
    return [_rows(c) for c in range(4)]


def _labelled() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(X, (X[:, 0] > X[:, 0].median()).long()) for X in _unlabelled()]


def _streaming(**settings) -> StreamingEM:
    p = run_simulation(FederatedEM(2, random_state=0, max_iter=3), _unlabelled()).state.params
    return StreamingEM(
        2,
        weights_init=p.weights,
        means_init=p.means,
        precisions_init=p.precisions_cholesky,
        **settings,
    )


SMALL_VGM2 = {"hidden": 8, "embedding_dim": 2, "local_epochs": 1, "batch_size": 16, "rounds": 1}


@dataclass(frozen=True)
class Variant:
    """An algorithm of the registry under settings that reach some of its reply kinds."""

    registered: str
    build: Callable
    labelled: bool = False
    allow_raw_rows: bool = False
    columns: int | None = None  # the client's first columns only (calibration scores: 1)


VARIANTS: dict[str, Variant] = {
    "em": Variant("FederatedEM", lambda: FederatedEM(2, max_iter=2, random_state=0)),
    "em_standardized": Variant(
        "FederatedEM",
        lambda: FederatedEM(
            3, max_iter=2, standardize=True, covariance_type="spherical", random_state=0
        ),
    ),
    "em_separated_tied": Variant(
        "FederatedEM",
        lambda: FederatedEM(
            3, max_iter=2, init_params="separated", covariance_type="tied", random_state=0
        ),
    ),
    "em_subset": Variant(
        "FederatedEM",
        lambda: FederatedEM(2, max_iter=2, init_params="subset", random_state=0),
        allow_raw_rows=True,
    ),
    "em_oneshot": Variant(
        "FederatedEM",
        lambda: FederatedEM(2, init_params="oneshot", max_iter=2, random_state=0),
    ),
    "joint": Variant(
        "JointFedGMM", lambda: JointFedGMM(3, 2, 2, max_iter=2, random_state=0), labelled=True
    ),
    "fedgengmm": Variant("FedGenGMM", lambda: FedGenGMM(k_range=(1, 3), random_state=0)),
    "local_gmms": Variant("LocalGMMs", lambda: LocalGMMs(k_range=(1, 3), random_state=0)),
    "pca": Variant("FederatedPCA", lambda: FederatedPCA(2)),
    "streaming": Variant("StreamingEM", _streaming),
    "streaming_track_only": Variant("StreamingEM", lambda: _streaming(rounds=0)),
    "pfedem": Variant(
        "PFedEM",
        lambda: PFedEM(3, 2, max_iter=2, local_epochs=1, random_state=0),
        labelled=True,
    ),
    "pfedem_exact": Variant(
        "PFedEM",
        lambda: PFedEM(
            3, 2, max_iter=2, local_epochs=1, gaussian_aggregation="exact", random_state=0
        ),
        labelled=True,
    ),
    "ifca": Variant(
        "IFCA",
        lambda: IFCA(D, 2, n_clusters=2, rounds=2, learner_factory="linear"),
        labelled=True,
    ),
    "fesem": Variant(
        "FeSEM",
        lambda: FeSEM(D, 2, n_clusters=2, rounds=3, learner_factory="linear"),
        labelled=True,
    ),
    "ifca_cam": Variant(
        "IFCACAM",
        lambda: IFCACAM(D, 2, n_clusters=2, rounds=3, learner_factory="linear"),
        labelled=True,
    ),
    "fesem_cam": Variant(
        "FeSEMCAM",
        lambda: FeSEMCAM(D, 2, n_clusters=2, rounds=3, learner_factory="linear"),
        labelled=True,
    ),
    "fedavg_plus": Variant(
        "FedAvgPlus",
        lambda: FedAvgPlus(D, 2, n_clusters=2, rounds=2, learner_factory="linear"),
        labelled=True,
    ),
    "clustered_em": Variant(
        "ClusteredEM",
        lambda: ClusteredEM(2, n_clusters=2, cluster_components=1, max_iter=2, random_state=0),
    ),
    "clustered_em3": Variant(
        "ClusteredEM",
        lambda: ClusteredEM(2, n_clusters=3, cluster_components=1, max_iter=2, random_state=0),
    ),
    "vb": Variant("FederatedVB", lambda: FederatedVB(3, max_iter=2, random_state=0)),
    "vb_oneshot": Variant("FederatedVBOneShot", lambda: FederatedVBOneShot(3, random_state=0)),
    "knn_markers": Variant(
        "FederatedKNNMarkers",
        lambda: FederatedKNNMarkers(2, n_neighbors=3, max_iter=2, random_state=0),
    ),
    "factor": Variant(
        "FederatedFactorEM", lambda: FederatedFactorEM(2, 1, max_iter=2, random_state=0)
    ),
    "factor_standardized": Variant(
        "FederatedFactorEM",
        lambda: FederatedFactorEM(
            2,
            1,
            max_iter=2,
            standardize=True,
            prior_strength=3.0,
            init_params="separated",
            isotropic=True,
            random_state=0,
        ),
    ),
    "vgm2": Variant("VGM2", lambda: VGM2(D, 2, umap_weight=0.0, **SMALL_VGM2), labelled=True),
    "vgm2_local": Variant("VGM2Local", lambda: VGM2Local(D, 2, **SMALL_VGM2), labelled=True),
    "vgm2_fedavg": Variant("VGM2FedAvg", lambda: VGM2FedAvg(D, 2, **SMALL_VGM2), labelled=True),
    "vgm2_prototype": Variant(
        "VGM2Prototype", lambda: VGM2Prototype(D, 2, **SMALL_VGM2), labelled=True
    ),
    "calibration": Variant(
        "FederatedCalibration",
        lambda: FederatedCalibration(edges=calibration_edges(-1.0)),
        columns=1,
    ),
}

#: (variant, reply kind): every kind each variant's algorithm answers.
PAIRS: tuple[tuple[str, str], ...] = (
    ("em", "centroids"),
    ("em", "assign"),
    ("em", "em"),
    ("em_standardized", "moments"),
    ("em_standardized", "em"),
    ("em_separated_tied", "range"),
    ("em_separated_tied", "assign"),
    ("em_separated_tied", "em"),
    ("em_subset", "count"),
    ("em_subset", "subset"),
    ("em_oneshot", "oneshot"),
    ("joint", "joint_em"),
    ("fedgengmm", "local_fit"),
    ("local_gmms", "local_fit"),
    ("pca", "moments_mean"),
    ("pca", "moments_scatter"),
    ("streaming", "stream"),
    ("streaming_track_only", "stream"),
    ("pfedem", "pfedem"),
    ("pfedem_exact", "pfedem"),
    ("ifca", "cam_cluster"),
    ("fesem", "cam_cluster"),
    ("ifca_cam", "cam_warmup_global"),
    ("ifca_cam", "cam_cluster"),
    ("fesem_cam", "cam_warmup_local"),
    ("fedavg_plus", "cam_ensemble"),
    ("clustered_em", "cluster_em"),
    ("clustered_em3", "cluster_em"),
    ("vb", "vb_prior"),
    ("vb", "vb_init"),
    ("vb", "vb"),
    ("vb_oneshot", "vb_prior"),
    ("vb_oneshot", "vb_local"),
    ("knn_markers", "vb_init"),
    ("knn_markers", "vb"),
    ("factor", "centroids"),
    ("factor", "assign"),
    ("factor", "factor_start"),
    ("factor", "factor_em"),
    ("factor_standardized", "moments"),
    ("factor_standardized", "range"),
    ("factor_standardized", "assign"),
    ("factor_standardized", "factor_start"),
    ("factor_standardized", "factor_em"),
    ("vgm2", "vgm2"),
    ("vgm2_local", "vgm2"),
    ("vgm2_fedavg", "vgm2"),
    ("vgm2_prototype", "vgm2"),
    ("calibration", "calibration"),
)


def _answered_kinds(algorithm) -> set[str]:
    owner = getattr(algorithm, "_owner", None)
    return set(owner) if owner is not None else set(type(algorithm).replies)


@functools.cache
def templates(variant: str) -> tuple:
    """The algorithm of ``variant`` and the first broadcast of each kind an honest in-process
    federation of 4 clients of 40 rows sent it, unpacked from its wire form:
    ``(algorithm, {kind: message})``."""
    spec = VARIANTS[variant]
    seen: dict[str, Message] = {}
    honest, honest_many = simulation.run_client_step, simulation.run_client_steps

    def spy(algorithm, data, message, context, *args, **kwargs):
        seen.setdefault(message.kind, unpack(message))  # as the client step sees it
        return honest(algorithm, data, message, context, *args, **kwargs)

    def spy_many(algorithm, items, message, *args, **kwargs):  # a batched round
        seen.setdefault(message.kind, unpack(message))
        return honest_many(algorithm, items, message, *args, **kwargs)

    data = _labelled() if spec.labelled else _unlabelled()
    if spec.columns:
        data = [X[:, : spec.columns] for X in data]
    policy = PrivacyPolicy(min_rows=MIN_ROWS, allow_raw_rows=spec.allow_raw_rows)
    with (
        mock.patch.object(simulation, "run_client_step", spy),
        mock.patch.object(simulation, "run_client_steps", spy_many),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # init_params="subset" warns that rows leave
        run_simulation(spec.build(), data, random_state=0, privacy=policy)
    return spec.build(), seen


# ----------------------------------------------------------------------------- numpy side
def kish(weights: np.ndarray) -> np.ndarray:
    """Kish's effective rows of each column of non-negative weights (n, K): (K,)."""
    s, q = weights.sum(0), np.square(weights).sum(0)
    return np.where(q > 0, s**2 / np.where(q > 0, q, 1.0), 0.0)


def log_det_factor(prec: np.ndarray, ct: str, k: int, d: int) -> np.ndarray:
    """log det U of each component's precision factor: (K,)."""
    if ct == "full":
        return np.log(np.abs(np.diagonal(prec, axis1=1, axis2=2))).sum(1)
    if ct == "tied":
        return np.full(k, np.log(np.abs(np.diag(prec))).sum())
    if ct == "diag":
        return np.log(prec).sum(1)
    return d * np.log(prec)


def log_gauss(X: np.ndarray, means: np.ndarray, prec: np.ndarray, ct: str) -> np.ndarray:
    """log N(x_i; mu_k, Sigma_k) (n, K) from Cholesky factors of the precisions (sklearn's
    convention: ``P = U U^T``, ``y = (x - mu) U``)."""
    d = X.shape[1]
    diff = X[:, None, :] - means[None]  # (n, K, d)
    if ct == "full":
        y = np.einsum("nkd,kde->nke", diff, prec)
    elif ct == "tied":
        y = diff @ prec
    elif ct == "diag":
        y = diff * prec[None]
    else:
        y = diff * prec[None, :, None]
    log_det = log_det_factor(prec, ct, means.shape[0], d)
    return -0.5 * (d * math.log(2 * math.pi) + np.square(y).sum(2)) + log_det


def factor_terms(X: np.ndarray, t: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Under a mixture of factor analysers (``t``: means (K, d), factors ``W`` (K, d, q), psi
    (K, d)): ``log N(x_i; mu_k, W_k W_k^T + diag(psi_k))`` (n, K), ``E[z | x_i, k]``
    (n, K, q) and ``Cov[z | x_i, k] = M_k^{-1}`` (K, q, q), with ``M = I + W^T Psi^{-1} W``:
    ``Sigma^{-1} = Psi^{-1} - Psi^{-1} W M^{-1} W^T Psi^{-1}`` (Woodbury),
    ``det Sigma = det M prod psi``, ``E[z | x] = M^{-1} W^T Psi^{-1} (x - mu)``."""
    W, psi, means = t["factors"], t["psi"], t["means"]
    d, q = W.shape[1], W.shape[2]
    diff = X[:, None, :] - means[None]  # (n, K, d)
    whitened = diff / psi[None]  # Psi^{-1} (x - mu)
    M = np.eye(q)[None] + np.einsum("kdp,kd,kdq->kpq", W, 1.0 / psi, W)
    M_inv = np.linalg.inv(M)
    projected = np.einsum("kdq,nkd->nkq", W, whitened)  # W^T Psi^{-1} (x - mu)
    ez = np.einsum("kpq,nkq->nkp", M_inv, projected)
    maha = (diff * whitened).sum(2) - (projected * ez).sum(2)
    log_det = np.linalg.slogdet(M)[1] + np.log(psi).sum(1)
    return -0.5 * (d * math.log(2 * math.pi) + log_det + maha), ez, M_inv


def softmax_rows(log_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-normalised ``exp(log_p)`` and the rows' log-sum-exp."""
    top = np.max(np.where(np.isfinite(log_p), log_p, -np.inf), axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", under="ignore", over="ignore", invalid="ignore"):
        e = np.exp(log_p - top)
        total = e.sum(1, keepdims=True)
        return e / total, (np.log(total) + top)[:, 0]


def lower_median(values: np.ndarray) -> np.ndarray:
    return np.quantile(values, 0.5, axis=0, method="lower")


def deviation_kish(values: np.ndarray, scale: np.ndarray | float = 0.0) -> np.ndarray:
    """Effective rows of the deviations from the (lower) median, per column (n, C): (C,);
    the row count where every value is the median. Deviations within round-off of
    ``scale`` (the magnitude the values were computed at, float64: 1e-9 of it is far above
    the sums' round-off and far below a deviation an observer can read) count as none."""
    dev = np.abs(values - lower_median(values))
    dev = np.where(dev <= 1e-9 * np.asarray(scale), 0.0, dev)
    rows = kish(dev)
    return np.where(dev.max(0) == 0, float(values.shape[0]), rows)


def contrast_kish(values: np.ndarray) -> float:
    """The fewest effective rows behind any contrast ``l . v_i`` of the sums of per-row
    values (n, C): over each single sum and the directions that equal the combined values
    of a pair (C = 2) or of two pairs (C = 3) of rows; for C > 3, of C - 1 pairs drawn."""
    n, c = values.shape
    magnitude = np.abs(values).max(0)  # (C,): a contrast's round-off is relative to it
    best = float(deviation_kish(values, magnitude).min())
    if c == 1 or n < 2:
        return best
    pairs = np.array(list(itertools.combinations(range(n), 2)))
    diffs = values[pairs[:, 1]] - values[pairs[:, 0]]  # (P, C)
    if c == 2:
        directions = np.stack([-diffs[:, 1], diffs[:, 0]], 1)
    elif c == 3:
        a, b = np.triu_indices(len(diffs), 1)
        directions = np.cross(diffs[a], diffs[b])
    else:
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(diffs), size=(20000, c - 1))
        directions = np.linalg.svd(diffs[picks], full_matrices=True)[2][:, -1, :]
    norms = np.linalg.norm(directions, axis=1)
    directions = directions[norms > 1e-12 * max(norms.max(initial=0.0), 1e-300)]
    for chunk in np.array_split(directions, max(1, len(directions) // 4096)):
        if len(chunk):
            scale = np.abs(chunk) @ magnitude
            best = min(best, float(deviation_kish(values @ chunk.T, scale).min()))
    return best


def log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))


def linear_log_py(params: dict[str, np.ndarray], Z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log p(y_i | z_i) under a linear softmax learner (n,)."""
    logits = Z @ params["weight"].T + params["bias"]
    return log_softmax(logits)[np.arange(len(y)), y]


def knn_view(X: np.ndarray, k: int, floor: float) -> np.ndarray:
    """log(leave-one-out distance to the k-th nearest other row + floor), (n, 1)."""
    dist = np.sqrt(np.square(X[:, None, :] - X[None]).sum(2))
    np.fill_diagonal(dist, np.inf)
    return np.log(np.sort(dist, axis=1)[:, k - 1] + floor)[:, None]


def np_tensors(message: Message) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in message.tensors.items()}


def nonzero_rows(t: np.ndarray) -> np.ndarray:
    """Which entries along dim 0 hold any nonzero value: bool (len,)."""
    return (t.reshape(t.shape[0], -1) != 0).any(1) if t.ndim else np.array([t != 0])


# ----------------------------------------------------------------------------- the client
@st.composite
def hostile(draw) -> dict:
    """The client (its rows' count, the far row's distance, labels) and how the server
    crafts its broadcast; the bulk is drawn from ``seed`` by numpy."""
    return {
        "n": draw(st.integers(7, 30)),
        "far": 10.0 ** draw(st.floats(0.0, 4.0)),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "extra": draw(st.integers(-2, 3)),  # components beyond the template's
        "extra_clusters": draw(st.integers(-1, 3)),  # cluster rows beyond the client's
        "place": draw(st.sampled_from(["rows", "far", "spread", "mixed", "template"])),
        "log_scale": draw(st.tuples(st.floats(-3.0, 3.0), st.floats(-3.0, 3.0))),
        "weights": draw(st.sampled_from(["dirichlet", "extreme", "tiny", "template"])),
        "shift": draw(st.sampled_from(["template", "far_row", "zero"])),
        "learner_scale": 10.0 ** draw(st.floats(-2.0, 2.0)),
        "one_row_class": draw(st.booleans()),
    }


def client_data(how: dict, labelled: bool):
    """A client of ``n`` rows (D features), its last row far out; labels for labelled
    algorithms (with ``one_row_class``, class 1 is the far row alone)."""
    rng = np.random.default_rng(how["seed"])
    n = how["n"]
    X = rng.normal(size=(n, D))
    X[-1] = how["far"] * rng.choice([-1.0, 1.0], size=D) * np.array([1.0, 0.3])
    Xt = torch.as_tensor(X)
    if not labelled:
        return Xt
    y = np.zeros(n, dtype=np.int64) if how["one_row_class"] else rng.integers(0, 2, n)
    y[-1] = 1
    return Xt, torch.as_tensor(y)


def client_view(algorithm, X: np.ndarray, message: Message) -> np.ndarray:
    """The rows the step sees, recomputed: z-scores after a standardising moments round,
    log kNN distances for the kNN markers."""
    if "scale" in message.tensors:
        X = (X - message.tensors["offset"].numpy()) / message.tensors["scale"].numpy()
    if isinstance(algorithm, FederatedKNNMarkers):
        X = knn_view(X, algorithm.config.n_neighbors, algorithm.config.distance_floor)
    return X


# ----------------------------------------------------------------------------- crafting
def crafted_mixture(
    how: dict, template: dict[str, np.ndarray], X: np.ndarray, ct: str, k: int
) -> dict[str, np.ndarray]:
    """Weights, means and precision factors of ``k`` components placed by ``how``."""
    rng = np.random.default_rng(how["seed"] + 1)
    n, d = X.shape
    spread = X.std(0) + 1.0
    far = X[np.argmax(np.square(X - np.median(X, 0)).sum(1))]
    place = how["place"]
    if place == "template" and template.get("means", X[:0]).shape[0] >= k:
        means = template["means"][:k].copy()
    elif place == "rows" or place == "template":
        means = X[rng.integers(0, n, k)]
    elif place == "far":
        means = (
            far + rng.normal(size=(k, d)) * spread * rng.choice([0.0, 1e-3, 1.0, 1e3], k)[:, None]
        )
    elif place == "spread":
        means = rng.normal(size=(k, d)) * spread * 10.0 ** rng.uniform(-1, 3, (k, 1))
    else:
        means = np.where(rng.random((k, 1)) < 0.5, X[rng.integers(0, n, k)], far)
    low, high = sorted(float(v) + 0.0 for v in how["log_scale"])  # + 0.0: no signed zero
    sd = 10.0 ** rng.uniform(low, high, k) * spread.mean()
    if ct == "full":
        prec = np.stack([np.eye(d) / s for s in sd])
        prec[:, 0, 1:] = rng.normal(size=(k, d - 1)) * 0.1 / sd[:, None]  # upper triangular
    elif ct == "tied":
        prec = np.eye(d) / sd[0]
    elif ct == "diag":
        prec = (1.0 / sd)[:, None] * 10.0 ** rng.uniform(-0.5, 0.5, (k, d))
    else:
        prec = 1.0 / sd
    mode = how["weights"]
    if mode == "template" and template.get("means", X[:0]).shape[0] == k and "weights" in template:
        weights = template["weights"]
    elif mode == "extreme":
        weights = np.full(k, 1e-12)
        weights[rng.integers(0, k)] = 1.0
    elif mode == "tiny":
        weights = 10.0 ** rng.uniform(-300, 0, k)
    else:
        weights = rng.dirichlet(np.full(k, 10.0 ** rng.uniform(-2, 1)))
    weights = np.maximum(weights, 1e-300)
    weights = weights / weights.sum()
    return {"weights": weights, "means": means, "precisions_cholesky": prec}


def crafted_shift(how: dict, template: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    if how["shift"] == "far_row":
        return X[np.argmax(np.abs(X).sum(1))]
    if how["shift"] == "zero":
        return np.zeros(X.shape[1])
    return template["shift"]


def drawn_like(how: dict, template: dict[str, np.ndarray], prefixes: tuple[str, ...]):
    """Tensors named with ``prefixes`` drawn anew with the template's shapes."""
    rng = np.random.default_rng(how["seed"] + 2)
    return {
        name: rng.normal(size=value.shape) * how["learner_scale"]
        for name, value in template.items()
        if name.startswith(prefixes)
    }


def own_limit(algorithm) -> int:
    """The most components the client's own configuration allows."""
    config = algorithm.config
    return int(getattr(config, "total_components", None) or config.n_components)


def craft(algorithm, kind: str, template: Message, X: np.ndarray, how: dict) -> Message:
    """A well-formed hostile broadcast of ``kind`` from the honest ``template``."""
    t = np_tensors(template)
    scalars = dict(template.scalars)
    if "seed" in scalars:
        scalars["seed"] = how["seed"]
    out: dict[str, np.ndarray] = {
        k: v for k, v in t.items() if k in ("offset", "scale")
    }  # the standardisation the client rows are seen in
    ct = getattr(algorithm.config, "covariance_type", "full")
    base_k = t["means"].shape[0] if "means" in t else 0
    k = max(1, base_k + how["extra"])
    if kind in ("em", "vb_init", "vb", "joint_em", "pfedem", "stream", "cluster_em"):
        mixture = crafted_mixture(how, t, X, ct, k)
        out.update(mixture, shift=crafted_shift(how, t, X))
        if kind == "vb":  # VB's log offsets: any finite values
            rng = np.random.default_rng(how["seed"] + 3)
            out["log_weights"] = np.log(out.pop("weights")) + rng.normal(size=k) * 3
        if kind == "joint_em":
            out.update(drawn_like(how, t, ("learner.",)))
        if kind == "pfedem":
            names = [n.split(".", 2)[2] for n in t if n.startswith("learner.0.")]
            rng = np.random.default_rng(how["seed"] + 2)
            for j in range(k):
                for name in names:
                    shape = t[learner_name(0, name)].shape
                    out[learner_name(j, name)] = rng.normal(size=shape) * how["learner_scale"]
        if kind == "cluster_em":
            rng = np.random.default_rng(how["seed"] + 4)
            n_clusters = max(1, algorithm.config.n_clusters + how["extra_clusters"])
            clusters = rng.integers(0, n_clusters, k)
            log_w = np.full((n_clusters, k), -np.inf)
            for c in range(n_clusters):
                allowed = (clusters == c) | (rng.random(k) < 0.5)
                if not allowed.any():
                    allowed[rng.integers(0, k)] = True
                w = rng.dirichlet(np.ones(int(allowed.sum())))
                log_w[c, allowed] = np.log(np.maximum(w, 1e-300))
            out["component_clusters"] = clusters
            out["cluster_log_weights"] = log_w
        if kind == "stream":
            scalars["window_round"] = 0
    elif kind == "assign":
        out["centers"] = crafted_mixture(how, t, X, "spherical", max(1, 2 + how["extra"]))["means"]
        out["shift"] = crafted_shift(how, t, X)
    elif kind == "factor_start":  # centres of any count, any test matrix, any shift
        out["centers"] = crafted_mixture(how, t, X, "spherical", max(1, 2 + how["extra"]))["means"]
        rng = np.random.default_rng(how["seed"] + 6)
        width = t["omega"].shape[1] + int(rng.integers(0, 3))
        out["omega"] = rng.normal(size=(X.shape[1], width)) * how["learner_scale"]
        out["shift"] = crafted_shift(how, t, X)
    elif kind == "factor_em":  # noise variances as the crafted diag mixture's; loadings
        mixture = crafted_mixture(how, t, X, "diag", k)
        psi = mixture.pop("precisions_cholesky") ** -2.0
        rng = np.random.default_rng(how["seed"] + 7)
        d, q = X.shape[1], t["factors"].shape[2]
        loadings = rng.normal(size=(k, d, q)) * np.sqrt(psi)[:, :, None]
        loadings *= 10.0 ** rng.uniform(-2.0, 2.0, (k, 1, 1))
        out.update(mixture, psi=psi, factors=loadings, shift=crafted_shift(how, t, X))
    elif kind == "moments_scatter":
        out["mean"] = crafted_shift(how, {"shift": t["mean"]}, X)
    elif kind == "vb_local":
        rng = np.random.default_rng(how["seed"] + 5)
        low, high = sorted(float(v) + 0.0 for v in how["log_scale"])  # + 0.0: no signed zero
        out.update(
            weight_concentration=np.array(10.0 ** rng.uniform(-3, 3)),
            mean_precision=np.array(10.0 ** rng.uniform(low, high)),
            mean=crafted_shift(how, {"shift": t["mean"]}, X),
            degrees_of_freedom=np.array(X.shape[1] - 1 + 10.0 ** rng.uniform(-2, 3)),
            covariance=t["covariance"] * 10.0 ** rng.uniform(2 * low, 2 * high),
            shift=crafted_shift(how, t, X),
        )
    elif kind.startswith("cam_"):
        out.update(drawn_like(how, t, ("learner.", "cluster.", "global.")))
    elif kind == "vgm2":
        out.update(drawn_like(how, t, ("encoder.", "head.", "prototypes")))
        if "prior" in t:  # marker parameters: positive
            out["prior"] = np.abs(drawn_like(how, t, ("prior",))["prior"]) + 1e-3
        if "prototype_counts" in t:
            out["prototype_counts"] = np.abs(np.round(t["prototype_counts"] * how["learner_scale"]))
    tensors = {
        name: torch.as_tensor(value, dtype=template.tensors[name].dtype)
        if name in template.tensors
        else torch.as_tensor(value)
        for name, value in out.items()
    }
    if "component_clusters" in tensors:
        tensors["component_clusters"] = tensors["component_clusters"].long()
    return Message(kind, tensors, scalars)


# ----------------------------------------------------------------------------- the checks
def assert_backed(rows, what: str) -> None:
    rows = np.atleast_1d(np.asarray(rows, dtype=float))
    assert (rows >= FLOOR).all(), f"{what} released backed by {rows.min():.4g} rows < {MIN_ROWS}"


def check_components(released: dict, resp: np.ndarray, X: np.ndarray, shift, ct: str, what: str):
    """Statistics released per component (``counts``, ``sums``, ``second``) are those of the
    responsibilities ``resp`` (n, K) about ``shift``, and every released component's
    responsibilities have >= min_rows effective rows; a tied second moment, of the released
    components' rows, likewise."""
    counts = released["counts"]
    k = counts.shape[0]
    assert resp.shape[1] == k
    sent = nonzero_rows(counts) | nonzero_rows(released["sums"])
    second = released.get("second")
    tied = ct == "tied"
    if second is not None and not tied:
        sent = sent | nonzero_rows(second)
    for name in ("xz", "sum_z", "zz", "sketch"):  # a factor analyser's further statistics
        if name in released:
            sent = sent | nonzero_rows(released[name])
    n = X.shape[0]
    assert np.allclose(counts[sent], resp[:, sent].sum(0), rtol=1e-6, atol=1e-9 * n), (
        f"{what}: released counts are not the recomputed responsibilities' sums"
    )
    centred = X - shift
    scale = np.abs(centred).max() * n + 1.0
    assert np.allclose(
        released["sums"][sent], resp[:, sent].T @ centred, rtol=1e-5, atol=1e-8 * scale
    ), f"{what}: released sums are not the recomputed responsibilities' sums"
    assert_backed(kish(resp[:, sent]), f"{what}: a component")
    if tied and np.any(second != 0) and sent.any():
        assert_backed(kish(resp[:, sent].sum(1, keepdims=True)), f"{what}: the tied second moment")
    return sent


def check_whole(n: int, what: str) -> None:
    assert_backed(n, f"{what}: a whole-client value")


def released_or_none(reply: Message):
    return None if reply.scalars.get("skipped") else np_tensors(reply)


def check_stats_reply(r, X, log_weights, t, ct, what):
    log_p = log_gauss(X, t["means"], t["precisions_cholesky"], ct) + log_weights
    resp, _ = softmax_rows(log_p)
    assert r["counts"].shape[0] <= t["means"].shape[0]
    return check_components(r, resp, X, t["shift"], ct, what)


def check(algorithm, kind: str, message: Message, data, reply: Message, before: dict) -> None:
    """Every value of ``reply`` backed by min_rows rows, recomputed from the client's rows."""
    what = f"{type(algorithm).__name__} {kind}"
    r = released_or_none(reply)
    if r is None:
        return
    X_raw = (data[0] if isinstance(data, tuple) else data).numpy()
    X = client_view(algorithm, X_raw, message)
    n = X.shape[0]
    check_whole(n, what)  # whatever else, a client below the floor releases nothing
    t = np_tensors(message)
    config = algorithm.config
    ct = getattr(config, "covariance_type", "full")
    if "n_samples" in r:
        assert float(r["n_samples"]) == n
    if kind in ("em", "vb_init", "vb"):
        assert r["counts"].shape[0] <= own_limit(algorithm)
        log_w = t["log_weights"] if kind == "vb" else np.log(t["weights"])
        check_stats_reply(r, X, log_w, t, ct, what)
    elif kind == "assign":
        assert r["counts"].shape[0] <= own_limit(algorithm)
        centers = t["centers"]
        labels = np.argmin(np.square(X[:, None] - centers[None]).sum(2), 1)
        resp = np.eye(centers.shape[0])[labels]
        check_components(r, resp, X, t["shift"], ct, what)
    elif kind == "centroids":
        counts, centers = r["counts"], r["centers"]
        assert centers.shape[0] <= own_limit(algorithm)
        assert_backed(counts, f"{what}: a centroid")
        assert math.isclose(counts.sum(), n)
        assert np.allclose(counts @ centers, X.sum(0), rtol=1e-8, atol=1e-8 * np.abs(X).sum())
    elif kind == "factor_start":
        check_factor_start(algorithm, r, X, t, what)
    elif kind == "factor_em":
        check_factor_em(algorithm, r, X, t, what)
    elif kind == "range":
        ordered = np.sort(X, 0)
        assert np.allclose(r["min"], ordered[:MIN_ROWS].mean(0), rtol=1e-10, atol=1e-12)
        assert np.allclose(r["max"], ordered[-MIN_ROWS:].mean(0), rtol=1e-10, atol=1e-12)
    elif kind == "subset":
        pytest.fail(f"{what}: raw rows released by a client that does not allow them")
    elif kind == "stream":
        check_stream(algorithm, r, X, t, before, what)
    elif kind == "cluster_em":
        check_cluster_em(algorithm, r, reply, X, t, what)
    elif kind == "joint_em":
        check_joint(algorithm, r, X, data, t, what)
    elif kind == "pfedem":
        check_pfedem(algorithm, r, X, data, t, what)
    elif kind in ("local_fit", "oneshot"):
        check_local_fit(algorithm, r, X, before, what)
    elif kind == "vb_local":
        resp = before["vb_resp"]
        assert r["counts"].shape[0] <= own_limit(algorithm)
        check_components(r, resp, X, t["shift"], ct, what)
    elif kind == "calibration":
        edges = config.edges.numpy()
        scores = X[:, 0]
        inner = [((scores > lo) & (scores <= hi)).sum() for lo, hi in itertools.pairwise(edges)]
        hand = [(scores <= edges[0]).sum(), *inner, (scores > edges[-1]).sum()]
        assert np.array_equal(r["counts"], np.array(hand, dtype=float)), what
    elif kind == "vgm2" and "prototypes" in r:
        y = data[1].numpy()
        classes = np.bincount(y, minlength=config.n_classes).astype(float)
        assert r["prototypes"].shape[0] <= config.n_classes
        sent = nonzero_rows(r["prototypes"]) | nonzero_rows(r["class_counts"])
        assert np.array_equal(r["class_counts"][sent], classes[sent])
        assert_backed(classes[sent], f"{what}: a class prototype")
    # moments, count, vb_prior, moments_mean, moments_scatter, cam_*, vgm2's models:
    # whole-client values, checked above


def assert_recomputed(released: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Released values equal the recomputation, relative to the values' scale."""
    scale = float(np.abs(expected).max(initial=0.0))
    assert np.allclose(released, expected, rtol=1e-6, atol=1e-8 * scale), what


def check_factor_start(algorithm, r, X, t, what):
    """The factor start's reply: counts, sums, second moments and sketch
    ``sum (x - shift)(x - shift)^T Omega`` of the rows nearest each broadcast centre."""
    assert r["counts"].shape[0] <= own_limit(algorithm)
    centers = t["centers"]
    labels = np.argmin(np.square(X[:, None] - centers[None]).sum(2), 1)
    resp = np.eye(centers.shape[0])[labels]
    sent = check_components(r, resp, X, t["shift"], "diag", what)
    centred = X - t["shift"]
    part = resp[:, sent]
    assert_recomputed(r["second"][sent], part.T @ np.square(centred), f"{what}: second")
    sketch = np.einsum("nk,nd,ne->kde", part, centred, centred @ t["omega"])
    assert_recomputed(r["sketch"][sent], sketch, f"{what}: sketch")


def check_factor_em(algorithm, r, X, t, what):
    """A factor EM reply: the responsibilities' statistics (:func:`check_components`) and
    ``sum r E[z]``, ``sum r (x - shift) E[z]^T``, ``sum r E[z z^T]`` of the same rows."""
    assert r["counts"].shape[0] <= own_limit(algorithm)
    log_n, ez, post_cov = factor_terms(X, t)
    resp, _ = softmax_rows(log_n + np.log(t["weights"]))
    sent = check_components(r, resp, X, t["shift"], "diag", what)
    rz = resp[:, sent, None] * ez[:, sent]  # (n, S, q)
    expected = {
        "sum_z": rz.sum(0),
        "xz": np.einsum("nd,nkq->kdq", X - t["shift"], rz),
        "zz": np.einsum("nkp,nkq->kpq", rz, ez[:, sent])
        + resp[:, sent].sum(0)[:, None, None] * post_cov[sent],
    }
    for name, value in expected.items():
        assert_recomputed(r[name][sent], value, f"{what}: {name}")


def check_stream(algorithm, r, X, t, before, what):
    config = algorithm.config
    ct = config.covariance_type
    assert r["counts"].shape[0] <= own_limit(algorithm)
    log_n = log_gauss(X, t["means"], t["precisions_cholesky"], ct)
    if "drift" in r:  # mean and variance of log p under the broadcast weights
        per_row = softmax_rows(log_n + np.log(t["weights"]))[1]
        values = centred_powers(per_row)  # the client orders the rows by these
        clipped = winsorised_values(values, per_row, r["drift"][0])
        if clipped is not None:  # the outlying rows clipped to the others' range
            assert_backed(contrast_kish(clipped), f"{what}: the winsorised drift values")
        else:
            keep = summed_rows(values, per_row[:, None], r["drift"][:1], what)
            kept = centred_powers(per_row[keep])
            assert_backed(contrast_kish(kept), f"{what}: the drift values")
    log_w = before["log_weights"]
    resp, _ = softmax_rows(log_n + log_w)
    n = X.shape[0]
    if config.rounds == 0:
        sent = r["counts"] != 0
        assert np.allclose(r["counts"][sent], n * np.exp(log_w[sent]), rtol=1e-8)
        assert_backed(kish(resp[:, sent]), f"{what}: a tracked count")
        return
    check_components(r, resp, X, t["shift"], ct, what)
    if "far_counts" in r and np.any(r["far_counts"] != 0):
        d = X.shape[1]
        log_det = log_det_factor(t["precisions_cholesky"], ct, t["means"].shape[0], d)
        mahal = 2.0 * (log_det - log_n) - d * math.log(2 * math.pi)
        far = mahal.min(1) > chi2.ppf(config.far_quantile, d)
        far_sent = nonzero_rows(r["far_counts"]) | nonzero_rows(r["far_sums"])
        assert_backed(kish(resp[far][:, far_sent]), f"{what}: far rows of a component")
        assert_backed(kish(resp[~far][:, far_sent]), f"{what}: near rows of a component")
        assert np.allclose(r["far_counts"][far_sent], resp[far][:, far_sent].sum(0), rtol=1e-6)


def winsorised_values(values: np.ndarray, per_row: np.ndarray, mean: float):
    """``[v, v^2]`` (n, 2) of the rows' values ``per_row`` (n,) with the ``m`` rows of
    ``values`` farthest from their median clipped to the range of the others, for the
    ``m`` (1, 2, 4, ...) whose mean is the released ``mean``; None when no such ``m``."""
    n = values.shape[0]
    order = np.argsort(-np.linalg.norm(values - lower_median(values), axis=1), kind="stable")
    for m in [2**j for j in range(int(math.log2(max(n // 2, 1))) + 1)]:
        keep = np.ones(n, dtype=bool)
        keep[order[:m]] = False
        clipped = np.clip(per_row, per_row[keep].min(), per_row[keep].max())
        if np.any(clipped != per_row) and same_means(clipped[:, None], mean, per_row[:, None]):
            return centred_powers(clipped)
    return None


def same_means(values: np.ndarray, means, rows: np.ndarray) -> bool:
    """Whether the column means of ``values`` (m, S) are the released ``means`` (S,), to
    round-off of the rows' values ``rows`` (n, S) (1e-12 of their size) and 1e-9 of their
    spread: rows whose log p agree to 1e-7 of its size (components far broader than the
    rows) still tell one clipping or leaving-out from another."""
    size = np.abs(rows).max(0)
    spread = rows.max(0) - rows.min(0)
    tol = 1e-12 * size + 1e-9 * spread + 1e-300
    return bool(np.all(np.abs(values.mean(0) - np.asarray(means)) <= tol))


def centred_powers(values: np.ndarray) -> np.ndarray:
    """``[v - c, (v - c)^2]`` (n, 2) about the median ``c`` of ``values`` (n,): the
    contrasts of the sums of ``v`` and ``v^2`` (with the row count) are those of these
    sums, and about the median their differences keep their precision (the powers of
    values far from 0 agree to ~1e-10 of their size, below what the round-off rule of
    :func:`deviation_kish` reads)."""
    centred = values - lower_median(values[:, None])[0]
    return np.stack([centred, centred**2], 1)


def summed_rows(values: np.ndarray, summed: np.ndarray, means: np.ndarray, what: str):
    """The rows whose ``summed`` values (n, S) have the released ``means`` (S,): all, or all
    but the ``m`` rows of ``values`` (n, C) farthest from their median (m = 1, 2, 4, ...,
    the client's rule for leaving an outlying row out of sums of per-row values)."""
    n = values.shape[0]
    order = np.argsort(-np.linalg.norm(values - lower_median(values), axis=1), kind="stable")
    for m in [0] + [2**j for j in range(int(math.log2(max(n // 2, 1))) + 1)]:
        keep = np.ones(n, dtype=bool)
        keep[order[:m]] = False
        if same_means(summed[keep], means, summed):
            return keep
    pytest.fail(f"{what}: released means are no mean of the rows' values")


def check_cluster_em(algorithm, r, reply, X, t, what):
    config = algorithm.config
    ct = config.covariance_type
    scores = r["cluster_log_likelihood"]
    assert scores.shape[0] <= config.n_clusters, f"{what}: more cluster rows than configured"
    assert r["counts"].shape[0] <= own_limit(algorithm)
    log_n = log_gauss(X, t["means"], t["precisions_cholesky"], ct)
    clw = t["cluster_log_weights"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        per_row = np.stack([softmax_rows(log_n + clw[c])[1] for c in range(clw.shape[0])], 1)
    finite = np.isfinite(per_row).all(0)
    values = per_row[:, finite]
    whole = float(r["log_likelihood"]) / X.shape[0]
    if np.allclose(scores, whole, rtol=1e-12, atol=0):  # the client's mean log-likelihood
        pass  # a whole-client value, like the log-likelihood itself
    else:
        summed = summed_rows(values, values, scores[finite], what)
        assert_backed(contrast_kish(values[summed]), f"{what}: the cluster log-likelihoods")
    cluster = int(reply.scalars["cluster"])
    check_stats_reply(r, X, clw[cluster], t, ct, what)


def _learner(t: dict, index: int) -> dict[str, np.ndarray]:
    prefix = f"learner.{index}."
    return {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}


def _learner_released(r: dict, t: dict, index: int) -> bool:
    sent = _learner(r, index)
    return any(not np.array_equal(v, t[f"learner.{index}.{k}"]) for k, v in sent.items())


def check_joint(algorithm, r, X, data, t, what):
    config = algorithm.config
    y, Z = data[1].numpy(), X
    k1, k2 = t["means"].shape[0], config.n_learners
    assert r["counts"].shape[0] <= own_limit(algorithm)
    log_n = log_gauss(X, t["means"], t["precisions_cholesky"], config.covariance_type)
    log_py = np.stack([linear_log_py(_learner(t, m), Z, y) for m in range(k2)], 1)
    log_pi = np.log(t["weights"] / k2)[:, None]
    joint = (log_pi[None] + log_n[:, :, None] + log_py[:, None, :]).reshape(len(X), -1)
    q = softmax_rows(joint)[0].reshape(len(X), k1, k2)
    cells = r["joint_counts"] != 0
    assert_backed(kish(q[:, cells]), f"{what}: a joint count")
    for m2 in range(k2):
        if cells[:, m2].any() or _learner_released(r, t, m2):
            assert_backed(kish(q[:, :, m2].sum(1, keepdims=True)), f"{what}: learner {m2}")
    weight = (q * cells[None]).sum(2)  # each Gaussian over its released cells
    check_components(r, weight, X, t["shift"], config.covariance_type, what)


def check_pfedem(algorithm, r, X, data, t, what):
    config = algorithm.config
    k = t["means"].shape[0]
    assert r["hard_counts"].shape[0] <= own_limit(algorithm)
    log_p = log_gauss(X, t["means"], t["precisions_cholesky"], config.covariance_type)
    gamma = softmax_rows(log_p + np.log(t["weights"]))[0]
    hard = np.bincount(gamma.argmax(1), minlength=k).astype(float)
    sent = nonzero_rows(r["hard_counts"])
    for name in ("client_means", "client_vars", "counts", "sums"):
        if name in r:
            sent = sent | nonzero_rows(r[name])
    trained = np.array([_learner_released(r, t, j) for j in range(k)])
    group = sent | trained
    assert np.array_equal(r["hard_counts"][group], hard[group])
    assert_backed(hard[group], f"{what}: a component's partition")
    assert_backed(kish(gamma[:, group]), f"{what}: a component's responsibilities")
    if "counts" in r:
        check_components(r, gamma * group, X, t["shift"], config.covariance_type, what)


def check_local_fit(algorithm, r, X, before, what):
    raw = before["local_fit"]  # the fitted mixture before the gate, all components
    n = X.shape[0]
    config = algorithm.config
    k_range = getattr(config, "k_range", None)  # FedGenGMM's; the one-shot start: K
    most = getattr(config, "client_components", None) or (max(k_range) if k_range else 0)
    assert r["weights"].shape[0] <= int(most or config.n_components)
    kept = [int(np.argmin(np.abs(raw["means"] - m).sum(1))) for m in r["means"]]
    assert np.allclose(raw["means"][kept], r["means"])
    assert_backed(raw["weights"][kept] * n, f"{what}: a local component (weight * n)")
    ct = algorithm.config.covariance_type
    resp = softmax_rows(
        log_gauss(X, raw["means"], raw["precisions_cholesky"], ct) + np.log(raw["weights"])
    )[0]
    assert_backed(kish(resp[:, kept]), f"{what}: a local component's responsibilities")
    assert np.allclose(r["weights"], raw["weights"][kept] / raw["weights"][kept].sum())


# ----------------------------------------------------------------------------- driving
def answer(algorithm, kind: str, message: Message, data, context: ClientContext):
    """``algorithm.answer`` and what the client held or fitted that the recomputation reads
    (its kept weights, a local fit's mixture, a local VB fit's responsibilities)."""
    before: dict = {}
    if kind in ("local_fit", "oneshot"):
        raw = algorithm.client_step(
            data, message, gate.client_context(0, policy=context.terms.policy)
        )
        if not raw.scalars.get("skipped"):
            before["local_fit"] = np_tensors(raw)
    if kind == "vb_local":
        recorded = {}
        original = vb_local.vb_log_resp

        def spy(X, posterior):
            out = original(X, posterior)
            recorded["resp"] = out[1].exp().numpy()
            return out

        with mock.patch.object(vb_local, "vb_log_resp", spy):
            reply = gate.answer(algorithm, data, message, context)
        before["vb_resp"] = recorded.get("resp")
        return reply, before
    reply = gate.answer(algorithm, data, message, context)
    if kind == "stream":
        before["log_weights"] = context.state["log_weights"].numpy()
    return reply, before


HYPOTHESIS = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize(("variant", "kind"), PAIRS, ids=[f"{v}-{k}" for v, k in PAIRS])
@HYPOTHESIS
@given(how=hostile())
@example(  # streaming EM's drift values: ten rows within 1e-8 of each other and one apart
    how={
        "n": 11,
        "far": 10000.0,
        "seed": 0,
        "extra": 0,
        "extra_clusters": 0,
        "place": "rows",
        "log_scale": (1.0, 1.0),
        "weights": "extreme",
        "shift": "template",
        "learner_scale": 1.0,
        "one_row_class": False,
    }
)
@example(  # streaming EM's drift values: components 1000x the rows' spread, so the rows'
    # log p agree to ~1e-6 of their size and a winsorised row moves the mean by less
    how={
        "n": 18,
        "far": 1.0,
        "seed": 30,
        "extra": 0,
        "extra_clusters": 0,
        "place": "rows",
        "log_scale": (3.0, 3.0),
        "weights": "dirichlet",
        "shift": "template",
        "learner_scale": 1.0,
        "one_row_class": False,
    }
)
@example(  # the same at 100x: the clipped rows' mean within 1e-9 of the unclipped one
    how={
        "n": 18,
        "far": 1.0,
        "seed": 2,
        "extra": 0,
        "extra_clusters": 0,
        "place": "rows",
        "log_scale": (2.0, 2.0),
        "weights": "dirichlet",
        "shift": "template",
        "learner_scale": 1.0,
        "one_row_class": False,
    }
)
@example(  # a signed zero in the components' scale range
    how={
        "n": 7,
        "far": 1.0,
        "seed": 0,
        "extra": 0,
        "extra_clusters": 0,
        "place": "rows",
        "log_scale": (0.0, -0.0),
        "weights": "dirichlet",
        "shift": "template",
        "learner_scale": 1.0,
        "one_row_class": False,
    }
)
def test_a_hostile_broadcast_obtains_nothing_below_the_floor(variant, kind, how) -> None:
    algorithm, messages = templates(variant)
    spec = VARIANTS[variant]
    data = client_data(how, spec.labelled)
    if spec.columns:
        data = data[:, : spec.columns]
    X = (data[0] if spec.labelled else data).numpy()
    template = messages[kind]
    message = craft(algorithm, kind, template, client_view(algorithm, X, template), how)
    context = gate.client_context(0, policy=POLICY)
    reply, before = answer(algorithm, kind, message, data, context)
    assert not reply.backing
    check(algorithm, kind, message, data, reply, before)
    if kind == "stream" and algorithm.config.rounds and not reply.scalars.get("skipped"):
        # the window's next round
        message = Message(kind, dict(message.tensors), {**message.scalars, "window_round": 1})
        before = {"log_weights": context.state["log_weights"].numpy()}
        reply = gate.answer(algorithm, data, message, context)
        check(algorithm, kind, message, data, reply, before)


def test_every_registered_algorithm_and_every_kind_it_answers_is_covered() -> None:
    assert {v.registered for v in VARIANTS.values()} == set(registry.ALGORITHMS)
    for variant in VARIANTS:
        algorithm, messages = templates(variant)
        kinds = {k for v, k in PAIRS if v == variant}
        assert kinds <= _answered_kinds(algorithm) & set(messages), variant
    answered = {k for v in VARIANTS for k in _answered_kinds(templates(v)[0])}
    assert answered == {k for _, k in PAIRS}


def test_cluster_rows_beyond_the_clients_own_clusters_are_refused() -> None:
    """A client configured with 2 clusters (4 components in all) answers a broadcast of 3
    cluster rows over its 4 components: refused by its own limit on cluster rows (the
    limit was the larger of components and clusters, so 3 or 4 rows were released)."""
    algorithm, messages = templates("clustered_em")
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(60, D)))
    honest = messages["cluster_em"]
    log_w = torch.full((3, 4), math.log(0.25), dtype=F64)
    message = Message(
        "cluster_em",
        {
            **honest.tensors,
            "component_clusters": torch.tensor([0, 1, 2, 2]),
            "cluster_log_weights": log_w + 0.01 * torch.arange(3.0, dtype=F64).unsqueeze(1),
        },
    )
    reply = gate.answer(algorithm, X, message, gate.client_context(0, policy=POLICY))
    assert reply.scalars.get("skipped"), "3 cluster rows released by a 2-cluster client"
    assert "configuration allows (2)" in reply.scalars["reason"]
    two = Message(
        "cluster_em",
        {**message.tensors, "cluster_log_weights": message.tensors["cluster_log_weights"][:2]},
    )
    released = gate.answer(algorithm, X, two, gate.client_context(0, policy=POLICY))
    assert not released.scalars.get("skipped"), released.scalars


def test_three_cluster_rows_of_a_crafted_broadcast_are_backed_under_every_contrast() -> None:
    """A 3-cluster client of 14 rows under a broadcast with means on its rows: some
    contrasts of its three scores, equal on two pairs of rows, are backed by 4.2 effective
    rows (the search over groups of three rows had found 5.7 and released them)."""
    algorithm, messages = templates("clustered_em3")
    how = {
        "n": 14,
        "far": 1.0,
        "seed": 136,
        "extra": 0,
        "extra_clusters": 0,
        "place": "rows",
        "log_scale": (0.0, 0.0),
        "weights": "dirichlet",
        "shift": "zero",
        "learner_scale": 1.0,
        "one_row_class": False,
    }
    data = client_data(how, labelled=False)
    message = craft(algorithm, "cluster_em", messages["cluster_em"], data.numpy(), how)
    context = gate.client_context(0, policy=POLICY)
    reply, before = answer(algorithm, "cluster_em", message, data, context)
    check(algorithm, "cluster_em", message, data, reply, before)
