"""Iterative federated EM for Gaussian mixtures (FedGMM Algorithm 2; DEM of the FedGenGMM paper).

Each EM round the server broadcasts the current parameters and a moment shift; every client
runs the E-step on its rows and replies with summed statistics (counts, first and second
moments about the shift, log-likelihood); the server adds them and runs the M-step. With
``mixture_weights="global"`` (DEM) the sums are those of the pooled rows, so any split into
clients follows scikit-learn's ``GaussianMixture`` to round-off. With ``"personal"``
(FedGMM) each client keeps its own weights ``pi_c`` and uses them in its E-step; the counts
it sends (``n_c * pi_c``) tell the server ``pi_c`` (under DP the E-step reads the
broadcast weights: kept exact counts would carry a row into later rounds). Summing
second moments about a common shift is exact for covariances too; the paper's averages of
client covariances and of client weights are settings (:class:`EMConfig`).

``FederatedEM`` chains steps (:func:`em_steps`)::

    [PCA (pca_components)] + [moments (standardize, prior)] + initialisation + EM

The PCA step (:class:`~fednovelty.federated.mixtures.pca.PCAStep`), the moments round
(:class:`~fednovelty.federated.init.moments.MomentsStep`) and the initialisation
(:func:`~fednovelty.federated.init.chain.init_steps`) are shared with the joint and clustered
mixtures; :class:`EMStep` runs until the mean log-likelihood changes by less than ``tol`` or
``max_iter`` rounds ran. A client below its privacy floor skips every round and the client
gate zeroes a component backed by fewer than ``min_rows`` effective rows
(``docs/privacy.md``). Round seeds come from ``random_state`` and ``EMState.rounds`` (the
PCA rounds do not move them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from torch import Tensor

from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    TorchSettings,
    optional_count,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import declare, stats_reply
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.chain import init_steps
from fednovelty.federated.init.combine import combine_stats
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.init.settings import (
    INIT_PARAMS,
    GivenMixture,
    InitSettings,
    MomentsSettings,
    PrivateSettings,
)
from fednovelty.federated.mixtures.accelerate import ACCELERATIONS, Squarem
from fednovelty.federated.mixtures.batched_e_step import e_step_replies
from fednovelty.federated.mixtures.e_step_reply import (
    client_e_step,
    floored_stats_message,
    kept_tied_second,
    personal_log_weights,
)
from fednovelty.federated.mixtures.paper_pooling import client_average_weights, paper_pooled_stats
from fednovelty.federated.mixtures.pca import PCAProjection, PCAState, PCAStep
from fednovelty.federated.trust.reply_form import stats_shapes
from fednovelty.federated.trust.value_checks import check_stats
from fednovelty.mixture import CovariancePrior, MixtureParams, params_from_stats
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.stats import SufficientStats

__all__ = [
    "COVARIANCE_POOLINGS",
    "GLOBAL_WEIGHTS",
    "INIT_PARAMS",
    "MIXTURE_WEIGHTS",
    "EMConfig",
    "EMSettings",
    "EMState",
    "EMStep",
    "FederatedEM",
    "client_e_step",
    "em_steps",
    "floored_stats_message",
    "kept_tied_second",
    "personal_log_weights",
]

MIXTURE_WEIGHTS: tuple[str, ...] = ("global", "personal")
#: how the M-step pools the clients' covariances (:class:`EMConfig`).
COVARIANCE_POOLINGS: tuple[str, ...] = ("exact", "paper")
#: how the global mixture weights are formed (:class:`EMConfig`).
GLOBAL_WEIGHTS: tuple[str, ...] = ("pooled", "client_average")


@settings_dataclass
class EMSettings(
    PrivateSettings,
    RobustSettings,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    InitSettings,
    TorchSettings,
):
    """What the chain of a federated EM algorithm (:func:`em_steps`) reads, short of a
    moments round and given initial parameters: the robust options (``aggregation``
    ``"sum"`` or ``"trimmed"``), ``n_components`` and ``chunk_size``, the covariance,
    iteration (``max_iter`` counts EM rounds) and initialisation settings, seed and
    placement, and

    Attributes:
        mixture_weights: ``"global"`` (one pi for all clients; DEM) or ``"personal"`` (one
            pi_c per client; FedGMM), as far as ``MIXTURE_WEIGHT_CHOICES`` has them.
        pca_components: fit the Gaussians on a federated PCA of the rows with this many
            axes (two extra rounds first; ``None``: on the rows themselves).
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum", "trimmed")
    MIXTURE_WEIGHT_CHOICES: ClassVar[tuple[str, ...]] = MIXTURE_WEIGHTS

    mixture_weights: str = "global"
    pca_components: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("mixture_weights", self.MIXTURE_WEIGHT_CHOICES)
        self._set("pca_components", optional_count("pca_components", self.pca_components))
        if self.private and self.pca_components is not None:
            raise ValueError(
                "the federated PCA rounds have no private form; use pca_components=None "
                "with dp_mode set."
            )


@settings_dataclass
class EMConfig(EMSettings, MomentsSettings, GivenMixture):
    """Settings of federated EM (``FederatedEM``; FedGMM Algorithm 2 and DEM):
    :class:`EMSettings`, the moments round's standardisation and covariance prior
    (:class:`~fednovelty.federated.init.settings.MomentsSettings`; ``standardize`` or
    ``prior_strength`` adds one round), given initial parameters
    (:class:`~fednovelty.federated.init.settings.GivenMixture`), and

    Attributes:
        acceleration: ``"none"`` (plain EM, scikit-learn's path) or ``"squarem"`` (the
            server extrapolates between EM maps under a likelihood safeguard,
            :mod:`~fednovelty.federated.mixtures.accelerate`; global weights and exact
            statistics only).
        covariance_pooling: ``"exact"``: the M-step's covariances from the summed second
            moments about the broadcast shift (centralized EM's). ``"paper"``: the FedGMM
            paper's Algorithm 1-2 (line 13) and reference code, each client's covariance
            taken about its *own* component mean, averaged with the clients' responsibility
            counts: ``Sigma_k = sum_c gamma_ck Sigma_ck / sum_c gamma_ck`` with
            ``Sigma_ck = sum_i r_ik (x_i - mu_ck)(x_i - mu_ck)^T / gamma_ck``, ``mu_ck`` the
            client's mean; it leaves out the spread of the client means about ``mu_k``
            (:func:`~fednovelty.federated.mixtures.paper_pooling.paper_pooled_stats`). The
            means are the same either way (Lemma 2).
        global_weights: ``"pooled"``: the global weights are the summed counts, normalised
            (each row counts once). ``"client_average"``: footnote 3's ``pi = sum_c gamma_c
            / N_c``, normalised: the unweighted mean of the clients' personal weights
            (:func:`~fednovelty.federated.mixtures.paper_pooling.client_average_weights`;
            ``mixture_weights="personal"`` only). With
            personal weights the global ones serve clients without weights of their own
            (scoring with no client, a new client's start).

    Raises:
        ValueError: ``covariance_pooling="paper"`` with ``dp_mode`` (the server divides
            each client's noisy statistics by its noisy count: no sensitivity bound; secure
            sums need ``dp_mode`` and show the server only the total), a robust
            ``aggregation`` or ``acceleration``; ``"client_average"`` without personal
            weights or with ``dp_mode="central"`` (whose server keeps no client weights).
    """

    ACCELERATION_CHOICES: ClassVar[tuple[str, ...]] = ACCELERATIONS
    #: ``n_components`` is an upper bound where the clients' privacy floors leave fewer
    #: k-means centroids than K: the fit seeds half as many centres as centroids (the
    #: detectors say so with a ``DataLossWarning``) instead of refusing small data.
    FEWER_CENTROIDS_OK: ClassVar[bool] = True

    acceleration: str = "none"
    covariance_pooling: str = "exact"
    global_weights: str = "pooled"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("acceleration", self.ACCELERATION_CHOICES)
        self._check_choice("covariance_pooling", COVARIANCE_POOLINGS)
        self._check_choice("global_weights", GLOBAL_WEIGHTS)
        if self.acceleration != "none" and (self.private or self.mixture_weights != "global"):
            raise ValueError(
                f"acceleration={self.acceleration!r} extrapolates the global mixture under the "
                "clients' summed log-likelihood: it needs mixture_weights='global' and no "
                "dp_mode (noisy rounds withhold the log-likelihood); use acceleration='none'."
            )
        if self.covariance_pooling == "paper":
            self._check_paper_pooling()
        if self.global_weights == "client_average" and (
            self.mixture_weights != "personal" or self.dp_mode == "central"
        ):
            raise ValueError(
                "global_weights='client_average' averages the clients' personal weights: it "
                "needs mixture_weights='personal' and a server that keeps them (not "
                "dp_mode='central'); use global_weights='pooled'."
            )

    def _check_paper_pooling(self) -> None:
        """Refuse ``covariance_pooling="paper"`` where it has no sound form."""
        if self.private:
            raise ValueError(
                "covariance_pooling='paper' takes each client's covariance about its own mean, "
                "dividing its statistics by its own count: under dp_mode those are noisy and "
                "the quotient has no sensitivity bound, and a secure sum (which needs dp_mode) "
                "shows the server only the total. Use covariance_pooling='exact' with dp_mode."
            )
        if self.aggregation != "sum" or self.acceleration != "none":
            raise ValueError(
                "covariance_pooling='paper' is the paper's plain weighted average of client "
                f"covariances; got aggregation={self.aggregation!r}, "
                f"acceleration={self.acceleration!r}. Use aggregation='sum' and "
                "acceleration='none', or covariance_pooling='exact'."
            )


@dataclass
class EMState:
    """Server state of federated EM.

    Attributes:
        phase: the next round's kind (``moments_mean``, ``moments_scatter``, ``moments``,
            ``centroids``, ``range``, ``count``, ``subset``, ``assign``, ``em``) or ``done``.
        params: current mixture (global weights) once initialised.
        centers: k-means centres during the assignment rounds, (n_components, n_features).
        lloyd_rounds: assignment rounds run.
        subset_fraction: share of each client's rows to send (``subset`` init).
        lower_bounds: mean log-likelihood before each M-step.
        n_iter: EM rounds run; ``converged``: whether ``tol`` was reached.
        client_weights: personal weights by client id (last E-step), each (n_components,).
        rounds: rounds of the moments, init and EM steps so far (the round seeds' counter;
            the PCA rounds are in ``pca.round``).
        offset, scale: the standardisation ``z = (x - offset) / scale`` (``standardize``),
            each (n_features,); the EM rounds' parameters are in ``z`` units until the end.
        prior: the covariance prior of every M-step (``prior_strength``), in ``z`` units.
        pca: the PCA step's progress (``pca_components``), else ``None``.
        projection: the federated PCA the Gaussians are fitted on (``pca_components``),
            else ``None``; ``params`` are in its units.
        squarem: the SQUAREM cycle (``acceleration="squarem"``), else ``None``; during
            the EM rounds ``params`` is the next broadcast.
        global_weights: how ``params.weights`` were formed (``EMConfig.global_weights``,
            set by each M-step); scoring that forms other global weights from the state
            (the joint model's) reads it.
    """

    phase: str
    params: MixtureParams | None = None
    centers: Tensor | None = None
    lloyd_rounds: int = 0
    subset_fraction: float = 0.0
    lower_bounds: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    client_weights: dict[int, Tensor] = field(default_factory=dict)
    rounds: int = 0
    offset: Tensor | None = None
    scale: Tensor | None = None
    prior: CovariancePrior | None = None
    pca: PCAState | None = None
    projection: PCAProjection | None = None
    squarem: Squarem | None = None
    global_weights: str = "pooled"


#: an ``em`` reply: the E-step's summed statistics under the broadcast mixture.
EM_REPLY = stats_reply("em", stats_shapes, (check_stats,), covariance=True, private="stats")


class EMStep(Step):
    """The EM rounds of federated EM (module docstring); :meth:`m_step` and :meth:`advance`
    are the Gaussian server half that other EM algorithms (``JointFedGMM``) reuse."""

    kinds = ("em",)
    replies = declare(EM_REPLY)
    streams = True  # a row source's E-step statistics are summed chunk by chunk
    batched = True  # the in-process engine's clients answer in one computation

    def __init__(self, config: EMConfig) -> None:
        self.config = config
        self.max_rounds = config.max_iter
        # E-step scratch buffers, reused by every client step this object runs (a client
        # process runs one client; the in-process engine runs them all in turn).
        self._workspace = Workspace()

    def configure(self, state: Any) -> Message:
        return Message(
            "em",
            {**state.params.tensors(), "shift": moment_shift(state.params)},
            expect={"covariance_type": self.config.covariance_type},
        )

    # ------------------------------------------------------------------ server half
    def m_step(self, state: Any, replies: dict[int, Message]) -> SufficientStats:
        """Combine the replies' statistics about the broadcast shift and set
        ``state.params`` to the M-step's mixture; returns the combined statistics.

        The covariances pool as ``covariance_pooling`` says and the weights as
        ``global_weights`` says (:mod:`~fednovelty.federated.mixtures.paper_pooling` for
        ``"paper"`` and ``"client_average"``, the latter over ``state.client_weights`` with
        this round's replies' weights in place of their earlier ones); a config
        without these settings (pFedEM's, the clustered mixtures') gets the defaults."""
        config = self.config
        shift = moment_shift(state.params)
        stats = combine_stats(replies, shift, config, state)
        if float(stats.n_samples) <= 0:
            raise ValueError("no client with data replied in this EM round.")
        summed = stats
        if getattr(config, "covariance_pooling", "exact") == "paper":
            stats = paper_pooled_stats(replies.values(), stats)
        params = params_from_stats(stats, config.reg_covar, state.prior)
        state.global_weights = getattr(config, "global_weights", "pooled")
        if state.global_weights == "client_average":
            known = {**state.client_weights, **reply_weights(replies, config)}
            if known:
                weights = client_average_weights(list(known.values()))
                params = replace(params, weights=weights.to(params.weights))
        state.params = params
        return summed

    def advance(self, state: Any, stats: SufficientStats) -> tuple[bool, float]:
        """Record an EM round's mean log-likelihood (the clients' summed log-likelihood over
        their summed rows) and apply the stopping rule (|change| < tol from the round before,
        or max_iter rounds; under SQUAREM only rounds that answered the EM map of the round
        before are compared); returns ``(whether EM is done, mean log-likelihood)``.
        Under differential privacy the clients withhold the log-likelihood: EM runs
        ``max_iter`` rounds and the mean log-likelihood is NaN (not recorded)."""
        if getattr(self.config, "dp_mode", None) is not None:
            state.n_iter += 1
            return state.n_iter >= self.config.max_iter, math.nan
        lower_bound = float(stats.log_likelihood / stats.n_samples)
        if state.scale is not None:  # log p(x) = log p(z) - sum log scale
            lower_bound -= float(state.scale.log().sum())
        state.n_iter += 1
        previous = state.lower_bounds[-1] if state.lower_bounds else -math.inf
        # under SQUAREM only a round that answered the EM map of the round before compares
        # with it (an extrapolated point moves the log-likelihood both ways)
        squarem = getattr(state, "squarem", None)
        if squarem is None or squarem.stage == "second":
            state.converged = abs(lower_bound - previous) < self.config.tol
        state.lower_bounds.append(lower_bound)
        return state.converged or state.n_iter >= self.config.max_iter, lower_bound

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        broadcast = state.params
        stats = self.m_step(state, replies)
        if config.mixture_weights == "personal":
            state.client_weights.update(reply_weights(replies, config))
        done, lower_bound = self.advance(state, stats)
        metrics = {"phase": "em"}
        if not math.isnan(lower_bound):
            metrics["mean_log_likelihood"] = lower_bound
        if getattr(config, "acceleration", "none") == "squarem":
            squarem = state.squarem = state.squarem or Squarem()
            following, best = squarem.step(broadcast, state.params, lower_bound)
            state.params = best if done else following
            metrics["squarem_alpha"] = squarem.alpha if squarem.stage == "check" else -1.0
        return (None if done else "em"), metrics

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        personal = self.config.mixture_weights == "personal"
        # under DP a row may move only its own round's statistics: weights kept from exact
        # counts of earlier rounds would carry it into every later round (module docstring)
        kept = personal and context.terms.private is None
        log_weights = context.state.get("log_weights") if kept else None
        if log_weights is None:
            log_weights = t["weights"].log()
        terms = context.terms
        stats, squared, row_log_likelihood = client_e_step(
            X, t, log_weights, self.config, self._workspace, terms.has_floor, row_likelihoods=True
        )
        if personal and X.shape[0] > 0:
            context.state["log_weights"] = personal_log_weights(stats.counts)
        if not terms.releases(X.shape[0]):
            return skipped_reply("em", terms.below_floor)
        return floored_stats_message(
            X, stats, squared, terms, log_weights, t, "em", row_log_likelihood
        )

    def client_steps(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        """Each client's :meth:`client_step` reply, the E-steps of groups of clients run as
        one computation (:func:`~fednovelty.federated.mixtures.batched_e_step.e_step_replies`;
        equal to round-off)."""
        return e_step_replies(items, message, self.config, self._workspace, self.client_step)


def reply_weights(replies: dict[int, Message], config: Any) -> dict[int, Tensor]:
    """Each replying client's personal weights ``counts / counts.sum()`` (n_components,),
    by client id, from the replies with rows; noisy counts (``config.dp_mode``) kept
    positive first (post-processing). None under ``dp_mode="central"``: a trusted server's
    clients send exact counts, and weights from them would leave the fit outside its
    guarantee."""
    if getattr(config, "dp_mode", None) == "central":
        return {}
    weights = {}
    for cid, reply in replies.items():
        if "n_samples" not in reply.tensors or not float(reply.tensors["n_samples"]) > 0:
            continue
        counts = reply.tensors["counts"].to(config.device, config.dtype)
        if getattr(config, "private", False):  # noisy counts: positive by post-processing
            counts = counts.clamp_min(1e-6 * float(counts.abs().sum()) + 1e-300)
        weights[cid] = counts / counts.sum()
    return weights


def em_steps(config: EMSettings, final: Step) -> list[Step]:
    """The chain of a federated EM algorithm ending in ``final`` (its EM step):
    ``[PCA?] + [moments] + init steps + [final]``."""
    steps: list[Step] = []
    if config.pca_components is not None:
        steps.append(PCAStep(config.pca_components, dtype=config.dtype, device=config.device))
    if isinstance(config, MomentsSettings):
        steps.append(MomentsStep(config))
    return [*steps, *init_steps(config), final]


class FederatedEM(ChainedAlgorithm):
    """Federated EM for a Gaussian mixture over clients (see module docstring).

    ``FederatedEM(n_components, **settings)`` with the settings of
    :class:`EMConfig` (``covariance_type``,
    ``mixture_weights``, ``init_params``, ``reg_covar``, ``tol``, ``max_iter``,
    ``kmeans_rounds``, ``kmeans_tol``, ``subset_size``, ``weights_init``, ``means_init``,
    ``precisions_init``, ``standardize``, ``prior_strength``, ``prior_scale``,
    ``pca_components``, ``aggregation``, ``trim``, ``client_weight_cap``, ``acceleration``,
    ``covariance_pooling``, ``global_weights``, ``random_state``, ``dtype``, ``device``,
    ``chunk_size``), or
    ``FederatedEM.from_config(EMConfig(...))``. Every setting reads as an attribute.
    """

    config_class = EMConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(EMConfig(n_components=n_components, **settings))

    def _setup(self, config: EMConfig) -> None:
        super()._setup(config)
        self._chain(em_steps(config, EMStep(config)))

    def new_state(self) -> EMState:
        return EMState(phase="")
