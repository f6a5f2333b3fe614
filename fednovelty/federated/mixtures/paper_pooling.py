"""The FedGMM paper's pooling of the clients' covariances and weights.

Two server-side alternatives to the exact M-step of federated EM
(:class:`~fednovelty.federated.mixtures.em.EMConfig`):

- ``covariance_pooling="paper"`` (Algorithm 1-2, line 13): each client's covariance about
  its *own* component mean, averaged with the clients' responsibility counts;
  :func:`paper_pooled_stats` turns the round's replies into statistics whose M-step gives
  exactly those covariances (from each client's :func:`within_scatter`).
- ``global_weights="client_average"`` (footnote 3): the global weights the unweighted mean
  of the clients' personal weights (:func:`client_average_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import released
from fednovelty.federated.core.base import Message
from fednovelty.mixture.stats import SufficientStats


def client_average_weights(client_weights: list[Tensor]) -> Tensor:
    """The FedGMM paper's footnote 3: ``pi = sum_c gamma_c / N_c`` normalised, i.e. the
    unweighted mean of the clients' weights ``pi_c = gamma_c / N_c`` (each (n_components,),
    summing to 1) -> (n_components,). Every entry is raised by ``10 * eps`` and the vector
    renormalised, as the M-step adds ``10 * eps`` to every count, so no component gets
    weight 0 (the E-step takes its log)."""
    mean = torch.stack(client_weights).mean(0)
    mean = mean + 10 * torch.finfo(mean.dtype).eps
    return mean / mean.sum()


def within_scatter(counts: Tensor, sums: Tensor, second: Tensor, covariance_type: str) -> Tensor:
    """One client's scatter of each component's rows about the client's *own* component mean,
    from its statistics about any shift: ``W_k = S_k - s_k s_k^T / n_k`` (``full``, (K, d, d)),
    ``S_k - s_k^2 / n_k`` (``diag``, (K, d)), ``S_k - |s_k|^2 / n_k`` (``spherical``, traces,
    (K,)), ``S - sum_k s_k s_k^T / n_k`` (``tied``, (d, d)); a component with ``n_k = 0``
    adds nothing. ``W_k = gamma_k Sigma_k`` with the paper's client covariance ``Sigma_k``.

    Args:
        counts: (K,) ``n_k``; sums: (K, d) ``s_k``; second: per ``covariance_type``.
    """
    held = counts > 0
    share = torch.where(held, 1.0 / counts.clamp_min(torch.finfo(counts.dtype).tiny), 0.0)
    if covariance_type == "full":
        return second - share.view(-1, 1, 1) * sums.unsqueeze(2) * sums.unsqueeze(1)
    if covariance_type == "tied":
        return second - (share.unsqueeze(1) * sums).T @ sums
    if covariance_type == "diag":
        return second - share.unsqueeze(1) * sums.square()
    return second - share * sums.square().sum(1)


def paper_pooled_stats(replies: Iterable[Message], summed: SufficientStats) -> SufficientStats:
    """Statistics whose M-step gives ``covariance_pooling="paper"``'s covariances.

    With ``W_ck`` each client's scatter about its own mean (:func:`within_scatter`) and
    ``n_k`` the summed counts, the paper's ``Sigma_k = sum_c gamma_ck Sigma_ck / sum_c
    gamma_ck = sum_c W_ck / n_k`` (``tied``: ``sum_c W_c / n``; ``spherical``: that trace
    over ``n_k d``). ``summed``'s second moment is replaced by ``sum_c W_ck + s_k s_k^T / n_k``
    (``n_k`` with the M-step's ``10 * eps``), so that the M-step, which subtracts the
    pooled mean's outer product, leaves exactly ``sum_c W_ck / n_k``; its prior and
    ``reg_covar`` apply as in the exact M-step. The counts and sums, and so the weights and
    means, are ``summed``'s.

    Args:
        replies: the round's replies (skipped ones are left out), statistics about
            ``summed.shift``; each client's (``counts``, ``sums``, ``second``) is
            one-to-one with the paper's (``gamma_c``, ``mu_c``, ``Sigma_c``).
        summed: their summed statistics.
    """
    ct, shift = summed.covariance_type, summed.shift
    within = torch.zeros_like(summed.second)
    for reply in released(replies):
        t = {k: reply.tensors[k].to(shift) for k in ("counts", "sums", "second")}
        within = within + within_scatter(t["counts"], t["sums"], t["second"], ct)
    nk = summed.counts + 10 * torch.finfo(summed.counts.dtype).eps
    sums = summed.sums
    if ct == "full":
        pooled = sums.unsqueeze(2) * sums.unsqueeze(1) / nk.view(-1, 1, 1)
    elif ct == "tied":
        pooled = (sums / nk.unsqueeze(1)).T @ sums
    elif ct == "diag":
        pooled = sums.square() / nk.unsqueeze(1)
    else:
        pooled = sums.square().sum(1) / nk
    return replace(summed, second=within + pooled)
