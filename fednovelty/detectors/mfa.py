"""``FedMFADetector``: a mixture of factor analysers trained by federated EM.

Component ``k`` has the low-rank-plus-diagonal covariance ``W_k W_k^T + diag(psi_k)``
(``n_factors`` columns in ``W_k``; with ``isotropic=True`` one noise variance per component:
mixtures of probabilistic PCA). Scoring and every EM round cost O(N K d q) and no
``d x d`` matrix is formed, so the model fits rows of hundreds of features (image or text
embeddings) where a full covariance is slow and over-parameterised. The federated algorithm
is :class:`~fednovelty.federated.mixtures.factor_em.FederatedFactorEM`; the math is in
:mod:`fednovelty.mixture.factor` (``docs/low_rank.md``).
"""

from __future__ import annotations

import math
from numbers import Integral

import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._members import member_mean
from fednovelty.detectors._option_fields import FLOOR, REMEDIES
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.explain import Components
from fednovelty.detectors.options import ClientSampling, Initialisation, Prior, Privacy, Robustness
from fednovelty.detectors.persistence import (
    check_in_box,
    check_items,
    check_positive,
    check_probabilities,
    get_attr,
    get_tensor,
    iteration_record,
    log_density_bound,
    restore_iteration_record,
)
from fednovelty.detectors.persistence_checks import check_at_least, check_scorable, noise_floor
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.mixtures.factor_em import FactorEMConfig, FederatedFactorEM
from fednovelty.mixture.containers import split, union
from fednovelty.mixture.factor import FactorParams, check_n_factors, factor_score_samples

#: ``n_factors="auto"``: this many loadings per component, at most ``n_features - 1``.
AUTO_FACTORS = 10


def resolve_n_factors(value, n_features: int) -> int:
    """``n_factors`` for rows ``n_features`` wide: ``"auto"`` is ``min(AUTO_FACTORS,
    n_features - 1)``; an integer is checked against the width
    (:func:`~fednovelty.mixture.factor.check_n_factors`: ``1 <= q <= n_features - 1``)."""
    if value == "auto":
        if n_features < 2:
            raise ValueError(
                f"a mixture of factor analysers needs at least 2 features (n_factors <= "
                f"n_features - 1), got n_features={n_features}; use FedGMMDetector for one "
                "feature."
            )
        return min(AUTO_FACTORS, n_features - 1)
    return check_n_factors(int(value), n_features)


class FedMFADetector(MixtureDetector):
    """Mixture of factor analysers (low-rank-plus-diagonal covariances) trained by federated
    EM; scores novelty as ``-log p(x)``.

    The fit runs federated EM's moments round (z-scores, the optional noise prior), the
    k-means rounds, one start round (each client sends per k-means part its counts, moments
    and a random sketch of its scatter; the server starts every component as probabilistic
    PCA) and the factor EM rounds (the clients send the E-step's summed statistics, the
    server runs Ghahramani & Hinton's M-step). Any split of the rows gives the centralized
    fit of the same start, to float64 round-off. ``n_components`` is an upper bound, as
    federated EM's: where the clients' privacy floors back fewer k-means centroids the fit
    has fewer components and says so with a ``FewerComponentsWarning``.

    Use it for wide rows (embeddings, more than a few dozen features) where a full
    covariance's ``d (d + 1) / 2`` parameters per component are more than the rows support;
    on 512-d image embeddings it matches the full model's AUROC at a fraction of its time
    (``docs/low_rank.md``). With ``n_members=M`` it fits ``M`` random starts and scores a
    row by the mean of their log-densities (``fednovelty.detectors._members``): on FEMNIST
    writers' transforms set ``n_components=60, n_members=8`` is above pooled KNN on every
    seed measured, at ``M`` times the rounds (``docs/low_rank.md``). Rounds of the fit have
    no differential-privacy form. With
    ``aggregation="trimmed"`` one lying client of ten (every sum over rows x 1e10) leaves the
    AUROC of the fit without it, where the plain sum loses it (``docs/robust.md``).

    Attributes:
        model_: the fitted :class:`~fednovelty.mixture.factor.FactorParams` (user units).
        weights_, means_: (n_components,), (n_components, n_features).
        factors_: loadings ``W``, (n_components, n_features, n_factors).
        noise_variances_: ``psi``, (n_components, n_features).
        n_components_, n_factors_: the fitted sizes (``n_components_`` counts every
            member's components).
        member_components_: each member's component count (``[n_components_]`` for one
            member); ``model_`` holds the members one after another, weights over ``M``.
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods
            (with members: rounds summed, every member converged, bounds one after another).
        history_: one dict per communication round; n_rounds_, bytes_up_, bytes_down_.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    The per-component API (``responsibilities``, ``explain``, ...) materialises each
    component's ``d x d`` covariance (O(K d^2) memory); scoring never does.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import FedMFADetector
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(400, 3)) @ rng.normal(size=(3, 12)) + 0.1 * rng.normal(
        ...     size=(400, 12))
        >>> det = FedMFADetector(n_components=2, n_factors=3, random_state=0)
        >>> det = det.fit(X, groups=np.repeat([0, 1, 2, 3], 100))
        >>> bool(det.decision_function([[5.0] * 12])[0] > det.threshold_)
        True
    """

    _params = declare(
        Param(
            "n_factors",
            "auto",
            [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
            "columns of each component's loadings ``W_k`` (the covariance's rank above the "
            f'noise), at most ``n_features - 1``; ``"auto"`` is ``min({AUTO_FACTORS}, '
            "n_features - 1)``.",
            convert=resolve_n_factors,
        ),
        Param(
            "isotropic",
            True,
            ["boolean"],
            "one noise variance per component (mixtures of probabilistic PCA); ``False``: one "
            "per feature (factor analysers).",
        ),
        Param(
            "init_params",
            "kmeans",
            [StrOptions({"kmeans", "separated"})],
            '``"kmeans"`` (federated k-means) or ``"separated"`` (centres spread over the '
            "merged feature range, then Lloyd rounds): the partition the start's sketch "
            "is taken on.",
        ),
        option(Initialisation, fields=("kmeans_rounds", "weights_init", "means_init")),
        option(
            Prior,
            fields=REMEDIES,
            auto={"strength": None},
            docs={
                "strength": "Here the prior is on the noise variances ``psi`` only (the "
                "loadings are maximum likelihood)."
            },
        ),
        option(
            Robustness,
            docs={
                "aggregation": 'Here ``"sum"`` or ``"trimmed"``, which makes every round '
                "robust to a lying client: the sketches and factor statistics are combined "
                "per component as federated EM's statistics are."
            },
        ),
        option(
            ClientSampling,
            fields=("engine",),
            docs={"engine": "Every round asks every client."},
        ),
        option(Privacy, fields=FLOOR),
        docs={
            "max_iter": "The ranking of the rows settles in 10-20 rounds, long before the "
            "log-likelihood (``docs/low_rank.md``); raise it to run EM to ``tol``.",
        },
    )

    def __init__(
        self,
        n_components=5,
        n_factors="auto",
        *,
        isotropic=True,
        reg_covar=1e-06,
        tol=0.001,
        max_iter=20,
        init_params="kmeans",
        initialisation=None,
        prior=None,
        sampling=None,
        robustness=None,
        privacy=None,
        contamination=0.1,
        calibration="contamination",
        alpha=0.01,
        calibration_share=0.2,
        n_members=1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ) -> None:
        store(self, locals())

    def max_fit_rounds(self, n_features: int | None = None) -> int:
        """Most rounds ``fit`` can run: the moments round (with ``Prior.standardize`` or the
        prior), the k-means rounds, the start round and ``max_iter`` EM rounds."""
        return FederatedFactorEM(1, 1, **self._round_settings()).max_rounds

    def _round_settings(self) -> dict:
        """The settings that decide how many rounds the algorithm runs."""
        prior = self._option("prior")
        return {
            "init_params": self.init_params,
            "kmeans_rounds": self._option("initialisation").kmeans_rounds,
            "max_iter": self.max_iter,
            "standardize": prior.standardize,
            "prior_strength": None if prior.strength is None else 1.0,
        }

    # -------------------------------------------------------------- fitting
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        width = clients[0].shape[1]
        n_total = sum(c.shape[0] for c in clients)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        settings = self._settings(width, FactorEMConfig)
        algorithm = FederatedFactorEM(**settings, random_state=seed, **self._torch_options())
        state = self._simulate(algorithm, clients, seed)
        self._set_factor_state(state)

    def _set_result(self, result) -> None:
        """Fitted attributes from a finished ``FederatedFactorEM`` run (``from_model``)."""
        factors = getattr(result.state, "factors", None)
        if factors is None:
            raise ValueError(
                "from_model needs a finished FederatedFactorEM run (its state holds no "
                "mixture of factor analysers)."
            )
        if factors.n_features != self.n_features_in_:
            raise ValueError(
                f"X has {self.n_features_in_} features but the model was trained on "
                f"{factors.n_features}."
            )
        self._set_factor_state(result.state)

    def _set_factor_state(self, state) -> None:
        options = self._torch_options()
        params = state.factors
        self._set_factors(FactorParams(*(getattr(params, name).to(**options) for name in _FIELDS)))
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)

    def _member_model(self) -> FactorParams:
        return self.model_

    def _set_members(self, models: list[FactorParams], records: list[dict]) -> None:
        """The members' union (``fednovelty.detectors._members``) and their records:
        ``n_iter_`` summed, ``converged_`` for every member, ``lower_bounds_`` one after
        another."""
        self._set_factors(union(models), [m.n_components for m in models])
        self.n_iter_ = sum(r["n_iter"] for r in records)
        self.converged_ = all(r["converged"] for r in records)
        self.lower_bounds_ = [bound for r in records for bound in r["lower_bounds"]]

    def _set_factors(self, params: FactorParams, members: list[int] | None = None) -> None:
        """Store a fitted mixture of factor analysers (the members' union, each member's
        component count in ``members``; default one member) and its numpy attributes."""
        self.member_components_ = [params.n_components] if members is None else list(members)
        self.model_ = params
        self.weights_ = params.weights.cpu().numpy()
        self.means_ = params.means.cpu().numpy()
        self.factors_ = params.factors.cpu().numpy()
        self.noise_variances_ = params.psi.cpu().numpy()
        self.n_components_ = params.n_components
        self.n_factors_ = params.n_factors

    # -------------------------------------------------------------- scoring
    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        X = X.to(self.model_.means)
        return member_mean(
            self.model_, self.member_components_, lambda member: factor_score_samples(X, member)
        )

    def _components(self) -> Components:
        """The components as full Gaussians (``W W^T + diag(psi)`` materialised)."""
        return Components(self.model_.to_mixture_params())

    def _log_density_bound(self) -> float:
        """The highest ``log p(x)`` the mixture gives any row: at most the log-sum-exp of
        its log-density at its means (Gaussian components are unimodal and symmetric)."""
        with torch.no_grad():
            bounds = [
                log_density_bound(factor_score_samples(member.means, member))
                for member in split(self.model_, self.member_components_)
            ]
        return max(bounds)

    # -------------------------------------------------------------- persistence
    def _get_state(self):
        tensors = {f"model.{name}": getattr(self.model_, name) for name in _FIELDS}
        return tensors, {**iteration_record(self), "member_components_": self.member_components_}

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        values = [get_tensor(tensors, f"model.{name}") for name in _FIELDS]
        width = self.n_features_in_
        if values[1].ndim != 2 or values[1].shape[1] != width:
            raise ModelFormatError(
                f"the tensor 'model.means' has shape {tuple(values[1].shape)}; the model "
                f"implies (n_components, {width})."
            )
        check_positive(values[3], "the tensor 'model.psi'", "noise variances are variances")
        try:
            params = FactorParams(*values)
        except ValueError as error:
            raise ModelFormatError(f"the mixture of factor analysers 'model': {error}") from None
        check_probabilities(params.weights, "the weights 'model.weights'")
        _check_factors(params, self.reg_covar)
        members = _saved_members(attrs, params.n_components)
        options = self._torch_options()
        self._set_factors(FactorParams(*(v.to(**options) for v in values)), members)
        restore_iteration_record(self, attrs, finite=False)


def _saved_members(attrs: dict, n_components: int) -> list[int]:
    """Each member's component count from a saved file (``member_components_``; files
    saved before ``n_members`` hold one member), checked against the model's components.

    Raises:
        ModelFormatError: counts that are not positive integers summing to the model's
            ``n_components``.
    """
    if "member_components_" not in attrs:
        return [n_components]
    members = check_items(get_attr(attrs, "member_components_", list), "member_components_", int)
    if not members or min(members) < 1 or sum(members) != n_components:
        raise ModelFormatError(
            f"member_components_ {members} must be positive counts summing to the model's "
            f"{n_components} components (each member's block of 'model')."
        )
    return members


def _check_factors(params: FactorParams, reg_covar: float) -> None:
    """A loaded mixture of factor analysers (weights, means, loadings ``W`` (K, d, q) and
    noise variances ``psi`` (K, d), already finite and of their shapes) means a fit:
    each feature's variance ``sum_q W^2 + psi`` at most ``sqrt(finfo.max)`` times its noise
    variance (loadings bounded), each noise variance at least the fit's floor
    (:func:`~fednovelty.detectors.persistence_checks.noise_floor`), the means scorable
    (:func:`~fednovelty.detectors.persistence_checks.check_scorable`) and the log-density at
    the means finite. The stored scores are checked against that density afterwards
    (``check_reachable_scores``)."""
    psi = params.psi
    variances = params.factors.square().sum(2) + psi  # (K, d)
    largest = math.sqrt(torch.finfo(psi.dtype).max)
    check_at_least(
        psi,
        noise_floor(params.weights, variances, reg_covar),
        "the tensor 'model.psi'",
        f"the fit adds reg_covar={reg_covar:g} to every noise variance in its own units",
    )
    check_in_box(
        variances / psi,
        "the loadings 'model.factors' (as each feature's variance over 'model.psi')",
        1.0,
        largest,
        "a loading is a part of the variance the noise does not explain, and scoring squares "
        "it over the noise variance",
    )
    check_scorable(
        params.means, float(psi.min().rsqrt()), "the tensors 'model.means' and 'model.psi'"
    )
    try:
        with torch.no_grad():
            at_means = factor_score_samples(params.means, params)
    except ValueError as error:
        raise ModelFormatError(
            f"the tensors 'model.factors' and 'model.psi' do not make covariances that score: "
            f"{error}"
        ) from None
    if not bool(torch.isfinite(at_means).all()):
        raise ModelFormatError(
            "the tensors 'model.factors' and 'model.psi' give a non-finite log-density at "
            "'model.means'."
        )


#: the fields of :class:`~fednovelty.mixture.factor.FactorParams`, in constructor order.
_FIELDS = ("weights", "means", "factors", "psi")

__all__ = ["AUTO_FACTORS", "FedMFADetector", "resolve_n_factors"]
