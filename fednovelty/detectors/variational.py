"""``FedVBDetector``: federated variational Bayes Gaussian mixture as a PyOD detector.

``fit(X, y=None, groups)`` runs :class:`~fednovelty.federated.variational.FederatedVB` on the
simulated clients (``y`` is ignored, as PyOD's detectors do). Every round the clients send the
summed statistics federated EM sends; under one shared prior the server's posterior is the
posterior of the pooled rows (scikit-learn's ``BayesianGaussianMixture``), whatever the split.

Choices, and why:

- ``n_components`` is a generous upper bound K: the Dirichlet (process) prior on the weights
  empties the components the data do not need. ``effective_n_components_`` counts the
  components whose expected weight exceeds ``weight_threshold``; ``active_components_`` is
  their mask. A pruned component keeps the posterior of an empty component (its prior: finite
  mean and covariance, a tiny weight), so nothing reported is ever NaN.
- ``score="predictive"`` (default) scores with the posterior predictive density, a mixture of
  Student-t densities (Bishop, PRML 10.81), which widens a component backed by few rows;
  ``score="plugin"`` scores with the plug-in Gaussian mixture (``weights_``, ``means_``,
  ``covariances_``, as scikit-learn reports them). Both are normalised densities, so
  ``score_samples`` is a log-density either way; for many rows per component they agree.
  scikit-learn's ``BayesianGaussianMixture.score_samples`` is neither (an E-step normaliser).
- Invalid priors raise :class:`~fednovelty.mixture.variational.InvalidPriorError` (a
  ``ValueError``) naming the argument, before any round runs; the checks that need the width
  (``degrees_of_freedom_prior > n_features - 1``, the shapes of ``mean_prior`` and
  ``covariance_prior``) run once ``X`` is known.
- ``save`` keeps the posterior itself (weight concentrations, mean precisions, degrees of
  freedom, means, covariances), not only the plug-in mixture; ``load`` validates it
  (``ModelFormatError`` on bad shapes, non-positive concentrations or precisions, degrees of
  freedom ``<= n_features - 1``, covariances that are not positive definite, NaN) and rebuilds
  the precision factors and the plug-in mixture with the functions fit used, so a loaded
  detector scores bit for bit as the saved one.
- ``aggregation="exact"`` (default) runs :class:`~fednovelty.federated.variational.
  FederatedVB` (the pooled rows' posterior, one round per VB iteration);
  ``aggregation="natural"`` or ``"moment"`` runs the one-shot
  :class:`~fednovelty.federated.vb_oneshot.FederatedVBOneShot` instead (a prior round and
  one round in which every client fits its own posterior; the server matches components
  and combines them by natural-parameter averaging or moment matching,
  ``docs/variational.md``). The fitted attributes and the saved file are the same either
  way (the posterior); ``lower_bounds_`` is empty and ``n_iter_`` the most local
  iterations for one-shot fits.
- Robust options against a lying client (``docs/robust.md``): ``robust_aggregation``
  (``"sum"`` or ``"trimmed"``; one-shot fits also ``"median"``), ``trim`` and
  ``client_weight_cap``, the algorithms' ``aggregation``, ``trim`` and
  ``client_weight_cap`` (named ``robust_aggregation`` here because ``aggregation``
  already picks the exact or one-shot rule, a different choice).
- Not here (yet): client sampling and dropout (the exact posterior needs every client each
  round), standardisation and PCA (``FederatedVB`` rejects them), personal weights.
"""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors.base import AGGREGATION_CONSTRAINTS, COMMON_CONSTRAINTS, MixtureDetector
from fednovelty.detectors.persistence import (
    check_items,
    get_attr,
    get_tensor,
    log_density_bound,
    register,
)
from fednovelty.exceptions import ModelFormatError, SingularCovarianceError
from fednovelty.federated import INIT_PARAMS
from fednovelty.federated.privacy import DEFAULT_MAX_CLUSTERS
from fednovelty.federated.variational import FederatedVB
from fednovelty.federated.vb_oneshot import FederatedVBOneShot
from fednovelty.mixture import score_samples
from fednovelty.mixture.covariance import covariance_shape, precisions_cholesky_from_covariances
from fednovelty.mixture.variational import (
    WEIGHT_PRIOR_TYPES,
    InvalidPriorError,
    VBPosterior,
    VBPrior,
    active_components,
    vb_plugin_params,
    vb_predictive_log_prob,
)

#: The posterior's tensors ``save`` writes (``posterior.<name>``).
POSTERIOR_TENSORS = (
    "weight_concentration",
    "mean_precision",
    "means",
    "degrees_of_freedom",
    "covariances",
)


@register
class FedVBDetector(MixtureDetector):
    """Bayesian Gaussian mixture of ``x`` trained by federated variational Bayes; scores
    novelty as ``-log p(x)`` under the posterior predictive (or the plug-in mixture).

    Args:
        n_components: upper bound K on the number of components; the prior prunes the ones
            the data do not need (``effective_n_components_``).
        weight_concentration_prior_type: ``"dirichlet_process"`` (stick-breaking; default)
            or ``"dirichlet_distribution"``.
        weight_concentration_prior: ``gamma_0`` / ``alpha_0`` > 0 (``None``: ``1 / K``);
            smaller empties more components.
        mean_prior: (n_features,) prior mean (``None``: the pooled mean, one extra round).
        mean_precision_prior: ``beta_0`` > 0 (``None``: 1).
        degrees_of_freedom_prior: ``nu_0`` > n_features - 1 (``None``: n_features).
        covariance_prior: the Wishart's ``W_0^-1``: (n_features, n_features) for
            full/tied, (n_features,) for diag, a float for spherical (``None``: the pooled
            covariance, its diagonal, or the mean of its diagonal; one extra round).
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.
        init_params: ``"kmeans"`` (federated k-means; default), ``"separated"`` or
            ``"subset"`` (pools a few raw rows on the server: not private); the initial
            mixture's responsibilities give the first posterior (scikit-learn's
            ``_initialize``).
        weights_init, means_init, precisions_init: a given initial mixture instead
            (scikit-learn's ``GaussianMixture`` arguments; precisions, not covariances).
        reg_covar: added to the diagonal of each weighted covariance (as scikit-learn).
        tol: stop when the ELBO changes by less than this; max_iter: most VB rounds.
        kmeans_rounds: most federated Lloyd rounds of the ``kmeans`` init.
        subset_size: rows pooled by the ``subset`` init.
        score: ``"predictive"`` (Student-t mixture; default) or ``"plugin"`` (Gaussian
            mixture of ``weights_``, ``means_``, ``covariances_``).
        weight_threshold: expected weight above which a component is counted as effective.
        aggregation: ``"exact"`` (federated VB on summed statistics; default), or one
            shot: ``"natural"`` (natural-parameter averaging of the clients' local
            posteriors) or ``"moment"`` (moment matching); one-shot fits initialise locally
            with k-means (``init_params="kmeans"``, no ``*_init``) and take
            ``covariance_type`` ``full``, ``diag`` or ``spherical``.
        robust_aggregation: the robust combination of the clients' replies (``aggregation``
            names the exact or one-shot rule here; ``docs/robust.md``): ``"sum"`` (default)
            or ``"trimmed"``: for the exact fit the trimmed statistics
            (:func:`~fednovelty.federated.robust.robust_stats`) and a robust k-means first
            round; for one-shot fits the most outlying client posteriors left out before
            matching, every client counted as the typical client's rows
            (:func:`~fednovelty.federated.robust.outlying_models`). ``"median"``: one-shot
            fits only, the posteriors with a robust z-score above 3.5 left out.
        trim: share of clients ``robust_aggregation="trimmed"`` leaves out (at each end
            for the exact fit).
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap); both fits.
        match_threshold: one-shot matching: a client component opens a new slot when its
            divergence to the closest slot exceeds this share of its divergence to the
            pooled data (> 0; ignored by ``"exact"``).
        privacy_min_rows: each client's privacy floor (``docs/privacy.md``); a client with
            fewer rows skips the rounds.
        contamination: expected share of anomalies, sets ``threshold_`` (PyOD).
        random_state: seed (int, RandomState or None).
        device: ``"cpu"`` (default) or ``"cuda"``; dtype: ``"float64"`` (default) or
            ``"float32"``.
        progress: show a progress bar over rounds.

    Attributes:
        posterior_: the :class:`~fednovelty.mixture.variational.VBPosterior`.
        weights_, means_, covariances_, precisions_cholesky_: the plug-in mixture (numpy, as
            scikit-learn's ``BayesianGaussianMixture``); ``model_`` the same as
            ``MixtureParams`` (what the per-component API reports).
        effective_n_components_: components with expected weight above ``weight_threshold``;
            active_components_: their boolean mask, shape (n_components,).
        lower_bounds_: the ELBO after each VB round (scikit-learn's ``lower_bounds_``).
        n_iter_, converged_: VB rounds run (the initial-posterior round not counted) and
            whether the ELBO settled.
        history_: one dict per communication round (kind, clients, bytes, metrics).
        n_rounds_, bytes_up_, bytes_down_: communication totals.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import FedVBDetector
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(0, 1, (200, 2)), rng.normal(8, 1, (200, 2))])
        >>> groups = np.repeat([0, 1, 2, 3], 100)
        >>> det = FedVBDetector(n_components=6, random_state=1).fit(X, groups=groups)
        >>> det.effective_n_components_
        2
        >>> bool(det.decision_function([[4.0, 30.0]])[0] > det.threshold_)
        True
    """

    _parameter_constraints: ClassVar[dict] = {
        **COMMON_CONSTRAINTS,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "weight_concentration_prior_type": [StrOptions(set(WEIGHT_PRIOR_TYPES))],
        # Values are checked in fit (InvalidPriorError naming the argument).
        "weight_concentration_prior": [Real, None],
        "mean_prior": ["array-like", None],
        "mean_precision_prior": [Real, None],
        "degrees_of_freedom_prior": [Real, None],
        "covariance_prior": ["array-like", Real, None],
        "init_params": [StrOptions(set(INIT_PARAMS))],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "kmeans_rounds": [Interval(Integral, 1, None, closed="left")],
        "subset_size": [Interval(Integral, 1, None, closed="left")],
        "score": [StrOptions({"predictive", "plugin"})],
        "weight_threshold": [Interval(Real, 0.0, 1.0, closed="left")],
        "aggregation": [StrOptions({"exact", "natural", "moment"})],
        "match_threshold": [Interval(Real, 0.0, None, closed="neither")],
        "robust_aggregation": [StrOptions({"sum", "trimmed", "median"})],
        **AGGREGATION_CONSTRAINTS,
    }

    def __init__(
        self,
        n_components=10,
        *,
        weight_concentration_prior_type="dirichlet_process",
        weight_concentration_prior=None,
        mean_prior=None,
        mean_precision_prior=None,
        degrees_of_freedom_prior=None,
        covariance_prior=None,
        covariance_type="full",
        init_params="kmeans",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        reg_covar=1e-6,
        tol=1e-3,
        max_iter=100,
        kmeans_rounds=10,
        subset_size=100,
        score="predictive",
        weight_threshold=1e-2,
        aggregation="exact",
        match_threshold=0.5,
        robust_aggregation="sum",
        trim=0.1,
        client_weight_cap=None,
        privacy_min_rows=5,
        contamination=0.1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ):
        self.n_components = n_components
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_prior = mean_prior
        self.mean_precision_prior = mean_precision_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.covariance_type = covariance_type
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.kmeans_rounds = kmeans_rounds
        self.subset_size = subset_size
        self.score = score
        self.weight_threshold = weight_threshold
        self.aggregation = aggregation
        self.match_threshold = match_threshold
        self.robust_aggregation = robust_aggregation
        self.trim = trim
        self.client_weight_cap = client_weight_cap
        self.privacy_min_rows = privacy_min_rows
        self.contamination = contamination
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.progress = progress

    # -------------------------------------------------------------- priors
    def _check_priors(self, n_features: int) -> None:
        """InvalidPriorError naming the argument for a prior that is not a proper
        distribution on ``n_features`` features (before any round runs)."""
        for name in ("weight_concentration_prior", "mean_precision_prior"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
                raise InvalidPriorError(
                    f"{name} must be a finite number > 0, got {value!r}; leave it None for "
                    "scikit-learn's default."
                )
        dof = self.degrees_of_freedom_prior
        if dof is not None and not (math.isfinite(float(dof)) and float(dof) > n_features - 1):
            raise InvalidPriorError(
                f"degrees_of_freedom_prior must be > n_features - 1 = {n_features - 1}, got "
                f"{dof!r}; use n_features ({n_features}) or more, or None."
            )
        like = {"dtype": torch.float64}
        mean = torch.zeros(n_features, **like)
        if self.mean_prior is not None:
            mean = torch.as_tensor(np.asarray(self.mean_prior, dtype=np.float64))
            if tuple(mean.shape) != (n_features,) or not bool(torch.isfinite(mean).all()):
                raise InvalidPriorError(
                    f"mean_prior must be a finite vector of shape ({n_features},), got shape "
                    f"{tuple(mean.shape)}."
                )
        shape = covariance_shape(self.covariance_type, 1, n_features)[1:]
        if self.covariance_type == "tied":
            shape = (n_features, n_features)
        covariance = torch.eye(n_features, **like) if len(shape) == 2 else torch.ones(shape, **like)
        if self.covariance_prior is not None:
            covariance = torch.as_tensor(np.asarray(self.covariance_prior, dtype=np.float64))
            if tuple(covariance.shape) != shape:
                raise InvalidPriorError(
                    f"covariance_prior for covariance_type={self.covariance_type!r} must have "
                    f"shape {shape}, got {tuple(covariance.shape)}."
                )
        try:  # what VBPrior checks beyond the above: finite, positive (definite), symmetric
            VBPrior(
                self.weight_concentration_prior_type,
                1.0,
                1.0,
                mean,
                float(n_features),
                covariance,
                self.covariance_type,
            )
        except InvalidPriorError as error:
            raise InvalidPriorError(f"covariance_prior: {error}") from None

    # -------------------------------------------------------------- fitting
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        n_total = sum(c.shape[0] for c in clients)
        n_features = clients[0].shape[1]
        self._check_priors(n_features)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        if self.aggregation != "exact":
            self._fit_one_shot(clients, seed)
            return
        if self.robust_aggregation == "median":
            raise ValueError(
                "robust_aggregation='median' is a one-shot option (aggregation 'natural' or "
                "'moment'); the exact fit (aggregation='exact') has 'sum' and 'trimmed'."
            )
        algorithm = FederatedVB(
            self.n_components,
            **self._prior_settings(),
            init_params=self.init_params,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
            reg_covar=self.reg_covar,
            tol=self.tol,
            max_iter=self.max_iter,
            kmeans_rounds=self.kmeans_rounds,
            subset_size=self.subset_size,
            aggregation=self.robust_aggregation,
            trim=self.trim,
            client_weight_cap=self.client_weight_cap,
            random_state=seed,
            **self._torch_options(),
        )
        privacy = self._privacy_policy(
            allow_raw_rows=self.init_params == "subset",
            max_clusters=max(DEFAULT_MAX_CLUSTERS, int(self.n_components)),
        )
        state = self._simulate(algorithm, clients, seed, privacy=privacy)
        self._set_posterior(state.posterior)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if not self.converged_:
            warnings.warn(
                f"Federated VB did not converge in max_iter={self.max_iter} rounds (last "
                "change in the ELBO above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=4,  # the caller's fit(...)
            )

    def _prior_settings(self) -> dict:
        """The priors, effective-weight threshold and covariance type, as both algorithms
        (exact and one-shot) take them."""
        return {
            "weight_concentration_prior_type": self.weight_concentration_prior_type,
            "weight_concentration_prior": self.weight_concentration_prior,
            "mean_prior": self.mean_prior,
            "mean_precision_prior": self.mean_precision_prior,
            "degrees_of_freedom_prior": self.degrees_of_freedom_prior,
            "covariance_prior": self.covariance_prior,
            "weight_threshold": self.weight_threshold,
            "covariance_type": self.covariance_type,
        }

    def _fit_one_shot(self, clients, seed) -> None:
        """The one-shot fit (``aggregation`` ``"natural"`` or ``"moment"``)."""
        given = ("weights_init", "means_init", "precisions_init")
        if self.init_params != "kmeans" or any(getattr(self, n) is not None for n in given):
            raise ValueError(
                f"aggregation={self.aggregation!r} (one shot) initialises each client's fit "
                "with local k-means: use init_params='kmeans' and leave weights_init, "
                "means_init and precisions_init unset, or aggregation='exact'."
            )
        if self.covariance_type == "tied":
            raise ValueError(
                f"aggregation={self.aggregation!r} (one shot) takes covariance_type 'full', "
                "'diag' or 'spherical'; use aggregation='exact' for 'tied'."
            )
        algorithm = FederatedVBOneShot(
            self.n_components,
            posterior_aggregation=self.aggregation,
            match_threshold=self.match_threshold,
            aggregation=self.robust_aggregation,
            trim=self.trim,
            client_weight_cap=self.client_weight_cap,
            **self._prior_settings(),
            reg_covar=self.reg_covar,
            tol=self.tol,
            max_iter=self.max_iter,
            random_state=seed,
            **self._torch_options(),
        )
        state = self._simulate(algorithm, clients, seed, privacy=self._privacy_policy())
        self._set_posterior(state.posterior)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if not self.converged_:
            warnings.warn(
                f"A client's local variational fit did not converge in max_iter={self.max_iter} "
                "iterations (last change in its ELBO above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=5,  # the caller's fit(...)
            )

    @classmethod
    def from_model(cls, result, X, **params):
        """:meth:`MixtureDetector.from_model` for a ``FederatedVB`` or ``FederatedVBOneShot``
        run: ``aggregation`` is ``"exact"`` for the former and the run's
        ``posterior_aggregation`` for the latter (the algorithms' own ``aggregation``
        setting, ``"sum"``, is not the detector's)."""
        config = getattr(result, "config", None) or {}
        params.setdefault("aggregation", config.get("posterior_aggregation", "exact"))
        return super().from_model(result, X, **params)

    def _set_posterior(self, posterior: VBPosterior) -> None:
        """Store the posterior, its plug-in mixture and the pruning record."""
        self.posterior_ = posterior
        self._set_mixture(vb_plugin_params(posterior))
        mask = active_components(posterior, self.weight_threshold)
        self.active_components_ = mask.cpu().numpy()
        self.effective_n_components_ = int(mask.sum())

    def _set_result(self, result) -> None:
        """``from_model``: the posterior and ELBO record of a finished ``FederatedVB`` run."""
        state = result.state
        posterior = getattr(state, "posterior", None)
        if posterior is None:
            raise ValueError(
                "from_model needs the result of a FederatedVB or FederatedVBOneShot run."
            )
        if posterior.n_features != self.n_features_in_:
            raise ValueError(
                f"X has {self.n_features_in_} features but the model was trained on "
                f"{posterior.n_features}."
            )
        options = self._torch_options()
        moved = {k: v.to(**options) for k, v in posterior.tensors().items()}
        self._set_posterior(
            VBPosterior(
                **moved,
                covariance_type=posterior.covariance_type,
                weight_concentration_prior_type=posterior.weight_concentration_prior_type,
            )
        )
        self.n_iter_, self.converged_ = state.n_iter, state.converged
        self.lower_bounds_ = list(state.lower_bounds)

    # -------------------------------------------------------------- scoring
    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        if self.score == "plugin":
            return score_samples(self.model_, X)
        return vb_predictive_log_prob(X, self.posterior_)

    # -------------------------------------------------------------- persistence
    def _log_density_bound(self) -> float:
        """The highest ``log p(x)`` the scored density (predictive Student-t or plug-in
        Gaussian mixture) gives any row (``log_density_bound`` at the posterior means)."""
        with torch.no_grad():
            return log_density_bound(self._log_density(self.posterior_.means))

    def _get_state(self):
        tensors = {f"posterior.{k}": getattr(self.posterior_, k) for k in POSTERIOR_TENSORS}
        attrs = {
            "n_iter_": self.n_iter_,
            "converged_": self.converged_,
            "lower_bounds_": self.lower_bounds_,
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        posterior = _posterior_from(
            tensors,
            self.n_components,
            self.n_features_in_,
            self.covariance_type,
            self.weight_concentration_prior_type,
        )
        options = self._torch_options()
        moved = {k: v.to(**options) for k, v in posterior.items()}
        try:
            factors = precisions_cholesky_from_covariances(
                moved["covariances"], self.covariance_type
            )
        except SingularCovarianceError as error:
            raise ModelFormatError(f"the tensor 'posterior.covariances': {error}") from None
        # The densities square (x - mean) times a factor: that must not overflow at the means.
        size = float(factors.abs().max()) * max(1.0, float(moved["means"].abs().max()))
        if size > math.sqrt(torch.finfo(factors.dtype).max):
            raise ModelFormatError(
                f"the posterior is too large to score in {factors.dtype} (precision Cholesky "
                f"factor times mean: {size:.3g})."
            )
        self._set_posterior(
            VBPosterior(
                **moved,
                precisions_cholesky=factors,
                covariance_type=self.covariance_type,
                weight_concentration_prior_type=self.weight_concentration_prior_type,
            )
        )
        weights = self.posterior_.weights
        with torch.no_grad():
            at_means = self._log_density(self.posterior_.means)
        if not bool(torch.isfinite(weights).all()) or bool(torch.isnan(at_means).any()):
            raise ModelFormatError(
                "the posterior's expected weights or its density at the means are NaN or "
                "inf; 'posterior.weight_concentration' is damaged."
            )
        self.n_iter_ = get_attr(attrs, "n_iter_", int, minimum=0)
        self.converged_ = get_attr(attrs, "converged_", bool)
        bounds = get_attr(attrs, "lower_bounds_", list)
        self.lower_bounds_ = check_items(bounds, "lower_bounds_", float)


def _posterior_from(
    tensors: dict[str, torch.Tensor],
    n_components: int,
    n_features: int,
    covariance_type: str,
    weight_type: str,
) -> dict[str, torch.Tensor]:
    """The saved posterior tensors (``posterior.*``), checked: the shapes ``n_components``,
    ``n_features`` and the types imply, finite, concentrations and mean precisions > 0,
    degrees of freedom > n_features - 1, diagonal / spherical covariances > 0 (full and tied
    ones are checked positive definite by their Cholesky factorisation). Raises
    ``ModelFormatError``."""
    k, d = n_components, n_features
    wc_shape = (2, k) if weight_type == "dirichlet_process" else (k,)
    dof_shape = () if covariance_type == "tied" else (k,)
    cov_shape = covariance_shape(covariance_type, k, d)
    shapes = {
        "weight_concentration": wc_shape,
        "mean_precision": (k,),
        "means": (k, d),
        "degrees_of_freedom": dof_shape,
        "covariances": cov_shape,
    }
    out = {name: get_tensor(tensors, f"posterior.{name}", shape) for name, shape in shapes.items()}
    for name in ("weight_concentration", "mean_precision"):
        if not bool((out[name] > 0).all()):
            raise ModelFormatError(
                f"the tensor 'posterior.{name}' holds a value <= 0; the posterior's "
                "concentrations and precisions are positive."
            )
    if not bool((out["degrees_of_freedom"] > d - 1).all()):
        raise ModelFormatError(
            f"the tensor 'posterior.degrees_of_freedom' holds a value <= n_features - 1 = "
            f"{d - 1}; a Wishart needs more degrees of freedom."
        )
    cov = out["covariances"]
    if covariance_type in ("diag", "spherical") and not bool((cov > 0).all()):
        raise ModelFormatError(
            "the tensor 'posterior.covariances' holds a value <= 0; variances are positive."
        )
    if covariance_type in ("full", "tied"):
        scale = float(cov.abs().max())
        if not torch.allclose(cov, cov.transpose(-1, -2), rtol=0, atol=1e-12 * scale):
            raise ModelFormatError("the tensor 'posterior.covariances' is not symmetric.")
    return out


__all__ = ["FedVBDetector"]
