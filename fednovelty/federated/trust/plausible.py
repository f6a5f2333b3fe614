"""The first round's defences: replies no honest federation produces, and robust moments.

The first round of most algorithms asks every client where its rows lie: feature moments
(``moments``), the default prior's mean and scatter (``vb_prior``), a whole local mixture
(FedGenGMM's ``local_fit``, the one-shot start's ``oneshot``), or, where no moments round
comes first, k-means centroids (their count-weighted mean is the mean of the client's rows).
Nothing earlier bounds these replies, and everything later is in their units. Pure functions:

- :func:`gross_screen`, applied by the round loop to **every** run
  (:mod:`fednovelty.runtime.loop`), whatever the robust options: each client's declared
  per-feature mean and standard deviation is compared with the other clients'
  (:func:`gross_outliers`); a client ``GROSS_Z`` (1e3) reference spreads away, or with a
  spread ``GROSS_SCALE`` (1e3) times the reference, is dropped from the round by name and,
  as every client the server gate drops, from the rest of the run (``docs/robust.md``).
- :func:`screen_local_fits`: a local mixture can pass that screen as a whole and hold one
  component no honest rows produce (weight 0.01 at 1e4 spreads); every component is judged
  against all the clients' components by the same thresholds, each client one vote
  (:func:`outlying_components`), and the implausible ones leave the union by name
  (:class:`ImplausibleComponentWarning`).
- :func:`robust_moments`, the ``moments`` round's combination when a robust option is on
  (``aggregation`` ``"trimmed"`` / ``"median"`` or a ``client_weight_cap``): per feature,
  the coordinate-wise median or trimmed mean of the clients' means is the centre, and the
  same combination of their variances plus that of their squared distances to the centre is
  the variance, each client one vote whatever the rows it claims.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.trust.robust import trimmed_mean
from fednovelty.mixture import FeatureMoments, MixtureParams, mixture_moments

#: a client whose declared mean lies more than this many reference spreads from the
#: clients' median, on some feature, is a gross outlier (:func:`gross_outliers`).
GROSS_Z = 1e3
#: ... and so is one whose declared standard deviation exceeds this many reference spreads.
GROSS_SCALE = 1e3


def coordinate_combine(values: Tensor, method: str, trim: float) -> Tensor:
    """Per entry over dim 0 of ``values`` (n_clients, ...): the median (``"median"``; the
    mean of the two middle values for an even count) or the mean after dropping the
    ``floor(trim * n_clients)`` lowest and highest values (any other method). Shape (...)."""
    if method == "median":
        return values.quantile(0.5, dim=0)
    return trimmed_mean(values, trim)


def gross_outliers(means: Tensor, scales: Tensor) -> Tensor:
    """(n_clients,) boolean: the clients whose declared location or spread no honest
    federation produces, judged against the others.

    Per feature ``j``, the reference is the coordinate-wise median ``c_j`` of the clients'
    means and the spread ``s_j = max(median_c scale_cj, 1.4826 MAD_c mean_cj)`` (the median
    client's standard deviation, or the spread of the clients' means where that is larger:
    clients holding different clusters). A client is a gross outlier where, on some
    feature, ``|mean_cj - c_j| > GROSS_Z s_j`` or ``scale_cj > GROSS_SCALE s_j``, and
    wherever its mean or scale is not finite. A feature with ``s_j <= 1e-6 max(|c_j|, 1)``
    (constant for most clients, the standardisation's own test) gives nothing to compare
    with and is not judged. Fewer than three finite clients: only non-finite ones.

    Args:
        means: (n_clients, n_features) each client's per-feature mean.
        scales: (n_clients, n_features) each client's per-feature standard deviation.
    """
    means, scales = means.double(), scales.double()
    finite = torch.isfinite(means).all(1) & torch.isfinite(scales).all(1)
    if int(finite.sum()) < 3:
        return ~finite
    center = coordinate_combine(means[finite], "median", 0.0)
    spread = torch.maximum(
        coordinate_combine(scales[finite], "median", 0.0),
        1.4826 * coordinate_combine((means[finite] - center).abs(), "median", 0.0),
    )
    return beyond_reference(means, scales, center, spread)


def beyond_reference(means: Tensor, scales: Tensor, center: Tensor, spread: Tensor) -> Tensor:
    """(n_rows,) boolean: the rows (clients' summaries, or components) of ``means`` and
    ``scales`` (n_rows, n_features) more than ``GROSS_Z`` reference spreads ``spread`` from
    ``center`` (each (n_features,)), or with a scale above ``GROSS_SCALE`` spreads, on some
    judged feature (``spread > 1e-6 max(|center|, 1)``), or not finite."""
    finite = torch.isfinite(means).all(1) & torch.isfinite(scales).all(1)
    judged = spread > 1e-6 * center.abs().clamp_min(1.0)
    far = ((means - center).abs() > GROSS_Z * spread) | (scales > GROSS_SCALE * spread)
    return ~finite | (far & judged).any(1)


def _moments_summary(reply: Message, broadcast: Message) -> tuple[Tensor, Tensor]:
    """A ``moments`` reply's per-feature mean and standard deviation, each (n_features,)."""
    t = reply.tensors
    n = t["n_samples"].double().clamp_min(1.0)
    return t["mean"].double(), (t["m2"].double() / n).sqrt()


def _scatter_summary(reply: Message, broadcast: Message) -> tuple[Tensor, Tensor]:
    """A ``vb_prior`` reply's per-feature mean and standard deviation (from its scatter)."""
    t = reply.tensors
    n = t["n_samples"].double().clamp_min(1.0)
    return t["mean"].double(), (torch.diagonal(t["scatter"].double()) / n).clamp_min(0).sqrt()


def _local_fit_summary(reply: Message, broadcast: Message) -> tuple[Tensor, Tensor]:
    """A local mixture's per-feature mean and standard deviation
    (:func:`~fednovelty.mixture.mixture_moments`)."""
    t = {k: v.double() for k, v in reply.tensors.items()}
    ct = str(broadcast.expect.get("covariance_type", "full"))
    params = MixtureParams(t["weights"], t["means"], t["precisions_cholesky"], ct)
    moments = mixture_moments(params, 1.0)
    return moments.mean, moments.m2.clamp_min(0).sqrt()


def _centroids_summary(reply: Message, broadcast: Message) -> tuple[Tensor, Tensor]:
    """A ``centroids`` reply's count-weighted mean of its centroids (the mean of the rows
    they summarise) and the weighted standard deviation of the centroids about it, each
    (n_features,)."""
    t = reply.tensors
    centers = t["centers"].double()
    weights = t["counts"].double().clamp_min(0)
    weights = weights / weights.sum().clamp_min(1e-300)
    mean = weights @ centers
    return mean, (weights @ (centers - mean).square()).clamp_min(0).sqrt()


Summary = Callable[[Message, Message], tuple[Tensor, Tensor]]
#: reply kinds in which every client declares where its rows lie, and how to read that
#: (per-feature mean and standard deviation): the replies :func:`gross_screen` compares.
GROSS_SUMMARIES: dict[str, Summary] = {
    "moments": _moments_summary,
    "vb_prior": _scatter_summary,
    "local_fit": _local_fit_summary,
    "oneshot": _local_fit_summary,
    "centroids": _centroids_summary,
}


def gross_screen(broadcast: Message, replies: Mapping[int, Message]) -> dict[int, str]:
    """Client id -> reason for every reply to ``broadcast`` that :func:`gross_outliers`
    calls implausible against the others (``{}`` for kinds not in ``GROSS_SUMMARIES``).

    Args:
        broadcast: the round's message.
        replies: client id -> a reply that passed validation; skipped replies are ignored.
            A reply whose summary cannot be read, or has another width than most, is
            judged as not finite.

    Returns:
        client id -> reason, for the clients to drop from the round.
    """
    summary = GROSS_SUMMARIES.get(broadcast.kind)
    ids = [c for c in sorted(replies) if not replies[c].scalars.get("skipped", False)]
    if summary is None or not ids:
        return {}
    rows = []
    for c in ids:
        try:
            mean, scale = summary(replies[c], broadcast)
        except (KeyError, RuntimeError, ValueError):
            mean = scale = torch.full((1,), math.inf, dtype=torch.float64)
        rows.append((mean.cpu().flatten(), scale.cpu().flatten()))
    sizes = [m.numel() for m, _ in rows]
    width = max(sizes, key=sizes.count)
    inf = torch.full((width,), math.inf, dtype=torch.float64)
    means = torch.stack([m if m.numel() == width else inf for m, _ in rows])
    scales = torch.stack([s if s.numel() == width else inf for m, s in rows])
    out = gross_outliers(means, scales)
    reason = (
        f"its {broadcast.kind!r} reply is implausible against the other clients' (a mean "
        f"more than {GROSS_Z:g} or a standard deviation more than {GROSS_SCALE:g} reference "
        "spreads from theirs, or not finite)"
    )
    return {c: reason for c, o in zip(ids, out.tolist(), strict=True) if o}


# ----------------------------------------------------------------- local-fit components
class ImplausibleComponentWarning(UserWarning):
    """Components of a client's local mixture that no honest rows produce were left out of
    the union (:func:`screen_local_fits`); the message names the client and the components."""


def weighted_median(values: Tensor, weights: Tensor) -> Tensor:
    """Per column of ``values`` (n, d), the smallest value whose cumulative weight under
    ``weights`` (n,) (non-negative, positive sum) reaches half the total; shape (d,)."""
    order = values.argsort(0)
    cumulative = weights[order].cumsum(0)  # (n, d)
    first = (cumulative < cumulative[-1] / 2).sum(0).clamp_max(values.shape[0] - 1)
    return values.gather(0, order).gather(0, first.unsqueeze(0)).squeeze(0)


def component_scales(params: MixtureParams) -> Tensor:
    """Each component's per-feature standard deviation, (n_components, n_features)."""
    cov = params.covariances.double()
    k, d = params.means.shape
    if params.covariance_type in ("full", "tied"):
        cov = torch.diagonal(cov, dim1=-2, dim2=-1)  # (K, d), or (d,) tied
    elif params.covariance_type == "spherical":
        cov = cov.unsqueeze(1)  # (K, 1)
    return cov.clamp_min(0).sqrt().expand(k, d)


def mixture_spread(params: MixtureParams) -> Tensor:
    """A local mixture's per-feature standard deviation of the rows it describes (n_features,):
    ``sqrt(sum_k w_k (var_k + (mu_k - m)^2))`` about its mean ``m = sum_k w_k mu_k``."""
    weights = params.weights.double().cpu().clamp_min(0)
    weights = weights / weights.sum().clamp_min(1e-300)
    means = params.means.double().cpu()
    centre = weights @ means
    variances = component_scales(params).cpu().square() + (means - centre).square()
    return (weights @ variances).clamp_min(0).sqrt()


def outlying_components(models: Mapping[int, MixtureParams]) -> dict[int, list[int]]:
    """Client id -> the components of its local mixture that no honest rows produce, judged
    against all the clients' components (the clients without any are left out).

    The reference is computed as :func:`gross_outliers` computes it for clients, over
    components instead, each client one vote (its components weighted by their mixture
    weights, so a claimed row count buys nothing): per feature, the weighted median ``c_j``
    of the component means and the spread ``s_j``, the larger of the weighted median of the
    components' standard deviations and 1.4826 times the weighted median of the means'
    distances to ``c_j``, and the weighted median over the clients (one vote each) of each
    client's own spread of its rows (:func:`mixture_spread`): a heavy-tailed feature whose
    typical component is narrow still has honest components far out, within their client's
    spread. A component is implausible where :func:`beyond_reference` says so
    (a mean more than ``GROSS_Z`` spreads from ``c_j`` or a standard deviation above
    ``GROSS_SCALE`` spreads on some judged feature, or anything not finite). With fewer than
    three clients whose components are all finite, only non-finite components are.

    Args:
        models: client id -> its local mixture (one covariance type and width for all).
    """
    ids = sorted(models)
    if not ids:
        return {}
    means = [models[c].means.double().cpu() for c in ids]
    scales = [component_scales(models[c]).cpu() for c in ids]
    votes = [models[c].weights.double().cpu().clamp_min(0) for c in ids]
    owner = torch.cat([torch.full((m.shape[0],), i) for i, m in enumerate(means)])
    means, scales, votes = torch.cat(means), torch.cat(scales), torch.cat(votes)
    finite = torch.isfinite(means).all(1) & torch.isfinite(scales).all(1)
    clean = [bool(finite[owner == i].all()) for i in range(len(ids))]
    if sum(clean) >= 3:
        use = torch.tensor(clean)[owner] & (votes > 0)
        center = weighted_median(means[use], votes[use])
        spread = torch.maximum(
            weighted_median(scales[use], votes[use]),
            1.4826 * weighted_median((means[use] - center).abs(), votes[use]),
        )
        honest = [i for i in range(len(ids)) if clean[i]]
        rows = torch.stack([mixture_spread(models[ids[i]]) for i in honest])
        spread = torch.maximum(spread, weighted_median(rows, torch.ones(len(honest))))
        out = beyond_reference(means, scales, center, spread)
    else:
        out = ~finite
    dropped: dict[int, list[int]] = {}
    for i, c in enumerate(ids):
        flagged = out[owner == i].nonzero().flatten().tolist()
        if flagged:
            dropped[c] = flagged
    return dropped


def keep_components(params: MixtureParams, keep: Tensor) -> MixtureParams:
    """``params`` with only the components where ``keep`` (n_components,) is true, their
    weights renormalised (a tied covariance is kept as it is)."""
    weights = params.weights[keep]
    prec = params.precisions_cholesky
    if params.covariance_type != "tied":
        prec = prec[keep]
    return MixtureParams(
        weights / weights.sum().clamp_min(1e-300), params.means[keep], prec, params.covariance_type
    )


def screen_local_fits(
    models: Mapping[int, MixtureParams], sizes: Mapping[int, float], kind: str
) -> tuple[dict[int, MixtureParams], dict[int, float], dict[int, list[int]]]:
    """The local fits of a round of ``kind`` without their implausible components
    (:func:`outlying_components`), by name.

    Each client keeps its other components, renormalised, and the rows behind them (its row
    count times their weight), so the union weighs its kept components as before; a client
    left with no component leaves the union. Every client that loses a component is named
    in one :class:`ImplausibleComponentWarning`.

    Args:
        models: client id -> its local mixture. sizes: client id -> its row count.

    Returns:
        ``(models, sizes, dropped)``: the kept mixtures and row counts by client id, and
        client id -> the indices of its components left out.
    """
    dropped = outlying_components(models)
    kept_models, kept_sizes = dict(models), dict(sizes)
    for c, components in dropped.items():
        keep = torch.ones(models[c].n_components, dtype=torch.bool)
        keep[components] = False
        del kept_models[c], kept_sizes[c]
        share = float(models[c].weights.double().cpu()[keep].sum()) if bool(keep.any()) else 0.0
        if share > 0 and math.isfinite(share):
            kept_models[c] = keep_components(models[c], keep.to(models[c].weights.device))
            kept_sizes[c] = sizes[c] * share
    if dropped:
        named = "; ".join(f"client {c}: component(s) {v}" for c, v in sorted(dropped.items()))
        warnings.warn(
            f"left out of the {kind!r} round's union, as no honest rows produce them ({named}): "
            f"a mean more than {GROSS_Z:g} or a standard deviation more than {GROSS_SCALE:g} "
            "reference spreads from the clients' components, or not finite.",
            ImplausibleComponentWarning,
            stacklevel=3,
        )
    return kept_models, kept_sizes, dropped


def robust_moments(
    n_samples: Tensor, means: Tensor, m2: Tensor, method: str, trim: float
) -> FeatureMoments:
    """Pooled feature moments that one client cannot move far (module docstring).

    Args:
        n_samples: (n_clients,) row counts. means, m2: (n_clients, n_features) each
            client's per-feature mean and sum of squared deviations.
        method: ``"median"`` (coordinate-wise medians) or ``"trimmed"`` (coordinate-wise
            trimmed means, ``trim`` of the clients dropped at each end).

    Returns:
        ``FeatureMoments`` of ``sum(n_samples)`` rows with the robust centre as mean and
        ``n * (within + between)`` as ``m2``: ``within`` the combined client variances,
        ``between`` the combined squared distances of the client means to the centre.
    """
    variances = m2 / n_samples.clamp_min(1.0).unsqueeze(1)
    center = coordinate_combine(means, method, trim)
    within = coordinate_combine(variances, method, trim)
    between = coordinate_combine((means - center).square(), method, trim)
    n = n_samples.sum()
    return FeatureMoments(n, center, (within + between) * n)
