"""``FedVBDetector``: federated variational Bayes Gaussian mixture as a PyOD detector.

``fit(X, y=None, groups)`` runs :class:`~fednovelty.federated.bayesian.variational.FederatedVB`
on the simulated clients (``y`` is ignored, as PyOD's detectors do). Every round the clients send
the summed statistics federated EM sends; under one shared prior the server's posterior is the
posterior of the pooled rows (scikit-learn's ``BayesianGaussianMixture``), whatever the split.
``posterior_merge="natural"`` or ``"moment"`` runs the one-shot
:class:`~fednovelty.federated.bayesian.vb_oneshot.FederatedVBOneShot` instead (every client fits its
own posterior; the server matches and combines them); the fitted attributes are the same. The
exact fit with ``init_params="oneshot"`` starts from such a posterior (matched with
``match_threshold``, combined by natural-parameter averaging, refined on the server) and goes
on with exact rounds.

Choices, and why:

- ``n_components`` is an upper bound: the Dirichlet (process) prior empties the components the
  data do not need (``effective_n_components_``, ``active_components_``); a pruned component
  keeps its prior's finite posterior, so nothing reported is NaN.
- ``density="predictive"`` scores with the posterior predictive (a Student-t mixture, Bishop PRML
  10.81), ``"plugin"`` with the plug-in Gaussian mixture; both are normalised densities.
- Invalid priors raise :class:`~fednovelty.mixture.vb_prior.InvalidPriorError` naming the
  argument before any round runs (the width-dependent checks once ``X`` is known).
- ``save`` keeps the posterior itself; ``load`` validates it and rebuilds the plug-in mixture
  with the functions fit used, so a loaded detector scores bit for bit as the saved one.
- ``dp_epsilon`` (exact fit only): differential privacy as federated EM's
  (``fednovelty.detectors._dp``): the rows are mapped to the public box ``dp_bounds`` and
  clipped, the prior moments are released as a noisy scatter and every initialisation and VB
  round's statistics as noisy sums; the initial centres are public (spread over the box),
  ``max_iter`` VB rounds run (no ELBO: the clients withhold the log-likelihood) and the
  server post-processes the noisy sums (counts floored, covariances bounded) before the
  conjugate update. The one-shot fits send local posteriors, which have no private form.
- Robust defaults (``standardize``, ``prior_strength="auto"``, ``prior_scale``): a federated
  ``moments`` round standardises the features (exact and one-shot fits) and the Wishart prior
  is ``n_features + 2`` pseudo-rows at ``prior_scale`` x each feature's pooled variance;
  ``standardize=False, prior_strength=None`` restores scikit-learn's priors on the raw
  features exactly.
- Not here: client sampling and dropout (the exact posterior needs every client each round),
  personal weights; ``sampling=`` selects only the engine (``ClientSampling.engine``).
  ``docs/variational.md`` has the details.
"""

from __future__ import annotations

import math
import warnings
from numbers import Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._dp import (
    bounds_engine,
    bounds_rounds,
    dp_plan,
    finish_private_fit,
    run_private_bounds,
)
from fednovelty.detectors._engine_check import refuse_flower_sim
from fednovelty.detectors._option_fields import DP
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors._vb_state import POSTERIOR_TENSORS, posterior_from
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.options import ClientSampling, Prior, Privacy, Robustness
from fednovelty.detectors.persistence import (
    iteration_record,
    log_density_bound,
    restore_iteration_record,
)
from fednovelty.detectors.persistence_checks import check_scorable
from fednovelty.exceptions import ModelFormatError, SingularCovarianceError
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.trust.privacy import DEFAULT_MAX_CLUSTERS
from fednovelty.mixture import score_samples
from fednovelty.mixture.covariance import covariance_shape, precisions_cholesky_from_covariances
from fednovelty.mixture.variational import VBPosterior
from fednovelty.mixture.vb_predictive import (
    active_components,
    vb_plugin_params,
    vb_predictive_log_prob,
)
from fednovelty.mixture.vb_prior import InvalidPriorError, VBPrior

#: The Wishart prior's default target, as a multiple of each feature's pooled variance.
VB_PRIOR_SCALE = 1.0


#: What the prior's fields mean for the variational mixture (``docs/variational.md``): its
#: robust defaults are federated standardisation and a Wishart prior of ``strength``
#: pseudo-rows at ``scale`` x the pooled variance of each feature (the covariance prior of
#: federated EM on the Wishart's terms).
VB_PRIOR_DOCS = {
    "standardize": "Here one extra ``moments`` round; the posterior and its scores stay in "
    "the original units.",
    "strength": "Here the Wishart's pseudo-rows.",
}


#: Which components count as effective (every variational mixture).
WEIGHT_THRESHOLD = Param(
    "weight_threshold",
    1e-2,
    [Interval(Real, 0.0, 1.0, closed="left")],
    "expected weight above which a component counts as effective.",
)
#: How the server combines the clients' posteriors (the exact or a one-shot rule).
POSTERIOR_MERGE = Param(
    "posterior_merge",
    "exact",
    [StrOptions({"exact", "natural", "moment"})],
    '``"exact"`` (federated VB on summed statistics: the pooled rows\' posterior) or one '
    'shot: ``"natural"`` (natural-parameter averaging of the clients\' local posteriors) or '
    '``"moment"`` (moment matching); one-shot fits initialise locally with k-means '
    '(``init_params="kmeans"``, no ``*_init``) and take ``covariance_type`` ``"full"``, '
    '``"diag"`` or ``"spherical"``. (The exact fit\'s ``init_params="oneshot"`` start combines '
    "by natural-parameter averaging.)",
    setting="posterior_aggregation",
)
#: The one-shot fits' matching of client components.
MATCH_THRESHOLD = Param(
    "match_threshold",
    0.5,
    [Interval(Real, 0.0, None, closed="neither")],
    "one-shot matching: a client component opens a new slot when its divergence to the "
    'closest slot exceeds this share of its divergence to the pooled data (``"exact"`` '
    'reads it only with ``init_params="oneshot"``).',
)
#: The settings only the one-shot algorithm takes (the exact fit's one-shot start reads
#: ``match_threshold`` too), and those only the exact one takes (its initialisation:
#: one-shot clients start from local k-means).
_ONE_SHOT_ONLY = ("posterior_aggregation", "match_threshold")
_EXACT_ONLY = (
    "init_params",
    "kmeans_rounds",
    "subset_size",
    "weights_init",
    "means_init",
    "precisions_init",
)


class FedVBDetector(MixtureDetector):
    """Bayesian Gaussian mixture of ``x`` trained by federated variational Bayes; scores
    novelty as ``-log p(x)`` under the posterior predictive (or the plug-in mixture).

    Attributes:
        posterior_: the :class:`~fednovelty.mixture.variational.VBPosterior`.
        weights_, means_, covariances_, precisions_cholesky_: the plug-in mixture (numpy, as
            scikit-learn's ``BayesianGaussianMixture``); ``model_`` the same as
            ``MixtureParams`` (what the per-component API reports).
        effective_n_components_: components with expected weight above ``weight_threshold``;
            active_components_: their boolean mask, shape (n_components,).
        lower_bounds_: the ELBO after each VB round (scikit-learn's ``lower_bounds_``).
        n_iter_, converged_: VB rounds run (the initial-posterior round not counted) and
            whether the ELBO settled (under ``dp_epsilon`` the clients withhold the
            log-likelihood the ELBO needs: ``max_iter`` rounds run, ``lower_bounds_`` is
            empty and ``converged_`` false).
        privacy_spent_: with ``dp_epsilon``, what the fit spent: ``epsilon`` (at
            ``delta``), the noisy ``releases``, ``noise_multiplier``, ``clip``, ``mode``.
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

    PRUNES_COMPONENTS = True

    #: files saved when ``aggregation`` named the posterior rule, the robust option was
    #: ``robust_aggregation`` and the scored density ``score``.
    _renamed_params: ClassVar[dict] = {
        "aggregation": "posterior_merge",
        "robust_aggregation": "aggregation",
        "score": "density",
    }
    _pca_front_end = True
    _params = declare(
        Param(
            "density",
            "predictive",
            [StrOptions({"predictive", "plugin"})],
            '``"predictive"`` (the posterior predictive, a Student-t mixture) or ``"plugin"`` '
            "(the Gaussian mixture of ``weights_``, ``means_``, ``covariances_``).",
            "estimator",
        ),
        WEIGHT_THRESHOLD,
        POSTERIOR_MERGE,
        MATCH_THRESHOLD,
        option(Prior, auto={"scale": VB_PRIOR_SCALE}, docs=VB_PRIOR_DOCS),
        option(
            Robustness,
            docs={
                "aggregation": 'Exact fit: ``"sum"`` or ``"trimmed"`` (trimmed statistics and '
                'a robust k-means round); one-shot fits: also ``"median"``; ``"trimmed"`` and '
                '``"median"`` leave the most outlying client posteriors out and count every '
                "client as the typical client's rows."
            },
        ),
        option(
            ClientSampling,
            fields=("engine",),
            docs={
                "engine": "Every round asks every client (the exact posterior needs them "
                'all). ``"flower-sim"`` refuses, at ``fit``, ``privacy.epsilon`` and the PCA '
                "front end (``pca_components`` engaged)."
            },
        ),
        option(Privacy, fields=DP),
        docs={
            "n_components": "An upper bound: the prior prunes the components the data do not "
            "need (``effective_n_components_``).",
            "init_params": "The initial mixture's responsibilities give the first posterior "
            "(scikit-learn's ``_initialize``); ``\"oneshot\"`` is variational Bayes' own: one "
            "round in which every client fits its posterior under the shared prior, matched "
            "(``match_threshold``), combined by natural-parameter averaging and refined on "
            "the server (100 iterations at most on the clients' component statistics), the exact "
            'rounds continuing from it (``covariance_type`` not ``"tied"``, no '
            "``privacy.epsilon``, no ``*_init``).",
        },
    )

    def __init__(
        self,
        n_components=10,
        *,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        init_params="kmeans",
        initialisation=None,
        density="predictive",
        weight_threshold=0.01,
        posterior_merge="exact",
        match_threshold=0.5,
        prior=None,
        pca_components="auto",
        sampling=None,
        robustness=None,
        privacy=None,
        contamination=0.1,
        calibration="contamination",
        alpha=0.01,
        calibration_share=0.2,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ) -> None:
        store(self, locals())

    # -------------------------------------------------------------- priors
    def _check_priors(self, n_features: int) -> None:
        """InvalidPriorError naming the argument for a prior that is not a proper
        distribution on ``n_features`` features (before any round runs)."""
        prior = self._option("prior")
        for name, value in (
            ("prior.weight_concentration", prior.weight_concentration),
            ("prior.mean_precision", prior.mean_precision),
        ):
            if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
                raise InvalidPriorError(
                    f"{name} must be a finite number > 0, got {value!r}; leave it None for "
                    "scikit-learn's default."
                )
        dof = prior.degrees_of_freedom
        if dof is not None and not (math.isfinite(float(dof)) and float(dof) > n_features - 1):
            raise InvalidPriorError(
                f"prior.degrees_of_freedom must be > n_features - 1 = {n_features - 1}, got "
                f"{dof!r}; use n_features ({n_features}) or more, or None."
            )
        like = {"dtype": torch.float64}
        mean = torch.zeros(n_features, **like)
        if prior.mean is not None:
            mean = torch.as_tensor(np.asarray(prior.mean, dtype=np.float64))
            if tuple(mean.shape) != (n_features,) or not bool(torch.isfinite(mean).all()):
                raise InvalidPriorError(
                    f"prior.mean must be a finite vector of shape ({n_features},), got shape "
                    f"{tuple(mean.shape)}."
                )
        shape = covariance_shape(self.covariance_type, 1, n_features)[1:]
        if self.covariance_type == "tied":
            shape = (n_features, n_features)
        covariance = torch.eye(n_features, **like) if len(shape) == 2 else torch.ones(shape, **like)
        if prior.covariance is not None:
            covariance = torch.as_tensor(np.asarray(prior.covariance, dtype=np.float64))
            if tuple(covariance.shape) != shape:
                raise InvalidPriorError(
                    f"prior.covariance for covariance_type={self.covariance_type!r} must have "
                    f"shape {shape}, got {tuple(covariance.shape)}."
                )
        try:  # what VBPrior checks beyond the above: finite, positive (definite), symmetric
            VBPrior(
                self._option("prior").weight_concentration_type,
                1.0,
                1.0,
                mean,
                float(n_features),
                covariance,
                self.covariance_type,
            )
        except InvalidPriorError as error:
            raise InvalidPriorError(f"prior.covariance: {error}") from None

    # -------------------------------------------------------------- fitting
    def _front_end(self, parts, clients, seed):
        """The PCA front end (``FrontEndMixin._front_end``), after refusing what the engine
        cannot run (:func:`~fednovelty.detectors._engine_check.refuse_flower_sim`), before
        any round."""
        refuse_flower_sim(self, clients[0].shape[1])
        return super()._front_end(parts, clients, seed)

    def _vb_settings(self, n_features: int, seed: int) -> tuple[dict, dict, dict]:
        """The algorithms' settings for rows ``n_features`` wide: those both take, those only
        the one-shot merge takes, those only the exact fit takes."""
        settings = self._settings(n_features)
        one_shot = {name: settings.pop(name) for name in _ONE_SHOT_ONLY}
        exact = {name: settings.pop(name) for name in _EXACT_ONLY}
        if exact["init_params"] == "oneshot":  # the exact fit's one-shot start
            exact["match_threshold"] = one_shot["match_threshold"]
        common = {**settings, "random_state": seed, **self._torch_options()}
        return common, one_shot, exact

    def max_fit_rounds(self, n_features: int | None = None) -> int:
        """Most rounds ``fit`` can run on rows ``n_features`` wide: the algorithm's (the
        prior-moments round, the initialisation's, ``vb_init`` and ``max_iter`` VB rounds;
        or a one-shot merge's), after federated PCA's two when the front end
        engages there (``_front_end_rounds``). The width changes no round count but the
        PCA front end's (``"auto"``), so an unknown one is taken as 1."""
        width = n_features or getattr(self, "n_features_in_", None) or 1
        common, one_shot, exact = self._vb_settings(width, 0)
        if self.posterior_merge != "exact":
            algorithm = FederatedVBOneShot(**common, **one_shot)
        else:
            algorithm = FederatedVB(**common, **exact)
        return algorithm.max_rounds + self._front_end_rounds(n_features)

    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        n_total = sum(c.shape[0] for c in clients)
        n_features = clients[0].shape[1]
        self._check_priors(n_features)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        common, one_shot, exact = self._vb_settings(n_features, seed)
        plan = box = None
        if self.posterior_merge != "exact":
            self._check_one_shot()
            algorithm = FederatedVBOneShot(**common, **one_shot)
            privacy = self._privacy_policy()
            not_converged = "A client's local variational fit did not converge in {} iterations"
        else:
            if self._option("robustness").aggregation == "median":
                raise ValueError(
                    "robustness.aggregation='median' is a one-shot option (posterior_merge "
                    "'natural' or 'moment'); the exact fit (posterior_merge='exact') has 'sum' "
                    "and 'trimmed'."
                )
            plan = dp_plan(
                self,
                n_features,
                len(clients),
                lambda private: FederatedVB(**common, **exact, **private).max_rounds,
                standardized=self._option("prior").standardize,
            )
            plan, box = run_private_bounds(self, plan, clients, seed)
            algorithm = FederatedVB(**common, **exact, **(plan.settings if plan else {}))
            privacy = self._privacy_policy(
                allow_raw_rows=self.init_params == "subset",
                max_clusters=max(DEFAULT_MAX_CLUSTERS, int(self.n_components)),
                dp=None if plan is None else plan.policy,
            )
            not_converged = "Federated VB did not converge in {} rounds"
        state = self._simulate(
            algorithm,
            clients,
            seed,
            round_offset=bounds_rounds(box),
            privacy=privacy,
            **bounds_engine(box),
        )
        finish_private_fit(self, plan, algorithm, box)
        self._set_posterior(state.posterior)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if not self.converged_ and plan is None:  # a private fit runs max_iter rounds
            warnings.warn(
                not_converged.format(f"max_iter={self.max_iter}")
                + " (last change in the ELBO above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=5,  # the caller of fit(...)
            )

    def _check_one_shot(self) -> None:
        """ValueError naming the setting a one-shot fit cannot take."""
        if self._option("privacy").epsilon is not None:
            raise ValueError(
                f"posterior_merge={self.posterior_merge!r} (one shot) sends each client's "
                "local posterior, which has no private form; use posterior_merge='exact' "
                "with privacy.epsilon."
            )
        start = self._option("initialisation")
        given = (start.weights_init, start.means_init, start.precisions_init)
        if self.init_params != "kmeans" or any(value is not None for value in given):
            raise ValueError(
                f"posterior_merge={self.posterior_merge!r} (one shot) initialises each client's "
                "fit with local k-means: use init_params='kmeans' and leave the "
                "initialisation's weights_init, means_init and precisions_init unset, or "
                "posterior_merge='exact'."
            )
        if self.covariance_type == "tied":
            raise ValueError(
                f"posterior_merge={self.posterior_merge!r} (one shot) takes covariance_type "
                "'full', 'diag' or 'spherical'; use posterior_merge='exact' for 'tied'."
            )

    @classmethod
    def from_model(cls, result, X, **params):
        """:meth:`MixtureDetector.from_model` for a ``FederatedVB`` or ``FederatedVBOneShot``
        run: ``posterior_merge`` is ``"exact"`` for the former and the run's
        ``posterior_aggregation`` for the latter."""
        config = getattr(result, "config", None) or {}
        params.setdefault("posterior_merge", config.get("posterior_aggregation", "exact"))
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
        if self.density == "plugin":
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
        return tensors, iteration_record(self)

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        posterior = posterior_from(
            tensors,
            self.n_components,
            self.n_features_in_,
            self.covariance_type,
            self._option("prior").weight_concentration_type,
        )
        options = self._torch_options()
        moved = {k: v.to(**options) for k, v in posterior.items()}
        try:
            factors = precisions_cholesky_from_covariances(
                moved["covariances"], self.covariance_type
            )
        except SingularCovarianceError as error:
            raise ModelFormatError(f"the tensor 'posterior.covariances': {error}") from None
        check_scorable(
            moved["means"],
            float(factors.abs().max()),
            "the tensors 'posterior.means' and 'posterior.covariances'",
        )
        self._set_posterior(
            VBPosterior(
                **moved,
                precisions_cholesky=factors,
                covariance_type=self.covariance_type,
                weight_concentration_prior_type=self._option("prior").weight_concentration_type,
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
        restore_iteration_record(self, attrs)


__all__ = ["FedVBDetector"]
