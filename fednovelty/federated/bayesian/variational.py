"""Federated variational Bayes for Gaussian mixtures (exact: summed statistics, one prior).

Every round the server broadcasts the variational posterior (:mod:`fednovelty.mixture.variational`)
and a moment shift; each client replies with the variational E-step's summed statistics (the
message of federated EM); the server adds them, recovers the responsibilities' entropy, runs
the conjugate M-step and records the ELBO. Under one shared prior any split of the rows
follows scikit-learn's ``BayesianGaussianMixture`` to round-off. ``FederatedVB`` chains::

    [public box / moments (standardize)] + [prior moments] + start + VB

:class:`VBPriorStep` merges the clients' means and scatters into scikit-learn's default
priors, or with ``prior_strength`` a Wishart of that many pseudo-rows. The start
(:func:`vb_steps`): federated EM's initialisation (K an upper bound) and one ``vb_init`` round;
or, with ``init_params="oneshot"``, one round of local posteriors under the same prior,
matched, combined and refined on the server (:class:`~fednovelty.federated.bayesian.vb_oneshot.
VBLocalStep`). :class:`VBStep` runs until the ELBO changes by less than ``tol``. Robust options
as federated EM's; a client below its privacy floor skips; a component backed by fewer than
``min_rows`` effective rows is sent as zeros and stays at its prior. With ``bounds`` (a public
box) or ``standardize`` the rounds work in ``[-1, 1]`` per feature or in z-scores and the
posterior is mapped back exactly (:func:`affine_posterior`). Under differential privacy
(``dp_mode``) the prior moments and every Lloyd, ``vb_init`` and ``vb`` round release noisy
sums, the start is public, and ``max_iter`` rounds run without the ELBO
(``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.bayesian.vb_local import VBLocalStep
from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    Settings,
    TorchSettings,
    as_tensor,
    optional_count,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import (
    STATS_BACKING,
    ReplySpec,
    components_limit,
    declare,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.chain import init_steps
from fednovelty.federated.init.combine import combine_stats, private_stats
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.init.settings import (
    GivenMixture,
    InitSettings,
    MomentsSettings,
    PrivateSettings,
)
from fednovelty.federated.init.units import check_bounds
from fednovelty.federated.mixtures.em import floored_stats_message
from fednovelty.federated.trust.privacy import client_backing
from fednovelty.federated.trust.validation import check_scatter, check_stats, stats_shapes
from fednovelty.mixture import MixtureParams, e_step_stats
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.stats import CovariancePrior, SufficientStats
from fednovelty.mixture.variational import (
    VBPosterior,
    resp_entropy_from_stats,
    vb_log_offset,
    vb_lower_bound,
    vb_m_step,
)
from fednovelty.mixture.vb_predictive import effective_n_components
from fednovelty.mixture.vb_prior import (
    WEIGHT_PRIOR_TYPES,
    InvalidPriorError,
    VBPrior,
    prior_from_moments,
    wishart_pseudo_rows,
)

__all__ = [
    "FederatedVB",
    "OneShotSettings",
    "PosteriorUnitsStep",
    "VBConfig",
    "VBMomentsSettings",
    "VBPriorSettings",
    "VBPriorStep",
    "VBState",
    "VBStep",
]


@settings_dataclass
class VBPriorSettings(TorchSettings):
    """scikit-learn's ``BayesianGaussianMixture`` priors (``None``: its defaults) and the
    effective-weight threshold, the arrays kept as tensors in ``dtype`` on ``device``.

    Attributes:
        weight_concentration_prior_type: ``dirichlet_process`` or ``dirichlet_distribution``.
        weight_concentration_prior: > 0 (default ``1 / n_components``).
        mean_precision_prior: > 0 (default 1).
        mean_prior: (n_features,) (default: the pooled mean).
        degrees_of_freedom_prior: > n_features - 1 (default n_features; checked once the
            width is known).
        covariance_prior: (n_features, n_features), (n_features,) or a float by
            covariance type (default: from the pooled covariance).
        weight_threshold: expected weight above which a component counts as effective.
    """

    weight_concentration_prior_type: str = "dirichlet_process"
    weight_concentration_prior: float | None = None
    mean_precision_prior: float | None = None
    mean_prior: Tensor | None = None
    degrees_of_freedom_prior: float | None = None
    covariance_prior: Tensor | float | None = None
    weight_threshold: float = 1e-2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight_concentration_prior_type not in WEIGHT_PRIOR_TYPES:
            raise InvalidPriorError(
                f"weight_concentration_prior_type must be one of {WEIGHT_PRIOR_TYPES}, "
                f"got {self.weight_concentration_prior_type!r}."
            )
        for name in ("weight_concentration_prior", "mean_precision_prior"):
            value = getattr(self, name)
            if value is not None and not (float(value) > 0 and math.isfinite(float(value))):
                raise InvalidPriorError(f"{name} must be a finite number > 0, got {value}.")
        dof = self.degrees_of_freedom_prior
        if dof is not None and not float(dof) > 0:
            raise InvalidPriorError(
                f"degrees_of_freedom_prior must be > n_features - 1, got {dof}."
            )
        for name in ("mean_prior", "covariance_prior"):
            self._set(name, as_tensor(getattr(self, name), self.dtype, self.device))

    @property
    def needs_prior_moments(self) -> bool:
        """Whether a ``vb_prior`` round runs (a default mean or covariance prior)."""
        return self.mean_prior is None or self.covariance_prior is None


#: How the server combines matched client posteriors.
POSTERIOR_AGGREGATIONS: tuple[str, ...] = ("natural", "moment")


@settings_dataclass
class OneShotSettings(Settings):
    """How the clients fit their local posteriors and the server turns them into one
    (:class:`~fednovelty.federated.bayesian.vb_local.VBLocalStep`: one-shot VB, and the
    ``init_params="oneshot"`` start of federated VB).

    Attributes:
        posterior_aggregation: how matched components combine
            (:func:`fednovelty.mixture.vb_aggregate.aggregate_posteriors`): ``"moment"``
            (moment matching, minimises the forward KL) or ``"natural"`` (natural-parameter
            averaging, minimises the reverse KL).
        match_threshold: a client component joins the closest slot when its symmetric KL
            divergence to the slot is at most ``match_threshold`` times its divergence to
            the pooled data's Gaussian; otherwise it opens a new slot while fewer than
            ``n_components`` are open (> 0).
        total_evidence: after combining a slot, scale its evidence from the average
            client's to the slot's total, the prior counted once
            (:func:`fednovelty.mixture.vb_aggregate.scale_evidence`); ``False`` keeps the
            rule's average (VGM2's use: the average as the next prior).
        refine_iter: most variational iterations the server then runs on the clients'
            component statistics, every row of a client's component sharing one set of
            responsibilities (:func:`fednovelty.mixture.vb_groups.fit_vb_groups`, stopped
            by ``tol``; no communication); 0: none.
        local_max_iter: most iterations of each client's local variational EM (stopped
            by ``tol``); ``None``: ``max_iter``.
    """

    posterior_aggregation: str = "moment"
    match_threshold: float = 0.5
    total_evidence: bool = True
    refine_iter: int = 0
    local_max_iter: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.posterior_aggregation not in POSTERIOR_AGGREGATIONS:
            raise ValueError(
                f"posterior_aggregation must be one of {list(POSTERIOR_AGGREGATIONS)}, got "
                f"{self.posterior_aggregation!r}."
            )
        threshold = self.match_threshold
        if isinstance(threshold, bool) or not (
            isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0
        ):
            raise ValueError(f"match_threshold must be a finite number > 0, got {threshold!r}.")
        self._set("match_threshold", float(threshold))
        if not isinstance(self.total_evidence, bool):
            raise ValueError(f"total_evidence must be True or False, got {self.total_evidence!r}.")
        refine = self.refine_iter
        if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
            raise ValueError(f"refine_iter must be an integer >= 0, got {refine!r}.")
        self._set("local_max_iter", optional_count("local_max_iter", self.local_max_iter))

    @property
    def local_iterations(self) -> int:
        """Most iterations of a client's local fit (``local_max_iter``, else ``max_iter``)."""
        return self.local_max_iter or self.max_iter


@settings_dataclass
class BoxSettings(Settings):
    """``bounds``: a public box ``(low, high)`` (each one value per feature, or ``None``)
    the rows are mapped to (``[-1, 1]`` per feature) before anything is taken from them,
    as :class:`~fednovelty.federated.init.settings.MomentsSettings` states it; what the
    :class:`~fednovelty.federated.init.moments.MomentsStep` of a VB chain reads. VB has no
    ``moments`` round (the prior-moments round takes its place): ``needs_moments`` is
    false."""

    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("bounds", check_bounds(self.bounds))

    @property
    def needs_moments(self) -> bool:
        """Never: the ``vb_prior`` round takes the ``moments`` round's place."""
        return False


@settings_dataclass
class VBMomentsSettings(MomentsSettings):
    """:class:`~fednovelty.federated.init.settings.MomentsSettings` read on the variational prior's
    terms: ``standardize`` runs the ``moments`` round (every later round works in pooled
    z-scores, the posterior is mapped back to the user's units at the end);
    ``prior_strength`` (``nu_0`` pseudo-rows, > n_features - 1) and ``prior_scale`` set the
    Wishart's defaults from the ``vb_prior`` round's pooled variances
    (:func:`~fednovelty.mixture.vb_prior.wishart_pseudo_rows`), so the prior alone needs
    no ``moments`` round; ``bounds`` as there. All off by default: scikit-learn's prior on
    the raw features."""

    @property
    def needs_moments(self) -> bool:
        """Whether a ``moments`` round runs first (standardisation only)."""
        return self.standardize


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
    priors (:class:`VBPriorSettings`), seed and placement. One posterior of the weights is
    shared by all clients. ``standardize``, ``prior_strength`` and ``prior_scale``
    (:class:`VBMomentsSettings`, off by default): a ``moments`` round of pooled z-scores and
    the Wishart's pseudo-rows.

    ``bounds`` (:class:`BoxSettings`): a public box every round's rows are mapped to
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
    (:class:`OneShotSettings`; here ``posterior_aggregation`` defaults to ``"natural"`` and
    ``refine_iter`` to 100), the VB rounds continuing from that posterior.

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


def prior_moments(reply: Message) -> tuple[Tensor, Tensor, Tensor]:
    """The moments a ``vb_prior`` reply declares: row count, per-feature mean and sum of
    squared deviations (the scatter's diagonal), (n_features,)."""
    t = reply.tensors
    return t["n_samples"], t["mean"], torch.diagonal(t["scatter"])


#: a ``vb_prior`` reply: the client's row count, mean (d,) and scatter about it (d, d),
#: symmetric positive semi-definite; it declares the client's moments (the box of its
#: later replies) and lies in the box of moments declared before it. Under differential
#: privacy it is released as a noisy scatter (count, sum of rows, sum of outer products).
VB_PRIOR_REPLY = ReplySpec(
    "vb_prior",
    shapes=lambda b, d: {"n_samples": (), "mean": (d,), "scatter": (d, d)},
    checks=(check_scatter,),
    backing={"n_samples": "client", "mean": "client", "scatter": "client"},
    box="moments",
    moments=prior_moments,
    private="scatter",
)
#: ``vb_init`` and ``vb`` replies: summed statistics under the broadcast mixture or
#: posterior, in the client's box; under differential privacy, noisy statistics.
VB_REPLIES = declare(
    *(
        ReplySpec(
            kind,
            shapes=stats_shapes,
            checks=(check_stats,),
            backing=STATS_BACKING,
            limit=components_limit,
            box="stats",
            covariance=True,
            private="stats",
        )
        for kind in ("vb_init", "vb")
    )
)


class VBPriorStep(Step):
    """Pooled mean and covariance for scikit-learn's default prior (module docstring), in
    the units the rounds work in (the public box's with ``bounds``); under differential
    privacy from the noisy sums, post-processed (:func:`private_prior_moments`). Each
    client's declared row count is kept in ``state.client_rows`` (what a later ``vb_local``
    reply is checked against)."""

    kinds = ("vb_prior",)
    replies = declare(VB_PRIOR_REPLY)

    def __init__(self, config: VBConfig) -> None:
        self.config = config

    def begin(self, state: Any) -> str | None:
        # The moments round sets federated EM's covariance prior from ``prior_strength``;
        # VB's prior is the Wishart alone, and its start (the initial mixture) stays plain.
        pooled, state.prior = state.prior, None
        if self._from_moments(pooled):
            state.vb_prior = self._pseudo_row_prior(pooled)
            return None
        if self.config.needs_prior_moments:
            return "vb_prior"
        state.vb_prior = self._prior(state, None, None, None)
        return None

    def _from_moments(self, pooled: Any) -> bool:
        """Whether the standardising ``moments`` round already gave everything the prior
        needs (z-scores: the pooled mean is 0 and the pseudo-rows need only the pooled
        variances), so no ``vb_prior`` round runs: the exact chain's k-means start, no given
        mean or covariance prior, no differential privacy."""
        config = self.config
        return (
            pooled is not None
            and getattr(config, "standardize", False)
            and getattr(config, "prior_strength", None) is not None
            and config.mean_prior is None
            and config.covariance_prior is None
            and getattr(config, "init_params", None) not in (None, "oneshot")
            and not getattr(config, "private", False)
        )

    def _pseudo_row_prior(self, pooled: CovariancePrior) -> VBPrior:
        """The Wishart of ``prior_strength`` pseudo-rows from the moments round's target
        (``prior_scale`` x the pooled variances in z-scores, population ``ddof=0``), the
        mean prior at the pooled mean (0 in z-scores), the other priors as given or
        scikit-learn's defaults."""
        config = self.config
        variance = pooled.scale / config.prior_scale
        dof, covariance = wishart_pseudo_rows(
            variance, config.prior_strength, config.prior_scale, config.covariance_type
        )
        k = config.n_components
        weight = config.weight_concentration_prior
        beta = config.mean_precision_prior
        dof = dof if config.degrees_of_freedom_prior is None else config.degrees_of_freedom_prior
        return VBPrior(
            weight_concentration_prior_type=config.weight_concentration_prior_type,
            weight_concentration=1.0 / k if weight is None else float(weight),
            mean_precision=1.0 if beta is None else float(beta),
            mean=torch.zeros_like(variance),
            degrees_of_freedom=float(dof),
            covariance=covariance,
            covariance_type=config.covariance_type,
        )

    def configure(self, state: Any) -> Message:
        if getattr(state, "scale", None) is None:  # the one-shot chain has no public box
            return Message("vb_prior")
        # the units of the moments the reply declares (the server gate's box is in x units)
        return Message("vb_prior", {"box_offset": state.offset, "box_scale": state.scale})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("vb_prior", context.terms.below_floor)
        n = X.shape[0]
        mean = X.mean(0) if n else X.new_zeros(X.shape[1])
        centered = X - mean
        tensors = {
            "n_samples": torch.tensor(float(n), dtype=X.dtype, device=X.device),
            "mean": mean,
            "scatter": centered.T @ centered,
        }
        return Message("vb_prior", tensors, backing=client_backing(tensors, n))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        if not getattr(config, "private", False):
            for cid, reply in replies.items():
                state.client_rows[cid] = float(reply.tensors["n_samples"])
        parts = [
            {k: v.to(config.device, config.dtype) for k, v in reply.tensors.items()}
            for reply in replies.values()
        ]
        n = sum(p["n_samples"] for p in parts)
        if float(n) < 2:
            raise ValueError("the default variational prior needs >= 2 rows in all.")
        mean = sum(p["n_samples"] * p["mean"] for p in parts) / n
        scatter = sum(
            p["scatter"] + p["n_samples"] * torch.outer(p["mean"] - mean, p["mean"] - mean)
            for p in parts
        )
        if getattr(config, "dp_mode", None) is not None:
            n, mean, scatter = private_prior_moments(n, mean, scatter, config, len(parts), state)
        state.vb_prior = self._prior(state, n, mean, scatter)
        state.reference = state.vb_prior
        if getattr(config, "prior_strength", None) is not None:
            # the matching's reference: the data's own Gaussian, not the pseudo-rows' prior
            state.reference = self._prior(state, n, mean, scatter, pseudo_rows=False)
        return None, {"phase": "vb_prior", "n_samples": float(n)}

    def _prior(
        self,
        state: Any,
        n: Tensor | None,
        mean: Tensor | None,
        scatter: Tensor | None,
        pseudo_rows: bool = True,
    ) -> VBPrior:
        """The shared prior from the pooled moments (``pseudo_rows=False``: scikit-learn's
        defaults whatever ``prior_strength`` says, the pooled data's Gaussian that the
        one-shot matching measures divergences against)."""
        config = self.config
        offset, scale = getattr(state, "offset", None), getattr(state, "scale", None)
        mean_prior, covariance_prior = working_priors(config, offset, scale)
        if n is None:  # every prior given: only the width is needed
            mean = mean_prior
            n, scatter = mean.new_tensor(2.0), torch.eye(mean.shape[0]).to(mean)
        moments = SufficientStats(
            counts=n.reshape(1),
            sums=torch.zeros_like(mean).unsqueeze(0),
            second=scatter.unsqueeze(0),
            shift=mean,
            log_likelihood=mean.new_zeros(()),
            n_samples=n,
            covariance_type="full",
        )
        return prior_from_moments(
            moments,
            config.n_components,
            config.covariance_type,
            weight_concentration_prior_type=config.weight_concentration_prior_type,
            weight_concentration_prior=config.weight_concentration_prior,
            mean_precision_prior=config.mean_precision_prior,
            mean_prior=mean_prior,
            degrees_of_freedom_prior=config.degrees_of_freedom_prior,
            covariance_prior=covariance_prior,
            prior_strength=getattr(config, "prior_strength", None) if pseudo_rows else None,
            prior_scale=getattr(config, "prior_scale", 1.0),
        )


def private_prior_moments(
    n: Tensor, mean: Tensor, scatter: Tensor, config: VBConfig, n_replies: int, state: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """The pooled noisy prior moments (row count (), mean (d,), scatter about the mean
    (d, d)) made usable, as federated EM's noisy statistics are
    (:func:`~fednovelty.federated.init.combine.private_stats`): they are one component's ``full``
    statistics about the clipping centre (the origin), so the trusted server's noise in
    ``"central"`` mode is the ``"scatter"`` release's (count 1, sum of rows ``B``, sum of
    outer products ``B**2``, same shares), and the post-processing keeps the count at least
    twice its noise, the mean in the clipping ball and the covariance's eigenvalues between
    the noise's floor and ``B**2``. Post-processing: no privacy cost."""
    stats = SufficientStats(
        counts=n.reshape(1),
        sums=(n * mean).unsqueeze(0),
        second=(scatter + n * torch.outer(mean, mean)).unsqueeze(0),
        shift=torch.zeros_like(mean),
        log_likelihood=mean.new_zeros(()),
        n_samples=n.reshape(()),
        covariance_type="full",
    )
    stats = private_stats(stats, config, n_replies, state)
    n = stats.counts[0]
    mean = stats.sums[0] / n
    return n, mean, stats.second[0] - n * torch.outer(mean, mean)


def working_priors(
    config: VBConfig, offset: Tensor | None, scale: Tensor | None
) -> tuple[Tensor | None, Tensor | float | None]:
    """The given ``mean_prior`` and ``covariance_prior`` (user units) in the units the
    rounds work in, ``z = (x - offset) / scale`` (each (n_features,); ``None``: the user's
    units): the mean shifted and scaled, the covariance ``D^-1 C D^-1`` (full, tied), divided
    by ``scale**2`` (diag) or by the one common ``scale**2`` (spherical)."""
    mean, cov = config.mean_prior, config.covariance_prior
    if scale is None:
        return mean, cov
    if mean is not None:
        mean = (mean - offset) / scale
    if cov is not None:
        if config.covariance_type in ("full", "tied"):
            cov = cov / torch.outer(scale, scale)
        elif config.covariance_type == "diag":
            cov = cov / scale.square()
        else:
            cov = cov / float(scale[0]) ** 2
    return mean, cov


def affine_posterior(posterior: VBPosterior, offset: Tensor, scale: Tensor) -> VBPosterior:
    """The posterior of the mixture of ``x = offset + scale * z`` when ``posterior`` is that
    of ``z`` (``offset``, ``scale`` (n_features,), ``scale`` > 0 and one common value for
    ``spherical``): means ``offset + scale * m``, covariances ``D C D`` (full, tied;
    ``D = diag(scale)``), ``scale**2 * c`` (diag, spherical), precision factors from those
    covariances (as a loaded posterior rebuilds them, so it scores bit for bit as the
    fitted one); the weights' concentrations,
    mean precisions and degrees of freedom do not change (a Wishart on ``Lambda_z`` is one
    on ``D^-1 Lambda_z D^-1`` with the same degrees of freedom)."""
    ct = posterior.covariance_type
    cov = posterior.covariances
    if ct in ("full", "tied"):
        cov = cov * torch.outer(scale, scale)
    elif ct == "diag":
        cov = cov * scale.square()
    else:
        cov = cov * scale[0].square()
    return replace(
        posterior,
        means=offset + posterior.means * scale,
        covariances=cov,
        precisions_cholesky=precisions_cholesky_from_covariances(cov, ct),
    )


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


class PosteriorUnitsStep(Step):
    """No round: when the chain finishes, maps ``state.posterior`` from the units the rounds
    worked in (a public box's, pooled z-scores) back to the user's
    (:func:`affine_posterior`); the last step of the exact and the one-shot chains."""

    max_rounds = 0

    def begin(self, state: Any) -> None:
        return None

    def configure(self, state: Any) -> Message:
        raise RuntimeError("PosteriorUnitsStep runs no round.")

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        raise RuntimeError("PosteriorUnitsStep runs no round.")

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        raise RuntimeError("PosteriorUnitsStep runs no round.")

    def finish(self, state: Any) -> None:
        if getattr(state, "scale", None) is not None and state.posterior is not None:
            state.posterior = affine_posterior(state.posterior, state.offset, state.scale)


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

    - prior moments (:class:`VBPriorStep`, one round, skipped when ``mean_prior`` and
      ``covariance_prior`` are both given): each client sends its row count, mean and scatter
      about its own mean (full matrix); the server merges them exactly (Chan's parallel formula,
      no cancellation) into scikit-learn's default ``mean_prior`` (the data mean) and
      ``covariance_prior`` (the data covariance, ``ddof=1``).
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
