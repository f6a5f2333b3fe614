"""The settings groups of federated variational Bayes that its relatives share.

:class:`VBPriorSettings` (scikit-learn's ``BayesianGaussianMixture`` priors and the
effective-weight threshold), :class:`OneShotSettings` (how local posteriors are matched and
combined: one-shot VB and VB's one-shot start), :class:`BoxSettings` (a public box, also
pFedEM's) and :class:`VBMomentsSettings` (standardisation and the Wishart's pseudo-rows). The
algorithms' configs compose them (:class:`~fednovelty.federated.bayesian.variational.VBConfig`,
:class:`~fednovelty.federated.bayesian.vb_oneshot.VBOneShotConfig`).
"""

from __future__ import annotations

import math

from torch import Tensor

from fednovelty.federated.core.config import (
    Settings,
    TorchSettings,
    as_tensor,
    optional_count,
    settings_dataclass,
)
from fednovelty.federated.init.settings import MomentsSettings
from fednovelty.federated.init.units import check_bounds
from fednovelty.mixture.vb_prior import WEIGHT_PRIOR_TYPES, InvalidPriorError

__all__ = [
    "POSTERIOR_AGGREGATIONS",
    "BoxSettings",
    "OneShotSettings",
    "VBMomentsSettings",
    "VBPriorSettings",
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
        self._check_choice("posterior_aggregation", POSTERIOR_AGGREGATIONS)
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
