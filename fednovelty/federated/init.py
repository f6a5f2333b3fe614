"""The steps that prepare federated EM (feature moments, the initial mixture) and the field
groups of their settings (:class:`MomentsSettings`, :class:`InitSettings`,
:class:`GivenMixture`); each a :class:`~fednovelty.federated.core.steps.Step` that federated EM
and its relatives chain before their own step, its progress kept in the algorithm's state.

- :class:`MomentsStep` (``moments``): row counts, feature means and sums of squared
  deviations, merged exactly (or robustly: :func:`pooled_moments`) into the pooled moments
  that set the standardisation ``z = (x - offset) / scale`` and the covariance prior.
- Initial centres: :class:`CentroidsStep` (``centroids``; DEM init 3, k-FED),
  :class:`RangeStep` (``range``; DEM init 1) or :class:`GivenMeans` (``means_init``), then
  :class:`AssignStep` (``assign``): federated Lloyd rounds, the last one giving the initial
  mixture from hard k-means responsibilities (scikit-learn's ``init_params="kmeans"``).
- :class:`SubsetStep` (``count``, ``subset``; DEM init 2): **raw rows to the server**; it
  warns when it begins. :class:`GivenParams`: every parameter given, no round.
- :class:`~fednovelty.federated.local_fit.OneShotStart` (``oneshot``): one round of local
  fits reduced on the server (FedGenGMM's round).

Every client half enforces the client's privacy policy (``docs/privacy.md``): it skips
below ``min_rows`` rows, forms at most ``min(n_components, max_clusters, n_rows //
min_rows)`` local clusters, sends ranges as the mean of the ``min_rows`` extreme values,
suppresses assignment statistics of centres backed by fewer than ``min_rows`` rows, and
refuses the ``subset`` round unless the policy allows raw rows.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import (
    merge_ranges,
    pool_centroids,
    stats_from_message,
    stats_message,
    sum_stats,
    total_variance,
)
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    Scalar,
    client_generator,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.core.config import (
    Settings,
    TorchSettings,
    as_tensor,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import (
    STATS_BACKING,
    ReplySpec,
    components_limit,
    components_setting,
    declare,
)
from fednovelty.federated.core.steps import Step
from fednovelty.federated.local_fit import OneShotStart
from fednovelty.federated.trust.dp import (
    MODES,
    block_multipliers,
    plausible_stats,
    private_sum,
    server_noise,
)
from fednovelty.federated.trust.plausible import robust_moments
from fednovelty.federated.trust.privacy import (
    backed,
    client_backing,
    merge_small_clusters,
    stats_backing,
    trimmed_range,
)
from fednovelty.federated.trust.private_robust import private_trimmed_moments, private_trimmed_stats
from fednovelty.federated.trust.robust import coordinate_median, outlying_points, robust_stats
from fednovelty.federated.trust.validation import (
    RTOL,
    InvalidReplyError,
    check_stats,
    expectation,
    stats_shapes,
)
from fednovelty.mixture import (
    CovariancePrior,
    FeatureMoments,
    MixtureParams,
    affine_params,
    feature_moments,
    fit_gmm,
    kmeans,
    merge_moments,
    params_from_stats,
    precisions_cholesky_from_precisions,
    prior_target,
    standardization,
    stats_from_resp,
)
from fednovelty.mixture.kmeans import assign, one_hot
from fednovelty.mixture.stats import SufficientStats

INIT_PARAMS: tuple[str, ...] = ("kmeans", "separated", "subset", "oneshot")


def check_bounds(bounds: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Public feature bounds as ``(low, high)`` tuples of floats (``None`` stays).

    Raises:
        ValueError: not two rows of one finite value per feature with ``low < high``.
    """
    if bounds is None:
        return None
    try:
        low, high = (tuple(float(v) for v in torch.as_tensor(row).reshape(-1)) for row in bounds)
    except (TypeError, ValueError):
        raise ValueError(
            f"bounds must be (low, high), each one finite value per feature; got {bounds!r}."
        ) from None
    if len(low) != len(high) or not low:
        raise ValueError(
            f"bounds must give low and high for every feature; got {len(low)} and {len(high)}."
        )
    if not all(
        math.isfinite(a) and math.isfinite(b) and a < b for a, b in zip(low, high, strict=True)
    ):
        raise ValueError("bounds must be finite with low < high for every feature.")
    return low, high


def box_units(bounds: tuple, like: Tensor) -> tuple[Tensor, Tensor]:
    """``(offset, scale)`` (each (n_features,)) of the map ``u = (x - offset) / scale`` that
    takes the box ``bounds`` to ``[-1, 1]`` per feature, in ``like``'s dtype and device."""
    low, high = (torch.tensor(row, dtype=like.dtype, device=like.device) for row in bounds)
    return (low + high) / 2, (high - low) / 2


@settings_dataclass
class MomentsSettings(Settings):
    """What a ``moments`` round of pooled feature moments sets
    (:class:`~fednovelty.federated.init.MomentsStep`): ``standardize`` (fit on z-scores; the
    result is in the original units), ``prior_strength`` (pseudo-rows of the covariance
    prior, > 0; ``None``: plain ML M-steps), ``prior_scale`` (> 0: the prior's target
    variance as a multiple of each feature's variance) and ``bounds`` (``(low, high)``,
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
    """How federated rounds find the initial mixture (:func:`init_steps`): ``init_params``
    (``"kmeans"``, ``"separated"``, ``"subset"`` or ``"oneshot"``), ``kmeans_rounds`` (most
    federated Lloyd rounds, >= 1), ``kmeans_tol`` (Lloyd stops when the largest squared
    centre move is below it times the mean feature variance) and ``subset_size`` (rows sent
    in total for ``"subset"``, >= 1)."""

    #: whether the k-means initialisation may seed fewer than ``n_components`` centres (an
    #: upper bound on K, as variational Bayes has); EM needs all of them.
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


def round_seed(config: Any, state: Any) -> int:
    """The seed of the round after ``state.rounds`` counted rounds."""
    return derived_seed(config.random_state, state.rounds)


def server_generator(config: Any, state: Any) -> torch.Generator:
    """The server's generator in the round after ``state.rounds`` counted rounds."""
    return torch.Generator().manual_seed(round_seed(config, state) ^ 0x5EED)


def row_count(X: Tensor) -> Tensor:
    """The number of rows of ``X`` as a 0-d tensor in its dtype (on the CPU)."""
    return torch.tensor(float(X.shape[0]), dtype=X.dtype)


def combine_stats(
    replies: dict[int, Message], shift: Tensor, config: Any, state: Any = None
) -> SufficientStats:
    """The M-step's statistics from the clients' replies about ``shift`` (n_features,): the
    plain sum, or the robust combination ``aggregation="trimmed"``
    (:func:`~fednovelty.federated.trust.robust.robust_stats`). With the clients' noisy statistics
    (``config.dp_mode``) the sum, or under ``"trimmed"`` the trimmed sum
    (:func:`~fednovelty.federated.trust.private_robust.private_trimmed_stats`), then the trusted
    server's noise in ``"central"`` mode (drawn after ``state.rounds``) and
    :func:`private_stats`."""
    if getattr(config, "dp_mode", None) is not None:
        if config.aggregation == "trimmed":
            stats = private_trimmed_stats(replies, shift, config.covariance_type, config.trim)
        else:
            stats = sum_stats(replies.values(), shift, config.covariance_type, noisy=True)
        return private_stats(stats, config, len(replies), state)
    if config.aggregation == "sum":
        return sum_stats(replies.values(), shift, config.covariance_type)
    ct = config.covariance_type
    per_client = {c: stats_from_message(m, shift, ct) for c, m in replies.items()}
    return robust_stats(per_client, config.trim)


def private_stats(
    stats: SufficientStats, config: Any, n_replies: int, state: Any = None
) -> SufficientStats:
    """Summed noisy statistics made usable (post-processing, no privacy cost): in
    ``"central"`` mode first the server's noise (``dp_noise_multiplier`` times each block's
    sensitivity); then :func:`~fednovelty.federated.trust.dp.plausible_stats` with counts at
    least twice the noise the summed counts carry (a component no row backs keeps a small
    weight instead of a negative one) and variances at least ``1e-4 * dp_clip**2`` and the
    noise's spectral norm on each covariance."""
    z, bound = config.dp_noise_multiplier, config.dp_clip
    if config.dp_mode == "central":
        source = server_noise(config, 0 if state is None else state.rounds)
        stats = private_sum(stats, z, bound, source)
    spread = z * (math.sqrt(n_replies) if config.dp_mode == "local" else 1.0)
    share = block_multipliers(spread)
    return plausible_stats(
        stats,
        bound,
        max(1.0, 2 * share["counts"]),
        1e-4 * bound**2,
        share["second"] * bound**2,
    )


def private_moments(
    moments: FeatureMoments, config: Any, n_replies: int, state: Any = None
) -> FeatureMoments:
    """Pooled noisy feature moments made usable as :func:`private_stats` makes summed
    statistics (they are one component's ``diag`` statistics about the clipping centre): in
    ``"central"`` mode first the trusted server's noise (the ``"moments"`` release's: count
    1, sum ``B``, sum of squares ``B**2``), then the count floored, the mean kept in the
    clipping ball and each variance between the noise's floor and ``B**2``."""
    n = moments.n_samples.reshape(())
    stats = SufficientStats(
        counts=n.reshape(1),
        sums=(n * moments.mean).unsqueeze(0),
        second=(moments.m2 + n * moments.mean.square()).unsqueeze(0),
        shift=torch.zeros_like(moments.mean),
        log_likelihood=n.new_zeros(()),
        n_samples=n,
        covariance_type="diag",
    )
    stats = private_stats(stats, config, n_replies, state)
    n = stats.counts[0]
    mean = stats.sums[0] / n
    return FeatureMoments(n, mean, stats.second[0] - n * mean.square())


def _server_like(config: Any) -> Tensor:
    """An empty tensor in the server's dtype and device (``config``'s)."""
    return torch.empty(0, dtype=config.dtype, device=config.device)


def robust_centroid_replies(replies: dict[int, Message], aggregation: str) -> dict[int, Message]:
    """The ``centroids`` replies a robust ``aggregation`` keeps (``"sum"``: all).

    Each client is summarised by the count-weighted mean of its centroids, (n_features,);
    the clients whose summary :func:`~fednovelty.federated.trust.robust.outlying_points` calls
    outlying are left out, the spread floored at the median client's own spread of its
    centroids (clients of different clusters are not outlying). One client's centroid far
    from every row (e.g. at 1e133) would otherwise seed a centre that no row joins, and
    the first M-step would fail. Only the seeds are affected: every client's rows still
    join the Lloyd rounds."""
    ids = [c for c, m in replies.items() if m.tensors["centers"].shape[0] > 0]
    if aggregation == "sum" or len(ids) < 3:
        return replies
    summaries, spreads = [], []
    for c in ids:
        t = replies[c].tensors
        centers = t["centers"].double().cpu()
        weights = t["counts"].double().cpu().clamp_min(0) + 1e-12
        weights = weights / weights.sum()
        mean = weights @ centers
        summaries.append(mean)
        spreads.append((weights @ (centers - mean).square()).sqrt())
    floor = coordinate_median(torch.nan_to_num(torch.stack(spreads), nan=math.inf))
    out = outlying_points(torch.stack(summaries), floor)
    left_out = {c for c, o in zip(ids, out.tolist(), strict=True) if o}
    return {c: m for c, m in replies.items() if c not in left_out}


def _check_enough(n_samples: float, n_components: int) -> None:
    if n_samples < n_components:
        raise ValueError(
            f"The clients hold {int(n_samples)} sample(s) but n_components={n_components}."
        )


# ----------------------------------------------------------------------------- replies
def declared_moments(reply: Message) -> tuple[Tensor, Tensor, Tensor]:
    """The moments a ``moments`` reply declares: row count, per-feature mean and sum of
    squared deviations (n_features,)."""
    t = reply.tensors
    return t["n_samples"], t["mean"], t["m2"]


def check_centroids(reply: Message, broadcast: Message) -> None:
    """At most the ``n_clusters`` centroids the round asked for, their counts adding up to
    the row count."""
    k, asked = int(reply.tensors["centers"].shape[0]), int(expectation(broadcast, "n_clusters"))
    if k > asked:
        raise InvalidReplyError(f"reply has {k} centroids; at most {asked} asked.")
    total, n = float(reply.tensors["counts"].sum()), float(reply.tensors["n_samples"])
    if abs(total - n) > RTOL * max(n, 1.0):
        raise InvalidReplyError(f"centroid counts add up to {total:g}, not the {n:g} rows sent.")


def check_subset(reply: Message, broadcast: Message) -> None:
    """At most as many rows as the client holds."""
    r, n = int(reply.tensors["rows"].shape[0]), float(reply.tensors["n_samples"])
    if r > n:
        raise InvalidReplyError(f"reply sends {r} rows of a client declaring {n:g}.")


MOMENTS_REPLY = ReplySpec(
    "moments",
    shapes=lambda b, d: {"n_samples": (), "mean": (d,), "m2": (d,)},
    backing={"n_samples": "client", "mean": "client", "m2": "client"},
    moments=declared_moments,
    private="moments",
)
CENTROIDS_REPLY = ReplySpec(
    "centroids",
    shapes=lambda b, d: {"centers": ("k", d), "counts": ("k",), "n_samples": ()},
    checks=(check_centroids,),
    backing={"centers": "components", "counts": "components", "n_samples": "client"},
    limit=components_limit,
    box="means",
    points=("centers",),
    components=components_setting,
)
RANGE_REPLY = ReplySpec(
    "range",
    shapes=lambda b, d: {"min": (d,), "max": (d,), "n_samples": ()},
    backing={"min": "client", "max": "client", "n_samples": "client"},
    box="means",
    points=("min", "max"),
)
ASSIGN_REPLY = ReplySpec(
    "assign",
    shapes=lambda b, d: stats_shapes(b, d, centers="centers"),
    checks=(check_stats,),
    backing=STATS_BACKING,
    limit=components_limit,
    box="stats",
    covariance=True,
    private="stats",
)
COUNT_REPLY = ReplySpec(
    "count", shapes=lambda b, d: {"n_samples": ()}, backing={"n_samples": "client"}
)
SUBSET_REPLY = ReplySpec(
    "subset",
    shapes=lambda b, d: {"rows": ("r", d), "n_samples": ()},
    checks=(check_subset,),
    backing={"rows": "client", "n_samples": "client"},
)


def pooled_moments(replies: dict[int, Message], config: Any) -> FeatureMoments:
    """The ``moments`` round's pooled moments: the exact merge of the clients' moments, or,
    with a robust option on (``aggregation`` other than ``"sum"``, or a
    ``client_weight_cap``), :func:`~fednovelty.federated.trust.plausible.robust_moments` (the
    coordinate-wise median for ``"median"``, else the trimmed mean with ``trim``), so one
    client cannot move the standardisation far. Under ``dp_mode`` a robust ``aggregation``
    is the coordinate-wise trimmed sum of the clients' counts, sums and sums of squares
    about the clipping centre (:func:`~fednovelty.federated.trust.private_robust.
    private_trimmed_moments`), which one row moves no more than the plain sum."""
    parts = [
        FeatureMoments(
            *(m.tensors[k].to(config.device, config.dtype) for k in ("n_samples", "mean", "m2"))
        )
        for m in replies.values()
    ]
    if config.aggregation == "sum" and config.client_weight_cap is None:
        return merge_moments(parts)
    if getattr(config, "dp_mode", None) is not None and config.aggregation != "sum":
        return private_trimmed_moments(parts, config.trim)
    method = "median" if config.aggregation == "median" else "trimmed"
    n, mean, m2 = (torch.stack([getattr(p, k) for p in parts]) for k in ("n_samples", "mean", "m2"))
    return robust_moments(n, mean, m2, method, config.trim)


class MomentsStep(Step):
    """Pooled feature moments: the standardisation and the covariance prior (module
    docstring). Runs only with ``standardize`` or ``prior_strength``."""

    kinds = ("moments",)
    replies = declare(MOMENTS_REPLY)

    def __init__(self, config: Any) -> None:
        self.config = config
        self.max_rounds = int(config.needs_moments)

    def begin(self, state: Any) -> str | None:
        config = self.config
        if config.bounds is not None:  # the public box is the working units until moments
            state.offset, state.scale = box_units(config.bounds, _server_like(config))
        return "moments" if config.needs_moments else None

    def configure(self, state: Any) -> Message:
        if self.config.bounds is None:
            return Message("moments")
        return Message("moments", {"box_offset": state.offset, "box_scale": state.scale})

    def rows(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        if "box_offset" not in message.tensors:
            return X
        offset = message.tensors["box_offset"].to(X.device, X.dtype)
        return (X - offset) / message.tensors["box_scale"].to(X.device, X.dtype)

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("moments", context.terms.below_floor)
        tensors = feature_moments(X).tensors()
        return Message("moments", tensors, backing=client_backing(tensors, X.shape[0]))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        moments = pooled_moments(replies, config)
        if getattr(config, "dp_mode", None) is not None:
            moments = private_moments(moments, config, len(replies), state)
        if float(moments.n_samples) == 0:
            raise ValueError("no client with data replied in the moments round.")
        scale = torch.ones_like(moments.mean)
        if config.standardize:
            offset, scale = standardization(moments, config.covariance_type)
            if config.bounds is None:
                state.offset, state.scale = offset, scale
            else:  # z = (u - offset) / scale with u = (x - box offset) / box scale
                state.offset = state.offset + state.scale * offset
                state.scale = state.scale * scale
        if config.prior_strength is not None:
            target = prior_target(moments.variance, scale, config.prior_scale)
            state.prior = CovariancePrior(config.prior_strength, target)
        return None, {"phase": "moments", "n_samples": float(moments.n_samples)}

    def broadcast(self, state: Any) -> tuple[dict[str, Tensor], dict[str, Scalar]]:
        if state.scale is None:
            return {}, {}
        return {"offset": state.offset, "scale": state.scale}, {}

    def view(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        if "scale" not in message.tensors:
            return X
        offset = message.tensors["offset"].to(X.device, X.dtype)
        return (X - offset) / message.tensors["scale"].to(X.device, X.dtype)

    def finish(self, state: Any) -> None:
        if state.scale is not None and state.params is not None:  # back to the user's units
            state.params = affine_params(state.params, state.offset, state.scale)


def to_working_units(state: Any, points: Tensor) -> Tensor:
    """User-unit points (m, n_features) in the units the rounds work in (z-scores after a
    standardising moments round)."""
    return points if state.scale is None else (points - state.offset) / state.scale


class GivenParams(Step):
    """Initial weights, means and precisions all given: the initial mixture, no round."""

    max_rounds = 0

    def __init__(self, config: Any) -> None:
        self.config = config

    def begin(self, state: Any) -> None:
        config = self.config
        params = MixtureParams(
            config.weights_init,
            config.means_init,
            precisions_cholesky_from_precisions(config.precisions_init, config.covariance_type),
            config.covariance_type,
        )
        if state.scale is not None:
            params = affine_params(params, -state.offset / state.scale, 1 / state.scale)
        state.params = params
        return None

    def configure(self, state: Any) -> Message:
        raise RuntimeError("GivenParams has no round.")

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        raise RuntimeError("GivenParams has no round.")

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        raise RuntimeError("GivenParams has no round.")


class GivenMeans(GivenParams):
    """``means_init`` given: the Lloyd assignment starts from those centres, no round."""

    def begin(self, state: Any) -> None:
        state.centers = to_working_units(state, self.config.means_init)
        return None


class CentroidsStep(Step):
    """k-FED: local k-means centroids, pooled and clustered by weighted k-means++ and Lloyd
    on the server into ``n_components`` centres (when fewer centroids arrive and the config's
    ``FEWER_CENTROIDS_OK``, K an upper bound: into half as many centres as centroids)."""

    kinds = ("centroids",)
    replies = declare(CENTROIDS_REPLY)

    def __init__(self, config: Any) -> None:
        self.config = config

    def configure(self, state: Any) -> Message:
        return Message(
            "centroids",
            scalars={"seed": round_seed(self.config, state)},
            expect={"n_clusters": self.config.n_components},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        k = terms.cluster_bound(self.config.n_components, X.shape[0])
        if k == 0:
            return skipped_reply("centroids", terms.below_floor)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        centers, labels = kmeans(X, k, generator=generator)
        centers, counts = merge_small_clusters(X, labels, centers, terms.min_rows)
        tensors = {"centers": centers, "counts": counts, "n_samples": row_count(X)}
        # each centroid is the mean of its (merged) cluster's rows
        backing = {"centers": counts, "counts": counts}
        backing.update(client_backing(["n_samples"], X.shape[0]))
        return Message("centroids", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        screened = robust_centroid_replies(replies, config.aggregation)
        if sum(int(m.tensors["centers"].shape[0]) for m in screened.values()) >= (
            config.n_components
        ):
            replies = screened  # else too few seeds remain: small honest clients, kept
        centers, counts = pool_centroids(replies.values())
        n_centers = config.n_components
        if config.FEWER_CENTROIDS_OK and 0 < centers.shape[0] < n_centers:
            # small clients under their privacy floors: each centre pools about two of their
            # centroids, so that after Lloyd's reassignment it still holds min_rows rows of
            # some client (one centroid a centre leaves every centre under the floor often)
            n_centers = (centers.shape[0] + 1) // 2
        if centers.shape[0] < n_centers:
            n_rows = int(sum(float(m.tensors["n_samples"]) for m in replies.values()))
            raise ValueError(
                f"The clients hold {n_rows} sample(s) in all but n_components="
                f"{config.n_components}; need at least as many samples as components, and "
                f"they sent {centers.shape[0]} centroid(s) (a client forms at most n_rows // "
                "min_rows clusters under its privacy floor). Lower n_components, add data or "
                "lower the clients' privacy floor (privacy_min_rows)."
            )
        centers = centers.to(config.device, config.dtype)
        counts = counts.to(config.device, config.dtype)
        state.centers, _ = kmeans(
            centers,
            n_centers,
            generator=server_generator(config, state),
            sample_weight=counts,
        )
        return None, {"phase": "centroids", "n_centroids": int(centers.shape[0])}


def separated_centers(low: Tensor, high: Tensor, n_centers: int, seed: int) -> Tensor:
    """``n_centers`` points far apart in the box ``[low, high]`` (each (n_features,)).

    Greedy max-min selection over a scrambled Sobol set, starting at the point nearest the
    box centre. Returns shape (n_centers, n_features).
    """
    d = low.shape[0]
    engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed)
    unit = engine.draw(max(256, 64 * n_centers), dtype=torch.float64).to(low.device, low.dtype)
    candidates = low + unit * (high - low)
    middle = (low + high) / 2
    chosen = [int((candidates - middle).square().sum(1).argmin())]
    nearest = (candidates - candidates[chosen[0]]).square().sum(1)
    for _ in range(1, n_centers):
        chosen.append(int(nearest.argmax()))
        nearest = torch.minimum(nearest, (candidates - candidates[chosen[-1]]).square().sum(1))
    return candidates[chosen]


class PublicCentres(GivenParams):
    """Initial centres from public knowledge only, no round: ``n_components`` points far
    apart in ``[-1, 1]`` per feature of the working units (z-scores, or the public box's
    units), as :func:`separated_centers` spreads them; what a differentially private fit
    starts from instead of the clients' centroids or ranges, which have no private form.
    Private Lloyd rounds (:class:`AssignStep`) follow."""

    def begin(self, state: Any) -> None:
        config = self.config
        width = self._width(state)
        low = -torch.ones(width, dtype=config.dtype, device=config.device)
        state.centers = separated_centers(low, -low, config.n_components, config.random_state)
        return None

    @staticmethod
    def _width(state: Any) -> int:
        if state.offset is None:
            raise ValueError(
                "a differentially private start needs the working units' width: give the "
                "public feature bounds (bounds / dp_bounds) or standardize."
            )
        return int(state.offset.shape[0])


class RangeStep(Step):
    """Feature ranges merged on the server; ``n_components`` centres far apart in the box."""

    kinds = ("range",)
    replies = declare(RANGE_REPLY)

    def __init__(self, config: Any) -> None:
        self.config = config

    def configure(self, state: Any) -> Message:
        return Message("range")

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("range", context.terms.below_floor)
        low, high = trimmed_range(X, context.terms.min_rows)
        # each end is the mean of the min_rows extreme values of its feature
        backing = client_backing(["min", "max"], context.terms.min_rows)
        backing.update(client_backing(["n_samples"], X.shape[0]))
        tensors = {"min": low, "max": high, "n_samples": row_count(X)}
        return Message("range", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        low, high = merge_ranges(replies.values())
        low, high = low.to(config.device, config.dtype), high.to(config.device, config.dtype)
        seed = round_seed(config, state)
        state.centers = separated_centers(low, high, config.n_components, seed)
        return None, {"phase": "range"}


def apply_user_init(params: MixtureParams, config: Any, state: Any) -> MixtureParams:
    """``params`` with the user's ``weights_init``, ``means_init`` and ``precisions_init``
    (those given) in their place, in the units the rounds work in."""
    weights = params.weights if config.weights_init is None else config.weights_init
    means, prec = params.means, params.precisions_cholesky
    if config.means_init is not None:
        means = to_working_units(state, config.means_init)
    if config.precisions_init is not None:
        ct = config.covariance_type
        prec = precisions_cholesky_from_precisions(config.precisions_init, ct)
        if state.scale is not None:  # x = offset + scale * z: U_z = D U_x
            prec = affine_params(
                MixtureParams(weights, means, prec, ct),
                means.new_zeros(means.shape[1]),
                1 / state.scale,
            ).precisions_cholesky
    return MixtureParams(weights, means, prec, config.covariance_type)


class AssignStep(Step):
    """Federated Lloyd rounds from ``state.centers``; at most ``budget`` rounds, fewer when
    the centres stop moving. Ends with the initial mixture in ``state.params``."""

    kinds = ("assign",)
    replies = declare(ASSIGN_REPLY)

    def __init__(self, config: Any, budget: int) -> None:
        self.config = config
        self.budget = int(budget)
        self.max_rounds = self.budget

    def configure(self, state: Any) -> Message:
        return Message(
            "assign",
            {"centers": state.centers, "shift": state.centers.mean(0)},
            expect={"covariance_type": self.config.covariance_type},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply("assign", terms.below_floor)
        centers = message.tensors["centers"].to(X.device, X.dtype)
        shift = message.tensors["shift"].to(X.device, X.dtype)
        labels, _ = assign(X, centers)
        resp = one_hot(labels, centers.shape[0], X)
        rows = resp.sum(0)  # hard responsibilities: a centre's rows are its effective rows
        keep = backed(rows, terms.floor)
        # a tied second moment is one for all centres: of the kept centres' rows only
        ct = self.config.covariance_type
        stats = stats_from_resp(X, resp * keep.to(X.dtype) if ct == "tied" else resp, ct, shift)
        reply = stats_message(stats, "assign")
        reply.backing.update(stats_backing(stats, rows, (rows * keep).sum()))
        return reply

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        stats = combine_stats(replies, state.centers.mean(0), config, state)
        _check_enough(float(stats.n_samples), state.centers.shape[0])
        occupied = stats.counts > 0
        moved = stats.shift + stats.sums / stats.counts.clamp_min(1e-300).unsqueeze(1)
        new_centers = torch.where(occupied.unsqueeze(1), moved, state.centers)
        movement = float((new_centers - state.centers).square().sum(1).max())
        state.lloyd_rounds += 1
        threshold = config.kmeans_tol * total_variance(stats)
        metrics = {"phase": "assign", "center_shift": movement}
        if state.lloyd_rounds >= self.budget or movement <= threshold:
            params = params_from_stats(stats, config.reg_covar, state.prior)
            state.params = apply_user_init(params, config, state)
            return None, metrics
        state.centers = new_centers
        return "assign", metrics


class SubsetStep(Step):
    """Row counts, then a random ``subset_size`` rows in all; the server fits a mixture on
    them (raw rows leave the clients: only clients whose policy allows it answer)."""

    kinds = ("count", "subset")
    replies = declare(COUNT_REPLY, SUBSET_REPLY)
    max_rounds = 2

    def __init__(self, config: Any) -> None:
        self.config = config

    def begin(self, state: Any) -> str:
        warnings.warn(
            "init_params='subset' sends raw rows of every client to the server; use "
            "'kmeans' (the default) where data must stay on the clients.",
            UserWarning,
            stacklevel=2,
        )
        return "count"

    def configure(self, state: Any) -> Message:
        if state.phase == "count":
            return Message("count")
        seed = round_seed(self.config, state)
        return Message("subset", scalars={"fraction": state.subset_fraction, "seed": seed})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        if message.kind == "count":
            if not terms.releases(X.shape[0]):
                return skipped_reply("count", terms.below_floor)
            n_rows = {"n_samples": row_count(X)}
            return Message("count", n_rows, backing=client_backing(n_rows, X.shape[0]))
        if not terms.allow_raw_rows:
            return skipped_reply(
                "subset", "the client's privacy policy does not allow raw rows (allow_raw_rows)"
            )
        n = X.shape[0]
        m = min(n, math.ceil(float(message.scalars["fraction"]) * n))
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        index = torch.randperm(n, generator=generator)[:m].to(X.device)
        tensors = {"rows": X[index], "n_samples": row_count(X)}
        # raw rows leave only by the client's own consent (allow_raw_rows, checked above);
        # the floor then asks for the client's rows behind the round, not behind each row
        return Message("subset", tensors, backing=client_backing(tensors, n))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        if state.phase == "count":
            total = sum(float(m.tensors["n_samples"]) for m in replies.values())
            _check_enough(total, config.n_components)
            state.subset_fraction = min(1.0, max(config.subset_size, config.n_components) / total)
            return "subset", {"phase": "count", "n_samples": total}
        rows = torch.cat([m.tensors["rows"] for m in replies.values()])
        rows = rows.to(config.device, config.dtype)
        k = config.n_components
        if rows.shape[0] < k:
            raise ValueError(f"the subset has {rows.shape[0]} rows, fewer than n_components={k}.")
        result = fit_gmm(
            rows,
            k,
            covariance_type=config.covariance_type,
            reg_covar=config.reg_covar,
            tol=config.tol,
            max_iter=config.max_iter,
            generator=server_generator(config, state),
            prior=state.prior,
        )
        state.params = result.params
        return None, {"phase": "subset", "rows_shared": int(rows.shape[0])}


def init_steps(config: Any) -> list[Step]:
    """The steps that produce the initial mixture, by the settings (scikit-learn's rule:
    weights, means and precisions all given -> no rounds; ``means_init`` -> one Lloyd
    round from them; else ``init_params``)."""
    if config.given_params:
        return [GivenParams(config)]
    if config.means_init is not None:
        return [GivenMeans(config), AssignStep(config, budget=1)]
    if getattr(config, "dp_mode", None) is not None:
        if config.init_params in ("subset", "oneshot"):
            raise ValueError(
                f"init_params={config.init_params!r} has no private form here (raw rows, or "
                'local fits); use "kmeans" or "separated" with differential privacy.'
            )
        return [PublicCentres(config), AssignStep(config, budget=config.kmeans_rounds)]
    if config.init_params == "kmeans":
        return [CentroidsStep(config), AssignStep(config, budget=config.kmeans_rounds)]
    if config.init_params == "separated":
        return [RangeStep(config), AssignStep(config, budget=1)]
    if config.init_params == "oneshot":
        return [OneShotStart(config)]
    return [SubsetStep(config)]
