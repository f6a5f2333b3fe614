"""Per-component views of a fitted mixture detector, and per-row explanations.

A detector's *components* are the Gaussians ``N(mu_k, Sigma_k)`` of one mixture, with the
weights ``pi_k`` of that mixture, in the space they model:

- ``FedGMMDetector`` (DEM, CentralGMM, the joint model's ``p(x)``) and ``FedGenGMMDetector``:
  the fitted mixture ``model_`` (``weights_``, ``means_``, ...). With ``copula=True``
  FedGenGMM scores with its Gaussian copula; its components are still those of the plain
  global mixture it holds, whose log-density is then not ``score_samples``.
- ``LocalGMMDetector``: the union of the client mixtures, client ``c``'s components in
  ``client_models_`` order, weighted by ``client_shares_[c] * pi_ck`` (uniform shares for a
  model saved without them). With ``combine="mixture"`` its log-density is
  ``score_samples``; with ``combine="mean"`` the score is the mean of the client models'
  log-densities, not this mixture's.
- ``FedMFADetector`` with ``n_members > 1``: every member's components one after another
  (``member_components_``), weights over the members; the score is the mean of the members'
  log-densities, not this mixture's.
- With ``pca_components`` (FedGMM) the Gaussians model the rows' projection
  ``z = W (x - m)`` (``W`` orthonormal rows); rows are projected before every computation.

:func:`mahalanobis_shares` splits a row's squared Mahalanobis distance to a component,
``d^2 = delta^T P delta`` with ``delta = x - mu_k`` and ``P = Sigma_k^{-1}``, into one share
per feature, ``delta_j (P delta)_j / d^2``; the shares sum to 1. With a full or tied
covariance, correlated features can give a share below 0 (a feature whose deviation is
expected given the others' lowers the distance) and another above 1; with ``diag`` and
``spherical`` every share is in [0, 1]. Under a PCA projection the same split is made in the
original features with ``P_x = W^T P W`` and ``delta = x - m - W^T mu_k`` (as ``W W^T = I``,
``delta^T P_x delta`` is the distance the Gaussians see), so shares name the input features.
A row at the component's mean (``d^2 = 0``) gets shares of 0.

The math is pure functions of torch tensors; :class:`ComponentsMixin` gives every
``MixtureDetector`` the public methods (``component_log_densities``, ``component_weights``,
``responsibilities``, ``predict_components``, ``explain``), which validate their input like
``score_samples`` and return numpy arrays or a DataFrame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from fednovelty.mixture import MixtureParams, log_gaussian_prob, predict_proba
from fednovelty.mixture.density import default_chunk_size
from fednovelty.runtime.threads import scoring_threads

__all__ = [
    "EXPLAIN_COLUMNS",
    "Components",
    "ComponentsMixin",
    "components_of",
    "log_densities",
    "mahalanobis_shares",
    "responsibilities",
    "union_mixture",
]


#: The columns ``explain`` puts before the features' shares.
EXPLAIN_COLUMNS = ("component", "responsibility", "mahalanobis_sq")


@dataclass(frozen=True)
class Components:
    """The Gaussian components a detector's per-component API reports.

    Attributes:
        params: the mixture, ``n_components`` Gaussians over ``n_dims`` dimensions.
        projection: maps rows (n_samples, n_features) to the Gaussians' (n_samples, n_dims)
            by ``(X - projection.mean) @ projection.components.T`` (a ``PCAProjection``),
            or ``None`` when the Gaussians model the rows themselves.
    """

    params: MixtureParams
    projection: Any = None

    @property
    def n_components(self) -> int:
        return self.params.n_components

    def project(self, X: Tensor) -> Tensor:
        """The Gaussians' view of rows ``X`` (n_samples, n_features) -> (n_samples, n_dims)."""
        return X if self.projection is None else self.projection.transform(X)


def union_mixture(models: list[MixtureParams], shares: Tensor) -> MixtureParams:
    """One mixture holding every component of ``models``, model ``c``'s weights scaled by
    ``shares[c]``.

    Args:
        models: mixtures over the same features, one covariance type.
        shares: (n_models,) non-negative, summing to 1.

    Returns:
        ``MixtureParams`` with ``sum_c K_c`` components in model order. Tied models become
        one full covariance per component when there is more than one model.
    """
    if not models:
        raise ValueError("union_mixture needs at least one mixture.")
    covariance_type = models[0].covariance_type
    if any(m.covariance_type != covariance_type for m in models):
        raise ValueError("union_mixture needs mixtures of one covariance type.")
    if len(models) == 1:
        return models[0]
    factors = []
    for model in models:
        chol = model.precisions_cholesky
        if covariance_type == "tied":
            chol = chol.expand(model.n_components, *chol.shape)
        factors.append(chol)
    weights = torch.cat([s * m.weights for s, m in zip(shares, models, strict=True)])
    return MixtureParams(
        weights,
        torch.cat([m.means for m in models]),
        torch.cat(factors),
        "full" if covariance_type == "tied" else covariance_type,
    )


def components_of(detector) -> Components:
    """The components of a fitted fednovelty detector (see the module doc), on its device
    and dtype.

    Raises:
        TypeError: the detector holds neither ``model_`` nor ``client_models_``.
    """
    if hasattr(detector, "model_"):
        return Components(detector.model_, getattr(detector, "pca_", None))
    models = getattr(detector, "client_models_", None)
    if not models:
        raise TypeError(
            f"{type(detector).__name__} holds no Gaussian mixture (neither model_ nor "
            "client_models_); it has no components."
        )
    shares = getattr(detector, "client_shares_", None)
    like = models[0].weights
    if shares is None:
        shares = torch.full((len(models),), 1.0 / len(models), dtype=like.dtype)
    return Components(union_mixture(models, torch.as_tensor(shares).to(like)))


def log_densities(components: Components, X: Tensor, chunk_size: int | None = None) -> Tensor:
    """``log N(z_i; mu_k, Sigma_k)`` of each row under each component, without the weights.

    Args:
        components: the Gaussians.
        X: rows (n_samples, n_features); projected first when ``components.projection``.
        chunk_size: rows per chunk (default from the mixture's size).

    Returns:
        (n_samples, n_components).
    """
    params = components.params
    Z = components.project(X)
    size = chunk_size or default_chunk_size(params.n_components, params.n_features)
    parts = [
        log_gaussian_prob(
            Z[start : start + size],
            params.means,
            params.precisions_cholesky,
            params.covariance_type,
        )
        for start in range(0, Z.shape[0], size)
    ]
    return torch.cat(parts) if parts else Z.new_zeros(0, params.n_components)


def responsibilities(
    components: Components, X: Tensor, log_weights: Tensor | None = None
) -> Tensor:
    """Posterior probability of each component for each row, ``pi_k N_k / sum_l pi_l N_l``.

    Args:
        components: the Gaussians.
        X: rows (n_samples, n_features).
        log_weights: (n_components,) ``log pi`` to use instead of the mixture's weights
            (e.g. a client's personal weights).

    Returns:
        (n_samples, n_components), rows summing to 1.
    """
    return predict_proba(components.params, components.project(X), log_weights)


def mahalanobis_shares(components: Components, X: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Each feature's share of each row's squared Mahalanobis distance to one component.

    Args:
        components: the Gaussians.
        X: rows (n_samples, n_features).
        labels: (n_samples,) int64, the component of each row.

    Returns:
        ``(shares, distances)``: shares (n_samples, n_features), each row summing to 1
        (0 everywhere for a row at its component's mean), and the squared distances
        ``d^2`` (n_samples,). See the module doc for the formula and its signs.
    """
    params = components.params
    Z = components.project(X)
    delta = Z - params.means[labels]  # (n, n_dims)
    weighted = torch.empty_like(delta)  # P delta, row by row
    ct, chol = params.covariance_type, params.precisions_cholesky
    if ct == "tied":
        weighted = (delta @ chol) @ chol.T
    elif ct == "full":
        for k in torch.unique(labels).tolist():
            rows = labels == k
            weighted[rows] = (delta[rows] @ chol[k]) @ chol[k].T
    elif ct == "diag":
        weighted = delta * chol[labels].square()
    else:
        weighted = delta * chol[labels].square().unsqueeze(1)
    distances = (delta * weighted).sum(1)
    projection = components.projection
    if projection is not None:  # back to the input features: P_x = W^T P W
        W = projection.components
        delta = X.to(W) - projection.mean - params.means[labels] @ W
        weighted = weighted @ W
    products = delta * weighted
    scale = torch.where(distances > 0, distances, torch.ones_like(distances))
    shares = torch.where(
        (distances > 0).unsqueeze(1), products / scale.unsqueeze(1), torch.zeros_like(products)
    )
    return shares, distances


def check_client_weights(weights, n_components: int) -> np.ndarray:
    """Mixture weights of a client as (n_components,) float64: a joint model's (M1, M2)
    weights are summed over the learners.

    Raises:
        ValueError: another shape, or a weight that is negative or not finite.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim == 2:
        weights = weights.sum(1)
    if weights.shape != (n_components,):
        raise ValueError(
            f"client weights of shape {weights.shape} do not fit a model with {n_components} "
            "components; pass a client id seen in fit or a handle from this detector's adapt."
        )
    if not (np.isfinite(weights).all() and (weights >= 0).all()):
        raise ValueError("client weights must be finite and non-negative.")
    return weights


class ComponentsMixin:
    """The per-component API of the mixture detectors (see the module doc).

    Needs from the detector: ``_check_score_input`` (validated torch rows), ``_components``
    (default :func:`components_of`), ``client_ids_`` and, for ``client=`` ids,
    ``client_weights_`` (n_clients, n_components) in ``client_ids_`` order.
    """

    def _components(self) -> Components:
        """The Gaussians the per-component API reports; a detector whose model is neither
        one mixture (``model_``) nor a union of client mixtures overrides this."""
        return components_of(self)

    def _client_index(self, client) -> int:
        """Position of a client id seen in fit in ``client_ids_``.

        Raises:
            TypeError: not a number or a string. ValueError: not seen in fit.
        """
        self._check_fitted()
        if isinstance(client, bool) or not isinstance(client, int | str | np.generic):
            raise TypeError(
                f"client must be a client id seen in fit or a handle from adapt(); got "
                f"{type(client).__name__}."
            )
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            ids = self.client_ids_.tolist()
            raise ValueError(
                f"client {client!r} was not seen in fit; known clients: {ids[:10]}"
                f"{'...' if len(ids) > 10 else ''}."
            )
        return int(matches[0])

    def _weights(self, components: Components, client) -> np.ndarray:
        """``pi`` (n_components,) float64: the mixture's, a fitted client's personal weights
        (``client_weights_``) or an ``adapt`` handle's."""
        k = components.n_components
        if client is None:
            return components.params.weights.cpu().numpy().astype(np.float64)
        if hasattr(client, "weights"):  # a handle from adapt()
            return check_client_weights(client.weights, k)
        index = self._client_index(client)
        if not hasattr(self, "client_weights_"):
            raise ValueError(
                f"{type(self).__name__} has no per-client mixture weights; call without "
                "client= (FedGMMDetector has them with mixture_weights='personal')."
            )
        return check_client_weights(self.client_weights_[index], k)

    def _log_weights(self, components: Components, client, like: Tensor) -> Tensor | None:
        """``log pi`` of ``client`` on ``like``'s device and dtype; ``None`` for the
        mixture's own weights."""
        if client is None:
            return None
        with np.errstate(divide="ignore"):
            return torch.as_tensor(np.log(self._weights(components, client))).to(like)

    def _component_rows(self, X) -> tuple[Components, Tensor]:
        Xt = self._check_score_input(X)
        components = self._components()
        return components, Xt.to(components.params.means)

    def component_weights(self, *, client=None) -> np.ndarray:
        """The components' mixture weights ``pi_k``, shape (n_components,).

        Args:
            client: ``None`` for the model's weights, a client id seen in fit for its
                personal weights (models with ``client_weights_``), or a handle returned by
                ``adapt``.
        """
        self._check_fitted()
        return self._weights(self._components(), client)

    def component_log_densities(self, X) -> np.ndarray:
        """``log N(x; mu_k, Sigma_k)`` of every row under every component, without the
        mixture weights (scikit-learn's ``GaussianMixture._estimate_log_prob``); add
        ``np.log(component_weights())`` for ``log pi_k N_k``.

        Args:
            X: rows (n_samples, n_features), array or DataFrame (validated as in
                ``score_samples``).

        Returns:
            (n_samples, n_components) float64.
        """
        components, Xt = self._component_rows(X)
        with torch.no_grad(), _threads(Xt, components):
            values = log_densities(components, Xt)
        return values.cpu().numpy().astype(np.float64)

    def responsibilities(self, X, *, client=None) -> np.ndarray:
        """Posterior probability of each component for each row (scikit-learn's
        ``GaussianMixture.predict_proba``), shape (n_samples, n_components), rows summing
        to 1; ``client`` as in :meth:`component_weights`."""
        components, Xt = self._component_rows(X)
        log_pi = self._log_weights(components, client, Xt)
        with torch.no_grad(), _threads(Xt, components):
            values = responsibilities(components, Xt, log_pi)
        return values.cpu().numpy().astype(np.float64)

    def predict_components(self, X, *, client=None) -> np.ndarray:
        """Index of the most responsible component of each row, shape (n_samples,) int64
        (scikit-learn's ``GaussianMixture.predict``); ``client`` as in
        :meth:`component_weights`."""
        return self.responsibilities(X, client=client).argmax(1).astype(np.int64)

    def explain(self, X, *, client=None) -> pd.DataFrame:
        """Which component explains each row best, and how much each feature adds to the
        row's distance from it.

        For each row: the component with the highest responsibility, that responsibility,
        the squared Mahalanobis distance ``d^2 = delta^T Sigma_k^{-1} delta`` to it and each
        feature's share ``delta_j (Sigma_k^{-1} delta)_j / d^2`` of it. Shares sum to 1;
        with a full or tied covariance and correlated features a share can be negative (the
        module doc of ``fednovelty.detectors.explain`` says why). A large share marks the
        feature that makes the row unusual for the component it is closest to.

        Args:
            X: rows (n_samples, n_features), array or DataFrame.
            client: as in :meth:`component_weights` (changes which component is chosen).

        Returns:
            DataFrame indexed like ``X`` (a DataFrame's index, else ``0..n-1``) with
            ``component`` (int), ``responsibility``, ``mahalanobis_sq`` and one share column
            per feature, named as ``feature_names_in_`` (``x0, x1, ...`` for a model fitted
            on an array).

        Raises:
            ValueError: X is not valid for this model (width, NaN, names), ``client`` is
                unknown, or a feature is named like one of the first three columns.
        """
        components, Xt = self._component_rows(X)
        names = getattr(self, "feature_names_in_", None)
        names = [f"x{j}" for j in range(Xt.shape[1])] if names is None else list(names)
        clash = sorted(set(names) & set(EXPLAIN_COLUMNS))
        if clash:
            raise ValueError(
                f"feature(s) {clash} are named like explain's own columns {EXPLAIN_COLUMNS}; "
                "rename them before fitting."
            )
        log_pi = self._log_weights(components, client, Xt)
        with torch.no_grad(), _threads(Xt, components):
            resp = responsibilities(components, Xt, log_pi)
            best = resp.max(1)
            shares, distances = mahalanobis_shares(components, Xt, best.indices)
        table = pd.DataFrame(
            shares.cpu().numpy().astype(np.float64),
            columns=names,
            index=X.index if isinstance(X, pd.DataFrame) else None,
        )
        table.insert(0, "mahalanobis_sq", distances.cpu().numpy().astype(np.float64))
        table.insert(0, "responsibility", best.values.cpu().numpy().astype(np.float64))
        table.insert(0, "component", best.indices.cpu().numpy().astype(np.int64))
        return table


def _threads(X: Tensor, components: Components):
    """The thread count ``score_samples`` would choose for this work."""
    return scoring_threads(X.shape[0], X.shape[1], components.n_components)
