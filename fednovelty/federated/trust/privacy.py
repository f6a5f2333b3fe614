"""The client's privacy policy and the client gate that applies it to every reply.

The server is not trusted: whatever a message asks, a client releases only values its own
:class:`PrivacyPolicy` allows (the simulation's ``run_simulation(..., privacy=...)``, a
Flower node's ``node_config``; never a field of a message). The rule is a **floor**: every
value a client releases (a component's statistics, a centroid, a row count, feature moments,
a local mixture's component, a range, a prototype, a cluster row's log-likelihood) is backed
by at least ``min_rows`` of its rows; a client with fewer rows releases nothing.

**The gate** (:func:`release`, run by :func:`fednovelty.federated.trust.gate.answer`, which
every engine calls): a client step states the effective rows behind each tensor of its reply
(``Message.backing``, never sent) and its ``ReplySpec.backing`` says what kind of value it
is. The gate refuses a reply with a whole value below the floor, with more grouped entries
than the client's own configuration allows, or with a tensor nobody classified or backed;
it zeros or removes the entries below the floor. What backs what: hard statistics, their
row counts; soft statistics, Kish's effective rows (:func:`effective_rows`,
:func:`resp_rows`); sums of per-row values, the effective rows of their deviations from the
median under every contrast (:func:`deviation_rows`, :func:`contrast_rows`); client totals
and models trained on all rows, the row count (:func:`client_backing`).

The floor is k-anonymity-style disclosure control of each released value, not differential
privacy (``docs/privacy.md``): a server can combine tensors and rounds. A policy with ``dp``
(:class:`~fednovelty.federated.trust.dp.DPPolicy`) releases each reply in its declared private
form, with noise (``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.declarations import RELEASE_TENSORS, ReplySpec
from fednovelty.federated.trust.dp import (
    STAT_BLOCKS,
    DPPolicy,
    charge,
    private_reply,
    release_noise,
)
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, DPSGDSettings, histogram_blocks
from fednovelty.federated.trust.ledger import PrivacyLedger, gaussian_cost
from fednovelty.federated.trust.noise import add_gaussian
from fednovelty.mixture import MixtureParams, SufficientStats
from fednovelty.mixture.kmeans import assign, one_hot

#: the default floor (see ``PrivacyPolicy``).
DEFAULT_MIN_ROWS = 5
#: the default bound on the local k-means clusters a message may ask for.
DEFAULT_MAX_CLUSTERS = 64


@dataclass(frozen=True)
class PrivacyPolicy:
    """What a client releases, whatever the server asks.

    Attributes:
        min_rows: the floor: every released statistic is backed by at least this many of
            the client's rows (effective rows for soft statistics), and a client with fewer
            rows releases nothing. The default 5 is the common minimum cell size of
            statistical disclosure control's threshold rule (agencies suppress published
            cells backed by fewer than 3 to 10 units; k-anonymity with k = 5 is the usual
            starting point), and small enough that a client of a few dozen rows still
            takes part in every round. ``min_rows=1`` is no floor: replies are those of the
            unprotected protocol (a client without rows replies ``skipped`` instead of
            zeros, which adds the same nothing) and give away small clients' rows (for
            tests against centralized references and for federations whose clients trust
            the server).
        allow_raw_rows: whether the client answers the ``subset`` round (raw rows sent to
            the server, ``init_params="subset"``); refused by default.
        max_clusters: the most local k-means clusters a ``centroids`` message may ask for;
            the client also never forms more than ``n_rows // min_rows``.
        dp: the client's differential-privacy policy
            (:class:`~fednovelty.federated.trust.dp.DPPolicy`), or ``None``. With one, every row a
            round works on is clipped, every reply is released only in its declared private
            form with the client's noise (``ReplySpec.private``; a kind without one is
            refused), and the floor gives way to the noise: the client releases from its
            first row and zeroes no component (which components it zeroed would depend on
            its rows).
        dp_sgd: the client's DP-SGD (:class:`~fednovelty.federated.trust.dp_sgd.DPSGDSettings`)
            for learners that leave it under ``dp``; ``None``: a private round releases no
            learner weights.

    Raises:
        TypeError / ValueError: a field of the wrong type or below 1, naming it.
    """

    min_rows: int = DEFAULT_MIN_ROWS
    allow_raw_rows: bool = False
    max_clusters: int = DEFAULT_MAX_CLUSTERS
    dp: DPPolicy | None = None
    dp_sgd: DPSGDSettings | None = None

    def __post_init__(self) -> None:
        for name in ("min_rows", "max_clusters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"PrivacyPolicy.{name} must be an int, got {type(value).__name__} {value!r}."
                )
            if value < 1:
                raise ValueError(f"PrivacyPolicy.{name} must be >= 1, got {value}.")
        if not isinstance(self.allow_raw_rows, bool):
            raise TypeError(
                "PrivacyPolicy.allow_raw_rows must be True or False, got "
                f"{type(self.allow_raw_rows).__name__} {self.allow_raw_rows!r}."
            )
        if self.dp is not None and not isinstance(self.dp, DPPolicy):
            raise TypeError(
                f"PrivacyPolicy.dp must be a DPPolicy or None, got {type(self.dp).__name__}."
            )
        if self.dp_sgd is not None and not isinstance(self.dp_sgd, DPSGDSettings):
            raise TypeError(
                "PrivacyPolicy.dp_sgd must be a DPSGDSettings or None, got "
                f"{type(self.dp_sgd).__name__}."
            )

    @property
    def floor(self) -> int:
        """The rows that must back a released value: ``min_rows``, or 1 under ``dp`` (the
        noise protects the rows; which values a floor suppressed would depend on them)."""
        return 1 if self.dp is not None else self.min_rows

    @property
    def has_floor(self) -> bool:
        """Whether the floor applies (:attr:`floor` > 1); without it the client steps release
        what the unprotected protocol does (and the noise of ``dp``, where set)."""
        return self.floor > 1


def effective_rows(counts: Tensor, squared_counts: Tensor) -> Tensor:
    """Kish's effective number of rows behind each component.

    Args:
        counts: ``sum_i r_ik``, shape (n_components,).
        squared_counts: ``sum_i r_ik^2``, shape (n_components,).

    Returns:
        ``counts^2 / squared_counts``, shape (n_components,); 0 where no row has weight.
    """
    positive = squared_counts > 0
    return torch.where(positive, counts.square() / squared_counts, 0.0)


def backed(rows: Tensor, min_rows: int) -> Tensor:
    """Which components have at least ``min_rows`` (effective) rows: a bool tensor of the
    shape of ``rows``. A relative slack of 1e-9 absorbs round-off of integer counts."""
    return rows >= min_rows * (1 - 1e-9)


def suppress_components(
    stats: SufficientStats, keep: Tensor, tied_second: Tensor | None = None
) -> SufficientStats:
    """``stats`` with the components not in ``keep`` sent as zeros.

    Args:
        stats: one client's statistics (n_components components).
        keep: bool (n_components,), the components backed by enough rows, on any device
            (the mask is moved to the statistics' device).
        tied_second: for ``tied`` statistics (one second moment for all components), the
            second moment of the kept components' responsibilities, (n_features,
            n_features); required there, ignored otherwise.

    Returns:
        Statistics of the same shapes; counts, sums and per-component second moments of the
        suppressed components are +0.0 (never -0.0, whose sign would tell a negative sum).
        Row count and log-likelihood are unchanged.
    """
    mask = keep.to(device=stats.counts.device, dtype=torch.bool)
    zero = torch.zeros((), dtype=stats.counts.dtype, device=stats.counts.device)
    if stats.covariance_type == "tied":
        if tied_second is None:
            raise ValueError("suppress_components needs tied_second for tied statistics.")
        second = tied_second
    else:
        second = torch.where(mask.view(-1, *[1] * (stats.second.ndim - 1)), stats.second, zero)
    return replace(
        stats,
        counts=torch.where(mask, stats.counts, zero),
        sums=torch.where(mask.unsqueeze(1), stats.sums, zero),
        second=second,
    )


def merge_small_clusters(
    X: Tensor, labels: Tensor, centers: Tensor, min_rows: int
) -> tuple[Tensor, Tensor]:
    """Centroids of k-means clusters with at least ``min_rows`` rows each.

    Every row of a cluster with fewer than ``min_rows`` rows joins the nearest centre of a
    cluster with enough rows (rows of large clusters stay); the centres are then the means
    of their rows, so no released centroid is backed by fewer than ``min_rows`` rows (a
    far-out single row moves its nearest centroid a little instead of being sent).

    Args:
        X: the client's rows, (n_samples, n_features).
        labels: each row's cluster, (n_samples,) int64 in ``[0, n_clusters)``.
        centers: k-means centres, (n_clusters, n_features).
        min_rows: the floor.

    Returns:
        ``(centers, counts)``: (n_kept, n_features) means and (n_kept,) row counts of the
        clusters with enough rows, in their original order. With ``min_rows=1`` (no floor):
        the non-empty clusters' k-means centres as they are.

    Raises:
        ValueError: no cluster has ``min_rows`` rows (ask for fewer clusters).
    """
    k = centers.shape[0]
    sizes = torch.bincount(labels, minlength=k)
    if min_rows <= 1:
        return centers[sizes > 0], sizes[sizes > 0].to(X.dtype)
    large = sizes >= min_rows
    if not bool(large.any()):
        raise ValueError(
            f"no k-means cluster has min_rows={min_rows} rows; form at most "
            "n_rows // min_rows clusters."
        )
    kept = large.nonzero().squeeze(1)
    new_index = torch.full((k,), -1, dtype=torch.long, device=labels.device)
    new_index[kept] = torch.arange(kept.shape[0], device=labels.device)
    merged = new_index[labels]
    moved = merged < 0
    if bool(moved.any()):
        nearest, _ = assign(X[moved], centers[kept])
        merged[moved] = nearest
    resp = one_hot(merged, kept.shape[0], X)
    counts = resp.sum(0)
    return (resp.T @ X) / counts.unsqueeze(1), counts


def trimmed_range(X: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """Per-feature low and high ends of the rows, each backed by ``min_rows`` rows.

    Args:
        X: rows, (n_samples, n_features), with ``n_samples >= min_rows``.
        min_rows: the floor (1 gives the exact minimum and maximum).

    Returns:
        ``(low, high)``, each (n_features,): the mean of the ``min_rows`` smallest and of
        the ``min_rows`` largest values of every feature (not coordinates of single rows).
    """
    ordered = X.sort(0).values
    return ordered[:min_rows].mean(0), ordered[-min_rows:].mean(0)


def backed_mixture(params: MixtureParams, n_rows: int, min_rows: int) -> MixtureParams:
    """A local mixture without the components backed by fewer than ``min_rows`` rows.

    A component's rows are ``weight_k * n_rows``: its share of the responsibilities that
    gave its mean and covariance (at most its effective rows, so the rule is the stricter
    one). The kept weights are renormalised.

    Args:
        params: a mixture fitted on ``n_rows`` rows (n_components components).
        n_rows: the rows it was fitted on.
        min_rows: the floor.

    Returns:
        The mixture of the kept components; ``params`` itself when all are kept or
        ``min_rows=1`` (no floor).

    Raises:
        ValueError: no component is backed by ``min_rows`` rows.
    """
    keep = backed(params.weights * n_rows, min_rows)
    if min_rows <= 1 or bool(keep.all()):
        return params
    if not bool(keep.any()):
        raise ValueError(f"no component of the local mixture has min_rows={min_rows} rows.")
    weights = params.weights[keep]
    prec = params.precisions_cholesky
    if params.covariance_type != "tied":
        prec = prec[keep]
    return MixtureParams(weights / weights.sum(), params.means[keep], prec, params.covariance_type)


def joint_rows(q: Tensor, min_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """What backs what a client of the joint model (FedGMM) releases, from its joint
    responsibilities.

    A learner is backed by the effective rows of its training weights ``sum_m1 q``; a cell
    ``(m1, m2)`` by those of ``q(m1, m2)``, and by none when its learner is below the floor;
    a Gaussian by those of its responsibilities over the backed cells,
    ``sum_{m2 backed} q(m1, m2)``, so that the Gaussian's released count equals its row of
    the released joint counts; a cell of a Gaussian below the floor is backed by none.

    Args:
        q: ``q_i(m1, m2)``, shape (n_samples, M1, M2), each row summing to 1.
        min_rows: the floor.

    Returns:
        Effective rows ``(gaussians, cells, learners)`` of shapes (M1,), (M1, M2) and (M2,);
        with ``min_rows=1`` (no floor) every entry is backed by the row count.
    """
    n, k1, k2 = q.shape
    if min_rows <= 1:
        everything = q.new_full((k1, k2), float(n))
        return everything[:, 0], everything, everything[0]
    learners = resp_rows(q.sum(1))
    cells = torch.where(backed(learners, min_rows).unsqueeze(0), resp_rows(q), 0.0)
    gaussians = resp_rows((q * backed(cells, min_rows).to(q.dtype)).sum(2))
    return gaussians, torch.where(backed(gaussians, min_rows).unsqueeze(1), cells, 0.0), learners


def joint_backing(q: Tensor, min_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Which Gaussians, cells and learners of the joint model a client may release:
    :func:`joint_rows` at the floor, bool tensors (M1,), (M1, M2), (M2,); a kept cell's
    Gaussian and learner are kept."""
    return tuple(backed(rows, min_rows) for rows in joint_rows(q, min_rows))


def deviation_rows(values: Tensor) -> Tensor:
    """Effective rows behind a sum of per-row values (a log-likelihood sum, a mean score).

    A sum ``sum_i v_i`` tells a reader about the rows through how the ``v_i`` differ; a value
    that is the same for every row (or for most of them) says nothing about any one. So the
    sum is backed by Kish's effective number of the deviations ``|v_i - median(v)|``:
    ``(sum_i |dev_i|)^2 / sum_i dev_i^2``, ``n`` when every value is the median. It is 1
    when one row differs from the others (a ReLU probe, ``max(0, u.x - t)``, set so that
    one row lies beyond ``t``), and about ``0.44 n`` for the log-densities of ``n`` rows
    drawn from the model that scores them (exponentially distributed deviations).

    Args:
        values: per-row values, (n_samples,) or (n_samples, n_sums) for several sums at once.

    Returns:
        The effective rows, () or (n_sums,); 0 for no rows.
    """
    n = values.shape[0]
    if n == 0:
        return values.new_zeros(values.shape[1:])
    median = values.median() if values.ndim == 1 else values.median(0).values
    deviation = (values - median).abs()
    rows = effective_rows(deviation.sum(0), deviation.square().sum(0))
    return torch.where(deviation.amax(0) == 0, float(n), rows)


def stats_backing(
    stats: SufficientStats, rows: Tensor, tied_rows: Tensor | float | None = None
) -> dict[str, Tensor]:
    """What backs each tensor of a statistics reply (``aggregate.STATS_FIELDS``).

    Args:
        stats: the released statistics (n_components components).
        rows: each component's effective rows, (n_components,).
        tied_rows: for ``tied`` statistics, the effective rows behind the one second
            moment (the rows' summed responsibilities over the kept components).

    Returns:
        ``counts``, ``sums`` and per-component ``second``: ``rows``; a tied ``second``:
        ``tied_rows`` (shape ()); ``log_likelihood`` and ``n_samples``: the row count.
    """
    like = stats.counts
    n = stats.n_samples.to(device=like.device, dtype=like.dtype)
    second = rows
    if stats.covariance_type == "tied":
        second = n if tied_rows is None else torch.as_tensor(tied_rows).to(like)
    return {"counts": rows, "sums": rows, "second": second, "log_likelihood": n, "n_samples": n}


def client_backing(tensors: Mapping[str, Tensor], n_rows: float) -> dict[str, Tensor]:
    """Every tensor of ``tensors`` backed as a whole by the client's ``n_rows`` rows (a
    ``"client"`` total such as a row count, feature moments or a scatter, or a model
    trained on all of them): name -> () tensor."""
    return {name: torch.tensor(float(n_rows), dtype=torch.float64) for name in tensors}


def resp_rows(resp: Tensor) -> Tensor:
    """Effective rows behind each column of responsibilities (or any non-negative
    weights) ``resp`` (n_samples, n_components): (n_components,)."""
    return effective_rows(resp.sum(0), resp.square().sum(0))


def unfloored(rows: Tensor, n_rows: float, policy: PrivacyPolicy) -> Tensor:
    """``rows``, or, for a policy without a floor (``min_rows=1``), the client's row count
    in their place: every entry is then released, as the unprotected protocol does."""
    return rows if policy.has_floor else torch.full_like(rows, float(n_rows))


#: the most combined values (candidate directions times rows) the exact search of
#: :func:`contrast_rows` evaluates; beyond it the leverage bound stands alone.
CONTRAST_BUDGET = 2**20


def contrast_rows(values: Tensor, floor: float | None = None) -> Tensor:
    """Effective rows behind a vector of sums of per-row values, under any contrast: a
    lower bound of the minimum, exact where it is affordable.

    A reader of ``C`` released sums ``s_c = sum_i v_ic`` can form any linear combination
    ``sum_c l_c s_c``: two cluster rows' log-likelihoods, each a V-shaped log-sum-exp of
    two equal-covariance Gaussians, can agree on every row but one, and their difference
    is then that row's value. The sums are backed by the smallest :func:`deviation_rows`
    of the combined values ``f_i = l . v_i`` over all directions ``l``,
    ``m(V) = min_l K(l)``, ``K(l) = ||f - med f||_1^2 / ||f - med f||_2^2``. Both ways of
    computing it below work on ``Y`` (n, r): the left singular vectors of the centred
    values ``W = V - mean(V)`` of rank ``r`` (singular values above ``max(n, C) * eps``
    times the largest); ``f = W l + const`` and ``W l = Y u`` with ``u = S Vh l``, so
    ``m(V)`` is the same minimum over ``u`` for ``Y``.

    **Exact search.** The directions ``u`` orthogonal to ``r - 1`` linearly independent
    row differences ``y_i - y_j`` (combined values equal on those pairs) contain a
    minimiser. Proof: the hyperplanes ``(y_i - y_j) . u = 0`` cut the directions into
    cones in which the order of the ``f_i`` is fixed, hence the median row ``m`` and the
    signs ``s_i`` of ``f_i - f_m``; there ``sqrt K(u) = g . u / ||A u||_2`` with the fixed
    ``g = sum_i s_i (y_i - y_m)`` and ``A = Y - 1 y_m^T``. Its superlevel sets
    ``{u : g . u - t ||A u||_2 >= 0}`` are convex (a linear minus a norm), so ``K`` is
    quasi-concave on the cone, ``K`` is continuous, and its minimum over the cone's
    closure (a pointed cone, as ``Y`` has rank ``r``) lies on an extreme ray: on
    ``r - 1`` independent hyperplanes. The search evaluates every such direction (the
    vectors orthogonal to each choice of ``r - 1`` of the ``n (n - 1) / 2`` differences)
    when their number times ``n`` is at most :data:`CONTRAST_BUDGET` (``C = 2``: ``n <= 127``;
    ``C = 3``: ``n <= 24``).

    **Leverage bound.** For every direction, ``K >= 1 / (h + 1 / n)`` with
    ``h = max_i ||y_i||^2``, the largest leverage of the centred values. Proof: take
    ``||u|| = 1``, so ``f - mean f = Y u`` has ``||Y u||_2^2 = 1`` (``Y`` orthonormal),
    ``|f_i - mean f| = |y_i . u| <= sqrt h``, and let ``delta = |mean f - med f|``, at
    most the standard deviation ``1 / sqrt n`` (``|mean - med| = |E(f - med)| <=
    E|f - med| <= E|f - mean| <= sd``, the lower median minimising ``E|f - c|``). With
    ``x = f - med f``: ``||x||_1 >= ||x||_2^2 / ||x||_inf``, so ``K >= ||x||_2^2 /
    ||x||_inf^2 >= (1 + n delta^2) / (sqrt h + delta)^2``, whose least value over
    ``delta`` (at ``delta = 1 / (n sqrt h)``) is ``n / (1 + n h)``. It is exact for one
    row apart from equal others (``h = 1 - 1/n``: 1 row), and about ``n / (1 + 2 ln n)``
    for normally distributed values.

    Args:
        values: per-row values, (n_samples, C).
        floor: when given, the exact search is skipped once the leverage bound reaches it
            (the sums are backed either way); None: search whenever affordable.

    Returns:
        The effective rows, a () tensor: the exact minimum where searched, else the
        leverage bound (never above it); ``n_samples`` when no direction separates rows.
    """
    n, c = values.shape
    if n == 0:
        return values.new_zeros(())
    centred = values - values.mean(0)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    tol = s.max() * max(n, c) * torch.finfo(values.dtype).eps if s.numel() else 0.0
    y = u[:, s > tol] if bool((s > 0).any()) else u[:, :0]
    r = y.shape[1]
    if r == 0:
        return values.new_tensor(float(n))
    bound = torch.clamp(1.0 / (y.square().sum(1).max() + 1.0 / n), max=float(n))
    if floor is not None and bool(backed(bound, floor)):
        return bound
    directions = _vertex_directions(y)
    if directions is None:
        return bound
    rows = min(float(deviation_rows(y[:, 0])), float(n))
    for chunk in directions.split(max(1, CONTRAST_BUDGET // (16 * n))):
        rows = min(rows, float(deviation_rows(y @ chunk.T).min()))
    return values.new_tensor(rows)


def _vertex_directions(y: Tensor) -> Tensor | None:
    """The directions orthogonal to ``r - 1`` linearly independent differences of the
    rows of ``y`` (n, r): (n_directions, r); None when their number times ``n`` exceeds
    :data:`CONTRAST_BUDGET`. For ``r = 1``: the one direction."""
    n, r = y.shape
    if r == 1:
        return y.new_ones((1, 1))
    if math.comb(n * (n - 1) // 2, r - 1) * n > CONTRAST_BUDGET:
        return None
    pairs = torch.combinations(torch.arange(n, device=y.device), 2)
    differences = y[pairs[:, 1]] - y[pairs[:, 0]]  # (P, r)
    if r == 2:
        directions = torch.stack([-differences[:, 1], differences[:, 0]], 1)
    else:
        picks = torch.combinations(torch.arange(pairs.shape[0], device=y.device), r - 1)
        chosen = differences[picks]  # (n_directions, r - 1, r)
        if r == 3:
            directions = torch.linalg.cross(chosen[:, 0], chosen[:, 1])
        else:
            directions = torch.linalg.svd(chosen, full_matrices=True).Vh[:, -1, :]
    # any direction's combined values are backed by at least the minimum, so directions of
    # dependent differences (round-off) only add candidates; exact zeros are dropped
    return directions[directions.norm(dim=1) > 0]


def contrast_backed(values: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """The rows whose per-row values may be summed and released: all of them when their
    sums are backed (:func:`contrast_rows` >= ``min_rows``), else all but the ``m`` rows
    farthest from the median (``m`` = 1, 2, 4, ... up to half the rows), the fewest left
    out that back the sums of the others. An honest client's outlying row can make a
    contrast of its sums (two clusters' mean log-likelihoods) mostly that row's value;
    leaving it out of the sums releases nothing of it.

    Args:
        values: per-row values, (n_samples, C).
        min_rows: the floor.

    Returns:
        ``(keep, rows)``: bool (n_samples,), the rows summed, and the effective rows behind
        their sums (a () tensor; below ``min_rows`` when no such ``m`` backs them).
    """
    n = values.shape[0]
    keep = torch.ones(n, dtype=torch.bool, device=values.device)
    rows = contrast_rows(values, min_rows)
    if bool(backed(rows, min_rows)) or n == 0:
        return keep, rows
    order = (values - values.median(0).values).norm(dim=1).argsort(descending=True)
    m = 1
    while m <= n // 2:
        trial = keep.clone()
        trial[order[:m]] = False
        trial_rows = contrast_rows(values[trial], min_rows)
        if bool(backed(trial_rows, min_rows)):
            return trial, trial_rows
        m *= 2
    return keep, rows


def clipped_deviations(per_row: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """Per-row values whose one sum is backed by ``min_rows`` rows by construction.

    Where the sum's deviations (:func:`deviation_rows`) are already backed, the values as
    they are. Else every deviation from the median is clipped to ``c``, the ``min_rows``-th
    largest ``|v_i - median|``: then at least ``min_rows`` rows deviate by exactly ``c`` and
    none by more, so ``sum_i d_i^2 <= c sum_i |d_i|`` and the effective rows
    ``(sum |d|)^2 / sum d^2 >= sum |d| / c >= min_rows``. A value that one row alone makes
    (a probe) is clipped to the others'; honest sums lose the tail of their
    ``min_rows - 1`` most outlying rows. Clipping about the median keeps the median.

    Args:
        per_row: (n_samples,) each row's value, ``n_samples >= 1``.
        min_rows: the client's floor.

    Returns:
        ``(values, rows)``: (n_samples,) values to sum, and the effective rows behind the
        sum (``>= min(min_rows, n_samples)``), a () tensor.
    """
    rows = deviation_rows(per_row)
    if bool(backed(rows, min_rows)):
        return per_row, rows
    median = per_row.median()
    deviation = per_row - median
    c = deviation.abs().topk(min(int(min_rows), per_row.shape[0])).values[-1]
    clipped = median + deviation.clamp(-c, c)
    return clipped, deviation_rows(clipped)


def winsorised_row_values(
    per_row: Tensor, min_rows: int, powers: tuple[int, ...] = (1,)
) -> tuple[Tensor, Tensor]:
    """Per-row values whose sums of powers (``sum_i v_i^p`` for ``p`` in ``powers``: a
    log-likelihood sum, a window's mean and variance of ``log p``) a client may release,
    and the effective rows behind those sums.

    A crafted broadcast can make one row stand out in such sums, and so can an honest
    outlying row. When the sums are not backed by ``min_rows`` rows under every contrast
    (:func:`contrast_backed`), the rows it would leave out are winsorised to the range of
    the others (a clipped row equals a kept one, so no contrast singles it out) where that
    backs the sums, which keeps every row and most of the spread; else they are left out.
    With ``min_rows <= 1`` (no floor) the values are returned as they are.

    Args:
        per_row: (n_samples,) each row's value.
        min_rows: the client's floor.
        powers: the powers whose sums are released.

    Returns:
        ``(values, rows)``: the values to sum, (m,) with m <= n_samples, and the effective
        rows behind their sums, a () tensor.
    """
    n = per_row.shape[0]
    if min_rows <= 1 or n == 0:
        return per_row, per_row.new_tensor(float(n))
    if tuple(powers) == (1,):
        return clipped_deviations(per_row, min_rows)

    def stack(values: Tensor) -> Tensor:
        return torch.stack([values**p for p in powers], 1)

    keep, rows = contrast_backed(stack(per_row), min_rows)
    if bool(keep.all()) or not bool(keep.any()):
        return per_row[keep], rows
    kept = per_row[keep]
    clipped = per_row.clamp(float(kept.min()), float(kept.max()))
    clipped_rows = contrast_rows(stack(clipped), floor=min_rows)
    if bool(backed(clipped_rows, min_rows)):
        return clipped, clipped_rows
    return kept, rows


#: the private forms a client with no rows answers with the noise alone.
SUMMED_FORMS = ("stats", "moments", "scatter")


def _empty_reply(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    rows_shape: tuple[int, ...] | None,
) -> Any:
    """Under a differential-privacy policy, the reply of a client with no rows to a round of
    a summed private form: zeros of the declared shapes, each backed by no row, for the gate
    to release with its noise; ``None`` otherwise (the skip stands)."""
    if policy.dp is None or rows_shape is None or rows_shape[0] != 0 or broadcast is None:
        return None
    if spec.private not in SUMMED_FORMS:
        return None
    # the broadcast's expectations are the server's (never sent): the client's own config
    known = {"covariance_type": getattr(config, "covariance_type", None)}
    expect = {k: v for k, v in known.items() if v is not None}
    probe = replace(broadcast, expect={**expect, **dict(broadcast.expect)})
    try:
        shapes = spec.shapes(probe, int(rows_shape[1]))
    except (KeyError, TypeError, ValueError):  # shapes the client cannot tell: skip stands
        return None
    if any(not isinstance(n, int) for shape in shapes.values() for n in shape):
        return None
    dtype = getattr(config, "dtype", torch.float64)
    device = getattr(config, "device", torch.device("cpu"))
    tensors = {
        name: torch.zeros(tuple(shape), dtype=dtype, device=device)
        for name, shape in shapes.items()
    }
    nothing = torch.tensor(0.0, dtype=torch.float64)
    return type(reply)(reply.kind, tensors, {}, backing=dict.fromkeys(tensors, nothing))


def _refused(reply: Any, reason: str) -> Any:
    """A skipped reply of ``reply``'s kind (and its message class) giving ``reason``."""
    return type(reply)(reply.kind, scalars={"skipped": True, "reason": reason})


def release(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    client: Any = None,
    rows_shape: tuple[int, ...] | None = None,
) -> Any:
    """The client gate: what of a client step's ``reply`` leaves the client.

    The one place every engine passes a reply through (``FederatedAlgorithm.answer``), and
    the one place a client adds differential-privacy noise. Pure: ``reply`` is not changed
    (the client's ledger records the noisy releases).

    ``reply.backing`` states, for every tensor of ``reply.tensors``, the effective rows
    behind it, and ``spec.backing`` what kind of value it is (:data:`BACKINGS`):

    - a backing of shape ``()`` backs the whole tensor (a ``"client"`` total, a learner, a
      statistic the step recomputed from the kept components such as a tied second
      moment); below ``policy.min_rows`` the reply is not released.
    - a backing of shape ``tensor.shape[:b]`` (``b >= 1``) backs each entry it indexes
      (component ``k``, class ``y``, bin ``b``, cell ``(m1, m2)``). Dimension 0 is the
      group; more entries than ``spec.limit(config, broadcast)`` allows refuse the reply
      (a limit may be a mapping from backing to limit where a reply has groups of two
      sizes, e.g. components and cluster rows).
      An entry below the floor is sent as zeros (``"components"``, ``"classes"``,
      ``"bins"``), removed (``"model"``: a local mixture's component, with the
      ``"weights"`` of the kept components renormalised), or refuses the reply
      (``"clusters"``: a cluster row's score of 0 would be read as a score, so a client
      never sends one it cannot back). When no entry of any grouped tensor is kept the
      reply is not released.
    - a tensor the declaration does not classify, or one without a stated backing, refuses
      the reply: what the gate cannot classify is not released.
    - under a differential-privacy policy (``policy.dp``) the floor gives way to the noise:
      the reply is released only in its declared private form (``spec.private``, else
      refused), within the client's budget of noisy releases (counted in ``ledger``, else
      refused), with the client's noise (:func:`~fednovelty.federated.trust.dp.private_reply`);
      a tensor the release does not cover needs a declared private part
      (``spec.private_parts``): a histogram gets the counts' noise, learner weights leave
      only when the client's own ``dp_sgd`` trained them, for no more steps than it allows,
      and a withheld value leaves as zeros. A ``"parts"`` release covers no tensor itself:
      it is its parts, one noisy release of the client's budget.

    Args:
        reply: the client step's ``Message`` (``tensors`` with shapes per its kind,
            ``scalars``, ``backing``: name -> () or leading-shape tensor of effective rows).
        spec: the ``ReplySpec`` of the reply's kind.
        policy: the client's own ``PrivacyPolicy``.
        config: the client's own configuration (the algorithm's settings) for
            ``spec.limit``.
        broadcast: the message the reply answers.
        client: the client's :class:`~fednovelty.federated.trust.gate.ClientTerms` (its
            ``client_id`` and its ``ledger``, charged with every noisy release and replaced
            by the charged one), or ``None``:
            a one-off release from an empty ledger.
        rows_shape: the shape of the client's rows ``(n_samples, n_features)``; under a
            differential-privacy policy a client with no rows answers a ``"stats"``,
            ``"moments"`` or ``"scatter"`` round with the noise alone (zeros of the declared
            shapes through the private form), like any other client, instead of skipping:
            a skip would tell the server it has no rows.

    Returns:
        The released ``Message`` (same kind and scalars, tensors floored, no ``backing``),
        or a skipped reply whose reason names the tensor (or the limit) that stopped it.
        A skipped reply passes as it is (without ``backing``).
    """
    if reply.scalars.get("skipped"):
        empty = _empty_reply(reply, spec, policy, config, broadcast, rows_shape)
        if empty is None:
            return type(reply)(reply.kind, scalars=dict(reply.scalars))
        reply = empty
    where = f"the client's {reply.kind!r} reply"
    unclassified = sorted(name for name in reply.tensors if spec.backing_of(name) is None)
    if unclassified:
        return _refused(
            reply,
            f"{where} holds {unclassified}, which its declaration does not classify; not released",
        )
    unbacked = sorted(set(reply.tensors) - set(reply.backing))
    if unbacked:
        return _refused(reply, f"{where} states no backing for {unbacked}; not released")
    limits = None if spec.limit is None else spec.limit(config, broadcast)
    if policy.dp is not None:
        return _private(reply, spec, policy, config, broadcast, limits, client)
    floor = policy.min_rows
    tensors: dict[str, Tensor] = {}
    grouped_kept: list[bool] = []
    removed: dict[str, Tensor] = {}
    # (id of a backing, device) -> (kept entries, all kept, any kept): tensors that share a
    # backing (a component's counts, sums and second moment) share its verdict
    verdicts: dict[tuple[int, torch.device], tuple[Tensor, bool, bool]] = {}
    for name, value in reply.tensors.items():
        rows = torch.as_tensor(reply.backing[name], dtype=torch.float64)
        kind = spec.backing_of(name)
        if rows.ndim == 0:
            if not bool(backed(rows, floor)):
                return _refused(
                    reply,
                    f"{where}: {name!r} is backed by {float(rows):.3g} "
                    f"effective rows, below the client's floor min_rows={floor}",
                )
            tensors[name] = value
            continue
        if tuple(rows.shape) != tuple(value.shape[: rows.ndim]):
            return _refused(
                reply,
                f"{where}: the backing of {name!r} has shape "
                f"{tuple(rows.shape)}, which does not index its shape "
                f"{tuple(value.shape)}; not released",
            )
        limit = limits.get(kind) if isinstance(limits, Mapping) else limits
        if limit is not None and rows.shape[0] > limit:
            return _refused(
                reply,
                f"{where}: {name!r} has {rows.shape[0]} {kind} entries, more "
                f"than the client's own configuration allows ({limit})",
            )
        key = (id(reply.backing[name]), value.device)
        if key not in verdicts:
            keep = backed(rows, floor).to(value.device)
            verdicts[key] = (keep, bool(keep.all()), bool(keep.any()))
        keep, all_kept, any_kept = verdicts[key]
        if kind == "clusters" and not all_kept:
            return _refused(
                reply,
                f"{where}: an entry of {name!r} is backed by "
                f"{float(rows.min()):.3g} effective rows, below the client's floor "
                f"min_rows={floor}",
            )
        grouped_kept.append(any_kept)
        if kind == "model" and rows.ndim == 1:
            removed[name] = keep
            tensors[name] = value[keep]
        elif all_kept:  # every entry backed: the tensor as it is (value * 1)
            tensors[name] = value
        else:  # blanked entries are +0.0: a product with 0 keeps the sign (-0.0)
            mask = keep.reshape(*keep.shape, *[1] * (value.ndim - keep.ndim))
            tensors[name] = torch.where(mask, value, torch.zeros((), dtype=value.dtype))
    if grouped_kept and not any(grouped_kept):
        return _refused(
            reply, f"{where}: no entry is backed by the client's floor min_rows={floor}"
        )
    if "weights" in removed and tensors["weights"].numel():
        tensors["weights"] = tensors["weights"] / tensors["weights"].sum()
    return type(reply)(reply.kind, _unsigned_zeros(tensors), dict(reply.scalars))


def _unsigned_zeros(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` with every ``-0.0`` made ``+0.0`` (``x + 0.0``; other values unchanged):
    a zero a step or the floor left behind tells nothing by its sign."""
    return {n: t + 0.0 if t.is_floating_point() else t for n, t in tensors.items()}


def _private(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    limits: Any,
    client: Any,
) -> Any:
    """:func:`release` under a differential-privacy policy (its docstring)."""
    dp = policy.dp
    where = f"the client's {reply.kind!r} reply"
    if spec.private is None:
        return _refused(
            reply,
            f"{where} has no private form (its declaration states none); not released "
            "under the client's differential-privacy policy",
        )
    for name, value in reply.tensors.items():
        rows = reply.backing[name]
        kind = spec.backing_of(name)
        limit = limits.get(kind) if isinstance(limits, Mapping) else limits
        if torch.as_tensor(rows).ndim and limit is not None and value.shape[0] > limit:
            return _refused(
                reply,
                f"{where}: {name!r} has {value.shape[0]} {kind} entries, more "
                f"than the client's own configuration allows ({limit})",
            )
    covered = RELEASE_TENSORS.get(spec.private)
    if covered is not None:
        loose = sorted(n for n in reply.tensors if n not in covered and not spec.private_part(n))
        if loose:
            return _refused(
                reply,
                f"{where} holds {loose}, which its {spec.private!r} release does not cover "
                "and no private part declares; not released",
            )
    if any(spec.private_part(n) == "dp_sgd" for n in reply.tensors):
        refusal = _dp_sgd_refusal(reply, policy.dp_sgd)
        if refusal is not None:
            return _refused(reply, f"{where}: {refusal}; not released")
    blocks = release_cost(reply, spec)
    if blocks is None:
        return _refused(reply, f"{where} states no noisy releases (dp_releases); not released")
    sgd = None
    if any(spec.private_part(n) == "dp_sgd" for n in reply.tensors):
        settings = policy.dp_sgd
        sgd = (settings.noise_multiplier, settings.sample_rate, int(reply.scalars["dp_sgd_steps"]))
    ledger = PrivacyLedger() if client is None else client.ledger
    charged = charge(ledger, dp, blocks, sgd)
    if charged is None:
        return _refused(
            reply,
            f"{where}: the client's privacy budget is spent (epsilon={dp.epsilon:g} at "
            f"delta={dp.delta:g}; this release would take it to "
            f"{ledger.after(gaussian_cost(dp.noise_multiplier, blocks), sgd).epsilon(dp.delta):.4g}"
            "); not released",
        )
    source = release_noise(dp, 0 if client is None else client.client_id, ledger.releases)
    if client is not None:
        client.ledger = charged
    if spec.private == "parts":  # no statistics: every tensor is a declared part
        tensors = dict(reply.tensors)
    else:
        tensors = private_reply(
            spec.private,
            reply.tensors,
            broadcast,
            getattr(config, "covariance_type", None),
            dp.client_noise,
            dp.clip_norm,
            source,
        )
    for name in tensors:
        part = spec.private_part(name)
        if part == "histogram" and dp.client_noise > 0:
            spread = HISTOGRAM_SHARE * dp.client_noise
            tensors[name] = add_gaussian(tensors[name], spread, source)
        elif part == "withheld":
            tensors[name] = torch.zeros_like(tensors[name])
    return type(reply)(reply.kind, tensors, dict(reply.scalars))


def release_cost(reply: Any, spec: ReplySpec) -> float | None:
    """The Gaussian mechanisms of the policy's multiplier ``z`` one private release of
    ``reply`` amounts to: the blocks of summed statistics (:data:`~fednovelty.federated.trust.dp.
    STAT_BLOCKS`) once for a ``"stats"``, ``"moments"`` or ``"scatter"`` release, once per
    stated iteration (``dp_releases``) of a private ``"fit"``, none for ``"parts"``; plus a
    released histogram's share (:func:`~fednovelty.federated.trust.dp_sgd.histogram_blocks`) for
    each ``"histogram"`` part. ``None``: a ``"fit"`` that states no iterations."""
    releases = 0 if spec.private == "parts" else 1
    if spec.private == "fit":
        releases = reply.scalars.get("dp_releases")
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
            return None
    histograms = sum(1 for n in reply.tensors if spec.private_part(n) == "histogram")
    return len(STAT_BLOCKS) * releases + histogram_blocks(histograms)


def _dp_sgd_refusal(reply: Any, sgd: DPSGDSettings | None) -> str | None:
    """Why learner weights may not leave under DP, or ``None``: the client's own policy
    must have DP-SGD (``PrivacyPolicy.dp_sgd``) and the reply must state the steps it ran,
    no more than that policy's round allows."""
    steps = reply.scalars.get("dp_sgd_steps")
    if sgd is None:
        return "its learners were not trained by DP-SGD (the client's policy has no dp_sgd)"
    allowed = sgd.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= allowed:
        return f"it states {steps!r} DP-SGD steps; the client's settings allow 0..{allowed}"
    return None


__all__ = [
    "CONTRAST_BUDGET",
    "DEFAULT_MAX_CLUSTERS",
    "DEFAULT_MIN_ROWS",
    "PrivacyPolicy",
    "backed",
    "backed_mixture",
    "client_backing",
    "clipped_deviations",
    "contrast_backed",
    "contrast_rows",
    "deviation_rows",
    "effective_rows",
    "joint_backing",
    "joint_rows",
    "merge_small_clusters",
    "release",
    "resp_rows",
    "stats_backing",
    "suppress_components",
    "trimmed_range",
    "unfloored",
    "winsorised_row_values",
]
