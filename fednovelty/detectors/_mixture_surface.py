"""scikit-learn's ``GaussianMixture`` surface on the mixture detectors.

:class:`MixtureSurfaceMixin` gives every ``MixtureDetector`` what a ``GaussianMixture`` user
reaches for, computed from the detector's own density and components:

- ``score(X, y=None)``: the mean of ``score_samples(X)``, the mean log-likelihood per row.
- ``bic(X)`` and ``aic(X)``: scikit-learn's formulas, ``-2 n score(X) + p log n`` and
  ``-2 n score(X) + 2 p``, with ``p`` the free parameters of the mixture ``score_samples``
  evaluates (:meth:`MixtureSurfaceMixin._n_parameters`). They are refused, with the reason,
  where ``score_samples`` is not a maximum-likelihood Gaussian mixture's log-density: the
  federated PCA front end (the residual term of the discarded directions), FedGenGMM's
  copula, LocalGMM's ``combine="mean"`` and ``n_members > 1`` (means of log-densities) and
  variational Bayes (scikit-learn's ``BayesianGaussianMixture`` has no ``bic``/``aic``
  either; its evidence bound is ``lower_bound_``).
- ``sample(n_samples=1, random_state=None)``: rows and their component labels drawn from the
  Gaussians of the per-component API (``_components``): the global mixture ``model_``, the
  factor analysers as full Gaussians, LocalGMM's union of client mixtures; variational Bayes'
  plug-in mixture (as ``BayesianGaussianMixture.sample``). Refused where ``score_samples`` is
  not that mixture's density (PCA front end, copula, ``combine="mean"``, ``n_members > 1``).
- ``lower_bound_``: the last of ``lower_bounds_`` where the fit recorded them.
- ``fit_predict(X, y=None, groups=None, **kwargs)``: ``fit`` then PyOD's ``labels_`` (1 =
  outlier, 0 = inlier), with the clients' ``groups``.

Which parameters are counted: the mixture ``score_samples`` uses. Personal weights
(``client_weights_``) and a joint model's label models are not part of that density and are
not counted; every component of the mixture is counted, an emptied one (weight 0) included,
as scikit-learn counts every component of ``GaussianMixture``.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import torch

from fednovelty.detectors._fit_state import seed_from
from fednovelty.mixture import n_parameters, sample
from fednovelty.mixture.factor import FactorParams


def factor_n_parameters(n_components: int, n_features: int, n_factors: int) -> int:
    """Free parameters of a mixture of factor analysers with a noise variance per feature
    and component: per component ``d`` means, ``d`` noise variances and ``d q - q (q-1) / 2``
    loadings (the loadings are identified up to a rotation of the ``q`` factors); plus
    ``K - 1`` weights."""
    d, q = n_features, n_factors
    per_component = 2 * d + d * q - q * (q - 1) // 2
    return n_components * per_component + n_components - 1


def density_refusal(detector) -> str | None:
    """Why ``detector.score_samples`` is not the log-density of the Gaussians of its
    per-component API (``_components``), or None when it is."""
    name = type(detector).__name__
    if getattr(detector, "pca_", None) is not None:
        return (
            f"this {name} was fitted with the federated PCA front end (pca_components): "
            "score_samples adds the probabilistic-PCA residual of the discarded directions to "
            "the mixture of the projected rows, so it is not one Gaussian mixture of x; refit "
            "with pca_components=None for a mixture of x"
        )
    if getattr(detector, "copula_joint_", None) is not None:
        return (
            f"this {name} scores with its Gaussian copula (copula=True), whose density is not "
            "the Gaussian mixture it holds; refit with copula=False for a mixture density"
        )
    members = getattr(detector, "member_components_", ())
    if len(members) > 1:
        return (
            f"this {name} scores with the mean of its {len(members)} members' log-densities "
            "(n_members), which is not one mixture's density; refit with n_members=1 for a "
            "mixture density"
        )
    if getattr(detector, "combine", None) == "mean":
        return (
            f"this {name} scores with combine='mean', the mean of the client models' "
            "log-densities, which is not a density; use combine='mixture' (the clients' "
            "mixtures weighted by their shares of the rows)"
        )
    return None


def check_n_samples(n_samples) -> int:
    """``n_samples`` as an int >= 1, or a ValueError that names it."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, Integral) or n_samples < 1:
        raise ValueError(
            f"n_samples must be an integer >= 1 (the number of rows to draw); got {n_samples!r}."
        )
    return int(n_samples)


class MixtureSurfaceMixin:
    """scikit-learn's ``GaussianMixture`` methods on a mixture detector (see the module doc).

    Needs from the detector: ``_check_fitted``, ``score_samples``, ``_components``, ``fit``,
    ``random_state`` and, where the fit records them, ``lower_bounds_`` and ``model_``.
    """

    def score(self, X, y=None) -> float:
        """Mean log-likelihood per row, ``mean(score_samples(X))`` (scikit-learn's
        ``GaussianMixture.score``); higher = more normal.

        Args:
            X: rows (n_samples, n_features), checked as ``score_samples`` checks them.
            y: ignored (present for API consistency).
        """
        return float(np.mean(self.score_samples(X)))

    def _n_parameters(self) -> int:
        """Free parameters of the mixture ``score_samples`` evaluates (scikit-learn's
        ``GaussianMixture._n_parameters`` count: covariances, means and ``K - 1`` weights).

        Raises:
            NotImplementedError: ``score_samples`` is not a maximum-likelihood Gaussian
                mixture's log-density (the reason is in the message).
        """
        self._check_fitted()
        reason = density_refusal(self)
        if reason is None and hasattr(self, "posterior_"):
            reason = (
                f"{type(self).__name__} is a variational Bayes fit: its prior prunes "
                "components and its evidence bound (lower_bound_) compares fits, as for "
                "scikit-learn's BayesianGaussianMixture, which has no bic or aic either"
            )
        if reason is not None:
            raise NotImplementedError(f"bic and aic are not defined here: {reason}.")
        model = getattr(self, "model_", None)
        if isinstance(model, FactorParams):
            return factor_n_parameters(model.n_components, model.n_features, model.n_factors)
        if model is not None:
            return n_parameters(model.covariance_type, model.n_components, model.n_features)
        models = self.client_models_  # LocalGMM: the clients' mixtures weighted by shares
        own = sum(n_parameters(m.covariance_type, m.n_components, m.n_features) for m in models)
        return own + len(models) - 1

    def bic(self, X) -> float:
        """Bayesian information criterion on rows ``X`` (n_samples, n_features),
        ``-2 n score(X) + p log n`` with ``p = _n_parameters()``; lower is better.

        Raises:
            NotImplementedError: see :meth:`_n_parameters`.
        """
        p = self._n_parameters()
        log_px = self.score_samples(X)
        return float(-2.0 * log_px.sum() + p * np.log(log_px.shape[0]))

    def aic(self, X) -> float:
        """Akaike information criterion on rows ``X`` (n_samples, n_features),
        ``-2 n score(X) + 2 p`` with ``p = _n_parameters()``; lower is better.

        Raises:
            NotImplementedError: see :meth:`_n_parameters`.
        """
        p = self._n_parameters()
        return float(-2.0 * self.score_samples(X).sum() + 2 * p)

    def sample(self, n_samples=1, random_state=None) -> tuple[np.ndarray, np.ndarray]:
        """Draw rows from the fitted mixture (scikit-learn's ``GaussianMixture.sample``).

        Args:
            n_samples: rows to draw, an int >= 1.
            random_state: an int, ``numpy.random.RandomState`` or None; None uses the
                detector's ``random_state`` (an int there gives the same rows on every
                call, as in scikit-learn).

        Returns:
            ``(X, labels)``: rows (n_samples, n_features) float64 and their components
            (n_samples,) int64, sorted by component, indexes into ``weights_`` (LocalGMM:
            into the union of ``client_models_``, client by client).

        Raises:
            ValueError: ``n_samples`` is not an int >= 1.
            NotImplementedError: ``score_samples`` is not the density of a Gaussian mixture
                the detector holds (the reason is in the message).
        """
        n_samples = check_n_samples(n_samples)
        self._check_fitted()
        reason = density_refusal(self)
        if reason is not None:
            raise NotImplementedError(f"sample is not defined here: {reason}.")
        params = self._components().params
        seed = seed_from(self.random_state if random_state is None else random_state)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            rows, labels = sample(params, n_samples, generator=generator)
        return rows.cpu().numpy().astype(np.float64), labels.cpu().numpy().astype(np.int64)

    @property
    def lower_bound_(self) -> float:
        """The last of ``lower_bounds_`` (the log-likelihood or evidence bound of the final
        round; scikit-learn's ``lower_bound_``), where the fit recorded them."""
        bounds = self.__dict__.get("lower_bounds_")
        if not bounds:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute 'lower_bound_': "
                + (
                    "this fit recorded no bound (lower_bounds_ is empty)."
                    if bounds is not None
                    else "its fit records no per-round bound (no lower_bounds_)."
                )
            )
        return float(bounds[-1])

    def fit_predict(self, X, y=None, groups=None, **kwargs) -> np.ndarray:
        """``fit(X, y, groups, **kwargs)``, then PyOD's outlier labels of the training rows,
        ``labels_`` (n_samples,): 1 = outlier, 0 = inlier. Not scikit-learn's
        ``GaussianMixture.fit_predict`` (component labels): those are
        ``predict_components(X)`` after ``fit``.

        Args:
            X: rows (n_samples, n_features).
            y: labels, for the detectors fitted with them; ignored by the others.
            groups: client id of each row, shape (n_samples,); None means one client.
            **kwargs: ``fit``'s keyword arguments (e.g. ``callbacks``).
        """
        return self.fit(X, y, groups, **kwargs).labels_
