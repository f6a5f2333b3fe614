"""Federated kNN-distance markers: a Dir-NIG mixture of the clients' nearest-neighbour distances.

The VGM2 paper's "mixture relation markers" (Sec. 3.3) model a one-dimensional distance with
a K-component Gaussian mixture under a Dirichlet prior on the weights and a
Normal-Inverse-Gamma prior on each component's mean and variance; the posterior predictive is
a mixture of Student-t densities. A one-dimensional Normal-Inverse-Gamma is the Normal-Wishart
of :mod:`fednovelty.mixture.variational` with ``n_features = 1``, so this module adds no
variational math of its own: it feeds federated VB a one-column feature and reads its
predictive.

The feature (:func:`knn_log_distances`): every client, on its own rows only, takes each row's
leave-one-out Euclidean distance ``d_k`` to its ``n_neighbors``-th nearest other row of the
same client (scikit-learn's ``NearestNeighbors``), and works with
``log(d_k + distance_floor)``: the log turns the distances' long right tail into a shift, the
floor keeps duplicate rows finite.

``FederatedKNNMarkers`` is federated VB on that feature::

    kNN view (no round) + FederatedVB's chain (prior moments, k-means init, VB)

:class:`KNNDistanceStep` replaces a client's rows by its column of log distances (computed
once, kept in the client's state); only one-dimensional statistics cross the wire. A client
with fewer than ``n_neighbors + 1`` rows skips. Each client then personalises the global
posterior with its own distances (:func:`personal_posterior`, no round) and scores a query
by its predictive upper-tail probability (:func:`predictive_log_tail`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from scipy import stats as scipy_stats
from scipy.special import logsumexp
from sklearn.neighbors import NearestNeighbors
from torch import Tensor

from fednovelty.federated.bayesian.variational import VBConfig, VBState, vb_steps
from fednovelty.federated.core.base import ClientContext, Message
from fednovelty.federated.core.config import at_least, settings_dataclass
from fednovelty.federated.core.steps import ChainedAlgorithm, ClientSkip, NoRoundStep
from fednovelty.mixture.stats import SufficientStats
from fednovelty.mixture.variational import VBPosterior, vb_e_step_stats, vb_m_step
from fednovelty.mixture.vb_predictive import vb_predictive_components
from fednovelty.mixture.vb_prior import VBPrior

__all__ = [
    "FederatedKNNMarkers",
    "KNNDistanceStep",
    "KNNMarkerConfig",
    "knn_log_distances",
    "kth_neighbor_distances",
    "personal_posterior",
    "predictive_log_tail",
]

#: key of a client's cached log distances in its ``ClientContext.state``.
CACHE_KEY = "knn_markers.log_distance"


@settings_dataclass
class KNNMarkerConfig(VBConfig):
    """Settings of federated kNN-distance markers (``FederatedKNNMarkers``): federated
    variational Bayes' (:class:`~fednovelty.federated.bayesian.variational.VBConfig`), applied to
    the one-column feature ``log(d_k + distance_floor)`` (``d_k`` a row's leave-one-out
    distance to its ``n_neighbors``-th nearest row of its own client), and:

    Attributes:
        n_neighbors: ``k`` (>= 1); a client needs ``k + 1`` rows to take part.
        distance_floor: added to every distance before the log (> 0), so duplicate rows
            (distance 0) give a finite feature; in the rows' units.

    ``covariance_type`` is ``"full"``: for one column every type is the same model.
    """

    COVARIANCE_CHOICES: ClassVar[tuple[str, ...]] = ("full",)

    n_neighbors: int = 5
    distance_floor: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("n_neighbors", int(at_least("n_neighbors", self.n_neighbors, 1)))
        floor = self.distance_floor
        if isinstance(floor, bool) or not (float(floor) > 0 and math.isfinite(float(floor))):
            raise ValueError(f"distance_floor must be a finite number > 0, got {floor!r}.")
        self._set("distance_floor", float(floor))


# --------------------------------------------------------------------------- distances


def kth_neighbor_distances(
    reference: np.ndarray, queries: np.ndarray | None, n_neighbors: int
) -> np.ndarray:
    """Euclidean distance of each query to its ``n_neighbors``-th nearest reference row.

    Args:
        reference: a client's rows (n_reference, n_features), ``n_reference >= n_neighbors``
            (``>= n_neighbors + 1`` when ``queries`` is ``None``).
        queries: (n_queries, n_features) rows that are not reference rows; ``None``: the
            reference rows themselves, each leaving itself out (its own zero distance is
            dropped, duplicates of it are kept).
        n_neighbors: ``k`` >= 1.

    Returns:
        Distances, shape (n_queries,) (or (n_reference,)), float64.
    """
    reference = np.asarray(reference, dtype=np.float64)
    own = queries is None
    k = n_neighbors + 1 if own else n_neighbors
    if reference.shape[0] < k:
        raise ValueError(
            f"the {n_neighbors}-th nearest neighbour needs >= {k} reference rows, got "
            f"{reference.shape[0]}."
        )
    index = NearestNeighbors(n_neighbors=n_neighbors).fit(reference)
    # kneighbors(None) leaves each reference row out: its k nearest *other* rows.
    distances, _ = index.kneighbors(None if own else np.asarray(queries, dtype=np.float64))
    return distances[:, -1]


def knn_log_distances(X: Tensor, n_neighbors: int, distance_floor: float) -> Tensor:
    """``log(d_k + distance_floor)`` of each row of ``X`` (n_samples, n_features), ``d_k``
    its leave-one-out distance to its ``n_neighbors``-th nearest other row of ``X``; shape
    (n_samples, 1), ``X``'s dtype and device."""
    distances = kth_neighbor_distances(X.detach().cpu().double().numpy(), None, n_neighbors)
    column = torch.as_tensor(np.log(distances + distance_floor)).unsqueeze(1)
    return column.to(X.device, X.dtype)


class KNNDistanceStep(NoRoundStep):
    """No round of its own: later rounds see each client's ``(n_c, 1)`` log kNN distances
    instead of its rows (module docstring)."""

    def broadcast(self, state: Any) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {}, {"n_features": 1}

    def view(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        k = self.config.n_neighbors
        if X.shape[0] < k + 1:
            raise ClientSkip(
                f"{X.shape[0]} row(s): a leave-one-out distance to the n_neighbors={k}-th "
                f"neighbour needs >= {k + 1} rows"
            )
        cached = context.state.get(CACHE_KEY)
        if cached is None or cached.shape[0] != X.shape[0]:
            cached = knn_log_distances(X, k, self.config.distance_floor)
            context.state[CACHE_KEY] = cached
        return cached.to(X.device, X.dtype)


class FederatedKNNMarkers(ChainedAlgorithm):
    """Federated VB of the clients' log kNN distances (see the module docstring).

    ``FederatedKNNMarkers(n_components, n_neighbors=5, **settings)`` with the settings of
    :class:`KNNMarkerConfig`, or ``from_config``. The result is
    ``state.posterior``, a one-feature
    :class:`~fednovelty.mixture.variational.VBPosterior` of ``log(d_k + distance_floor)``.
    """

    config_class = KNNMarkerConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(KNNMarkerConfig(n_components=n_components, **settings))

    def _setup(self, config: KNNMarkerConfig) -> None:
        super()._setup(config)
        self._chain([KNNDistanceStep(config), *vb_steps(config)])

    def new_state(self) -> VBState:
        return VBState(phase="")


# --------------------------------------------------------------------------- personal


def _component(stats: SufficientStats, k: int) -> SufficientStats:
    """Component ``k`` of ``full`` statistics as one-component statistics."""
    return replace(
        stats,
        counts=stats.counts[k : k + 1],
        sums=stats.sums[k : k + 1],
        second=stats.second[k : k + 1],
    )


def tempered_priors(posterior: VBPosterior, strength: float) -> list[VBPrior]:
    """One Normal-Wishart prior per component of ``posterior`` (``full``): component ``k``
    worth ``n_k = max(strength * E[pi_k], tiny)`` pseudo-rows (weight concentration and mean
    precision ``n_k``, degrees of freedom ``n_features + n_k``), with the posterior's mean and
    expected precision (``W_0^-1 = covariances_k * dof``)."""
    tiny = 1e3 * torch.finfo(posterior.means.dtype).eps
    pseudo = (strength * posterior.weights).clamp_min(tiny)
    d = posterior.n_features
    priors = []
    for k in range(posterior.n_components):
        n_k = float(pseudo[k])
        dof = d + n_k
        priors.append(
            VBPrior(
                weight_concentration_prior_type="dirichlet_distribution",
                weight_concentration=n_k,
                mean_precision=n_k,
                mean=posterior.means[k],
                degrees_of_freedom=dof,
                covariance=posterior.covariances[k] * dof,
                covariance_type="full",
            )
        )
    return priors


def personal_posterior(
    log_distances: Tensor,
    posterior: VBPosterior,
    *,
    strength: float,
    n_iter: int = 10,
    reg_covar: float = 1e-6,
) -> VBPosterior:
    """A client's personal posterior: its own log distances under the global posterior as a
    tempered prior (the VGM2 paper's server prior).

    It runs on the client, in no round. A kNN distance shrinks
    with the size of the set it is taken in (roughly as ``n_c ** (-1 / intrinsic dimension)``)
    and with the client's own region of the data, so one pooled distribution does not describe
    any one client's distances. Each client therefore updates the global posterior with its own
    distances, the VGM2 paper's "server prior": the prior of component ``k`` is the global
    posterior's component tempered to ``prior_strength * E[pi_k]`` pseudo-rows (weight
    concentration, mean precision and degrees of freedom above 1 alike, the expected precision
    kept), and a few local variational iterations (E-step under the current personal posterior,
    the conjugate M-step of :func:`~fednovelty.mixture.variational.vb_m_step` run per component
    with that component's prior) give the client's personal Dir-NIG posterior. It stays on the
    client; nothing is sent.

    Args:
        log_distances: the client's feature, shape (n_c, 1).
        posterior: the global ``full`` posterior (one feature).
        strength: pseudo-rows the global posterior is worth in all (> 0); the larger, the
            closer the result stays to the global posterior.
        n_iter: local variational iterations (E-step under the current posterior, conjugate
            M-step per component under its tempered prior), >= 1.
        reg_covar: added to each weighted variance, as in federated VB.

    Returns:
        The personal posterior (``dirichlet_distribution`` weights; the components keep their
        order and number).
    """
    if posterior.covariance_type != "full":
        raise ValueError("personal_posterior needs a 'full' posterior.")
    if not strength > 0:
        raise ValueError(f"strength must be > 0, got {strength}.")
    priors = tempered_priors(posterior, strength)
    current = posterior
    for _ in range(max(int(n_iter), 1)):
        shift = current.weights @ current.means
        stats = vb_e_step_stats(log_distances, current, shift)
        parts = [
            vb_m_step(_component(stats, k), prior, reg_covar) for k, prior in enumerate(priors)
        ]
        current = VBPosterior(
            weight_concentration=torch.cat([p.weight_concentration for p in parts]),
            mean_precision=torch.cat([p.mean_precision for p in parts]),
            means=torch.cat([p.means for p in parts]),
            degrees_of_freedom=torch.cat([p.degrees_of_freedom for p in parts]),
            covariances=torch.cat([p.covariances for p in parts]),
            precisions_cholesky=torch.cat([p.precisions_cholesky for p in parts]),
            covariance_type="full",
            weight_concentration_prior_type="dirichlet_distribution",
        )
    return current


# --------------------------------------------------------------------------- scoring


def _t_log_sf(z: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """``log P(T > z)`` for Student-t ``T`` with ``dof`` degrees of freedom (broadcast),
    finite far in the upper tail (Mills-ratio asymptote where scipy underflows) and ``-inf``
    at ``z = +inf`` (a distance that overflowed: nothing lies beyond it), never NaN."""
    out = np.array(scipy_stats.t.logsf(z, dof), dtype=np.float64)
    beyond = np.broadcast_to(np.isposinf(z), out.shape)
    out[beyond] = -np.inf
    far = (~np.isfinite(out) | (out < -600.0)) & ~beyond
    if far.any():
        zf = np.broadcast_to(z, out.shape)[far]
        nu = np.broadcast_to(dof, out.shape)[far]
        asymptote = scipy_stats.t.logpdf(zf, nu) + np.log((nu + zf * zf) / ((nu + 1.0) * zf))
        out[far] = asymptote
    return out


def predictive_log_tail(values: np.ndarray, posterior: VBPosterior) -> np.ndarray:
    """``log P(V > v)`` of each value under the posterior predictive of a one-feature
    posterior (a Student-t mixture, Bishop PRML 10.81), shape (n_values,).

    For the kNN markers this is the upper-tail probability ``P(D > log(d + floor))`` of a
    query's log distance ``d`` to the client's ``n_neighbors``-th nearest row, under the
    client's Student-t mixture: ``sum_k E[pi_k] sf_t((v - m_k) / s_k; nu_k)``, in log
    space. For a query drawn like the client's rows this is roughly uniform on [0, 1] (a
    calibrated p-value); far rows get tiny values. ``scipy``'s log survival function of the t
    distribution underflows to ``-inf`` far in the tail for many degrees of freedom; there the
    tail is replaced by its Mills-ratio asymptote ``log pdf(z) + log((nu + z^2) / ((nu + 1)
    z))``, exact to leading order for large ``z``, so scores stay finite and ordered.

    Args:
        values: (n_values,) values of the modelled feature (log distances).
        posterior: a one-feature :class:`~fednovelty.mixture.variational.VBPosterior`.
    """
    if posterior.n_features != 1:
        raise ValueError(
            f"predictive_log_tail needs a one-feature posterior, got {posterior.n_features}."
        )
    t_dof, _, log_det_scale = vb_predictive_components(posterior)
    dof = t_dof.detach().cpu().double().numpy()
    scale = np.exp(0.5 * log_det_scale.detach().cpu().double().numpy())
    means = posterior.means[:, 0].detach().cpu().double().numpy()
    with np.errstate(divide="ignore"):  # a weight that underflowed to 0 adds nothing
        log_w = np.log(posterior.weights.detach().cpu().double().numpy())
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    per_component = _t_log_sf((v - means) / scale, dof) + log_w
    return np.minimum(logsumexp(per_component, axis=1), 0.0)
