"""What backs what a client releases: the effective rows behind each value.

The floor of a client's :class:`~fednovelty.federated.trust.privacy.PrivacyPolicy` is held
against rows: a client step states, for every tensor of its reply, the rows behind it
(``Message.backing``, never sent) and the client gate compares them with the floor
(:func:`backed`; :mod:`~fednovelty.federated.trust.release`). What backs what: hard
statistics, their row counts; soft statistics, Kish's effective rows (:func:`effective_rows`,
:func:`resp_rows`; a statistics reply's tensors: :func:`stats_backing`); the joint model's
Gaussians, cells and learners, the effective rows of their joint responsibilities
(:func:`joint_rows`); sums of per-row values, the effective rows of their deviations from the
median (:func:`deviation_rows`; under every contrast:
:mod:`~fednovelty.federated.trust.contrast`); client totals and models trained on all rows,
the row count (:func:`client_backing`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from fednovelty.mixture import SufficientStats


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


def resp_rows(resp: Tensor) -> Tensor:
    """Effective rows behind each column of responsibilities (or any non-negative
    weights) ``resp`` (n_samples, n_components): (n_components,)."""
    return effective_rows(resp.sum(0), resp.square().sum(0))


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
