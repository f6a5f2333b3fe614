"""Robust combinations of client replies: bounds on what one client can do to the model.

Validation (:mod:`fednovelty.federated.trust.validation`) drops replies that no rows could
produce or that contradict what their client declared. A client that lies consistently
from its first reply on (a made-up data set, or a claimed row count far above its real one)
passes it; these pure functions bound its influence instead. Each costs something on honest
federations (rows of a rare cluster held by one client look like an attack), so all are
options, off by default; ``benchmarks/poisoning.py`` compares both sides.

- :func:`weight_factors`: **a cap on one client's weight**. No client counts for more than
  ``cap`` times the median client's row count; a larger client's statistics (or local
  mixture) are scaled down to that weight, its means and covariances unchanged.
- :func:`robust_stats`: **a trimmed combination of per-client estimates** for federated EM
  (``aggregation="trimmed"``): per component, the clients' shares of their rows are
  combined by a trimmed mean, so a component that one client fills on its own gets almost
  no weight, and its mean and covariance come from the clients whose own component mean
  lies nearest the coordinate-wise median of theirs. ``trim`` must exceed the share of
  hostile clients to stop them all.
- :func:`outlying_models`: the same idea for local mixtures (FedGenGMM) and client
  posteriors (one-shot federated VB, after :func:`typical_row_factors` has counted every
  client as the typical client's rows): ``"trimmed"`` leaves out the ``ceil(trim * C)``
  clients farthest from the median summary, ``"median"`` every client whose robust z-score
  exceeds 3.5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.mixture import MixtureParams, SufficientStats, mixture_moments


def weight_factors(sizes: Mapping[int, float], cap: float | None) -> dict[int, float]:
    """Per-client factor ``min(1, cap * median(sizes) / size)`` (1 for all when ``cap`` is
    ``None``): scaling a client's statistics by it caps its weight at ``cap`` medians."""
    if cap is None or not sizes:
        return dict.fromkeys(sizes, 1.0)
    median = float(torch.tensor([float(s) for s in sizes.values()]).quantile(0.5))
    limit = cap * max(median, 1.0)
    return {c: (1.0 if s <= limit else limit / float(s)) for c, s in sizes.items()}


def typical_row_factors(
    sizes: Mapping[int, float], aggregation: str, trim: float
) -> dict[int, float]:
    """Per-client factor ``typical / size`` that counts every client as the typical
    client's rows: ``typical`` the median of ``sizes`` (``"median"``) or their trimmed mean
    (``"trimmed"``, ``floor(trim * C)`` dropped at each end), so a claimed row count buys
    no weight; 1 for all under ``"sum"``. Scaling a client's statistics by its factor
    keeps its shares, means and covariances."""
    if aggregation == "sum" or not sizes:
        return dict.fromkeys(sizes, 1.0)
    values = torch.tensor([float(s) for s in sizes.values()], dtype=torch.float64)
    typical = coordinate_median(values) if aggregation == "median" else trimmed_mean(values, trim)
    return {c: float(typical) / max(float(s), 1e-300) for c, s in sizes.items()}


#: reply tensors that are sums over rows (scaled by a weight cap); means are not.
EXTENSIVE: tuple[str, ...] = (
    "counts",
    "sums",
    "second",
    "log_likelihood",
    "n_samples",
    "m2",
    "joint_counts",
    "hard_counts",
    "far_counts",
    "far_sums",
    "far_second",
    "scatter",
    "xz",
    "sum_z",
    "zz",
    "sketch",
)


def cap_replies(replies: Mapping[int, Message], cap: float | None) -> dict[int, Message]:
    """``replies`` with every client above ``cap`` median row counts counted as that many
    (its sums over rows scaled by :func:`weight_factors`; means and parameters kept).
    Replies without ``n_samples`` are returned as they are."""
    sizes = {
        c: float(m.tensors["n_samples"]) for c, m in replies.items() if "n_samples" in m.tensors
    }
    factors = weight_factors(sizes, cap)
    capped = dict(replies)
    for c, factor in factors.items():
        if factor < 1.0:
            m = replies[c]
            tensors = {k: (v * factor if k in EXTENSIVE else v) for k, v in m.tensors.items()}
            capped[c] = Message(m.kind, tensors, dict(m.scalars))
    return capped


def scale_stats(stats: SufficientStats, factor: float) -> SufficientStats:
    """``stats`` of rows counted ``factor`` times (means and covariances unchanged)."""
    if factor == 1.0:
        return stats
    return SufficientStats(
        counts=stats.counts * factor,
        sums=stats.sums * factor,
        second=stats.second * factor,
        shift=stats.shift,
        log_likelihood=stats.log_likelihood * factor,
        n_samples=stats.n_samples * factor,
        covariance_type=stats.covariance_type,
    )


def trimmed_mean(values: Tensor, trim: float) -> Tensor:
    """Mean over dim 0 of ``values`` (n_clients, ...) after dropping the ``floor(trim * n)``
    lowest and highest values of every entry."""
    n = values.shape[0]
    cut = math.floor(trim * n)
    ordered = values.sort(0).values
    return ordered[cut : n - cut].mean(0)


def _keep_nearest(means: Tensor, present: Tensor, trim: float) -> Tensor:
    """(n_clients,) boolean: the clients among ``present`` less the ``floor(trim * n)``
    whose component mean (rows of ``means``, (n_clients, n_features)) lies farthest from
    the coordinate-wise median of theirs (distances in units of the per-feature MAD)."""
    index = present.nonzero().flatten()
    keep = torch.zeros_like(present)
    if index.numel() == 0:
        return keep
    chosen = means[index]
    center = chosen.median(0).values
    spread = (chosen - center).abs().median(0).values.clamp_min(1e-12 * (center.abs() + 1))
    distance = ((chosen - center) / spread).square().sum(1)
    n_keep = index.numel() - math.floor(trim * index.numel())
    keep[index[distance.argsort()[:n_keep]]] = True
    return keep


def trimmed_factors(counts: Tensor, sums: Tensor, n: Tensor, trim: float) -> tuple[Tensor, Tensor]:
    """How the trimmed combination weighs every client's statistics of every component.

    Per component ``k``, every client's share of its rows ``counts_ck / n_c`` is combined by
    a trimmed mean over clients (the ``floor(trim * C)`` highest and lowest values dropped);
    the component's statistics are those of the clients that hold at least one row's worth
    of it, less the ``floor(trim * C_k)`` whose own component mean lies farthest from the
    coordinate-wise median of theirs, scaled to the combined weight.

    Args:
        counts: (n_clients, n_components); sums: (n_clients, n_components, n_features)
            about one shift; n: (n_clients,) row counts.
        trim: share of clients dropped at each end, in [0, 0.5).

    Returns:
        ``(factors, total)``: factors (n_clients, n_components), 0 for a client left out of
        a component, so that component ``k`` of the combination of any per-component sum
        over rows ``T`` (n_clients, n_components, ...) is ``sum_c factors[c, k] T[c, k]``;
        total (), the rows the combination stands for (``C`` times the trimmed mean of the
        row counts: the plain total when they agree, so a claimed count does not set it).
    """
    n = n.clamp_min(1e-300)
    combined = trimmed_mean(counts / n.unsqueeze(1), trim)
    if float(combined.sum()) <= 0:
        combined = (counts / n.unsqueeze(1)).mean(0)
    weights = combined / combined.sum()
    total = n.shape[0] * trimmed_mean(n, trim)
    factors = torch.zeros_like(counts)
    for k in range(counts.shape[1]):
        present = counts[:, k] >= 1.0  # at least one row's worth of the component
        if not bool(present.any()):
            present = counts[:, k] > 0
        means = sums[:, k] / counts[:, k].clamp_min(1e-300).unsqueeze(1)
        keep = _keep_nearest(means, present, trim)
        kept_count = counts[keep, k].sum()
        if float(kept_count) > 0:
            factors[keep, k] = total * weights[k] / kept_count
    return factors, total


def trimmed_combination(
    stacked: Mapping[str, Tensor], trim: float, pooled: tuple[str, ...] = ()
) -> dict[str, Tensor]:
    """The trimmed combination of the clients' summed statistics, any family's.

    Args:
        stacked: name -> the clients' tensors stacked on dim 0, about one shift. Must hold
            ``counts`` (C, K), ``sums`` (C, K, d) and ``n_samples`` (C,); may hold
            ``log_likelihood`` (C,) (combined as ``total`` times the trimmed mean of the
            clients' per-row log-likelihoods). Every other tensor (C, K, ...) is a sum over
            rows per component (second moments, factor statistics, sketches), combined by
            :func:`trimmed_factors`.
        trim: share of clients dropped at each end, in [0, 0.5).
        pooled: names of tensors (C, ...) that carry no component (a tied scatter): their
            plain sum.

    Returns:
        name -> the combined tensor, each of its clients' shape without dim 0.
    """
    counts, n = stacked["counts"], stacked["n_samples"]
    factors, total = trimmed_factors(counts, stacked["sums"], n, trim)
    out = {}
    for name, values in stacked.items():
        if name in pooled:
            out[name] = values.sum(0)
        elif name == "n_samples":
            out[name] = total.to(values)
        elif name == "log_likelihood":
            out[name] = total * trimmed_mean(values / n.clamp_min(1e-300), trim)
        else:
            scale = factors.reshape(*factors.shape, *([1] * (values.ndim - 2)))
            out[name] = (values * scale.to(values)).sum(0)
    return out


def robust_stats(per_client: Mapping[int, SufficientStats], trim: float) -> SufficientStats:
    """The statistics the M-step sees under the trimmed combination
    (:func:`trimmed_combination`; a tied second moment, one scatter of all rows that carries
    no component means, is the plain sum).

    Args:
        per_client: client id -> its (possibly weight-capped) statistics about one shift.
        trim: share of clients dropped at each end, in [0, 0.5).

    Returns:
        ``SufficientStats`` whose component ``k`` has count ``N * w_k`` (``N = C`` times
        the trimmed mean of the clients' row counts; ``w`` the trimmed shares, normalised)
        and the mean and covariance of the kept clients' rows of that component; the row
        count is ``N`` and the log-likelihood ``N`` times the trimmed mean of the clients'
        per-row log-likelihoods.
    """
    stats = [per_client[c] for c in sorted(per_client)]
    names = ("counts", "sums", "second", "log_likelihood", "n_samples")
    stacked = {name: torch.stack([getattr(s, name) for s in stats]) for name in names}
    tied = stats[0].covariance_type == "tied"
    out = trimmed_combination(stacked, trim, pooled=("second",) if tied else ())
    return SufficientStats(shift=stats[0].shift, covariance_type=stats[0].covariance_type, **out)


def trimmed_sum(values: Tensor, trim: float) -> Tensor:
    """Sum over dim 0 of ``values`` (n_clients, ...) of every entry's order statistics less
    the ``floor(trim * n_clients)`` lowest and highest, shape (...); NaN counts as the
    highest value.

    The sum of the middle order statistics is non-decreasing in every client's entry, and
    moving one client's entry by ``delta`` moves the ``n`` order statistics by ``delta`` in
    all, each the same way: so the result moves by at most ``|delta|`` per entry, and a
    change of one client's tensor moves it by at most that change's L2 norm. A trimmed sum
    of clipped statistics has the plain sum's sensitivity (``docs/differential_privacy.md``,
    robust aggregation of private replies).
    """
    n = values.shape[0]
    cut = math.floor(trim * n)
    ordered = torch.nan_to_num(values, nan=math.inf, posinf=math.inf, neginf=-math.inf)
    ordered = ordered.sort(0).values
    return ordered[cut : n - cut].sum(0)


def trimmed_sum_stats(per_client: list[SufficientStats], trim: float) -> SufficientStats:
    """The coordinate-wise :func:`trimmed_sum` of every field of the clients' statistics
    (all about one shift): the statistics of ``C - 2 floor(trim * C)`` clients' worth of
    rows, no client's more than its own. Under differential privacy, taken about the
    clipping centre, it changes with one row by no more than the plain sum does."""
    names = ("counts", "sums", "second", "log_likelihood", "n_samples")
    combined = {
        name: trimmed_sum(torch.stack([getattr(s, name) for s in per_client]), trim)
        for name in names
    }
    first = per_client[0]
    return SufficientStats(shift=first.shift, covariance_type=first.covariance_type, **combined)


def model_summary(params: MixtureParams) -> Tensor:
    """Per-feature mean and log-variance of a mixture's distribution, (2 * n_features,)."""
    moments = mixture_moments(params, 1.0)
    return torch.cat([moments.mean, moments.m2.clamp_min(1e-300).log()])


#: robust z-score above which ``outlying_models(..., "median")`` leaves a client out
#: (Iglewicz and Hoaglin's cut-off for the modified z-score).
OUTLYING_Z = 3.5


def outlying_models(models: Mapping[int, MixtureParams], method: str, trim: float) -> list[int]:
    """Client ids whose local mixtures to leave out under ``"trimmed"`` (the
    ``ceil(trim * n)`` most outlying) or ``"median"`` (those whose score exceeds
    ``OUTLYING_Z``); ``[]`` for ``"sum"`` or fewer than three clients.

    Outlyingness is the largest robust z-score over the summary entries
    (:func:`model_summary`): ``|s - median| / (1.4826 MAD)``, means scaled by the median
    client's standard deviation where that is larger than the MAD.
    """
    ids = sorted(models)
    if method == "sum" or len(ids) < 3:
        return []
    summary = torch.stack([model_summary(models[c]) for c in ids])  # (C, 2d)
    d = summary.shape[1] // 2
    center = summary.median(0).values
    mad = 1.4826 * (summary - center).abs().median(0).values
    sd = (center[d:] / 2).exp()
    spread = torch.cat([torch.maximum(mad[:d], sd), mad[d:].clamp_min(0.1)])
    score = ((summary - center).abs() / spread).amax(1)
    if method == "median":
        return [c for c, z in zip(ids, score.tolist(), strict=True) if z > OUTLYING_Z]
    order = score.argsort(descending=True)[: math.ceil(trim * len(ids) - 1e-9)]
    return sorted(ids[int(i)] for i in order)


# ---------------------------------------------------------------------- model updates
#: the robust combinations of model updates (learners, encoders, cluster models).
UPDATE_AGGREGATIONS: tuple[str, ...] = ("sum", "trimmed", "median")


def coordinate_median(values: Tensor) -> Tensor:
    """Median over dim 0 of ``values`` (n_clients, ...) of every entry, shape (...): the
    middle value, or the mean of the two middle values for an even number of clients
    (``numpy.median``'s rule). The coordinate-wise median of Yin et al. (2018)."""
    n = values.shape[0]
    if n == 0:
        raise ValueError("coordinate_median needs at least one client's values.")
    ordered = values.sort(0).values
    middle = ordered[(n - 1) // 2]
    return middle if n % 2 else (middle + ordered[n // 2]) / 2


def coordinate_trimmed_mean(values: Tensor, trim: float) -> Tensor:
    """Mean over dim 0 of ``values`` (n_clients, ...) of every entry after dropping its
    ``floor(trim * n_clients)`` lowest and highest values, shape (...): the coordinate-wise
    trimmed mean of Yin et al. (2018) (``scipy.stats.trim_mean``'s cut)."""
    if values.shape[0] == 0:
        raise ValueError("coordinate_trimmed_mean needs at least one client's values.")
    return trimmed_mean(values, trim)


def robust_average_params(
    current: Mapping[str, Tensor],
    copies: list[Mapping[str, Tensor]],
    weights: Tensor,
    aggregation: str,
    trim: float,
) -> dict[str, Tensor]:
    """A new model from the clients' trained copies of ``current``.

    ``"sum"``: the weighted mean ``sum_c w_c theta_c / sum_c w_c``
    (:func:`~fednovelty.federated.core.aggregate.average_params`); ``"trimmed"`` /
    ``"median"``: the coordinate-wise trimmed mean (``trim`` at each end) or median of the
    copies whose weight is positive, unweighted: a client's weight only says whether it
    took part, so a claimed row count buys no influence (Byzantine-robust FL, Yin et al.
    2018).

    Args:
        current: name -> the broadcast tensor; kept (a new dict of the same tensors) when
            no copy has a positive weight, and each result has its dtype and device.
        copies: the clients' parameter dicts, each with every name of ``current``.
        weights: (len(copies),) non-negative weights, in the order of ``copies``.
        aggregation: ``"sum"``, ``"trimmed"`` or ``"median"``.
        trim: share of copies dropped at each end of every entry (``"trimmed"``).

    Returns:
        name -> tensor of ``current[name]``'s shape (nothing given is modified).
    """
    from fednovelty.federated.core.aggregate import average_params

    if aggregation == "sum":
        return average_params(dict(current), copies, weights)
    if aggregation not in UPDATE_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {UPDATE_AGGREGATIONS}, got {aggregation!r}.")
    chosen = [copy for copy, w in zip(copies, weights.tolist(), strict=True) if w > 0]
    if not chosen:
        return dict(current)
    new = {}
    for name, tensor in current.items():
        stacked = torch.stack([copy[name].to(tensor.device) for copy in chosen]).double()
        if aggregation == "median":
            new[name] = coordinate_median(stacked).to(tensor)
        else:
            new[name] = coordinate_trimmed_mean(stacked, trim).to(tensor)
    return new


def robust_average_learners(
    learners: list[dict[str, Tensor]],
    replies: list[Message],
    gammas: Tensor,
    aggregation: str,
    trim: float,
) -> list[dict[str, Tensor]]:
    """:func:`~fednovelty.federated.core.aggregate.average_learners` under ``aggregation``:
    learner ``m2`` from the clients' copies ``learner.{m2}.{name}`` of ``replies`` whose
    ``gammas[:, m2]`` (n_replies, M2) is positive, by :func:`robust_average_params`."""
    from fednovelty.federated.core.aggregate import learner_name

    return [
        robust_average_params(
            learner,
            [{name: r.tensors[learner_name(m2, name)] for name in learner} for r in replies],
            gammas[:, m2],
            aggregation,
            trim,
        )
        for m2, learner in enumerate(learners)
    ]


def outlying_points(points: Tensor, floor: Tensor | None = None) -> Tensor:
    """(n_points,) boolean: the points (n_points, n_features) whose robust z-score
    ``|p - median| / spread`` exceeds ``OUTLYING_Z`` in some feature, ``spread`` the
    larger of ``1.4826 MAD`` and ``floor`` (n_features,) (a known scale of honest points,
    so that a feature where most points agree does not make the rest outlying; default
    ``1e-12`` times the median's scale). Fewer than three points: none."""
    n = points.shape[0]
    if n < 3:
        return torch.zeros(n, dtype=torch.bool, device=points.device)
    values = points.double()
    center = coordinate_median(values)
    spread = 1.4826 * coordinate_median((values - center).abs())
    if floor is not None:
        spread = torch.maximum(spread, floor.to(spread))
    spread = spread.clamp_min(1e-12 * (float(center.abs().max()) + 1))
    score = ((values - center).abs() / spread).amax(1)
    return torch.nan_to_num(score, nan=math.inf) > OUTLYING_Z
