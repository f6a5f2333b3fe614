"""One-shot federated variational Bayes: local posteriors, matched and combined once.

Two rounds (after a standardising ``moments`` round with ``standardize``), whatever K:

1. ``vb_prior`` (:class:`~fednovelty.federated.bayesian.vb_prior_step.VBPriorStep`, skipped when
   ``mean_prior`` and ``covariance_prior`` are both given): the pooled mean and covariance
   for scikit-learn's default Normal-Wishart prior, so every client fits under one shared
   prior; each client's declared row count is recorded.
2. ``vb_local`` (:class:`VBLocalStep`): each client runs variational EM on its own rows under
   the broadcast prior (from local k-means labels, at most :func:`local_clusters`) and replies
   with the statistics of its converged responsibilities, which under the shared prior *are*
   its posterior: the server rebuilds it exactly and validates every reply like a statistics
   reply; a bad one is dropped with its reason (``state.dropped``), never the run.

The server then matches the clients' components into at most ``n_components`` slots
(:func:`match_components`: symmetric KL relative to the pooled data's Gaussian), combines each
slot (:func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors`, ``"moment"`` or
``"natural"``), with ``total_evidence`` scales each slot's evidence to its total, and with
``refine_iter`` runs variational iterations on the clients' component statistics
(:func:`~fednovelty.mixture.vb_groups.fit_vb_groups`). The same step is the one-shot start
of :class:`~fednovelty.federated.bayesian.variational.FederatedVB`. Robust options
(``"trimmed"``, ``"median"``) weigh every client as the typical client's rows and leave out
outlying client posteriors. A client below its privacy floor skips both rounds and suppresses
every component backed by fewer than ``min_rows`` effective rows (sent as zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from fednovelty.federated.bayesian.vb_local import (
    VBLocalStep,
    combine_slots,
    gaussian_jeffreys,
    match_components,
    stack_groups,
)
from fednovelty.federated.bayesian.vb_prior_step import VBPriorStep
from fednovelty.federated.bayesian.vb_settings import (
    OneShotSettings,
    VBMomentsSettings,
    VBPriorSettings,
)
from fednovelty.federated.bayesian.vb_units import PosteriorUnitsStep
from fednovelty.federated.core.config import (
    AGGREGATIONS,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    settings_dataclass,
)
from fednovelty.federated.core.steps import ChainedAlgorithm
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.mixture.variational import VBPosterior
from fednovelty.mixture.vb_prior import VBPrior

__all__ = [
    "FederatedVBOneShot",
    "VBLocalStep",
    "VBOneShotConfig",
    "VBOneShotState",
    "combine_slots",
    "gaussian_jeffreys",
    "match_components",
    "stack_groups",
]


@settings_dataclass
class VBOneShotConfig(
    RobustSettings,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    VBMomentsSettings,
    VBPriorSettings,
    OneShotSettings,
):
    """Settings of one-shot federated variational Bayes (``FederatedVBOneShot``,
    :mod:`fednovelty.federated.bayesian.vb_oneshot`): ``n_components`` and ``chunk_size``, the
    covariance settings (``full``, ``diag`` or ``spherical``: the clients' fits do not
    align one shared Wishart), the iteration settings (of each client's local variational
    EM, which local k-means initialises), the priors
    (:class:`~fednovelty.federated.bayesian.vb_settings.VBPriorSettings`), how the server
    combines the local posteriors
    (:class:`~fednovelty.federated.bayesian.vb_settings.OneShotSettings`:
    ``posterior_aggregation``, ``match_threshold``, ``total_evidence``, ``refine_iter``
    (default 0 here), ``local_max_iter``), seed and placement, and the robust options
    (:class:`RobustSettings`): ``aggregation`` ``"trimmed"`` leaves out the
    ``ceil(trim * C)`` most outlying client posteriors, ``"median"`` those whose robust
    z-score exceeds 3.5, and both count every client as the typical client's rows (trimmed
    mean or median of the row counts); ``client_weight_cap`` applies.
    """

    #: ``"trimmed"`` / ``"median"``: every client counts as the typical client's rows, and
    #: outlying client posteriors are left out before the matching
    #: (:func:`fednovelty.federated.trust.robust.outlying_models`); ``client_weight_cap`` applies.
    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = AGGREGATIONS
    COVARIANCE_CHOICES: ClassVar[tuple[str, ...]] = ("full", "diag", "spherical")


#: expected count (rows) below which a client's component takes no part in the matching.


@dataclass
class VBOneShotState:
    """Server state of one-shot federated VB.

    Attributes:
        phase, rounds: the chain's (``vb_prior``, ``vb_local``, ``done``).
        vb_prior: the shared Normal-Wishart prior once known.
        client_rows: client id -> row count declared in the ``vb_prior`` round.
        client_posteriors: client id -> its local posterior (rebuilt from its statistics,
            counted as the typical client's rows under a robust ``aggregation``).
        assignments: client id -> slot of each of its components, (n_components,) long
            (-1: the component was empty or suppressed).
        dropped: client id -> why its reply was refused.
        left_out: clients whose posteriors the robust ``aggregation`` left out of the
            matching and combination (outlying plug-in mixtures).
        posterior: the combined posterior.
        n_iter: most local VB iterations a client ran; ``converged``: every client's local
            fit converged.
        lower_bounds: empty (no global ELBO is computed in one shot); kept so detectors
            read the same fields as from ``FederatedVB``.
        effective_n_components: components whose expected weight exceeds the threshold.
    """

    phase: str
    rounds: int = 0
    vb_prior: VBPrior | None = None
    client_rows: dict[int, float] = field(default_factory=dict)
    client_posteriors: dict[int, VBPosterior] = field(default_factory=dict)
    assignments: dict[int, Tensor] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    left_out: list[int] = field(default_factory=list)
    posterior: VBPosterior | None = None
    n_iter: int = 0
    converged: bool = True
    lower_bounds: list[float] = field(default_factory=list)
    effective_n_components: int = 0
    offset: Tensor | None = None
    scale: Tensor | None = None
    prior: Any = None
    params: Any = None
    reference: VBPrior | None = None


# --------------------------------------------------------------------------- matching


class FederatedVBOneShot(ChainedAlgorithm):
    """One-shot federated variational Bayes Gaussian mixture (see the module docstring).

    ``FederatedVBOneShot(n_components, **settings)`` with the settings of
    :class:`VBOneShotConfig`, or
    ``FederatedVBOneShot.from_config(VBOneShotConfig(...))``. The result is
    ``state.posterior``; ``state.assignments`` records the matching and ``state.dropped``
    the refused replies.

    Matching (:func:`match_components`). The clients' components are pooled (each weighted by
    its expected count ``n_ic``), largest first; each joins the open *slot* whose count-weighted
    Gaussian is closest in symmetric KL divergence (a slot holding another component of the same
    client is used only when no other is left), unless that divergence exceeds
    ``match_threshold`` times the component's divergence to the pooled data's Gaussian (the
    prior's mean and covariance): then it opens a new slot, while fewer than ``n_components``
    are open. The threshold is relative, so it needs no units: a component joins a slot that
    explains it much better than the whole data does.

    Combining. Each slot's components are combined with
    :func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors` (``posterior_aggregation``:
    ``"moment"``, moment matching, the minimiser of ``sum w KL(q_i || p)``, or ``"natural"``,
    natural-parameter averaging, the minimiser of ``sum w KL(p || q_i)``), the weights being the
    clients' expected counts. The weight distribution comes from the slots' summed counts and
    the prior, as the exact M-step would make it (Dirichlet ``alpha_0 + N_s``; sticks ``(1 +
    N_s, gamma_0 + sum_{t > s} N_t)``), slots ordered by decreasing count; unused slots keep the
    prior (an empty component).

    Evidence (``total_evidence``, default on). Either rule gives an *average* of the clients'
    posteriors: the prior counted once per client's worth of rows, the mean precision and
    degrees of freedom of one typical client. That costs the predictive density: every client's
    covariance carries ``W_0^-1 / (nu_0 + n_ic)`` of prior, which the exact posterior dilutes
    over all rows. So the server then raises the combined likelihood factor ``p / p_0`` to the
    power ``S = N_s^2 / sum_i n_is^2`` (the slot's total count over the count-weighted average
    contribution; 1 for one client, the number of clients for equal shares):
    :func:`~fednovelty.mixture.vb_aggregate.scale_evidence`. For natural averaging with equal
    shares this is exactly the product of the clients' likelihood factors, the posterior of the
    matched statistics summed. ``total_evidence=False`` keeps the average (what VGM2 uses as the
    next round's prior).

    Robust options (``aggregation`` ``"trimmed"`` or ``"median"``, :mod:`fednovelty.federated.
    robust`). Before the matching, every client's statistics are rescaled to the typical
    client's row count (:func:`~fednovelty.federated.trust.robust.typical_row_factors`: the trimmed
    mean or median of the declared counts), so a claimed row count sets no weight, and the
    clients whose posteriors' plug-in mixtures are outlying
    (:func:`~fednovelty.federated.trust.robust.outlying_models`: the ``ceil(trim * C)``
    most outlying, or every one with a robust z-score above 3.5) are left out
    (``state.left_out``). The ``vb_prior`` round is still the plain sum.
    ``client_weight_cap`` scales down a client's statistics before either.

    Components with an expected count below ``MIN_COMPONENT_COUNT`` (one row) are left out of
    the matching. Privacy: a client below its floor skips both rounds; a client suppresses every
    component backed by fewer than ``min_rows`` effective rows (Kish) by sending it as zeros.
    """

    config_class = VBOneShotConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(VBOneShotConfig(n_components=n_components, **settings))

    def _setup(self, config: VBOneShotConfig) -> None:
        super()._setup(config)
        self._chain(
            [MomentsStep(config), VBPriorStep(config), VBLocalStep(config), PosteriorUnitsStep()]
        )

    def new_state(self) -> VBOneShotState:
        return VBOneShotState(phase="")
