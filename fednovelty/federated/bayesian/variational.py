"""Federated variational Bayes for Gaussian mixtures (exact: summed statistics, one prior).

Every round the server broadcasts the variational posterior (:mod:`fednovelty.mixture.variational`)
and a moment shift; each client replies with the variational E-step's summed statistics (the
message of federated EM); the server adds them, recovers the responsibilities' entropy, runs
the conjugate M-step and records the ELBO. Under one shared prior any split of the rows
follows scikit-learn's ``BayesianGaussianMixture`` to round-off. ``FederatedVB`` chains::

    [public box / moments (standardize)] + [prior moments] + start + VB

:class:`~fednovelty.federated.bayesian.vb_prior_step.VBPriorStep` merges the clients' means and
scatters into scikit-learn's default priors, or with ``prior_strength`` a Wishart of that many
pseudo-rows. The start (:func:`vb_steps`): federated EM's initialisation (K an upper bound)
and one ``vb_init`` round; or, with ``init_params="oneshot"``, one round of local posteriors
under the same prior, matched, combined and refined on the server
(:class:`~fednovelty.federated.bayesian.vb_local.VBLocalStep`). :class:`VBStep` runs until the
ELBO changes by less than ``tol``. Robust options as federated EM's; a client below its
privacy floor skips; a component backed by fewer than ``min_rows`` effective rows is sent as
zeros and stays at its prior. With ``bounds`` (a public box) or ``standardize`` the rounds
work in ``[-1, 1]`` per feature or in z-scores and the posterior is mapped back exactly
(:mod:`~fednovelty.federated.bayesian.vb_units`). Under differential privacy (``dp_mode``)
the prior moments and every Lloyd, ``vb_init`` and ``vb`` round release noisy sums, the start
is public, and ``max_iter`` rounds run without the ELBO
(``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.bayesian.vb_local import VB_REPLIES, VBLocalStep
from fednovelty.federated.bayesian.vb_prior_step import VBPriorStep
from fednovelty.federated.bayesian.vb_settings import (
    OneShotSettings,
    VBMomentsSettings,
    VBPriorSettings,
)
from fednovelty.federated.bayesian.vb_units import PosteriorUnitsStep
from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    settings_dataclass,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.chain import init_steps
from fednovelty.federated.init.combine import combine_stats
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.init.settings import GivenMixture, InitSettings, PrivateSettings
from fednovelty.federated.mixtures.em import floored_stats_message
from fednovelty.mixture import MixtureParams, e_step_stats
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.variational import (
    VBPosterior,
    resp_entropy_from_stats,
    vb_log_offset,
    vb_lower_bound,
    vb_m_step,
)
from fednovelty.mixture.vb_predictive import effective_n_components
from fednovelty.mixture.vb_prior import VBPrior

__all__ = ["FederatedVB", "VBConfig", "VBState", "VBStep", "pad_components", "vb_steps"]


@settings_dataclass
class VBConfig(
    PrivateSettings,
    RobustSettings,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    InitSettings,
    VBMomentsSettings,
    GivenMixture,
    VBPriorSettings,
    OneShotSettings,
):
    """Settings of federated variational Bayes (``FederatedVB``): the robust options
    (``aggregation`` ``"sum"`` or ``"trimmed"``), ``n_components`` (the upper bound K) and
    ``chunk_size``, the covariance and iteration settings (``tol`` applies to the ELBO, as
    scikit-learn's), federated EM's initialisation
    (:func:`~fednovelty.federated.init.chain.init_steps`, given parameters included), the
    priors (:class:`~fednovelty.federated.bayesian.vb_settings.VBPriorSettings`), seed and
    placement. One posterior of the weights is shared by all clients. ``standardize``,
    ``prior_strength`` and ``prior_scale``
    (:class:`~fednovelty.federated.bayesian.vb_settings.VBMomentsSettings`, off by default): a
    ``moments`` round of pooled z-scores and the Wishart's pseudo-rows.

    ``bounds`` (:class:`~fednovelty.federated.bayesian.vb_settings.BoxSettings`): a public box
    every round's rows are mapped to
    (``[-1, 1]`` per feature) before anything is taken from them; the posterior is mapped
    back to the user's units at the end. Differential privacy
    (:class:`~fednovelty.federated.init.settings.PrivateSettings`, ``dp_mode`` set) needs the
    box (the rows are clipped around its centre), the plain sum (``aggregation="sum"``, no
    ``client_weight_cap``) and runs ``max_iter`` VB rounds: the ELBO needs the
    log-likelihood, which the clients withhold.

    The start: the initial mixture of the initialisation settings, its responsibilities
    giving the first posterior (scikit-learn's ``_initialize``); with
    ``init_params="oneshot"`` instead one round in which every client fits its own
    posterior under the shared prior (local k-means start, ``tol``, ``local_max_iter`` or
    else ``max_iter`` iterations) and the server matches, combines and refines them
    (:class:`~fednovelty.federated.bayesian.vb_settings.OneShotSettings`; here
    ``posterior_aggregation`` defaults to ``"natural"`` and ``refine_iter`` to 100), the VB
    rounds continuing from that posterior.

    Raises:
        ValueError: ``dp_mode`` without
            ``bounds`` or with a robust option; ``covariance_type="spherical"`` with a box
            whose features have different widths (one variance cannot be rescaled per
            feature); ``init_params="oneshot"`` with ``dp_mode`` (local posteriors have
            no private form), with ``covariance_type="tied"`` or with a given
            ``means_init`` / ``weights_init`` / ``precisions_init``.
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum", "trimmed")
    #: K is an upper bound: the k-means initialisation may seed fewer components than K when
    #: the clients' privacy floors allow fewer centroids; the rest start empty, at the prior.
    FEWER_CENTROIDS_OK: ClassVar[bool] = True

    posterior_aggregation: str = "natural"
    refine_iter: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init_params == "oneshot":
            self._check_oneshot_start()
        if self.private and self.bounds is None:
            raise ValueError(
                "differential privacy clips rows around the centre of a public box: give "
                "bounds=(low, high) (one value per feature each) with dp_mode set."
            )
        if self.bounds is not None and self.covariance_type == "spherical":
            low, high = self.bounds
            widths = {round(b - a, 12) for a, b in zip(low, high, strict=True)}
            if len(widths) > 1:
                raise ValueError(
                    'covariance_type="spherical" needs bounds of one width for every feature '
                    "(a spherical covariance cannot be rescaled per feature); widen the "
                    'narrower features\' bounds or use "diag".'
                )

    def _check_oneshot_start(self) -> None:
        """A ``ValueError`` naming the setting the one-shot start cannot take."""
        if self.private:
            raise ValueError(
                'init_params="oneshot" sends every client\'s local posterior, which has no '
                'private form; use init_params="kmeans" or "separated" with dp_mode set.'
            )
        if self.covariance_type == "tied":
            raise ValueError(
                'init_params="oneshot" takes covariance_type "full", "diag" or "spherical" '
                "(the clients' tied fits do not align one shared Wishart); use "
                'init_params="kmeans" for "tied".'
            )
        given = [
            n
            for n in ("weights_init", "means_init", "precisions_init")
            if getattr(self, n) is not None
        ]
        if given:
            raise ValueError(
                f'init_params="oneshot" starts from the clients\' local fits, not from a given '
                f'mixture: leave {", ".join(given)} unset, or use init_params="kmeans" with them.'
            )


@dataclass
class VBState:
    """Server state of federated VB.

    It has the fields of :class:`~fednovelty.federated.mixtures.em.EMState` that the shared
    init steps read and write (``phase``, ``rounds``, ``params``, ``centers``, ``lloyd_rounds``,
    ``subset_fraction``, ``offset``, ``scale``, ``prior``, ``pca``, ``projection``;
    ``params`` is the initial mixture), and:

    Attributes:
        vb_prior: the Normal-Wishart prior once known.
        posterior: current variational posterior.
        lower_bounds: the ELBO after each VB M-step (scikit-learn's ``lower_bounds_``;
            with ``bounds`` in the box's units; empty under differential privacy).
        offset, scale: the public box's map ``u = (x - offset) / scale`` (``bounds``),
            each (n_features,); ``vb_prior`` stays in those units, ``posterior`` is mapped
            back to the user's when the chain finishes.
        n_iter: VB rounds run (the ``vb_init`` or ``vb_local`` round is not one);
            ``converged``.
        effective_n_components: components whose expected weight exceeds the threshold.
        client_rows, client_posteriors, assignments, dropped, left_out: the one-shot
            start's record (``init_params="oneshot"``; as
            :class:`~fednovelty.federated.bayesian.vb_oneshot.VBOneShotState`'s).
        reference: scikit-learn's default prior from the ``vb_prior`` round (the pooled
            data's mean and covariance; what the one-shot matching measures against).
    """

    phase: str
    rounds: int = 0
    params: MixtureParams | None = None
    centers: Tensor | None = None
    lloyd_rounds: int = 0
    subset_fraction: float = 0.0
    offset: Tensor | None = None
    scale: Tensor | None = None
    prior: Any = None
    pca: Any = None
    projection: Any = None
    vb_prior: VBPrior | None = None
    posterior: VBPosterior | None = None
    lower_bounds: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    effective_n_components: int = 0
    client_rows: dict[int, float] = field(default_factory=dict)
    client_posteriors: dict[int, VBPosterior] = field(default_factory=dict)
    assignments: dict[int, Tensor] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    left_out: list[int] = field(default_factory=list)
    reference: VBPrior | None = None


def pad_components(params: MixtureParams, n_components: int) -> MixtureParams:
    """``params`` with zero-weight components appended up to ``n_components`` (each at the
    mixture mean with the first component's precision factor): components the
    initialisation could not seed (fewer centroids than the upper bound K) take no
    responsibility in the ``vb_init`` round, so the VB M-step leaves them at the prior.
    ``params`` itself when it has ``n_components`` already."""
    missing = n_components - params.n_components
    if missing <= 0:
        return params
    weights = torch.cat([params.weights, params.weights.new_zeros(missing)])
    mean = moment_shift(params)
    means = torch.cat([params.means, mean.expand(missing, -1)])
    prec = params.precisions_cholesky
    if params.covariance_type != "tied":
        prec = torch.cat([prec, prec[:1].expand(missing, *prec.shape[1:])])
    return MixtureParams(weights, means, prec, params.covariance_type)


class VBStep(Step):
    """The ``vb_init`` round and the VB rounds (module docstring); after a one-shot start
    (a posterior already in ``state.posterior``) the VB rounds alone, counted from 0."""

    kinds = ("vb_init", "vb")
    replies = VB_REPLIES

    def __init__(self, config: VBConfig) -> None:
        self.config = config
        self.max_rounds = config.max_iter + 1

    def begin(self, state: Any) -> str | None:
        if state.posterior is not None:  # the one-shot start's posterior
            state.n_iter, state.converged = 0, False
            return "vb"
        state.params = pad_components(state.params, self.config.n_components)
        return "vb_init"

    def configure(self, state: Any) -> Message:
        expect = {"covariance_type": self.config.covariance_type}
        if state.phase == "vb_init":
            params = state.params
            return Message(
                "vb_init", {**params.tensors(), "shift": moment_shift(params)}, expect=expect
            )
        posterior = state.posterior
        return Message(
            "vb",
            {
                "log_weights": vb_log_offset(posterior),
                "means": posterior.means,
                "precisions_cholesky": posterior.precisions_cholesky,
                "shift": posterior.weights @ posterior.means,
            },
            expect=expect,
        )

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply(message.kind, context.terms.below_floor)
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        log_weights = t["weights"].log() if message.kind == "vb_init" else t["log_weights"]
        terms = context.terms
        # sum_i r_ik^2: with the counts, each component's effective rows (the floor's test)
        squared = X.new_zeros(t["means"].shape[0]) if terms.has_floor else None
        stats = e_step_stats(
            X,
            log_weights,
            t["means"],
            t["precisions_cholesky"],
            self.config.covariance_type,
            t["shift"],
            self.config.chunk_size,
            squared_counts=squared,
        )
        return floored_stats_message(X, stats, squared, terms, log_weights, t, message.kind)

    # ------------------------------------------------------------------ server half
    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        if state.phase == "vb_init":
            shift = moment_shift(state.params)
        else:
            shift = state.posterior.weights @ state.posterior.means
        stats = combine_stats(replies, shift, config, state)
        if float(stats.n_samples) <= 0:
            raise ValueError("no client with data replied in this VB round.")
        if state.phase == "vb_init":
            state.posterior = vb_m_step(stats, state.vb_prior, config.reg_covar)
            state.effective_n_components = effective_n_components(
                state.posterior, config.weight_threshold
            )
            return "vb", {"phase": "vb_init"}
        # the entropy needs the log-likelihood, which private clients withhold
        entropy = None if config.private else resp_entropy_from_stats(stats, state.posterior)
        state.posterior = vb_m_step(stats, state.vb_prior, config.reg_covar)
        state.n_iter += 1
        state.effective_n_components = effective_n_components(
            state.posterior, config.weight_threshold
        )
        metrics: dict[str, Any] = {
            "phase": "vb",
            "effective_n_components": state.effective_n_components,
        }
        if entropy is not None:
            elbo = float(vb_lower_bound(state.posterior, entropy))
            previous = state.lower_bounds[-1] if state.lower_bounds else -math.inf
            state.lower_bounds.append(elbo)
            state.converged = abs(elbo - previous) < config.tol
            metrics["elbo"] = elbo
        done = state.converged or state.n_iter >= config.max_iter
        return (None if done else "vb"), metrics


def vb_steps(config: VBConfig) -> list[Step]:
    """The chain of federated VB: ``[public box] + [prior moments] + start + [VB]`` (the
    box is :class:`~fednovelty.federated.init.moments.MomentsStep` without a round: with ``bounds``
    it sets the working units, maps every later round's rows to them and the initial
    mixture back at the end). The start is federated EM's init steps or, with
    ``init_params="oneshot"``, VB's own one-shot round of local posteriors
    (:class:`~fednovelty.federated.bayesian.vb_local.VBLocalStep`, in place of federated
    EM's one-shot mixture)."""
    if config.init_params == "oneshot":
        start: list[Step] = [VBLocalStep(config)]
    else:
        start = init_steps(config)
    return [MomentsStep(config), VBPriorStep(config), *start, VBStep(config), PosteriorUnitsStep()]


class FederatedVB(ChainedAlgorithm):
    """Federated variational Bayes Gaussian mixture (see the module docstring).

    ``FederatedVB(n_components, **settings)`` with the settings of :class:`VBConfig`, or
    ``FederatedVB.from_config(VBConfig(...))``. The result is ``state.posterior``
    (:class:`~fednovelty.mixture.variational.VBPosterior`), ``state.lower_bounds`` (ELBO per
    round) and ``state.effective_n_components``.

    - prior moments (:class:`~fednovelty.federated.bayesian.vb_prior_step.VBPriorStep`, one
      round, skipped when ``mean_prior`` and ``covariance_prior`` are both given): each client
      sends its row count, mean and scatter about its own mean (full matrix); the server
      merges them exactly (Chan's parallel formula, no cancellation) into scikit-learn's
      default ``mean_prior`` (the data mean) and ``covariance_prior`` (the data covariance,
      ``ddof=1``).
    - initialisation: :func:`~fednovelty.federated.init.chain.init_steps` as in federated EM
      (k-means, separated, subset, or given ``weights_init``/``means_init``/
      ``precisions_init``); it leaves a Gaussian mixture in ``state.params``. K is an upper
      bound: when the clients' privacy floors let them send fewer k-means centroids than K,
      the k-means init seeds half as many components as centroids arrived and the rest start
      empty (:func:`pad_components`), at the prior.
    - or, with ``init_params="oneshot"``, the one-shot start
      (:class:`~fednovelty.federated.bayesian.vb_local.VBLocalStep`, one ``vb_local``
      round): every client fits its own posterior under the shared prior and sends its
      statistics; the server matches and combines the local posteriors
      (``posterior_aggregation``, ``match_threshold``, ``total_evidence``) and runs up to
      ``refine_iter`` variational iterations on the clients' component statistics; the
      ``vb`` rounds start from that posterior (no ``vb_init`` round).
    - VB (:class:`VBStep`): one ``vb_init`` round (clients' Gaussian E-step responsibilities
      under ``state.params``, summed; the server's VB M-step gives the first posterior:
      scikit-learn's ``_initialize`` from those responsibilities) and then ``vb`` rounds until
      the ELBO changes by less than ``tol`` (in nats, summed over all rows:
      scikit-learn's rule) or ``max_iter`` rounds ran.

    Robust options (:mod:`fednovelty.federated.trust.robust`, as federated EM's):
    ``client_weight_cap`` scales down the sums of a client claiming more than that many median
    clients' rows, and ``aggregation="trimmed"`` combines the ``vb_init``/``vb`` statistics by
    :func:`~fednovelty.federated.trust.robust.robust_stats` (through the shared
    :func:`~fednovelty.federated.init.combine.combine_stats`) and leaves the most outlying client's
    k-means centroids out of the initialisation; the posterior is then no longer the pooled
    rows' exactly, and the ELBO is computed from the combined statistics.
    """

    config_class = VBConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(VBConfig(n_components=n_components, **settings))

    def _setup(self, config: VBConfig) -> None:
        super()._setup(config)
        self._chain(vb_steps(config))

    def new_state(self) -> VBState:
        return VBState(phase="")
