"""Server-side aggregation rules as pure functions of client replies.

Nothing here knows about engines; every function takes ``Message`` replies (or the
tensors in them) and returns tensors. A skipped reply (``scalars["skipped"]``: a client
below its privacy floor, or one that refused the round) carries no statistics; the
functions that take replies leave it out, as if the client had not replied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.mixture import MixtureParams, SufficientStats, merge_stats

STATS_FIELDS = ("counts", "sums", "second", "log_likelihood", "n_samples")


def released(replies: Iterable[Message]) -> list[Message]:
    """The replies that carry statistics (skipped replies left out)."""
    return [m for m in replies if not m.scalars.get("skipped", False)]


def stats_message(stats: SufficientStats, kind: str) -> Message:
    """A reply carrying statistics; the shift is not sent back (the server chose it)."""
    tensors = stats.tensors()
    return Message(kind, {name: tensors[name] for name in STATS_FIELDS})


def _check_stats_tensors(
    t: dict[str, Tensor],
    n_features: int,
    where: str,
    noisy: bool = False,
    totals: dict[str, Tensor] | None = None,
) -> None:
    """Shape and value checks of statistics tensors (single reply or stacked replies);
    ``noisy`` statistics (differential privacy) may have negative counts. ``totals``: the
    stacked tensors' sums over dim 0, where known: a total is finite only where every term
    is (inf and NaN propagate), so only the terms of a non-finite total are read."""
    sums = t["sums"]
    if sums.shape[-1] != n_features or sums.ndim < 2:
        raise ValueError(
            f"{where} has sums of shape {tuple(sums.shape)}; expected (n_components, {n_features})."
        )
    for name, value in t.items():
        if totals is not None and bool(torch.isfinite(totals[name]).all()):
            continue
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where} has non-finite values in {name!r}.")
    if noisy:
        return
    if bool((t["counts"] < 0).any()) or bool((t["n_samples"] < 0).any()):
        raise ValueError(f"{where} has negative counts.")


def stats_from_message(message: Message, shift: Tensor, covariance_type: str) -> SufficientStats:
    """Rebuild ``SufficientStats`` from a reply, checking shapes and values.

    Raises:
        ValueError: missing tensors, wrong shapes, non-finite values or negative counts.
    """
    missing = [name for name in STATS_FIELDS if name not in message.tensors]
    if missing:
        raise ValueError(f"statistics reply lacks tensors {missing}.")
    t = {name: message.tensors[name].to(shift.device, shift.dtype) for name in STATS_FIELDS}
    _check_stats_tensors(t, shift.shape[0], "statistics reply")
    return SufficientStats(shift=shift, covariance_type=covariance_type, **t)


def sum_stats(
    replies: Iterable[Message], shift: Tensor, covariance_type: str, noisy: bool = False
) -> SufficientStats:
    """Sum of the statistics in ``replies`` (the whole federated M-step input); ``noisy``:
    the replies carry differential-privacy noise (negative counts allowed).

    The replies are stacked field by field, :data:`SUM_BYTES` of replies at a time, and each
    stack checked and summed in one pass per field (one kernel per field and stack instead of
    one per reply and field; no stack of a whole large federation's second moments at once).
    Replies whose shapes disagree fall back to one-by-one merging, which names the problem.
    Skipped replies are left out.
    """
    replies = released(replies)
    if not replies:
        raise ValueError(
            "sum_stats needs at least one reply with statistics (every reply was skipped: "
            "each client is below its privacy floor)."
        )
    try:
        size = max(
            1, SUM_BYTES // max(1, sum(_nbytes(replies[0].tensors[n]) for n in STATS_FIELDS))
        )
        total: dict[str, Tensor] = {}
        for start in range(0, len(replies), size):
            part = replies[start : start + size]
            stacked = {
                name: torch.stack([m.tensors[name] for m in part]).to(shift.device, shift.dtype)
                for name in STATS_FIELDS
            }
            sums = {name: value.sum(0) for name, value in stacked.items()}
            _check_stats_tensors(stacked, shift.shape[0], "a statistics reply", noisy, totals=sums)
            total = sums if not total else {name: total[name] + sums[name] for name in sums}
    except (KeyError, RuntimeError):
        return merge_stats(stats_from_message(m, shift, covariance_type) for m in replies)
    return SufficientStats(shift=shift, covariance_type=covariance_type, **total)


#: bytes of replies :func:`sum_stats` stacks at a time.
SUM_BYTES = 1 << 22


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def pool_centroids(replies: Iterable[Message]) -> tuple[Tensor, Tensor]:
    """Concatenate clients' local centroids and their counts (skipped replies left out).

    Returns:
        ``(centers, counts)``: shapes (n_centroids, n_features), (n_centroids,).
    """
    replies = [m for m in released(replies) if m.tensors["centers"].shape[0] > 0]
    if not replies:
        return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    centers = torch.cat([m.tensors["centers"] for m in replies])
    counts = torch.cat([m.tensors["counts"] for m in replies]).to(centers.dtype)
    return centers, counts


def merge_ranges(replies: Iterable[Message]) -> tuple[Tensor, Tensor]:
    """Elementwise minimum and maximum of the clients' feature ranges, each (n_features,)
    (skipped replies left out)."""
    replies = [m for m in released(replies) if float(m.tensors["n_samples"]) > 0]
    if not replies:
        raise ValueError("no client with data replied with its feature range.")
    low = torch.stack([m.tensors["min"] for m in replies]).amin(0)
    high = torch.stack([m.tensors["max"] for m in replies]).amax(0)
    return low, high


def total_variance(stats: SufficientStats) -> float:
    """Mean per-feature variance of all rows summarised by ``stats`` (for k-means tolerances)."""
    second = stats.second
    if stats.covariance_type == "full":
        trace = torch.diagonal(second, dim1=1, dim2=2).sum()
    else:
        trace = second.sum() if stats.covariance_type != "tied" else torch.trace(second)
    n = stats.n_samples.clamp_min(1.0)
    mean = stats.sums.sum(0) / n
    return float((trace / n - mean.square().sum()) / stats.n_features)


def union_mixture(models: list[MixtureParams], sizes: list[float]) -> MixtureParams:
    """One mixture holding every client's components, weights ``r_ck |D_c| / |D|``.

    Client mixtures with ``tied`` covariances become ``full`` in the union (each client has
    its own tied matrix); other covariance types are kept.

    Args:
        models: client mixtures (same covariance type and n_features).
        sizes: number of rows behind each model, same length.
    """
    if not models:
        raise ValueError("union_mixture needs at least one client model.")
    total = float(sum(sizes))
    weights = torch.cat([m.weights * (s / total) for m, s in zip(models, sizes, strict=True)])
    means = torch.cat([m.means for m in models])
    ct = models[0].covariance_type
    if ct == "tied":
        prec = torch.cat([m.precisions_cholesky.expand(m.n_components, -1, -1) for m in models])
        ct = "full"
    else:
        prec = torch.cat([m.precisions_cholesky for m in models])
    return MixtureParams(weights / weights.sum(), means, prec, ct)


def learner_name(index: int, name: str) -> str:
    """The message tensor name of parameter ``name`` of learner ``index``."""
    return f"learner.{index}.{name}"


def learners_tensors(learners: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Every learner's parameters under their message names (:func:`learner_name`), learner
    by learner in order."""
    return {
        learner_name(m, name): value
        for m, params in enumerate(learners)
        for name, value in params.items()
    }


def average_learners(
    learners: Sequence[dict[str, Tensor]], replies: Sequence[Message], gammas: Tensor
) -> list[dict[str, Tensor]]:
    """Each learner as the gamma-weighted mean of the clients' trained copies (FedGMM's
    learner M-step): ``theta_m2 = sum_c gamma_c(m2) theta_c(m2) / sum_c gamma_c(m2)``.

    Args:
        learners: the broadcast learners, M2 dicts of parameter tensors; a learner that no
            client used (its gammas sum to 0) is kept as it is, and each result has the
            dtype and device of the broadcast tensor.
        replies: the clients' replies (skipped ones left out), each with tensors
            ``learner.{m2}.{name}`` for every learner and parameter.
        gammas: (n_replies, M2) each client's summed responsibilities of each learner,
            in the order of ``replies``.

    Returns:
        M2 new dicts of parameter tensors (``learners`` is not modified).
    """
    return [
        average_params(
            learner,
            [{name: r.tensors[learner_name(m2, name)] for name in learner} for r in replies],
            gammas[:, m2],
        )
        for m2, learner in enumerate(learners)
    ]


def average_params(
    current: dict[str, Tensor], copies: Sequence[dict[str, Tensor]], weights: Tensor
) -> dict[str, Tensor]:
    """The weighted mean ``sum_c w_c theta_c / sum_c w_c`` of parameter dicts.

    Args:
        current: the parameters the copies started from; kept (a new dict of the same
            tensors) when the weights sum to 0, and each result has the dtype and device of
            its tensor here.
        copies: the clients' parameter dicts, each with every name of ``current``.
        weights: (len(copies),) non-negative weights, in the order of ``copies``.

    Returns:
        A new dict of parameter tensors (nothing given is modified).
    """
    total = float(weights.sum())
    if total <= 0:
        return dict(current)
    new = {}
    for name, tensor in current.items():
        stacked = torch.stack([copy[name] for copy in copies])
        shape = (-1,) + (1,) * (stacked.ndim - 1)
        new[name] = (stacked * (weights / total).view(shape)).sum(0).to(tensor)
    return new
