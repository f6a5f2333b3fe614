"""The settings groups of the preparation rounds, composed into the algorithms' configs.

- :class:`MomentsSettings`: what a ``moments`` round sets (standardisation, covariance
  prior, a public box of the features).
- :class:`InitSettings`: how rounds find the initial mixture (``init_params``: one of
  :data:`INIT_PARAMS`, the k-means and subset budgets).
- :class:`GivenMixture`: initial weights, means and precisions given as settings.
- :class:`PrivateSettings`: what the server knows of its clients' differential-privacy
  policy (``dp_mode``: one of :data:`DP_MODES`); every private round reads it.

Each is a :class:`~fednovelty.federated.core.config.Settings` group
(:mod:`fednovelty.federated.core.config` describes how they compose).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from fednovelty.federated.core.config import (
    Settings,
    TorchSettings,
    as_tensor,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.init.units import check_bounds
from fednovelty.federated.trust.dp import MODES

#: how rounds find the initial mixture (:class:`InitSettings`).
INIT_PARAMS: tuple[str, ...] = ("kmeans", "separated", "subset", "oneshot")


@settings_dataclass
class MomentsSettings(Settings):
    """What a ``moments`` round of pooled feature moments sets
    (:class:`~fednovelty.federated.init.moments.MomentsStep`): ``standardize`` (fit on
    z-scores; the result is in the original units), ``prior_strength`` (pseudo-rows of the
    covariance prior, > 0; ``None``: plain ML M-steps), ``prior_scale`` (> 0: the prior's
    target variance as a multiple of each feature's variance) and ``bounds`` (``(low, high)``,
    each one value per feature: a public box the rows are first mapped to, ``[-1, 1]`` per
    feature, before any moment is taken; what a differentially private fit needs, since its
    rows are clipped around the origin of the units it works in)."""

    standardize: bool = False
    prior_strength: float | None = None
    prior_scale: float = 1.0
    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("bounds", check_bounds(self.bounds))
        if self.prior_strength is not None and not float(self.prior_strength) > 0:
            raise ValueError(f"prior_strength must be > 0 or None, got {self.prior_strength}.")
        if not float(self.prior_scale) > 0:
            raise ValueError(f"prior_scale must be > 0, got {self.prior_scale}.")
        strength = self.prior_strength
        self._set("prior_strength", None if strength is None else float(strength))
        self._set("prior_scale", float(self.prior_scale))
        self._set("standardize", bool(self.standardize))

    @property
    def needs_moments(self) -> bool:
        """Whether a ``moments`` round runs first (standardisation or the prior)."""
        return self.standardize or self.prior_strength is not None


#: where differential-privacy noise is added (``fednovelty.federated.trust.dp.MODES``).
DP_MODES: tuple[str, ...] = MODES


@settings_dataclass
class PrivateSettings(Settings):
    """What the server knows of its clients' differential-privacy policy
    (:class:`~fednovelty.federated.trust.dp.DPPolicy`; each client holds its own): ``dp_mode``
    (``None``: off, else one of :data:`DP_MODES`), ``dp_noise_multiplier`` (``z``: the
    trusted server's noise in ``"central"`` mode, and the noise the sum carries), and
    ``dp_clip`` (``B``, the rows' clipping radius). With ``dp_mode`` set the server reads
    noisy sums: it post-processes them into statistics rows in the clipping ball could
    produce, runs a fixed number of rounds (no stopping rule on a withheld log-likelihood)
    and its gate checks private replies for form and finiteness only. A robust option is
    allowed where it keeps the guarantee (``docs/differential_privacy.md``, robust
    aggregation of private replies): ``aggregation="trimmed"`` (or ``"median"`` where the
    algorithm has it) in ``"central"`` and ``"local"`` mode, ``client_weight_cap`` in
    ``"local"`` mode only, neither in ``"distributed"`` mode. ``dp_insecure_seed`` is for
    tests only: the trusted server's ``"central"`` noise drawn from it
    (:class:`~fednovelty.federated.trust.noise.SeededNoise`), reproducible by whoever knows it, so
    a fit with it has no privacy guarantee; ``None`` (the default): fresh OS entropy, never
    ``random_state``."""

    dp_mode: str | None = None
    dp_noise_multiplier: float = 0.0
    dp_clip: float = 1.0
    dp_insecure_seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dp_mode is not None:
            self._check_choice("dp_mode", DP_MODES)
        self._set(
            "dp_noise_multiplier",
            float(at_least("dp_noise_multiplier", self.dp_noise_multiplier, 0)),
        )
        if not float(self.dp_clip) > 0:
            raise ValueError(f"dp_clip must be > 0, got {self.dp_clip!r}.")
        self._set("dp_clip", float(self.dp_clip))
        if self.private:
            self._check_private_robust()

    def _check_private_robust(self) -> None:
        """Refuse, by name, a robust option that ``dp_mode`` cannot keep private: in
        ``"distributed"`` mode each reply carries a share of the noise and only the sum
        carries all of it, so any other combination of the replies would release less
        noise than the guarantee needs; a ``client_weight_cap`` reads the row counts, exact
        in ``"central"`` mode, where one row could then move every capped client's weight
        (in ``"local"`` mode they are noisy, and the cap is post-processing)."""
        aggregation = getattr(self, "aggregation", "sum")
        if aggregation != "sum" and self.dp_mode == "distributed":
            raise ValueError(
                f'aggregation="{aggregation}" combines the clients\' replies, each of which '
                'carries only a share of the noise in dp_mode="distributed"; only their sum '
                'is private. Use aggregation="sum", or dp_mode="central" or "local".'
            )
        if getattr(self, "client_weight_cap", None) is not None and self.dp_mode != "local":
            raise ValueError(
                f"client_weight_cap reads the clients' row counts, which are exact in "
                f'dp_mode="{self.dp_mode}": one row could move every capped client\'s '
                "weight, beyond the sensitivity the noise is calibrated for. Use it with "
                'dp_mode="local" (noisy row counts), or aggregation="trimmed".'
            )

    @property
    def private(self) -> bool:
        """Whether the clients release noisy statistics (``dp_mode`` set)."""
        return self.dp_mode is not None


@settings_dataclass
class InitSettings(Settings):
    """How federated rounds find the initial mixture
    (:func:`~fednovelty.federated.init.chain.init_steps`): ``init_params`` (``"kmeans"``,
    ``"separated"``, ``"subset"`` or ``"oneshot"``), ``kmeans_rounds`` (most federated Lloyd
    rounds, >= 1), ``kmeans_tol`` (Lloyd stops when the largest squared centre move is below
    it times the mean feature variance) and ``subset_size`` (rows sent in total for
    ``"subset"``, >= 1)."""

    #: whether the k-means initialisation may seed fewer than ``n_components`` centres (an
    #: upper bound on K, as variational Bayes and federated EM have).
    FEWER_CENTROIDS_OK: ClassVar[bool] = False

    init_params: str = "kmeans"
    kmeans_rounds: int = 10
    kmeans_tol: float = 1e-4
    subset_size: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("init_params", INIT_PARAMS)
        for name in ("kmeans_rounds", "subset_size"):
            self._set(name, int(at_least(name, getattr(self, name), 1)))
        self._set("kmeans_tol", float(at_least("kmeans_tol", self.kmeans_tol, 0)))


@settings_dataclass
class GivenMixture(TorchSettings):
    """A mixture given as settings: ``weights_init``, ``means_init``, ``precisions_init``
    (scikit-learn's initial parameters: numpy, lists or torch; precision factors, not
    covariances), kept as tensors in ``dtype`` on ``device``."""

    weights_init: Tensor | None = None
    means_init: Tensor | None = None
    precisions_init: Tensor | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("weights_init", "means_init", "precisions_init"):
            self._set(name, as_tensor(getattr(self, name), self.dtype, self.device))

    @property
    def given_params(self) -> bool:
        """Whether the weights, means and precisions are all given (no init rounds)."""
        given = (self.weights_init, self.means_init, self.precisions_init)
        return all(value is not None for value in given)
