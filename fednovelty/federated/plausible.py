"""The first round's defences: replies no honest federation produces, and robust moments.

The first round of most algorithms asks every client where its rows lie: feature moments
(``moments``), the default prior's mean and scatter (``vb_prior``), a whole local mixture
(FedGenGMM's ``local_fit``), or, where no moments round comes first, k-means centroids
(``centroids``: their count-weighted mean is the mean of the client's rows). Nothing earlier
bounds these replies, and everything later is in their units: one client declaring a mean
of 1e133 makes the pooled scale 1e132 and every score a constant. Two defences, both pure
functions:

- :func:`gross_screen`, applied by the round loop to **every** run
  (:mod:`fednovelty.runtime.loop`), whatever the algorithm's robust options: each
  client's declared per-feature mean and standard deviation is compared with the other
  clients' (:func:`gross_outliers`); a client ``GROSS_Z`` (1e3) reference spreads away, or
  with a spread ``GROSS_SCALE`` (1e3) times the reference, is dropped from the round by name
  and, as every client the server gate drops, from the rest of the run. The thresholds sit
  far above what honest federations reach (``docs/robust.md``).
- :func:`robust_moments`, the ``moments`` round's combination when the algorithm's robust
  option is on (``aggregation`` ``"trimmed"`` / ``"median"`` or a ``client_weight_cap``):
  per feature, the coordinate-wise median or trimmed mean of the clients' means is the
  centre, and the same combination of their variances plus that of their squared distances
  to the centre is the variance, each client one vote whatever the rows it claims.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from fednovelty.federated.base import Message
from fednovelty.federated.robust import trimmed_mean
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
    out = ~finite
    if int(finite.sum()) < 3:
        return out
    center = coordinate_combine(means[finite], "median", 0.0)
    deviation = (means - center).abs()
    spread = torch.maximum(
        coordinate_combine(scales[finite], "median", 0.0),
        1.4826 * coordinate_combine(deviation[finite], "median", 0.0),
    )
    judged = spread > 1e-6 * center.abs().clamp_min(1.0)
    far = (deviation > GROSS_Z * spread) | (scales > GROSS_SCALE * spread)
    return out | (far & judged).any(1)


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
